"""Runs `python -m tff_dp.run` as a user would and samples it every round.

The job runs in its own process (killed with this one: see
`tff_dp.runtime.processes.popen_dying_with_parent`), its log in
`<run_dir>/job.log`.
Each time its `non_private/metrics.csv` gains a row (it runs with
--release_non_private_metrics), the resident memory of the job's
Python process and of its TFF `worker_binary` is recorded with the row's
`round_seconds`; the peak of each over the round (polled every `poll_s`)
too, and the CPU seconds each has used so far (their differences between
rounds say how many cores the job kept busy, and where). Samples are
appended to `<run_dir>/samples.jsonl`, so rerunning the
same command after an interruption resumes the job from its checkpoint and
keeps the earlier samples (a new `segment` starts: the worker restarted).
"""

import csv
import dataclasses
import datetime
import json
import pathlib
import re
import statistics
import sys
import time
from typing import Optional, Sequence

from benchmarks import rss
from tff_dp.runtime import processes


@dataclasses.dataclass
class Sample:
  round: int
  segment: int
  round_seconds: float
  sampled_clients: int
  # "python": the job's Python processes (training and evaluation).
  python_rss_mb: Optional[float]  # None: read after the job ended.
  worker_rss_mb: Optional[float]
  python_peak_mb: float
  worker_peak_mb: float
  elapsed_s: float
  train_seconds: Optional[float] = None
  eval_seconds: Optional[float] = None
  # CPU seconds used so far (this segment) by the job and by its worker.
  python_cpu_s: Optional[float] = None
  worker_cpu_s: Optional[float] = None


def _rows(path: pathlib.Path) -> list[dict]:
  try:
    with open(path) as f:
      return list(csv.DictReader(f))
  except (OSError, csv.Error):
    return []


def _float(value) -> Optional[float]:
  try:
    return float(value)
  except (TypeError, ValueError):
    return None


def wall_per_round(samples: Sequence[Sample]) -> dict[int, float]:
  """Wall seconds between consecutive rows of one segment, by round.

  Unlike `round_seconds` these include everything the job did between
  rounds (metrics files, TensorBoard, checkpoints), to within `poll_s`.
  """
  out = {}
  for prev, cur in zip(samples, samples[1:]):
    if cur.segment == prev.segment and cur.round == prev.round + 1:
      out[cur.round] = cur.elapsed_s - prev.elapsed_s
  return out


# An absl log line's time and the round it ends: a round that is not
# checkpointed logs 'Round k/N trained; ...', one that is logs 'Checkpoint
# of round k written' once its checkpoint is on disk.
_ROUND_END = re.compile(
  r'^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) .*?\] '
  r'(?:Round (\d+)/\d+ trained|Checkpoint of round (\d+) written)'
)


def round_ends(log_text: str) -> dict[int, float]:
  """Seconds on the job's log clock (from its first such line) at which
  each round ended, from the job's own log lines.

  Rows reach metrics.csv `checkpoint_every` rounds at a time (released
  with the checkpoint that covers them), so the time between rows says
  nothing about one round; these lines are logged as each round ends.
  Where a log holds several runs (a resume), a round's last line counts.
  """
  ends, first = {}, None
  for line in log_text.splitlines():
    match = _ROUND_END.match(line)
    if not match:
      continue
    month, day, hour, minute = (int(g) for g in match.groups()[:4])
    # The year is not logged; 2000 is a leap year, so 02-29 parses.
    when = datetime.datetime(2000, month, day, hour, minute).timestamp()
    when += float(match.group(5))
    if first is None:
      first = when
    ends[int(match.group(6) or match.group(7))] = when - first
  return ends


def read_samples(run_dir: pathlib.Path) -> list[Sample]:
  path = run_dir / 'samples.jsonl'
  if not path.exists():
    return []
  out = []
  for line in path.read_text().splitlines():
    if line.strip():
      out.append(Sample(**json.loads(line)))
  return out


def run_job(
  flags: Sequence[str],
  rounds: int,
  run_dir: str,
  *,
  poll_s: float = 0.5,
  timeout_s: Optional[float] = None,
) -> list[Sample]:
  """Runs (or resumes) the job to `rounds` rounds; returns all samples.

  Raises:
    RuntimeError: If the job exits with an error or runs past `timeout_s`.
  """
  out = pathlib.Path(run_dir)
  out.mkdir(parents=True, exist_ok=True)
  samples = read_samples(out)
  segment = 1 + max((s.segment for s in samples), default=0)
  cmd = [
    sys.executable,
    '-m',
    'tff_dp.run',
    *flags,
    # The round times and cohort sizes read below are non-private outputs.
    '--release_non_private_metrics',
    f'--rounds={rounds}',
    f'--root_output_dir={out / "job"}',
  ]
  # metrics_log.NON_PRIVATE_DIR: where the run keeps them.
  metrics = out / 'job' / 'non_private' / 'metrics.csv'
  seen = len(_rows(metrics))
  start = time.perf_counter()
  with open(out / 'job.log', 'a') as log:
    log.write(f'\n$ {" ".join(cmd)}\n')
    log.flush()
    job = processes.popen_dying_with_parent(cmd, stdout=log, stderr=log)
    peak_py = peak_worker = 0
    try:
      while True:
        done = job.poll() is not None
        workers = processes.worker_binary_children(job.pid)
        # Read only while the job and its worker run: after the last row
        # the job exits and a reading of a dead process would be 0.
        live = not done and bool(workers)
        if live:
          # The job's Python processes: it and its other children (the
          # evaluation process).
          pythons = [job.pid] + [
            c for c in rss.children(job.pid) if c not in workers
          ]
          py_now = sum(rss.rss_bytes(p) for p in pythons)
          worker_now = sum(rss.rss_bytes(w) for w in workers)
          py_cpu = sum(rss.cpu_seconds_of(p) for p in pythons)
          worker_cpu = sum(rss.cpu_seconds_of(w) for w in workers)
          peak_py = max(peak_py, py_now)
          peak_worker = max(peak_worker, worker_now)
        rows = _rows(metrics)
        for row in rows[seen:]:
          sample = Sample(
            round=int(row['round']),
            segment=segment,
            round_seconds=float(row['round_seconds']),
            sampled_clients=int(row['sampled_clients']),
            python_rss_mb=py_now / 2**20 if live else None,
            worker_rss_mb=worker_now / 2**20 if live else None,
            python_peak_mb=peak_py / 2**20,
            worker_peak_mb=peak_worker / 2**20,
            elapsed_s=time.perf_counter() - start,
            train_seconds=_float(row.get('train_seconds')),
            eval_seconds=_float(row.get('eval_seconds')),
            python_cpu_s=py_cpu if live else None,
            worker_cpu_s=worker_cpu if live else None,
          )
          samples.append(sample)
          with open(out / 'samples.jsonl', 'a') as f:
            f.write(json.dumps(dataclasses.asdict(sample)) + '\n')
          peak_py = peak_worker = 0
        seen = max(seen, len(rows))
        if done:
          break
        if timeout_s is not None and time.perf_counter() - start > timeout_s:
          raise RuntimeError(f'Job ran past {timeout_s:g} s: {cmd}')
        time.sleep(poll_s)
    finally:
      if job.poll() is None:
        processes.stop_processes([job])
  if job.returncode != 0:
    tail = (out / 'job.log').read_text()[-3000:]
    raise RuntimeError(f'Job exited with {job.returncode}:\n{tail}')
  return samples


def slope_mb_per_round(
  samples: Sequence[Sample], *fields: str
) -> tuple[float, float]:
  """Least-squares slope (MB a round) of the sum of `fields` against the
  round number, and its standard error.

  Samples missing a reading (None) in any field are left out; with fewer
  than 3 the error (and with fewer than 2 the slope) is NaN.
  """
  kept = [s for s in samples if all(getattr(s, f) is not None for f in fields)]
  if len(kept) < 2:
    return float('nan'), float('nan')
  x = [float(s.round) for s in kept]
  y = [sum(getattr(s, f) for f in fields) for s in kept]
  fit = statistics.linear_regression(x, y)
  if len(kept) < 3:
    return fit.slope, float('nan')
  mean_x = statistics.fmean(x)
  residual = sum(
    (yi - fit.intercept - fit.slope * xi) ** 2 for xi, yi in zip(x, y)
  )
  spread = sum((xi - mean_x) ** 2 for xi in x)
  return fit.slope, (residual / (len(kept) - 2) / spread) ** 0.5
