r"""Plots from results folders of `python -m tff_dp.run`.

  python -m tff_dp.plot --runs=runs/a,runs/b --output_dir=plots

writes, for the runs together: `metric_vs_round.png`,
`metric_vs_epsilon.png` (private runs), `metric_vs_bytes_up.png`
(cumulative upload per expected participant slot is not known here, so the
total bytes all clients uploaded); and for each run with update
diagnostics, `update_norm_angle_<run>.png`: the cohort's clients in the
(update norm, cosine to the last global step) plane at `--round` (default:
the last round with angles), drawn from the histogram in
`diagnostics.jsonl` (one dot per occupied cell, area by count; seed 003
Figs. 1-2), beside the per-round norm quantiles.
"""

import csv
import json
import pathlib
from typing import Optional, Sequence

from absl import app
from absl import flags
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tff_dp.client_works import diagnostics  # noqa: E402

_METRICS = ('test_accuracy', 'test_balanced_accuracy', 'test_auroc')


def read_rows(run_dir: pathlib.Path) -> list[dict[str, float]]:
  with open(run_dir / 'metrics.csv', newline='') as f:
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


def pick_metric(rows: Sequence[dict]) -> str:
  for m in _METRICS:
    if any(m in r for r in rows):
      return m
  raise ValueError(
    'No test metric in metrics.csv (evaluate with --eval_every).'
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


def plot_norm_angle(
  run_dir: pathlib.Path, path: pathlib.Path, round_num: Optional[int] = None
) -> Optional[pathlib.Path]:
  """Norm x cosine cells of one round, and norm quantiles per round."""
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
  right.set_xlabel('round')
  right.set_ylabel('pre-clip update norm')
  right.legend(fontsize=8)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


_RUNS = flags.DEFINE_list('runs', None, 'Results folders of tff_dp.run.')
_LABELS = flags.DEFINE_list('labels', None, 'Legend labels (default: names).')
_OUT = flags.DEFINE_string('output_dir', 'plots', 'Where PNGs go.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  dirs = [pathlib.Path(r) for r in _RUNS.value]
  missing = [str(d) for d in dirs if not (d / 'metrics.csv').exists()]
  if missing:
    raise app.UsageError(f'No metrics.csv in: {", ".join(missing)}')
  if _LABELS.value and len(_LABELS.value) != len(dirs):
    raise app.UsageError('--labels must have one label per run.')
  for path in plot_runs(dirs, pathlib.Path(_OUT.value), _LABELS.value):
    print(path)


if __name__ == '__main__':
  flags.mark_flag_as_required('runs')
  app.run(main)
