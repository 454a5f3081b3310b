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


def release_free_memory() -> bool:
  """Returns this process's free heap pages to the OS (glibc malloc_trim).

  A run frees and reallocates large native buffers every round (client
  datasets, TF tensors) and glibc keeps freed pages in its arenas. In a
  small in-process run (25 clients a round, no evaluation or checkpoints)
  calling this every round took the growth from 1.8 to 0.1 MB a round; in
  `make run`'s job it has not been shown to help (README, "Memory over
  long runs"). The runner calls this once a round. Returns False where
  there is no malloc_trim.
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
  the kernel when this process ends (however it ends)."""
  parent = os.getpid()
  if _PRCTL is None:  # No parent-death signal here: atexit ends it.
    return subprocess.Popen(list(args), process_group=0, **popen_kwargs)
  return _SPAWNER.popen(
    list(args),
    process_group=0,
    preexec_fn=lambda: _die_with_parent(parent),
    **popen_kwargs,
  )


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
    stderr: Where its stderr goes (default: this process's).
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
  # TFF's ServiceManager.__del__ would raise at teardown (its `subprocess`
  # global is gone by then); its process has been ended above.
  for obj in gc.get_objects():
    if type(obj).__name__ == 'ServiceManager' and hasattr(obj, '_process'):
      type(obj).__del__ = lambda self: None


atexit.register(_end_at_exit)
