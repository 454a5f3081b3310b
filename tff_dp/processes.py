"""Ends the TFF `worker_binary` processes that this Python process started.

TFF's C++ execution contexts start a `worker_binary` child and stop it in a
`__del__` that fails at interpreter shutdown (`subprocess` is already torn
down), so the child outlives Python and keeps its stdout pipe open: a
`| tail` or a test runner then hangs. Importing `tff_dp` registers
`end_worker_binaries` with `atexit`, which runs before that teardown.
"""

import atexit
import gc
import os
import signal
import time


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
  end_worker_binaries()
  # TFF's ServiceManager.__del__ would raise at teardown (its `subprocess`
  # global is gone by then); its process has been ended above.
  for obj in gc.get_objects():
    if type(obj).__name__ == 'ServiceManager' and hasattr(obj, '_process'):
      type(obj).__del__ = lambda self: None


atexit.register(_end_at_exit)
