"""The frontier drawing: its front, ceiling and title, the paper's hollow
numbers, points spread at one upload, and DDGauss under Poisson
sampling."""

import dataclasses
import math

import pytest
import frontier_rows

from tff_dp.reporting import frontier
from tff_dp.reporting import frontier_plot
from tff_dp.reporting import wording


def test_frontier_draws_the_front_ceiling_and_title(tmp_path):
  points = frontier.frontier_points_from_results(
    frontier_rows.store(tmp_path, frontier_rows.STUDY)
  )
  fig = frontier_plot.frontier_figure(
    points, 'Task: 30 rounds', paper_words='Table I, 180 rounds'
  )
  ax = fig.axes[0]
  title = fig._suptitle.get_text()  # pylint: disable=protected-access
  assert title.startswith('Task: 30 rounds\n')
  # Epsilon, its accountant, delta and the sampling rate.
  assert 'ε = 1.00 (RDP accountant; PLD: 0.8)' in title
  assert 'δ = 1e-4' in title and 'Poisson q = 1/60' in title
  assert ax.get_xscale() == 'log'
  assert 'KB' in ax.get_xlabel() and '(%)' in ax.get_ylabel()
  # The front: FL-TOP-DP (5 KB, 64%), CMP-Fed rank 16 (300 KB, 62%) is
  # beaten by it, DP-FedAvg's mean 65% (6000 KB) is not; flat after it.
  (front,) = (
    line for line in ax.get_lines() if line.get_drawstyle() == 'steps-post'
  )
  assert list(front.get_ydata()) == pytest.approx([64, 65, 65])
  # The ceiling: a dashed line at FedAvg's 80%.
  dashed = [l for l in ax.get_lines() if l.get_linestyle() == '--']
  assert [l.get_ydata()[0] for l in dashed] == pytest.approx([80])
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert 'non-private FedAvg (ceiling): 80.0' in legend
  assert 'bar: min–max over 3 seeds (no bar: 1 seed)' in legend
  frontier_plot.plt.close(fig)
  # Without a FedAvg row the plot says there is none.
  no_fedavg = [p for p in points if p.method != 'fedavg']
  fig = frontier_plot.frontier_figure(no_fedavg, paper_words='Table I')
  legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
  assert 'no non-private run: no ceiling' in legend
  frontier_plot.plt.close(fig)


def _hollow(ax):
  return [
    line
    for line in ax.get_lines()
    if line.get_markerfacecolor() == 'none' and len(line.get_xdata()) == 1
  ]


def test_paper_numbers_are_hollow_and_only_where_the_rows_have_them(
  tmp_path,
):
  points = frontier.frontier_points_from_results(
    frontier_rows.store(tmp_path, frontier_rows.STUDY)
  )
  fig = frontier_plot.frontier_figure(points, paper_words='Table I, 180 rounds')
  ax = fig.axes[0]
  # DP-FedAvg (once for its 3 seeds), CMP-Fed rank 1 and FedAvg.
  hollow = _hollow(ax)
  assert sorted(l.get_ydata()[0] for l in hollow) == pytest.approx([69, 78, 86])
  for line in hollow:
    (x,) = line.get_xdata()
    # At its configuration's point, in its method's marker and colour.
    (filled,) = (
      l
      for l in ax.get_lines()
      if l not in hollow
      and list(l.get_xdata()) == [x]
      and l.get_marker() not in ('None', '', '_')
    )
    assert line.get_marker() == filled.get_marker()
    assert line.get_markeredgecolor() == filled.get_color()
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert "hollow: the paper's number for the same method" in legend
  assert 'Table I, 180 rounds' in fig.texts[-1].get_text()
  frontier_plot.plt.close(fig)
  with pytest.raises(ValueError, match='say which table and rounds'):
    frontier_plot.frontier_figure(points)
  # No paper numbers: nothing hollow, no paper entry.
  bare = [dataclasses.replace(p, paper=None) for p in points]
  fig = frontier_plot.frontier_figure(bare)
  assert not _hollow(fig.axes[0])
  legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
  assert not [t for t in legend if 'paper' in t]
  assert 'paper' not in fig.texts[-1].get_text().lower()
  frontier_plot.plt.close(fig)


def test_points_at_one_upload_are_spread_apart():
  xs = frontier_plot.dodge([10.0, 100.0, 10.0, 10.0], step=0.05)
  logs = [math.log10(x) for x in xs]
  # The three at 10 KB: 0.05 apart in log10, in order, centred on 10.
  assert [logs[0], logs[2], logs[3]] == pytest.approx([0.95, 1.0, 1.05])
  assert xs[1] == 100.0
  assert frontier_plot.upload_clusters([10.0, 100.0, 10.0, 10.0]) == [
    [0, 2, 3],
    [1],
  ]


def test_ddgauss_under_poisson_is_marked_and_left_off_the_front(tmp_path):
  rows = {
    'dp': frontier_rows.row('dp_fedavg', 'DP-FedAvg', 4826.0, 0.59, 6.0),
    'ddg': frontier_rows.row('ddgauss', 'DDGauss', 3016.0, 0.60, 6.0, pld=5.0),
  }
  points = frontier.frontier_points_from_results(
    frontier_rows.store(tmp_path, rows)
  )
  assert points[1].caveat == 'Poisson: ε not rigorous'
  fig = frontier_plot.frontier_figure(points)
  ax = fig.axes[0]
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert 'DDGauss (Poisson: ε not rigorous)' in legend
  assert 'Pareto front of the private points (DDGauss left out)' in legend
  (front,) = (l for l in ax.get_lines() if l.get_drawstyle() == 'steps-post')
  assert list(front.get_ydata()) == pytest.approx([59, 59])
  # Its published PLD epsilon is left out of the title's.
  assert 'PLD: 0.8)' in fig._suptitle.get_text()  # pylint: disable=protected-access
  frontier_plot.plt.close(fig)
  # Fixed-size cohorts: no caveat.
  fixed = {'method': 'ddgauss', 'clients_per_round': '30'}
  assert wording.epsilon_caveat(fixed) == ''
