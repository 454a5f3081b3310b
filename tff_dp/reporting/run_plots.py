"""The plots of run folders (`python -m tff_dp.plot --runs=...`).

`plot_runs` draws the runs together: `<metric>_vs_round.png`,
`<metric>_vs_epsilon.png` and `<metric>_vs_bytes_up.png`, each run in its
method's colour and marker and the n-th run of a method in the n-th line
style (`run_styles`); `plot_norm_angle` draws one run's clients in the
(update norm, cosine to the last global update) plane beside its per-round
norm quantiles, with short plain labels on the log axes (`short_log_ticks`).
"""

import json
import pathlib
from typing import Any, Optional, Sequence

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from tff_dp.client_works import diagnostics  # noqa: E402
from tff_dp.reporting import run_folders  # noqa: E402
from tff_dp.reporting import styles as styles_lib  # noqa: E402
from tff_dp.reporting import wording  # noqa: E402


def _series(rows, x_key, metric):
  pts = [(r[x_key], r[metric]) for r in rows if x_key in r and metric in r]
  return [p[0] for p in pts], [p[1] for p in pts]


# Runs of one method on one plot share its colour and marker; these tell
# them apart.
_LINESTYLES = ('-', '--', ':', '-.', (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))


def run_styles(methods: Sequence[str]) -> list[dict[str, Any]]:
  """A (colour, marker, line style) for each run of a plot, from its
  method (a `METHOD_STYLES` key): the method's colour and marker, and
  the n-th run of a method the n-th line style.

  Raises:
    ValueError: If a method has no style, or more runs than line styles.
  """
  seen: dict[str, int] = {}
  out = []
  for m in methods:
    style = styles_lib.method_style(m)
    n = seen.get(m, 0)
    if n >= len(_LINESTYLES):
      raise ValueError(
        f'can draw at most {len(_LINESTYLES)} runs of method {m!r} on one '
        f'plot, got more'
      )
    seen[m] = n + 1
    out.append(
      {
        'color': style.color,
        'marker': style.marker,
        'linestyle': _LINESTYLES[n],
      }
    )
  return out


def plot_runs(
  run_dirs: Sequence[pathlib.Path],
  output_dir: pathlib.Path,
  labels: Optional[Sequence[str]] = None,
) -> list[pathlib.Path]:
  """The three comparison plots; returns the files written.

  Each run is drawn in its method's colour and marker (`METHOD_STYLES`);
  a DDGauss run under Poisson sampling says in the legend that its
  epsilon is not rigorous (`epsilon_caveat`).
  """
  output_dir.mkdir(parents=True, exist_ok=True)
  runs = [(d, run_folders.read_rows(d)) for d in run_dirs]
  names = list(labels or [d.name for d in run_dirs])
  flags = [run_folders.run_flags(d) for d in run_dirs]
  labels = [
    f'{n} ({wording.epsilon_caveat(f)})' if wording.epsilon_caveat(f) else n
    for n, f in zip(names, flags)
  ]
  metric = run_folders.pick_metric(runs[0][1])
  scale = wording.scale(metric)
  styles = run_styles([styles_lib.method_key(f) for f in flags])
  written = []
  for x_key, name, xlabel in (
    ('round', 'round', 'round'),
    ('epsilon_rdp', 'epsilon', 'ε spent so far (RDP accountant)'),
    ('bytes_up_total', 'bytes_up', 'bytes uploaded so far, all clients'),
  ):
    # The legend goes right of the axes, so it never hides a curve.
    fig, ax = plt.subplots(figsize=(8.5, 4))
    drawn = 0
    for (_, rows), label, style in zip(runs, labels, styles):
      x, y = _series(rows, x_key, metric)
      if x:
        ax.plot(x, [v * scale for v in y], label=label, markersize=3, **style)
        drawn += 1
    if not drawn:
      plt.close(fig)
      continue
    if x_key == 'bytes_up_total':
      ax.set_xscale('log')
    ax.set_xlabel(xlabel)
    ax.set_ylabel(wording.metric_axis_label(metric))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0))
    path = output_dir / f'{metric}_vs_{name}.png'
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
  for d, name in zip(run_dirs, names):
    path = plot_norm_angle(d, output_dir / f'update_norm_angle_{name}.png')
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
  diag = run_dir / run_folders.NON_PRIVATE_DIR / 'diagnostics.jsonl'
  if not diag.exists():  # A run from before non_private/ existed.
    diag = run_dir / 'diagnostics.jsonl'
  if not diag.exists():
    return None
  lines = [json.loads(l) for l in diag.read_text().splitlines() if l]
  with_angles = [l for l in lines if l.get('joint_hist')]
  if round_num is not None:
    with_angles = [l for l in with_angles if l['round'] == round_num]
  rows = run_folders.read_rows(run_dir)
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
