"""A stopped job leaves no TFF worker_binary behind, however it is stopped."""

import gc
import os
import signal
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

from tff_dp.runtime import processes

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def _alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


@pytest.mark.parametrize(
  'signum, exit_code',
  [
    # `make test-slow` (each starts the binary and its evaluation child;
    # `make test` ends started workers in
    # test_a_started_worker_dies_with_its_parent):
    pytest.param(
      signal.SIGTERM, 128 + signal.SIGTERM, marks=pytest.mark.slow
    ),  # A scheduler, timeout, kill.
    pytest.param(
      signal.SIGINT, None, marks=pytest.mark.slow
    ),  # Ctrl-C: KeyboardInterrupt.
    pytest.param(
      signal.SIGKILL, -signal.SIGKILL, marks=pytest.mark.slow
    ),  # No Python runs at all.
  ],
)
def test_a_signalled_job_leaves_no_worker(tmp_path, signum, exit_code):
  out = tmp_path / 'run'
  proc = subprocess.Popen(
    [
      sys.executable,
      '-m',
      'tff_dp.run',
      '--task=heart_disease',
      '--method=dp_fedavg',
      '--rounds=10000',
      '--client_sampling_rate=0.75',
      '--noise_multiplier=0.5',
      '--delta=1e-3',
      '--batch_size=32',
      '--checkpoint_every=1',
      f'--root_output_dir={out}',
    ],
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
    # Its own session: the signal reaches the job alone, as `kill PID`.
    start_new_session=True,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
  )
  try:
    deadline = time.time() + 300
    # Mid-training: a checkpoint is written and the worker is running.
    while not (out / 'secret' / 'checkpoints' / 'round_2').exists():
      assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
      assert time.time() < deadline
      time.sleep(0.2)
    workers = processes.worker_binary_children(proc.pid)
    assert len(workers) == 1
    os.kill(proc.pid, signum)
    code = proc.wait(timeout=30)
    end = time.time() + 10
    while _alive(workers[0]) and time.time() < end:
      time.sleep(0.1)
    assert not _alive(workers[0]), f'worker {workers[0]} outlived the job'
    if exit_code is None:
      assert code != 0
    else:
      assert code == exit_code
    if signum == signal.SIGTERM:
      assert b'Received SIGTERM: stopping' in proc.stderr.read()
    # The checkpoints written before the signal are intact.
    assert (out / 'secret' / 'checkpoints').is_dir()
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()


def test_a_started_worker_dies_with_its_parent(tmp_path):
  # A Python process that starts a worker and is then SIGKILLed.
  code = (
    'import portpicker, sys, time\n'
    'from tff_dp.runtime import contexts, processes\n'
    'p = processes.start_worker_binary(contexts.worker_binary_path(), '
    'portpicker.pick_unused_port())\n'
    'print(p.pid, flush=True)\n'
    'time.sleep(600)\n'
  )
  parent = subprocess.Popen(
    [sys.executable, '-c', code], stdout=subprocess.PIPE, text=True
  )
  try:
    worker = int(parent.stdout.readline())
    assert _alive(worker)
    parent.kill()
    parent.wait(timeout=30)
    end = time.time() + 10
    while _alive(worker) and time.time() < end:
      time.sleep(0.1)
    assert not _alive(worker)
  finally:
    if parent.poll() is None:
      parent.kill()


def test_exit_on_signals_keeps_ignored_signals_ignored():
  # `nohup` ignores SIGHUP: a job started under it must survive logout.
  saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
  try:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    processes.exit_on_signals()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)
    with pytest.raises(SystemExit) as exit_info:
      handler(signal.SIGTERM, None)
    assert exit_info.value.code == 128 + signal.SIGTERM
    # Once: a second SIGTERM while exiting takes the default action.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
  finally:
    for s, h in saved.items():
      signal.signal(s, h)


_EXIT_WITHOUT_TEARDOWN = """
import atexit, sys
from tff_dp.runtime import processes

class Teardown:
  def __del__(self):
    sys.stderr.write('torn down')

KEPT = Teardown()  # A module global: its __del__ runs only in teardown.
atexit.register(lambda: sys.stderr.write('atexit ran;'))
sys.stdout.write('unflushed output')
processes.exit_without_teardown(int(sys.argv[1]))
sys.stdout.write('after the exit')
"""


@pytest.mark.parametrize('code', [0, 3])
def test_exit_without_teardown_runs_atexit_and_flushes_but_no_teardown(code):
  done = subprocess.run(
    [sys.executable, '-c', _EXIT_WITHOUT_TEARDOWN, str(code)],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert done.returncode == code
  assert done.stdout == 'unflushed output'
  assert done.stderr == 'atexit ran;'
  # The same script exiting normally is torn down (the check above can fail).
  normal = _EXIT_WITHOUT_TEARDOWN.replace(
    'processes.exit_without_teardown(int(sys.argv[1]))', 'sys.exit(0)'
  )
  done = subprocess.run(
    [sys.executable, '-c', normal], capture_output=True, text=True, timeout=60
  )
  assert done.stderr == 'atexit ran;torn down'


class _StopSignalInFinalizer:
  """In a reference cycle; its finalizer signals this process and runs on."""

  def __init__(self, signum):
    self.signum = signum
    self.cycle = self

  def __del__(self):
    os.kill(os.getpid(), self.signum)
    # Python runs the handler in here, at a bytecode of this loop.
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
      pass


@pytest.mark.parametrize(
  'signum, raised',
  [(signal.SIGTERM, SystemExit), (signal.SIGINT, KeyboardInterrupt)],
)
def test_collect_garbage_keeps_a_stop_signal_that_lands_in_a_finalizer(
  signum, raised
):
  saved = signal.getsignal(signum)
  try:
    if signum == signal.SIGINT:
      signal.signal(signum, signal.default_int_handler)
    else:
      signal.signal(signum, signal.SIG_DFL)
      processes.exit_on_signals((signum,))
    handler = signal.getsignal(signum)
    # A plain collection: the handler's exception is raised in the
    # finalizer, where Python reports it as unraisable and goes on; the
    # stop is lost.
    unraised = []
    saved_hook = sys.unraisablehook
    sys.unraisablehook = unraised.append
    try:
      _StopSignalInFinalizer(signum)
      gc.collect()
    finally:
      sys.unraisablehook = saved_hook
    assert [u.exc_type for u in unraised] == [raised]
    signal.signal(signum, handler)
    _StopSignalInFinalizer(signum)
    with pytest.raises(raised):
      processes.collect_garbage()
    if signum == signal.SIGTERM:
      # exit_on_signals' handler ran (it resets itself, once).
      assert signal.getsignal(signum) is signal.SIG_DFL
    else:
      assert signal.getsignal(signum) is handler
  finally:
    signal.signal(signum, saved)


class _InCycle:
  def __init__(self):
    self.cycle = self


def test_collect_garbage_collects_cycles():
  gc.disable()
  try:
    ref = weakref.ref(_InCycle())
    assert ref() is not None
    assert processes.collect_garbage() >= 1
    assert ref() is None
  finally:
    gc.enable()


def _rss_mb():
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmRSS'):
        return int(line.split()[1]) / 1024
  raise RuntimeError('no VmRSS')


@pytest.mark.skipif(
  not sys.platform.startswith('linux'), reason='glibc malloc_trim'
)
def test_release_free_memory_returns_freed_heap_pages():
  # 256 MB in 64 KB blocks (below glibc's mmap threshold, so on a thread's
  # malloc arena), all freed but the last: glibc keeps the pages resident
  # until they are trimmed, as it kept a long run's freed round buffers.
  kept = []

  def churn():
    blocks = [np.ones(8000) for _ in range(4000)]
    kept.append(blocks[-1])

  thread = threading.Thread(target=churn)
  thread.start()
  thread.join()
  before = _rss_mb()
  assert processes.release_free_memory()
  assert _rss_mb() < before - 150


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
  environ = {
    k: v
    for k, v in os.environ.items()
    if k
    not in (
      'LD_PRELOAD',
      processes.JEMALLOC_CONF_ENV,
      processes.JOB_JEMALLOC_ENV,
      processes.JEMALLOC_RERUN_ENV,
      processes.GLIBC_MALLOC_ENV,
    )
    and not k.startswith('MALLOC_')
  }
  return subprocess.run(
    [sys.executable, '-c', code],
    env={**environ, **env},
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )


_RERUN = (
  'import os\n'
  'print("start", os.getpid())\n'
  'from tff_dp.runtime import processes\n'
  'processes.rerun_under_jemalloc()\n'
  'print("ran", os.getpid(), processes.loaded_jemalloc(), '
  'os.environ.get("MALLOC_CONF"))\n'
)


def test_rerun_under_jemalloc_preloads_it_once_in_the_same_process():
  library = processes.find_jemalloc('TFF_DP_NO_SUCH_SETTING')
  if library is None:
    pytest.skip(f'no {processes.JEMALLOC_LIBRARY} here (make install adds one)')
  done = _run_python(_RERUN, **{processes.JOB_JEMALLOC_ENV: 'auto'})
  assert done.returncode == 0, done.stderr
  lines = [line.split() for line in done.stdout.splitlines()]
  # Started twice (before and after the re-execution), ran once, one pid.
  assert [line[0] for line in lines] == ['start', 'start', 'ran']
  assert len({line[1] for line in lines}) == 1
  assert os.path.realpath(lines[2][2]) == os.path.realpath(library)
  assert lines[2][3] == processes.JEMALLOC_CONF
  # A path names the library; the user's MALLOC_CONF is kept.
  done = _run_python(
    _RERUN, MALLOC_CONF='narenas:1', **{processes.JOB_JEMALLOC_ENV: library}
  )
  lines = [line.split() for line in done.stdout.splitlines()]
  assert [line[0] for line in lines] == ['start', 'start', 'ran']
  assert lines[2][3] == 'narenas:1'


@pytest.mark.parametrize('setting', [None, 'none', ' None '])
def test_rerun_under_jemalloc_is_opt_in(setting):
  env = {} if setting is None else {processes.JOB_JEMALLOC_ENV: setting}
  done = _run_python(_RERUN, **env)
  assert done.returncode == 0, done.stderr
  lines = [line.split() for line in done.stdout.splitlines()]
  assert [line[0] for line in lines] == ['start', 'ran']
  assert lines[1][2] == 'None'


def test_rerun_under_jemalloc_names_a_missing_library():
  done = _run_python(_RERUN, **{processes.JOB_JEMALLOC_ENV: '/no/such/lib.so'})
  assert done.returncode != 0
  assert "TFF_DP_JEMALLOC='/no/such/lib.so' is not a file" in done.stderr


# In a fresh interpreter: the settings applied, whether a 1 MiB block
# allocated after a 4 MiB one was freed is mmapped (glibc's own threshold
# has risen to 4 MiB by then), and how many arenas 8 threads allocating at
# once end up with (malloc_info's heaps).
_GLIBC = r"""
import ctypes, os, sys, tempfile, threading
from tff_dp.runtime import processes
applied = processes.tune_glibc_malloc()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
class MallInfo2(ctypes.Structure):
  _fields_ = [(n, ctypes.c_size_t) for n in (
      'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks',
      'fsmblks', 'uordblks', 'fordblks', 'keepcost')]
libc.mallinfo2.restype = MallInfo2
libc.free(libc.malloc(4 << 20))
before = libc.mallinfo2().hblks
block = libc.malloc(1 << 20)
mmapped = libc.mallinfo2().hblks - before
libc.free(block)
barrier = threading.Barrier(8)
def work():
  held = libc.malloc(1000)
  barrier.wait()
  libc.free(held)
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
  t.start()
for t in threads:
  t.join()
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.TemporaryDirectory() as d:
  path = os.path.join(d, 'info.xml')
  f = libc.fopen(path.encode(), b'w')
  libc.malloc_info(0, f)
  libc.fclose(f)
  heaps = open(path).read().count('<heap nr=')
print(sorted(applied.items()), mmapped, heaps)
"""


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc')
@pytest.mark.parametrize(
  'env, applied, mmapped, max_heaps',
  [
    # The default: 2 arenas at most; large blocks stay mmapped.
    (
      {},
      [('MALLOC_ARENA_MAX', 2), ('MALLOC_MMAP_THRESHOLD_', 131072)],
      1,
      2,
    ),
    ({'TFF_DP_GLIBC_MALLOC': 'tuned'}, None, 1, 2),
    # glibc's defaults: the threshold rose; up to one arena a thread.
    ({'TFF_DP_GLIBC_MALLOC': ' None '}, [], 0, 9),
    # glibc's own variable wins over ours.
    ({'MALLOC_ARENA_MAX': '4'}, [('MALLOC_MMAP_THRESHOLD_', 131072)], 1, 4),
  ],
)
def test_tune_glibc_malloc(env, applied, mmapped, max_heaps):
  done = _run_python(_GLIBC, **env)
  assert done.returncode == 0, done.stderr
  got_applied, got_mmapped, heaps = done.stdout.rsplit(' ', 2)
  if applied is not None:
    assert got_applied == str(applied)
  assert int(got_mmapped) == mmapped
  assert int(heaps) <= max_heaps
  if max_heaps == 9:  # Without the limit, the threads took more than 2.
    assert int(heaps) > 2


def test_tune_glibc_malloc_names_a_bad_setting(monkeypatch):
  monkeypatch.setenv(processes.GLIBC_MALLOC_ENV, 'small')
  with pytest.raises(ValueError, match="TFF_DP_GLIBC_MALLOC='small' is not"):
    processes.tune_glibc_malloc()
