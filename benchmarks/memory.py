r"""Memory of a long run: RSS of the job and its TFF worker, every round.

Runs `python -m tff_dp.run` with the flags after `--` (`make bench-memory`
passes `make run`'s: seed 001's DP-FedAvg round on Fashion-MNIST) for
--rounds rounds, as a user would, and samples the resident memory of the
job's Python process and of its `worker_binary` each time a round's row
lands in metrics.csv (`benchmarks.job_watch`). Writes the curve
(`memory.png`), a table of every 10th round and the least-squares slope
over the last 100 rounds (`memory.md`, `memory.json`). Rerunning the same
command after an interruption resumes the job from its checkpoint.

  python -m benchmarks.memory --rounds=200 -- --task=fashion_mnist_iid \
      --method=dp_fedavg --client_sampling_rate=0.016667 ...
"""

import os
import pathlib
import re
import shlex

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from benchmarks import job_watch  # noqa: E402
from benchmarks import results_table  # noqa: E402

_ROUNDS = flags.DEFINE_integer('rounds', 200, 'Rounds to run (>= 2).')
_RUN_DIR = flags.DEFINE_string(
  'run_dir', 'runs/bench_memory', 'The job directory (resumed if present).'
)
_OUTPUT = flags.DEFINE_string(
  'output', 'benchmarks/results/memory.md', 'Results markdown file.'
)
_REPORT_ONLY = flags.DEFINE_bool(
  'report_only',
  False,
  'Rewrite the results from the finished run in --run_dir; run nothing.',
)
_WINDOW = flags.DEFINE_integer(
  'slope_rounds', 100, 'The slope is fitted over this many last rounds.'
)
# Where the slope counts as flat (issue 23): under 1 MB a round.
FLAT_MB_PER_ROUND = 1.0


def _mb(value):
  return '' if value is None else round(value)


def plot(samples, path: pathlib.Path, title: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(7, 4))
  for field, label in (
    ('worker_rss_mb', 'worker_binary'),
    ('python_rss_mb', 'Python (tff_dp.run)'),
  ):
    kept = [s for s in samples if getattr(s, field) is not None]
    ax.plot(
      [s.round for s in kept],
      [getattr(s, field) / 1024 for s in kept],
      label=label,
    )
  ax.set_xlabel('round')
  ax.set_ylabel('resident memory (GiB)')
  ax.set_title(title, fontsize=9)
  ax.set_ylim(bottom=0)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def job_allocators(log: pathlib.Path) -> list[str]:
  """The distinct 'Memory allocator: ...' lines of the job's log."""
  found = []
  if log.exists():
    for match in re.finditer(r'Memory allocator: (.*)', log.read_text()):
      if match.group(1).strip() not in found:
        found.append(match.group(1).strip())
  return found


def main(argv):
  job_flags = argv[1:]
  if _ROUNDS.value < 2:
    raise app.UsageError(f'--rounds must be >= 2. Found {_ROUNDS.value}.')
  if not job_flags:
    raise app.UsageError("Give the job flags after --, e.g. make run's.")
  if _REPORT_ONLY.value:
    samples = job_watch.read_samples(pathlib.Path(_RUN_DIR.value))
    if not samples or samples[-1].round < _ROUNDS.value:
      raise app.UsageError(
        f'--report_only needs a finished run of {_ROUNDS.value} rounds in '
        f'{_RUN_DIR.value}; it has {len(samples)} samples.'
      )
  else:
    samples = job_watch.run_job(job_flags, _ROUNDS.value, _RUN_DIR.value)
  # The job's own time: each segment's elapsed time at its last sample.
  wall = sum(
    max(s.elapsed_s for s in samples if s.segment == segment)
    for segment in {s.segment for s in samples}
  )
  last = [s for s in samples if s.round > _ROUNDS.value - _WINDOW.value]
  segments = sorted({s.segment for s in last})
  # A resumed job starts fresh processes: fit the last segment only.
  last = [s for s in last if s.segment == segments[-1]]
  slopes = {
    f: job_watch.slope_mb_per_round(last, f)
    for f in ('worker_rss_mb', 'python_rss_mb')
  }
  slopes['together'] = job_watch.slope_mb_per_round(
    last, 'worker_rss_mb', 'python_rss_mb'
  )

  def fmt(key):
    slope, error = slopes[key]
    return f'{slope:+.3f} MB/round (standard error {error:.3f})'

  allocators = job_allocators(pathlib.Path(_RUN_DIR.value) / 'job.log')
  out = pathlib.Path(_OUTPUT.value)
  out.parent.mkdir(parents=True, exist_ok=True)
  png = out.with_suffix('.png')
  command = (
    f'python -m benchmarks.memory --rounds={_ROUNDS.value} -- '
    + ' '.join(shlex.quote(f) for f in job_flags)
  )
  plot(
    samples,
    png,
    f'{_ROUNDS.value} rounds of: tff_dp.run {" ".join(job_flags)[:90]}...',
  )
  for s in samples:
    if s.round % 10 and s.round not in (1, _ROUNDS.value):
      continue
    results_table.update(
      str(out),
      f'round_{s.round:04d}',
      {
        'round': s.round,
        'clients': s.sampled_clients,
        'round s': round(s.round_seconds, 1),
        'worker RSS MB': _mb(s.worker_rss_mb),
        'Python RSS MB': _mb(s.python_rss_mb),
        'worker peak MB': round(s.worker_peak_mb),
        'segment': s.segment,
      },
      title='Resident memory over a long run',
      columns=[
        'round',
        'clients',
        'round s',
        'worker RSS MB',
        'Python RSS MB',
        'worker peak MB',
        'segment',
      ],
      notes=(
        f'`{command}` (make bench-memory), run on {results_table.today()}; '
        f'machine: {results_table.machine()}; the job ran {wall:.0f} s '
        '(all segments). RSS is sampled when a round\'s row lands in '
        'metrics.csv (the round includes evaluation every --eval_every '
        'rounds and a checkpoint every 10). The job\'s allocator, as its '
        f'log gives it: {"; ".join(allocators) or "not logged"}. Curve: '
        f'[{png.name}]({png.name}).\n\n'
        f'**Slope over rounds {_ROUNDS.value - _WINDOW.value + 1}-'
        f'{_ROUNDS.value}** (least squares): worker '
        f'{fmt("worker_rss_mb")}, Python {fmt("python_rss_mb")}, '
        f'together {fmt("together")} (target: under '
        f'{FLAT_MB_PER_ROUND:g}); '
        + (
          'one segment (no restart) in that window.'
          if len(segments) == 1
          else f'segments {segments} in that window (the job was resumed; '
          f'the slope is fitted on the last, rounds {last[0].round}-'
          f'{last[-1].round}).'
        )
      ),
    )
  print(
    f'slope over the last {len(last)} rounds: worker '
    f'{fmt("worker_rss_mb")}, Python {fmt("python_rss_mb")}, together '
    f'{fmt("together")}'
  )


if __name__ == '__main__':
  app.run(main)
