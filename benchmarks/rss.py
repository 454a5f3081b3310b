"""Peak resident memory of this process and its children, sampled; and
the CPU seconds they used (robust where a shared machine's speed drifts)."""

import os
import threading


def _rss_bytes(pid: int) -> int:
  try:
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith('VmRSS:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def rss_bytes(pid: int) -> int:
  """Resident memory of a live process (0 if it is gone)."""
  return _rss_bytes(pid)


def children(pid: int) -> list[int]:
  """Pids of the live direct children of `pid`."""
  out = []
  try:
    for entry in os.listdir('/proc'):
      if entry.isdigit():
        try:
          with open(f'/proc/{entry}/stat') as f:
            ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
          continue
        if ppid == pid:
          out.append(int(entry))
  except OSError:
    pass
  return out


def _cpu_ticks(pid: int) -> int:
  """utime + stime of a live process, in clock ticks (0 if it is gone)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      fields = f.read().rsplit(')', 1)[1].split()
    return int(fields[11]) + int(fields[12])
  except (OSError, ValueError, IndexError):
    return 0


def cpu_seconds_of(pid: int) -> float:
  """CPU seconds (user + system) a live process has used (0 if gone)."""
  return _cpu_ticks(pid) / os.sysconf('SC_CLK_TCK')


def cpu_seconds() -> float:
  """CPU seconds used so far by this process and its live direct children.

  On a shared VM, wall time includes time the hypervisor gave our cores to
  others (steal); CPU time counts only the time we ran, so a difference of
  two readings measures a round's work even while the machine's speed
  drifts. It misses children that exit in between (not the TFF worker).
  """
  me = os.getpid()
  ticks = _cpu_ticks(me) + sum(_cpu_ticks(c) for c in children(me))
  return ticks / os.sysconf('SC_CLK_TCK')


class PeakRss:
  """Samples RSS of this process plus its direct children every interval.

  The children are looked up (a scan of /proc) once every `rescan_s`, not at
  every sample: the scan costs milliseconds of CPU, which a 2-core machine
  running a CPU-bound round would lose to the sampler.
  """

  def __init__(self, interval_s: float = 0.1, rescan_s: float = 2.0):
    self._interval = interval_s
    self._rescan_every = max(1, round(rescan_s / interval_s))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self.peak = 0

  def _run(self):
    me = os.getpid()
    children, n = [], 0
    while not self._stop.is_set():
      if n % self._rescan_every == 0:
        children = children(me)
      n += 1
      total = _rss_bytes(me) + sum(_rss_bytes(c) for c in children)
      self.peak = max(self.peak, total)
      self._stop.wait(self._interval)

  def reset(self):
    self.peak = 0

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
