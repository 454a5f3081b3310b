r"""Plots from results folders of `python -m tff_dp.run`.

  python -m tff_dp.plot --runs=runs/a,runs/b --output_dir=plots

writes, for the runs together: `metric_vs_round.png`,
`metric_vs_epsilon.png` (private runs), `metric_vs_bytes_up.png`
(cumulative upload per expected participant slot is not known here, so the
total bytes all clients uploaded); and for each run with update
diagnostics, `update_norm_angle_<run>.png`: the cohort's clients in the
(update norm, cosine to the last global step) plane at `--round` (default:
the last round with angles), drawn from the histogram in
`diagnostics.jsonl` (one dot per occupied cell, area by count; Zhang et
al. 2022, Figs. 1-2), beside the per-round norm quantiles.

  python -m tff_dp.plot --frontier --runs=runs/a,runs/b --output_dir=plots
  python -m tff_dp.plot --frontier \
      --frontier_results=benchmarks/results/seed001_iid.json \
      --frontier_rows=a,b --frontier_title=T --output_dir=p

writes `frontier.png`: the best test metric against KB uploaded per
participating client per round, one point per method (runs or rows that
differ only by seed, `_seed<N>`, are one point at their mean with their
range as error bars), the paper's number for it as a hollow marker at the
same upload. Every private point must have the same epsilon (RDP, within
1%), or it raises; non-private points are labelled "no DP".
`--frontier_results` reads a study's results store
(`benchmarks/results/<study>.json`), so a frontier can be drawn after its
run folders are gone. (Flags are prefixed `frontier_`: modules that import
this one, such as the study runner, define `--rows` of their own.)
"""

import csv
import dataclasses
import json
import pathlib
import re
from typing import Optional, Sequence

from absl import app
from absl import flags
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from tff_dp.client_works import diagnostics  # noqa: E402

_METRICS = ('test_accuracy', 'test_balanced_accuracy', 'test_auroc')


# The run folder's subfolder of non-private outputs (`outputs.NON_PRIVATE_DIR`).
NON_PRIVATE_DIR = 'non_private'


def _read_csv(path: pathlib.Path) -> list[dict[str, float]]:
  with open(path, newline='') as f:
    out = []
    for r in csv.DictReader(f):
      row = {}
      for k, v in r.items():
        try:
          row[k] = float(v)
        except (TypeError, ValueError):
          pass
      out.append(row)
  return out


def read_rows(run_dir: pathlib.Path) -> list[dict[str, float]]:
  """The numeric cells of a run's `metrics.csv`, a dict per round, with its
  `non_private/metrics.csv` columns merged in by round where it has one."""
  rows = _read_csv(run_dir / 'metrics.csv')
  extra = run_dir / NON_PRIVATE_DIR / 'metrics.csv'
  if extra.exists():
    by_round = {r['round']: r for r in _read_csv(extra)}
    rows = [{**by_round.get(r['round'], {}), **r} for r in rows]
  return rows


def pick_metric(rows: Sequence[dict]) -> str:
  for m in _METRICS:
    if any(m in r for r in rows):
      return m
  raise ValueError(
    'No test metric in metrics.csv (evaluate with --eval_every; a task '
    'whose test examples belong to clients writes them only to '
    'non_private/, with --release_non_private_metrics).'
  )


def _series(rows, x_key, metric):
  pts = [(r[x_key], r[metric]) for r in rows if x_key in r and metric in r]
  return [p[0] for p in pts], [p[1] for p in pts]


_LINESTYLES = ('-', '--', ':', '-.')
_MARKERS = ('.', 'x', '^', 's')


def line_styles(n: int) -> list[dict[str, str]]:
  """A distinct (colour, line style, marker) for each of `n` runs.

  Matplotlib's default cycle repeats its 10 colours, so an 11th run would
  look like the 1st; each further group of 10 gets the next line style and
  marker.
  """
  if n > 10 * len(_LINESTYLES):
    raise ValueError(
      f'can draw at most {10 * len(_LINESTYLES)} runs on one plot, got {n}'
    )
  return [
    {
      'color': f'C{i % 10}',
      'linestyle': _LINESTYLES[i // 10],
      'marker': _MARKERS[i // 10],
    }
    for i in range(n)
  ]


def plot_runs(
  run_dirs: Sequence[pathlib.Path],
  output_dir: pathlib.Path,
  labels: Optional[Sequence[str]] = None,
) -> list[pathlib.Path]:
  """The three comparison plots; returns the files written."""
  output_dir.mkdir(parents=True, exist_ok=True)
  runs = [(d, read_rows(d)) for d in run_dirs]
  labels = labels or [d.name for d in run_dirs]
  metric = pick_metric(runs[0][1])
  styles = line_styles(len(runs))
  written = []
  for x_key, name, xlabel in (
    ('round', 'round', 'round'),
    ('epsilon_rdp', 'epsilon', 'epsilon (RDP)'),
    ('bytes_up_total', 'bytes_up', 'bytes uploaded, all clients'),
  ):
    # The legend goes right of the axes, so it never hides a curve.
    fig, ax = plt.subplots(figsize=(8, 4))
    drawn = 0
    for (_, rows), label, style in zip(runs, labels, styles):
      x, y = _series(rows, x_key, metric)
      if x:
        ax.plot(x, y, label=label, markersize=4, **style)
        drawn += 1
    if not drawn:
      plt.close(fig)
      continue
    if x_key == 'bytes_up_total':
      ax.set_xscale('log')
    ax.set_xlabel(xlabel)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0))
    path = output_dir / f'{metric}_vs_{name}.png'
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
  for d, label in zip(run_dirs, labels):
    path = plot_norm_angle(d, output_dir / f'update_norm_angle_{label}.png')
    if path is not None:
      written.append(path)
  return written


class ShortLogFormatter(matplotlib.ticker.LogFormatter):
  """Log-axis tick labels as short plain numbers: '0.9', '1', '1.2'.

  It labels the ticks matplotlib's `LogFormatter` labels (which minor
  ticks, by how many decades are in view: `short_log_ticks`), but as
  '%.2g': the default math text '1.1 x 10^0' on each minor tick overlaps
  its neighbours.
  """

  def __call__(self, x, pos=None):
    return f'{x:.2g}' if super().__call__(x, pos) else ''


# Decades in view up to which minor ticks are labelled: all of them up
# to 0.4 (matplotlib's default), matplotlib's subset (1, 2, 3, 4 and 6
# in each decade) up to 1.4, none above. Matplotlib's own limit for the
# subset, 1 decade, left a panel spanning 0.1 to 1.75 (update norms of a
# Cheng et al. 2022 run) with the one label '1'; above about 1.5 decades
# the subset's '0.03' and '0.04' touch on a half-width panel, while two
# decade labels are then in view or nearly so.
_MINOR_LABEL_DECADES = (1.4, 0.4)


def short_log_ticks(axis) -> None:
  """Short labels on the major and minor ticks of a log-scale axis."""
  axis.set_major_formatter(ShortLogFormatter())
  axis.set_minor_formatter(
    ShortLogFormatter(
      labelOnlyBase=False, minor_thresholds=_MINOR_LABEL_DECADES
    )
  )


def plot_norm_angle(
  run_dir: pathlib.Path, path: pathlib.Path, round_num: Optional[int] = None
) -> Optional[pathlib.Path]:
  """Norm x cosine cells of one round, and norm quantiles per round."""
  diag = run_dir / NON_PRIVATE_DIR / 'diagnostics.jsonl'
  if not diag.exists():  # A run from before non_private/ existed.
    diag = run_dir / 'diagnostics.jsonl'
  if not diag.exists():
    return None
  lines = [json.loads(l) for l in diag.read_text().splitlines() if l]
  with_angles = [l for l in lines if l.get('joint_hist')]
  if round_num is not None:
    with_angles = [l for l in with_angles if l['round'] == round_num]
  rows = read_rows(run_dir)
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  if with_angles:
    line = with_angles[-1]
    norm_mid = np.sqrt(diagnostics.EDGES[:-1] * diagnostics.EDGES[1:])
    xs, ys, ss = [], [], []
    for key, count in line['joint_hist'].items():
      i, j = (int(v) for v in key.split(','))
      # Bucket i holds [EDGES[i-1], EDGES[i]); cosine bucket j is 0.1 wide.
      xs.append(norm_mid[min(max(i - 1, 0), len(norm_mid) - 1)])
      ys.append(-1 + (j + 0.5) * 2 / diagnostics.ANGLE_BUCKETS)
      ss.append(count)
    left.scatter(xs, ys, s=20 * np.asarray(ss), alpha=0.6)
    left.set_xscale('log')
    short_log_ticks(left.xaxis)
    left.set_ylim(-1.05, 1.05)
    left.set_title(f'round {line["round"]}: clients by update norm and angle')
  else:
    left.set_title('no angles recorded')
  left.set_xlabel('client update L2 norm')
  left.set_ylabel('cosine to the last global update')
  for q in ('q10', 'q50', 'q90'):
    x, y = _series(rows, 'round', f'update_norm_{q}')
    if x:
      right.plot(x, y, label=q)
  x, y = _series(rows, 'round', 'clip')
  if x:
    right.plot(x, y, 'k--', label='clip')
  right.set_yscale('log')
  short_log_ticks(right.yaxis)
  right.set_xlabel('round')
  right.set_ylabel('pre-clip update norm')
  right.legend(fontsize=8)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


@dataclasses.dataclass(frozen=True)
class FrontierPoint:
  """One run (or results row) on the accuracy-upload plane."""

  group: str  # Runs of one group differ only by seed.
  label: str
  kb_up_per_round: float
  metric: float
  epsilon: Optional[float]  # RDP; None for a non-private run.
  paper: Optional[float] = None


_SEED_SUFFIX = re.compile(r'_seed\d+$')
_SEED_LABEL = re.compile(r', seed \d+$')


def frontier_points_from_results(
  path: pathlib.Path, rows: Optional[Sequence[str]] = None
) -> list[FrontierPoint]:
  """Points from a study's results store (`benchmarks/results/*.json`)."""
  table = json.loads(pathlib.Path(path).read_text())
  names = list(rows) if rows else list(table)
  unknown = [n for n in names if n not in table]
  if unknown:
    raise ValueError(
      f'rows {unknown} are not in {path}; it has {sorted(table)}'
    )
  points = []
  for name in names:
    r = table[name]
    paper = r.get('paper')
    points.append(
      FrontierPoint(
        group=_SEED_SUFFIX.sub('', name),
        label=_SEED_LABEL.sub('', r.get('method') or name),
        kb_up_per_round=float(r['KB up / client / round']),
        metric=float(r['best test metric']),
        epsilon=r.get('epsilon RDP'),
        paper=float(paper) if isinstance(paper, (int, float)) else None,
      )
    )
  return points


def frontier_points_from_runs(
  run_dirs: Sequence[pathlib.Path], labels: Optional[Sequence[str]] = None
) -> list[FrontierPoint]:
  """Points from results folders of `python -m tff_dp.run` (best test
  metric over the evaluated rounds; runs with one label are one group)."""
  points = []
  for i, d in enumerate(run_dirs):
    d = pathlib.Path(d)
    summary = json.loads((d / 'summary.json').read_text())
    rows = read_rows(d)
    metric = pick_metric(rows)
    label = labels[i] if labels else _SEED_SUFFIX.sub('', d.name)
    points.append(
      FrontierPoint(
        group=label,
        label=label,
        kb_up_per_round=summary['bytes_per_client_per_round']['up'] / 1000,
        metric=max(r[metric] for r in rows if metric in r),
        epsilon=summary.get('epsilon_rdp'),
      )
    )
  return points


def frontier_groups(points: Sequence[FrontierPoint]) -> list[dict]:
  """One entry per group, in first-seen order: its label, upload `x` (mean
  over its points), the metric's `mean`, `min` and `max` over seeds,
  `seeds`, `private` and `paper`.

  Raises:
    ValueError: If a group's points differ in upload (they are not seeds of
      one configuration).
  """
  groups: dict[str, list[FrontierPoint]] = {}
  for p in points:
    groups.setdefault(p.group, []).append(p)
  out = []
  for name, members in groups.items():
    xs = [p.kb_up_per_round for p in members]
    if max(xs) > 1.001 * min(xs):
      raise ValueError(
        f'group {name!r} mixes uploads {min(xs):.4g} to {max(xs):.4g} KB: '
        'only seeds of one configuration share a point'
      )
    ys = np.array([p.metric for p in members])
    out.append(
      dict(
        group=name,
        label=members[0].label,
        x=float(np.mean(xs)),
        mean=float(ys.mean()),
        min=float(ys.min()),
        max=float(ys.max()),
        seeds=len(members),
        private=members[0].epsilon is not None,
        paper=members[0].paper,
      )
    )
  return out


def plot_frontier(
  points: Sequence[FrontierPoint],
  path: pathlib.Path,
  title: str = '',
  metric: str = 'best test metric',
) -> pathlib.Path:
  """Draws the frontier (see the module doc) and returns `path`.

  Raises:
    ValueError: If there are no points or the private points' epsilons
      differ by more than 1%.
  """
  if not points:
    raise ValueError('no points to draw')
  eps = sorted({p.epsilon for p in points if p.epsilon is not None})
  if eps and eps[-1] > 1.01 * eps[0]:
    raise ValueError(
      f'the private points have epsilons {eps[0]:.4g} to {eps[-1]:.4g}: a '
      'frontier compares methods at one epsilon (within 1%)'
    )
  groups = frontier_groups(points)
  fig, ax = plt.subplots(figsize=(8, 4.5))
  if len(groups) <= 20:  # tab20: 20 distinct colours, one per method.
    colours = [plt.get_cmap('tab20')(i) for i in range(len(groups))]
  else:
    colours = [s['color'] for s in line_styles(len(groups))]
  for colour, g in zip(colours, groups):
    label = g['label']
    if not g['private'] and 'no DP' not in label:
      label += ' (no DP)'
    if g['seeds'] > 1:
      label += f" ({g['seeds']} seeds)"
    ax.errorbar(
      g['x'],
      g['mean'],
      yerr=[[g['mean'] - g['min']], [g['max'] - g['mean']]],
      color=colour,
      marker='o' if g['private'] else 's',
      linestyle='none',
      capsize=3,
      label=label,
    )
    if g['paper'] is not None:
      ax.plot(
        g['x'],
        g['paper'],
        marker='o',
        markerfacecolor='none',
        color=colour,
        linestyle='none',
      )
  ax.plot([], [], 'ko', markerfacecolor='none', label='paper (hollow)')
  ax.set_xscale('log')
  ax.set_xlabel('KB uploaded per participating client per round')
  ax.set_ylabel(metric)
  eps_words = f'epsilon {eps[0]:.3g} (RDP)' if eps else 'no DP'
  # Over the figure: a long legend must not push the title off its edge.
  fig.suptitle(f'{title} ({eps_words})' if title else eps_words, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0))
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


_RUNS = flags.DEFINE_list('runs', None, 'Results folders of tff_dp.run.')
_FRONTIER = flags.DEFINE_boolean(
  'frontier', False, 'Draw frontier.png (accuracy against upload).'
)
_RESULTS = flags.DEFINE_string(
  'frontier_results',
  None,
  'With --frontier: a study results store (benchmarks/results/*.json) to '
  'draw instead of --runs.',
)
_ROWS = flags.DEFINE_list(
  'frontier_rows',
  None,
  'With --frontier_results: its rows to draw (default: all).',
)
_TITLE = flags.DEFINE_string(
  'frontier_title', '', 'With --frontier: the plot title.'
)
_LABELS = flags.DEFINE_list('labels', None, 'Legend labels (default: names).')
_OUT = flags.DEFINE_string('output_dir', 'plots', 'Where PNGs go.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _RESULTS.value and not _FRONTIER.value:
    raise app.UsageError('--frontier_results is read only with --frontier.')
  out = pathlib.Path(_OUT.value)
  if _RESULTS.value:
    points = frontier_points_from_results(
      pathlib.Path(_RESULTS.value), _ROWS.value
    )
    print(plot_frontier(points, out / 'frontier.png', _TITLE.value))
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
    points = frontier_points_from_runs(dirs, _LABELS.value)
    print(plot_frontier(points, out / 'frontier.png', _TITLE.value))
    return
  for path in plot_runs(dirs, out, _LABELS.value):
    print(path)


if __name__ == '__main__':
  app.run(main)
