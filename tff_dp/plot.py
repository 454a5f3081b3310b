r"""Plots from results folders of `python -m tff_dp.run` and from the
studies' results stores.

  python -m tff_dp.plot --runs=runs/a,runs/b --output_dir=plots

writes, for the runs together: `<metric>_vs_round.png`,
`<metric>_vs_epsilon.png` (private runs), `<metric>_vs_bytes_up.png`
(cumulative upload per expected participant slot is not known here, so the
total bytes all clients uploaded), each run in its method's colour and
marker (`styles.METHOD_STYLES`, the same in every plot); and for each run
with update diagnostics, `update_norm_angle_<run>.png`: the cohort's
clients in the (update norm, cosine to the last global step) plane at
`--round` (default: the last round with angles), drawn from the
histogram in `diagnostics.jsonl` (one dot per occupied cell, area by
count; Zhang et al. 2022, Figs. 1-2), beside the per-round norm
quantiles.

  python -m tff_dp.plot --frontier --runs=runs/a,runs/b --output_dir=plots
  python -m tff_dp.plot --frontier \
      --frontier_results=benchmarks/results/seed001_iid.json \
      --frontier_metric=test_accuracy --frontier_rows=a,b \
      --frontier_title=T --frontier_paper='Table I, 180 rounds' \
      --output_dir=p

writes `frontier.png` (`frontier_plot.plot_frontier`): the test metric
with its unit (the mean of the last three evaluations where every run has
them, else the last evaluation; never the best round, which was picked on
the test set) against the upload per participating client per round on a
log axis; one point per configuration (rows that differ only by seed,
`_seed<N>`, are one point at their mean, their min-max a bar), in its
method's colour and marker; epsilon, its accountant, delta and the
sampling in the title; the non-private FedAvg ceiling, the Pareto front
of the private points, and the paper's numbers (hollow) where the rows
carry them. Every private point must have the same epsilon (RDP, within
1%), or it raises. `--frontier_results` reads a study's results store
(`benchmarks/results/<study>.json`) and the run files its finished rows
kept (`benchmarks/results/runs/<study>/<row>/`), so a frontier can be
drawn after its run folders are gone. (Flags are prefixed `frontier_`:
modules that import this one, such as the study runner, define `--rows`
of their own.)
"""

import pathlib

from absl import app
from absl import flags

from tff_dp.reporting import frontier
from tff_dp.reporting import frontier_plot
from tff_dp.reporting import run_folders
from tff_dp.reporting import run_plots

_RUNS = flags.DEFINE_list('runs', None, 'Results folders of tff_dp.run.')
_FRONTIER = flags.DEFINE_boolean(
  'frontier', False, 'Draw frontier.png (the test metric against upload).'
)
_RESULTS = flags.DEFINE_list(
  'frontier_results',
  None,
  'With --frontier: study results stores (benchmarks/results/*.json) to '
  'draw instead of --runs; each row from the store that holds it.',
)
_ROWS = flags.DEFINE_list(
  'frontier_rows',
  None,
  'With --frontier_results: its rows to draw (default: all).',
)
_METRIC = flags.DEFINE_enum(
  'frontier_metric',
  None,
  list(run_folders.METRICS),
  "With --frontier_results: the study's test metric (its rows record "
  'only the values).',
)
_TITLE = flags.DEFINE_string(
  'frontier_title', '', 'With --frontier: the plot title.'
)
_PAPER = flags.DEFINE_string(
  'frontier_paper',
  '',
  "With --frontier: the paper's table and rounds its hollow numbers come "
  'from (needed when the rows carry paper numbers).',
)
_NOTE = flags.DEFINE_string(
  'frontier_note', '', 'With --frontier: a last line for the footnote.'
)
_LABELS = flags.DEFINE_list('labels', None, 'Legend labels (default: names).')
_OUT = flags.DEFINE_string('output_dir', 'plots', 'Where PNGs go.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _RESULTS.value and not _FRONTIER.value:
    raise app.UsageError('--frontier_results is read only with --frontier.')
  out = pathlib.Path(_OUT.value)
  frontier_words = dict(
    title=_TITLE.value, paper_words=_PAPER.value, note=_NOTE.value
  )
  if _RESULTS.value:
    if not _METRIC.value:
      raise app.UsageError('--frontier_results needs --frontier_metric.')
    points = frontier.frontier_points_from_stores(
      [pathlib.Path(p) for p in _RESULTS.value],
      _ROWS.value,
      metric=_METRIC.value,
    )
    print(
      frontier_plot.plot_frontier(
        points, out / 'frontier.png', metric=_METRIC.value, **frontier_words
      )
    )
    return
  if not _RUNS.value:
    raise app.UsageError('Give --runs (or --frontier --frontier_results).')
  dirs = [pathlib.Path(r) for r in _RUNS.value]
  missing = [str(d) for d in dirs if not (d / 'metrics.csv').exists()]
  if missing:
    raise app.UsageError(f'No metrics.csv in: {", ".join(missing)}')
  if _LABELS.value and len(_LABELS.value) != len(dirs):
    raise app.UsageError('--labels must have one label per run.')
  if _FRONTIER.value:
    points = frontier.frontier_points_from_runs(dirs, _LABELS.value)
    metric = run_folders.pick_metric(run_folders.read_rows(dirs[0]))
    print(
      frontier_plot.plot_frontier(
        points, out / 'frontier.png', metric=metric, **frontier_words
      )
    )
    return
  for path in run_plots.plot_runs(dirs, out, _LABELS.value):
    print(path)


if __name__ == '__main__':
  app.run(main)
