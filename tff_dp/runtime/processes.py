"""Starts TFF `worker_binary` processes that die with this process, and
ends them.

TFF's C++ execution contexts start a `worker_binary` child and stop it in a
`__del__` that fails at interpreter shutdown (`subprocess` is already torn
down), so the child outlives Python and keeps its stdout pipe open: a
`| tail` or a test runner then hangs; and a SIGTERM or SIGKILL of Python
runs no Python at all, so the worker was left behind holding its memory.

* `start_worker_binary` starts a worker in its own process group with a
  parent-death signal (Linux `PR_SET_PDEATHSIG`, SIGKILL): the kernel ends
  it when this process ends, however it ends (SIGTERM, SIGKILL, a crash).
  The signal follows the thread that forked the child, so every worker is
  forked from one daemon thread that lives as long as the process.
* Importing `tff_dp` registers `end_worker_binaries` with `atexit` (an
  orderly SIGINT to each worker child, before that teardown).
* `exit_on_signals` turns SIGTERM (and SIGHUP) into `SystemExit` in the
  main thread, so `python -m tff_dp.run` stops like on Ctrl-C: `atexit`
  runs and the workers are ended (checkpoints are written atomically, so
  the last complete one is kept).
* TensorFlow's start-up noise (`stderr_filter.TF_STARTUP_NOISE`) is
  dropped from the children's stderr: `popen_dying_with_parent` copies
  their stderr to the job's without it (`stderr_filter`).
"""

import atexit
import ctypes
import gc
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence

from tff_dp.runtime import stderr_filter

_PR_SET_PDEATHSIG = 1
# prctl, looked up once here (not in the forked child); None off Linux,
# where workers get no parent-death signal (atexit only).
_PRCTL = None
if sys.platform.startswith('linux'):
  try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
    _PRCTL.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    _PRCTL.restype = ctypes.c_int
  except (OSError, AttributeError):
    _PRCTL = None

# glibc's malloc_trim, or None (another libc or platform).
_MALLOC_TRIM = None
if sys.platform.startswith('linux'):
  try:
    _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim
    _MALLOC_TRIM.argtypes = [ctypes.c_size_t]
    _MALLOC_TRIM.restype = ctypes.c_int
  except (OSError, AttributeError):
    _MALLOC_TRIM = None


# glibc's mallopt, or None (another libc or platform). Its parameters
# (malloc.h): M_MMAP_THRESHOLD and M_ARENA_MAX.
_MALLOPT = None
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
if sys.platform.startswith('linux'):
  try:
    _MALLOPT = ctypes.CDLL(None).mallopt
    _MALLOPT.argtypes = [ctypes.c_int, ctypes.c_int]
    _MALLOPT.restype = ctypes.c_int
  except (OSError, AttributeError):
    _MALLOPT = None

# The job's glibc malloc settings (`tune_glibc_malloc`): unset or 'tuned',
# GLIBC_MALLOC_SETTINGS; 'none', glibc's defaults. glibc's own variables
# (MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_), where set, win.
GLIBC_MALLOC_ENV = 'TFF_DP_GLIBC_MALLOC'
# At most 2 arenas (glibc allows 8 a core by default, and each thread then
# allocates from, and keeps freed pages in, its own), and a fixed 128 KiB
# mmap threshold (glibc's starting value, which it otherwise raises to the
# size of each large block freed, up to 32 MiB, so that later blocks of
# that size come from the arenas instead of their own mappings). The two
# were measured together, not each alone (performance notes, "Memory over long
# runs").
GLIBC_MALLOC_SETTINGS = (
  ('MALLOC_ARENA_MAX', _M_ARENA_MAX, 2),
  ('MALLOC_MMAP_THRESHOLD_', _M_MMAP_THRESHOLD, 128 * 1024),
)


def tune_glibc_malloc() -> dict[str, int]:
  """Applies GLIBC_MALLOC_SETTINGS to this process's glibc malloc.

  Call it first thing in a job's `__main__`, before threads start (an
  arena limit binds only arenas not yet created). It does nothing under
  `TFF_DP_GLIBC_MALLOC=none`, off glibc, or when jemalloc is loaded; a
  setting whose glibc variable is in the environment is left to glibc.
  Returns the settings applied, by glibc variable name.

  Raises:
    ValueError: If `TFF_DP_GLIBC_MALLOC` is not unset, 'tuned' or 'none'.
  """
  setting = os.environ.get(GLIBC_MALLOC_ENV, '').strip().lower()
  if setting not in ('', 'tuned', 'none'):
    raise ValueError(
      f'{GLIBC_MALLOC_ENV}={os.environ[GLIBC_MALLOC_ENV]!r} is not one of '
      "'tuned' (the default) or 'none' (glibc's own defaults)."
    )
  if setting == 'none' or _MALLOPT is None or loaded_jemalloc() is not None:
    return {}
  applied = {}
  for name, parameter, value in GLIBC_MALLOC_SETTINGS:
    if name not in os.environ and _MALLOPT(parameter, value) == 1:
      applied[name] = value
  return applied


# jemalloc (performance notes, "Memory over long runs"): the TFF worker
# preloads it when found (`contexts.worker_jemalloc`); the job's own
# Python only when asked (TFF_DP_JEMALLOC, `rerun_under_jemalloc`).
# `make install` unpacks Debian's libjemalloc2 into the venv's lib/ when
# the system has none.
JEMALLOC_LIBRARY = 'libjemalloc.so.2'
JEMALLOC_PATHS = (
  os.path.join(sys.prefix, 'lib', JEMALLOC_LIBRARY),
  os.path.join('/usr/lib/x86_64-linux-gnu', JEMALLOC_LIBRARY),
  os.path.join('/usr/lib64', JEMALLOC_LIBRARY),
  os.path.join('/usr/local/lib', JEMALLOC_LIBRARY),
)
# jemalloc's settings unless the user's MALLOC_CONF is set: no separate
# arena for allocations over 8 MiB, which returned freed pages at once, so
# a round's large activations were unmapped and refaulted every step (40 s
# of worker CPU per 100 clients against glibc's 32-33, and 34.3 without
# that arena; 7 rounds each, 2026-11-24, ad hoc).
JEMALLOC_CONF_ENV = 'MALLOC_CONF'
JEMALLOC_CONF = 'oversize_threshold:0'
# The job's own allocator (`python -m tff_dp.run`), opt-in: unset or
# 'none', glibc's malloc; 'auto', the first of JEMALLOC_PATHS that exists; a
# path, that library. Not the default: in `make run`'s job Python's live
# heap stayed flat over rounds 20-49 (mallinfo2's in-use bytes +0.01 MB a
# round, and its object count too) while glibc's free-but-kept arena space
# grew 3.3 MB a round and RSS 2.5 (standard error 0.6), i.e. fragmentation;
# under jemalloc the same rounds grew RSS 2.2 (1.4) MB a round, no
# measurable difference in 30 rounds (2026-11-24, ad hoc). Round time
# was the same (21.3 against 22.2 s per 100 clients, rounds 20-49).
JOB_JEMALLOC_ENV = 'TFF_DP_JEMALLOC'
# Set in the re-executed job to the library it preloaded, so that it never
# re-executes again and its workers can drop it (TFF_DP_WORKER_JEMALLOC=none).
JEMALLOC_RERUN_ENV = 'TFF_DP_JEMALLOC_RERUN'


def find_jemalloc(env_var: str) -> Optional[str]:
  """The jemalloc library that `env_var` names, else the first found.

  `env_var` set to 'none' means none (glibc malloc); unset, empty or
  'auto', the first of `JEMALLOC_PATHS` that exists, or None.

  Raises:
    ValueError: If `env_var` names a file that does not exist.
  """
  setting = os.environ.get(env_var)
  if setting is not None and setting.strip().lower() not in ('', 'auto'):
    if setting.strip().lower() == 'none':
      return None
    if not os.path.isfile(setting):
      raise ValueError(
        f'{env_var}={setting!r} is not a file: set it to the path of '
        f'{JEMALLOC_LIBRARY}, or to "none" for glibc malloc.'
      )
    return setting
  return next((p for p in JEMALLOC_PATHS if os.path.isfile(p)), None)


def loaded_jemalloc(pid: Optional[int] = None) -> Optional[str]:
  """The jemalloc library mapped into process `pid` (default this one)."""
  try:
    with open(f'/proc/{pid or "self"}/maps') as f:
      for line in f:
        fields = line.split()  # The sixth, where present, is the path.
        if len(fields) >= 6 and 'libjemalloc' in os.path.basename(fields[5]):
          return fields[5]
  except OSError:
    pass
  return None


def rerun_under_jemalloc() -> None:
  """Re-executes this Python with jemalloc preloaded if TFF_DP_JEMALLOC asks.

  Call it first thing in a job's `__main__` (before TensorFlow loads, so
  that the re-execution costs only Python's start): `os.execve` keeps the
  pid, the arguments (`sys.orig_argv`) and the environment, adding
  `LD_PRELOAD` and, unless set, `MALLOC_CONF`. It returns without
  re-executing when `TFF_DP_JEMALLOC` is unset or 'none', off Linux, when
  'auto' finds no library, when jemalloc is already loaded, and in the
  re-executed process itself.

  Raises:
    ValueError: If `TFF_DP_JEMALLOC` names a file that does not exist.
  """
  setting = os.environ.get(JOB_JEMALLOC_ENV, '').strip().lower()
  if setting in ('', 'none') or not sys.platform.startswith('linux'):
    return
  if os.environ.get(JEMALLOC_RERUN_ENV):
    return
  library = find_jemalloc(JOB_JEMALLOC_ENV)
  if library is None or loaded_jemalloc() is not None:
    return
  env = dict(os.environ)
  env['LD_PRELOAD'] = ' '.join([library] + env.get('LD_PRELOAD', '').split())
  env.setdefault(JEMALLOC_CONF_ENV, JEMALLOC_CONF)
  env[JEMALLOC_RERUN_ENV] = library
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], env)


def release_free_memory() -> bool:
  """Returns this process's free heap pages to the OS (glibc malloc_trim).

  A run frees and reallocates large native buffers every round (client
  datasets, TF tensors) and glibc keeps freed pages in its arenas. In a
  small in-process run (25 clients a round, no evaluation or checkpoints)
  calling this every round took the growth from 1.8 to 0.1 MB a round; in
  `make run`'s job it has not been shown to help (docs/performance.md,
  "Memory over long runs"). The runner calls this once a round. Returns
  False where there is no malloc_trim.
  """
  if _MALLOC_TRIM is None:
    return False
  _MALLOC_TRIM(0)
  return True


# The signals `collect_garbage` holds: the stop signals `exit_on_signals`
# handles, and SIGINT (Python's KeyboardInterrupt).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def collect_garbage(signums: Sequence[int] = STOP_SIGNALS) -> int:
  """`gc.collect()`, with the Python handlers of `signums` held until it ends.

  Python runs a signal's handler in the main thread at the next bytecode,
  which during a collection is often inside a finalizer (`__del__`); an
  exception raised there (`SystemExit` from `exit_on_signals`,
  `KeyboardInterrupt`) is printed and ignored, so the stop was lost and the
  job ran on (a SIGTERM during the collection after a checkpoint). Here a
  signal that arrives during the collection is recorded, and its handler
  runs once the collection is over. Off the main thread (where handlers
  cannot be set) it is a plain `gc.collect()`. Returns what `gc.collect`
  returns.
  """
  if threading.current_thread() is not threading.main_thread():
    return gc.collect()
  received = []
  held = {}
  for signum in signums:
    handler = signal.getsignal(signum)
    if callable(handler):
      held[signum] = handler
      signal.signal(signum, lambda s, frame: received.append((s, frame)))
  try:
    return gc.collect()
  finally:
    for signum, handler in held.items():
      signal.signal(signum, handler)
    if received:
      signum, frame = received[0]
      held[signum](signum, frame)


# Set at exit: a computation still running then must not restart a worker.
_SHUTTING_DOWN = threading.Event()


def shutting_down() -> bool:
  """True once this process has begun ending its workers at exit."""
  return _SHUTTING_DOWN.is_set()


def _die_with_parent(parent_pid: int) -> None:
  """Child side, between fork and exec: SIGKILL when the parent dies."""
  if _PRCTL is not None:
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  # The parent may have died before prctl took effect.
  if os.getppid() != parent_pid:
    os._exit(1)


class _Spawner:
  """Forks children from one daemon thread that lives until process exit.

  `PR_SET_PDEATHSIG` fires when the forking *thread* ends, so forking from
  whichever thread asks (e.g. TFF's event-loop thread, which ends with its
  execution context) could kill a worker that is still in use.
  """

  def __init__(self):
    self._requests: queue.Queue = queue.Queue()
    self._thread: Optional[threading.Thread] = None
    self._lock = threading.Lock()

  def _run(self):
    while True:
      args, kwargs, box, done = self._requests.get()
      try:
        box['process'] = subprocess.Popen(*args, **kwargs)
      except BaseException as e:  # pylint: disable=broad-except
        box['error'] = e
      done.set()

  def popen(self, *args, **kwargs) -> subprocess.Popen:
    with self._lock:
      if self._thread is None or not self._thread.is_alive():
        self._thread = threading.Thread(
          target=self._run, name='tff_dp-worker-spawner', daemon=True
        )
        self._thread.start()
    box: dict = {}
    done = threading.Event()
    self._requests.put((args, kwargs, box, done))
    done.wait()
    if 'error' in box:
      raise box['error']
    return box['process']


_SPAWNER = _Spawner()


def popen_dying_with_parent(
  args: Sequence[str], **popen_kwargs
) -> subprocess.Popen:
  """`subprocess.Popen(args, ...)` in its own process group, SIGKILLed by
  the kernel when this process ends (however it ends).

  Without `stderr` (or with None), the child's stderr goes to this
  process's, less the lines of `stderr_filter.TF_STARTUP_NOISE`.
  """
  parent = os.getpid()
  read_fd = None
  if popen_kwargs.get('stderr') is None:
    read_fd, popen_kwargs['stderr'] = os.pipe()
  try:
    if _PRCTL is None:  # No parent-death signal here: atexit ends it.
      process = subprocess.Popen(list(args), process_group=0, **popen_kwargs)
    else:
      process = _SPAWNER.popen(
        list(args),
        process_group=0,
        preexec_fn=lambda: _die_with_parent(parent),
        **popen_kwargs,
      )
  except BaseException:
    if read_fd is not None:
      os.close(read_fd)
    raise
  finally:
    if read_fd is not None:
      os.close(popen_kwargs['stderr'])  # The child holds its own copy.
  if read_fd is not None:
    stderr_filter.copy_stderr(process, read_fd)
  return process


def start_worker_binary(
  binary_path: str,
  port: int,
  *,
  max_concurrent_computation_calls: int = -1,
  env: Optional[dict] = None,
  stdout=None,
  stderr=None,
) -> subprocess.Popen:
  """Starts a TFF `worker_binary` that is ended when this process ends.

  The worker runs in its own process group (a terminal's Ctrl-C reaches
  Python, which ends it in order) with SIGKILL as its parent-death signal.

  Args:
    binary_path: The `worker_binary` executable.
    port: The gRPC port it serves on.
    max_concurrent_computation_calls: Its cap on concurrent computations
      (-1: none).
    env: Its environment (default: this process's).
    stdout: Where its stdout goes (default: this process's).
    stderr: Where its stderr goes (default: this process's, less
      `stderr_filter.TF_STARTUP_NOISE`).
  """
  return popen_dying_with_parent(
    [
      binary_path,
      f'--port={port}',
      f'--max_concurrent_computation_calls={max_concurrent_computation_calls}',
    ],
    env=env,
    stdout=stdout,
    stderr=stderr,
  )


def stop_processes(processes: Sequence[subprocess.Popen]) -> None:
  """SIGKILLs each still-running process's group and reaps it."""
  for p in processes:
    if p.poll() is None:
      try:
        os.killpg(p.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      p.wait()


def exit_on_signals(signums=(signal.SIGTERM, signal.SIGHUP)) -> None:
  """Makes each signal in `signums` raise `SystemExit(128 + signum)`.

  Call from the main thread (Python runs signal handlers there). The exit
  then runs `atexit`, which ends this process's worker_binary children.
  A signal that is ignored (e.g. SIGHUP under `nohup`) stays ignored.
  """

  def handler(signum, frame):
    del frame
    # Once: a second signal while exiting takes the default action.
    signal.signal(signum, signal.SIG_DFL)
    # os.write, not print: the main thread may be inside a stderr write.
    os.write(
      2,
      f'Received {signal.Signals(signum).name}: stopping (the last '
      'checkpoint is kept; rerun the same command to resume).\n'.encode(),
    )
    raise SystemExit(128 + signum)

  for signum in signums:
    if signal.getsignal(signum) is not signal.SIG_IGN:
      signal.signal(signum, handler)


def exit_without_teardown(code: int = 0) -> None:
  """Ends this process now, as a normal exit would, minus the teardown.

  Runs `atexit` (which ends this process's worker_binary children and
  flushes `logging`), flushes stdout and stderr, then `os._exit(code)`:
  no module teardown and no C++ static destructors. TensorFlow's native
  objects can crash a process in that teardown after its work is done
  (tensorflow/tensorflow#40186). A fresh-clone CI run saw `python -m
  tff_dp.run` end with SIGSEGV (exit -11) on a one-round job, its
  faulthandler report without a single Python thread stack (the crash was
  on a thread Python did not know); whether it was in the teardown was not
  established. A job's files are all written and flushed before its `main`
  returns, so this skips nothing a user reads.
  """
  atexit._run_exitfuncs()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(code)


def worker_binary_children(parent_pid: int | None = None) -> list[int]:
  """Pids of `worker_binary` processes whose parent is `parent_pid`."""
  parent_pid = os.getpid() if parent_pid is None else parent_pid
  pids = []
  try:
    entries = os.listdir('/proc')
  except OSError:
    return pids
  for entry in entries:
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat', 'rb') as f:
        stat = f.read().decode(errors='replace')
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        cmdline = f.read().decode(errors='replace')
    except OSError:
      continue
    # The 4th field of /proc/PID/stat, after the ')' of the command name.
    ppid = int(stat.rsplit(')', 1)[1].split()[1])
    if ppid == parent_pid and 'worker_binary' in cmdline:
      pids.append(int(entry))
  return pids


def end_worker_binaries(timeout_s: float = 5.0) -> list[int]:
  """SIGINTs this process's worker_binary children; SIGKILLs stragglers.

  Returns:
    The pids that were signalled.
  """
  pids = worker_binary_children()
  for pid in pids:
    try:
      os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
      pass
  deadline = time.monotonic() + timeout_s
  remaining = list(pids)
  while remaining and time.monotonic() < deadline:
    remaining = [p for p in remaining if _alive(p)]
    if remaining:
      time.sleep(0.05)
  for pid in remaining:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  for pid in pids:  # Reap, so no zombie is left behind.
    try:
      os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
      pass
  return pids


def _alive(pid: int) -> bool:
  try:
    os.waitpid(pid, os.WNOHANG)
  except ChildProcessError:
    pass
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      state = f.read().decode(errors='replace').rsplit(')', 1)[1].split()[0]
    return state != 'Z'
  except OSError:
    return False


def _end_at_exit() -> None:
  _SHUTTING_DOWN.set()
  end_worker_binaries()
  stderr_filter.finish_stderr_copies()
  # TFF's ServiceManager.__del__ would raise at teardown (its `subprocess`
  # global is gone by then); its process has been ended above.
  for obj in gc.get_objects():
    if type(obj).__name__ == 'ServiceManager' and hasattr(obj, '_process'):
      type(obj).__del__ = lambda self: None


atexit.register(_end_at_exit)
