"""The frontier drawing (`python -m tff_dp.plot --frontier`): `frontier.png`.

`frontier_figure` draws the groups of `frontier.frontier_groups` against
the upload per participating client per round on a log axis, spread
sideways where they share an upload (`dodge`), each in its method's colour
and marker with a min-max bar over its seeds, the paper's numbers hollow,
the Pareto front of the private points, the non-private ceiling, and each
point's words placed clear of the others; `plot_frontier` saves it.
"""

import pathlib
import math
import textwrap
from typing import Any, Sequence

import matplotlib

matplotlib.use('Agg')
import matplotlib.figure  # noqa: E402
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from tff_dp.reporting import frontier  # noqa: E402
from tff_dp.reporting import frontier_words  # noqa: E402
from tff_dp.reporting import styles  # noqa: E402
from tff_dp.reporting import wording  # noqa: E402
from tff_dp.methods import style as style_lib  # noqa: E402


def upload_clusters(xs: Sequence[float], tol: float = 0.01) -> list[list[int]]:
  """Indices of the points that share an upload (within `tol` in log10 of
  the cluster's first), by upload, each cluster in index order."""
  logs = [math.log10(x) for x in xs]
  clusters: list[list[int]] = []
  for i in sorted(range(len(xs)), key=lambda i: (logs[i], i)):
    if clusters and logs[i] - logs[clusters[-1][0]] <= tol:
      clusters[-1].append(i)
    else:
      clusters.append([i])
  return [sorted(c) for c in clusters]


def dodge(xs: Sequence[float], step: float) -> list[float]:
  """Spreads points that share an upload (`upload_clusters`) about their
  mean, `step` apart in log10, in index order: each stays visible."""
  out = list(xs)
  for members in upload_clusters(xs):
    centre = np.mean([math.log10(xs[i]) for i in members])
    for k, i in enumerate(members):
      out[i] = 10 ** (centre + (k - (len(members) - 1) / 2) * step)
  return out


def frontier_figure(
  points: Sequence[frontier.FrontierPoint],
  title: str = '',
  metric: str = 'test_accuracy',
  paper_words: str = '',
  note: str = '',
) -> matplotlib.figure.Figure:
  """The metric-upload frontier, as a figure (`plot_frontier` saves it).

  One point per configuration (its seeds' mean, a bar over their min-max),
  in its method's `METHOD_STYLES` colour and marker, against the upload
  per participating client per round (log axis); configurations at one
  upload are spread sideways (`dodge`) over a grey band at their upload.
  The y value is the mean of each run's last 3 evaluations when every
  point has it, else every point's last evaluation (the footnote says
  which); never the best round, which was picked on the test set. A
  method's configurations are labelled by what differs (`point_words`).
  The paper's number is a hollow marker at its configuration, only where
  the row has one (once per method, value and upload), described by
  `paper_words` (its table and rounds). A dashed line is the non-private
  FedAvg rows' ceiling, or the legend says there is no non-private run. A
  grey step line is the Pareto front of the private configurations (those
  with a caveat on their epsilon left out). The title's second line gives
  epsilon, its accountant, delta and the sampling (`privacy_words`).

  Raises:
    ValueError: If there are no points, the private points' epsilons
      differ by more than 1%, or paper numbers are drawn without
      `paper_words`.
  """
  if not points:
    raise ValueError('no points to draw')
  statistic, y_words, y_note = frontier_words.statistic(points)
  groups = frontier.frontier_groups(points, statistic)
  privacy = frontier_words.privacy_words(groups)
  footnote = _footnote(groups, y_note, paper_words, note)

  width, height = 11.5, 6.2
  fig = plt.figure(figsize=(width, height))
  bottom = (0.75 + 0.13 * (footnote.count('\n') + 1)) / height
  ax = fig.add_axes([0.065, bottom, 0.56, 0.87 - bottom])
  xs = _frontier_x(ax, groups, width_in=0.56 * width)
  scale = wording.scale(metric)
  legend = _draw(ax, groups, xs, scale)
  _finish(fig, ax, legend, metric, y_words, title, privacy, footnote)
  words, _ = frontier_words.point_words(groups)
  _place_labels(
    fig,
    ax,
    [
      (x, g.mean * scale, words[g.name], styles.method_style(g.method).color)
      for g, x in zip(groups, xs)
      if words[g.name]
    ],
  )
  return fig


def plot_frontier(
  points: Sequence[frontier.FrontierPoint],
  path: pathlib.Path,
  title: str = '',
  metric: str = 'test_accuracy',
  paper_words: str = '',
  note: str = '',
) -> pathlib.Path:
  """Draws `frontier_figure(points, ...)` to `path` (PNG) and returns it."""
  fig = frontier_figure(points, title, metric, paper_words, note)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def _footnote(
  groups: Sequence[frontier.FrontierGroup],
  y_note: str,
  paper_words: str,
  note: str,
) -> str:
  """The footnote's lines: the y statistic's note (`y_note`), where the
  paper's hollow numbers come from (`paper_words`) where any are drawn,
  and `note`.

  Raises:
    ValueError: If paper numbers are drawn without `paper_words`.
  """
  if any(g.paper is not None for g in groups) and not paper_words:
    raise ValueError(
      'rows carry paper numbers: say which table and rounds (paper_words)'
    )
  notes = [y_note]
  if any(g.paper is not None for g in groups):
    notes.append(f"Hollow: the paper's reported number ({paper_words}).")
  if note:
    notes.append(note)
  return '\n'.join(textwrap.fill(n, 160) for n in notes)


def _draw(ax, groups, xs, scale) -> list[tuple[Any, str]]:
  """Draws the groups, the paper's numbers, the Pareto front and the
  ceiling; returns their legend entries, with the seed bars and the grey
  band at a shared upload explained where drawn."""
  legend = _draw_points(ax, groups, xs, scale)
  legend += _draw_paper(ax, groups, xs, scale)
  legend += _draw_front(ax, groups, xs, scale)
  legend += _draw_ceiling(ax, groups, scale)
  seeds = sorted({g.seeds for g in groups if g.seeds > 1})
  if seeds:
    legend.append(
      (
        matplotlib.lines.Line2D(
          [], [], color='0.3', marker='_', markersize=12, linewidth=1.4
        ),
        f'bar: min–max over {"/".join(map(str, seeds))} seeds '
        '(no bar: 1 seed)',
      )
    )
  if any(len(c) > 1 for c in upload_clusters([g.x for g in groups])):
    legend.append(
      (
        matplotlib.lines.Line2D([], [], color='0.8', linewidth=4, alpha=0.6),
        'grey band: one upload; its points spread sideways',
      )
    )
  return legend


def _finish(
  fig,
  ax,
  legend,
  metric: str,
  y_words: str,
  title: str,
  privacy: str,
  footnote: str,
) -> None:
  """The axes' labels and tick words, the title over `privacy`, the
  legend right of the axes and the footnote at the bottom."""
  ax.set_xlabel('upload per participating client per round (KB, log scale)')
  ax.set_ylabel(f'{wording.metric_axis_label(metric)}, {y_words}')
  ax.xaxis.set_major_formatter(PlainLogFormatter())
  ax.xaxis.set_minor_formatter(
    PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1.4, 0.4))
  )
  ax.grid(alpha=0.3)
  fig.suptitle((f'{title}\n' if title else '') + privacy, fontsize=10, y=0.985)
  ax.legend(
    [h for h, _ in legend],
    [n for _, n in legend],
    fontsize=7.5,
    loc='upper left',
    bbox_to_anchor=(1.02, 1.0),
    frameon=False,
  )
  fig.text(0.01, 0.015, footnote, fontsize=7, va='bottom', color='0.25')


def _frontier_x(ax, groups: Sequence[frontier.FrontierGroup], width_in: float):
  """Sets the log upload axis (the data's decades, at least 0.8, padded
  for the spread) and returns each group's drawn x (`dodge`d: neighbours
  0.14 in apart), with a grey band at each shared upload."""
  logs = [math.log10(g.x) for g in groups]
  span = max(max(logs) - min(logs), 0.8)
  centre = (max(logs) + min(logs)) / 2
  clusters = upload_clusters([g.x for g in groups])
  widest = max(len(c) for c in clusters)
  step = view = 0.0
  for _ in range(4):  # Converges: the spread is small against the span.
    view = span + 2 * (0.1 * span + (widest - 1) / 2 * step)
    step = 0.14 / width_in * view
  ax.set_xscale('log')
  ax.set_xlim(10 ** (centre - view / 2), 10 ** (centre + view / 2))
  for members in clusters:
    if len(members) > 1:
      x = 10 ** np.mean([logs[i] for i in members])
      ax.axvline(x, color='0.8', linewidth=4, zorder=0, alpha=0.6)
  return dodge([g.x for g in groups], step)


# Markers that look small at one size get more of it.
_MARKER_SIZE = {'*': 11.0, 'd': 9.0, 'p': 9.0, 'h': 9.0, 'H': 9.0}


def _marker_handle(style: style_lib.Style, hollow: bool = False):
  return matplotlib.lines.Line2D(
    [],
    [],
    marker=style.marker,
    color=style.color,
    markerfacecolor='none' if hollow else style.color,
    markeredgecolor=style.color if hollow else 'white',
    markersize=_MARKER_SIZE.get(style.marker, 8.0),
    linestyle='none',
  )


def _draw_points(ax, groups, xs, scale) -> list[tuple[Any, str]]:
  """Each group's marker and min-max bar; a legend entry per method."""
  _, legend_words = frontier_words.point_words(groups)
  legend = {}
  for g, x in zip(groups, xs):
    style = styles.method_style(g.method)
    y = g.mean * scale
    ax.plot(
      x,
      y,
      marker=style.marker,
      color=style.color,
      markersize=_MARKER_SIZE.get(style.marker, 8.0),
      markeredgecolor='white',
      markeredgewidth=0.6,
      linestyle='none',
      zorder=5,
    )
    if g.seeds > 1:
      # Caps wider than the marker (drawn over the bar): a range narrower
      # than the marker still shows.
      ax.errorbar(
        x,
        y,
        yerr=[[y - g.min * scale], [g.max * scale - y]],
        ecolor=style.color if style.color != style_lib.BLACK else '0.35',
        elinewidth=1.4,
        capsize=6,
        capthick=1.4,
        linestyle='none',
        zorder=4,
      )
    if g.method not in legend:
      extra = legend_words[g.method]
      legend[g.method] = (
        _marker_handle(style),
        f'{style.name} ({extra})' if extra else style.name,
      )
  return list(legend.values())


def _draw_paper(ax, groups, xs, scale) -> list[tuple[Any, str]]:
  """The paper's numbers, hollow in the method's marker: once per method
  (correlated-noise variants count as their base method), value and
  upload, at the first such group."""
  drawn = set()
  for g, x in zip(groups, xs):
    base = g.method.split('+')[0]
    key = (base, g.paper, round(g.x, 3))
    if g.paper is None or key in drawn:
      continue
    drawn.add(key)
    style = styles.method_style(
      base if base in styles.METHOD_STYLES else g.method
    )
    ax.plot(
      x,
      g.paper * scale,
      marker=style.marker,
      markerfacecolor='none',
      markeredgecolor=style.color,
      markeredgewidth=1.3,
      markersize=_MARKER_SIZE.get(style.marker, 8.0) + 1,
      linestyle='none',
      zorder=3,
    )
  if not drawn:
    return []
  return [
    (
      _marker_handle(style_lib.Style('', '0.2', 'o'), hollow=True),
      "hollow: the paper's number for the same method",
    )
  ]


def _draw_front(ax, groups, xs, scale) -> list[tuple[Any, str]]:
  """The step line through the Pareto front of the private groups whose
  epsilon carries no caveat, flat after its last point."""
  eligible = [i for i, g in enumerate(groups) if g.private and not g.caveat]
  front = [
    eligible[i]
    for i in frontier.pareto_front(
      [groups[i].x for i in eligible], [groups[i].mean for i in eligible]
    )
  ]
  if not front:
    return []
  fx = [xs[i] for i in front]
  fy = [groups[i].mean * scale for i in front]
  # Flat after the last point: the best at any larger upload.
  ax.step(
    fx + [ax.get_xlim()[1]],
    fy + [fy[-1]],
    where='post',
    color='0.45',
    linewidth=1.2,
    zorder=2,
  )
  left_out = dict.fromkeys(
    styles.method_style(g.method).name for g in groups if g.private and g.caveat
  )
  words = 'Pareto front of the private points'
  if left_out:
    words += f' ({", ".join(left_out)} left out)'
  return [(matplotlib.lines.Line2D([], [], color='0.45', linewidth=1.2), words)]


def _draw_ceiling(ax, groups, scale) -> list[tuple[Any, str]]:
  """A dashed line at each non-private FedAvg group, or a legend line that
  says the study has none."""
  ceilings = [g for g in groups if styles.is_ceiling(g.method)]
  for g in ceilings:
    ax.axhline(
      g.mean * scale,
      color=style_lib.BLACK,
      linestyle='--',
      linewidth=1,
      zorder=1,
    )
  if not ceilings:
    return [
      (
        matplotlib.lines.Line2D([], [], linestyle='none'),
        'no non-private run: no ceiling',
      )
    ]
  return [
    (
      matplotlib.lines.Line2D(
        [], [], color=style_lib.BLACK, linestyle='--', linewidth=1
      ),
      'non-private FedAvg (ceiling): '
      + ', '.join(f'{g.mean * scale:.1f}' for g in ceilings),
    )
  ]


class PlainLogFormatter(matplotlib.ticker.LogFormatter):
  """Log-axis tick labels as plain numbers: '0.1', '3', '2,000', '10,000'
  (on the ticks matplotlib's `LogFormatter` labels)."""

  def __call__(self, x, pos=None):
    if not super().__call__(x, pos):
      return ''
    return f'{x:,.0f}' if x >= 1 else f'{x:.2g}'


def _place_labels(fig, ax, labels) -> None:
  """Writes each (x, y, text, colour) right of its point, then moves
  labels up or down until none overlaps another label or a marker, with a
  thin grey line back to the point from a label that moved."""
  if not labels:
    return
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  to_display = ax.transData.transform
  points_per_px = 72 / fig.dpi
  texts = [
    ax.annotate(
      text,
      (x, y),
      xytext=(6, 0),
      textcoords='offset points',
      fontsize=6.5,
      color=colour,
      va='center',
      ha='left',
      zorder=6,
      # Readable over grid and front lines.
      bbox=dict(boxstyle='square,pad=0.05', fc='white', ec='none', alpha=0.8),
    )
    for x, y, text, colour in labels
  ]
  # Left of the point where the right would cross the axes' edge.
  right_edge = ax.get_window_extent(renderer).x1
  sides = [6] * len(texts)
  for i, t in enumerate(texts):
    if t.get_window_extent(renderer).x1 > right_edge:
      sides[i] = -6
      t.set_horizontalalignment('right')
      t.xyann = (-6, 0)
  markers = []
  for line in ax.get_lines():
    if line.get_marker() in (None, 'None', '', ' '):
      continue
    for xy in line.get_xydata():
      px, py = to_display(xy)
      markers.append((px - 6, py - 6, px + 6, py + 6))
  offsets = [0.0] * len(texts)
  for _ in range(300):
    boxes = [t.get_window_extent(renderer) for t in texts]
    moved = False
    for i, b in enumerate(boxes):
      push = 0.0
      others = [(o.x0, o.y0, o.x1, o.y1) for j, o in enumerate(boxes) if j != i]
      for x0, y0, x1, y1 in others + markers:
        if b.x0 < x1 and x0 < b.x1 and b.y0 < y1 and y0 < b.y1:
          # Away from the other box's centre (ties: by position in list).
          if (b.y0 + b.y1) / 2 >= (y0 + y1) / 2:
            push += y1 - b.y0 + 1
          else:
            push -= b.y1 - y0 + 1
      if push:
        step = max(-3.0, min(3.0, push / 2))
        offsets[i] += step * points_per_px
        texts[i].xyann = (sides[i], offsets[i])
        moved = True
    if not moved:
      break
  for t, side, offset in zip(texts, sides, offsets):
    if abs(offset) > 5:
      ax.annotate(
        '',
        t.xy,
        xytext=(side, offset),
        textcoords='offset points',
        arrowprops=dict(
          arrowstyle='-', color='0.6', linewidth=0.5, shrinkA=0, shrinkB=4
        ),
        zorder=1,
      )
