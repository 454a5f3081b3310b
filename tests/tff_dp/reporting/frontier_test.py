"""The frontier's model: points from results stores and the run files
their rows kept, groups of seeds, the Pareto front and what it refuses."""

import pytest
import frontier_rows

from tff_dp.reporting import frontier
from tff_dp.reporting import frontier_plot


def test_frontier_from_a_results_store_groups_seeds(tmp_path):
  store = frontier_rows.store(tmp_path, frontier_rows.STUDY)
  points = frontier.frontier_points_from_results(store, metric='test_accuracy')
  groups = {g.name: g for g in frontier.frontier_groups(points)}
  assert list(groups) == ['dp', 'top', 'cmp_r1', 'cmp_r16', 'fedavg']
  dp = groups['dp']
  assert (dp.label, dp.method, dp.seeds) == ('DP-FedAvg', 'dp_fedavg', 3)
  # The final evaluations, not the best (0.05 higher in every row).
  assert dp.mean == pytest.approx(0.65)
  assert (dp.min, dp.max) == (0.60, 0.70)
  assert dp.paper == 0.78 and groups['top'].paper is None
  assert not groups['fedavg'].private and groups['top'].private
  assert groups['cmp_r16'].flags['cmp_rank'] == '16'
  png = frontier_plot.plot_frontier(
    points,
    tmp_path / 'frontier.png',
    'study',
    paper_words='Table 1, 180 rounds',
  )
  assert png.stat().st_size > 10_000
  chosen = frontier.frontier_points_from_results(store, ['top', 'fedavg'])
  assert [p.group for p in chosen] == ['top', 'fedavg']
  with pytest.raises(ValueError, match=r"rows \['nope'\] are not in"):
    frontier.frontier_points_from_results(store, ['nope'])


def _write_metrics(run_dir, values, metric='test_accuracy'):
  run_dir.mkdir(parents=True)
  lines = ['round,' + metric] + [
    f'{2 * (i + 1)},{v}' for i, v in enumerate(values)
  ]
  (run_dir / 'metrics.csv').write_text('\n'.join(lines) + '\n')


def test_last_three_evaluations_come_from_kept_run_files(tmp_path):
  rows = {
    'a': frontier_rows.row('dp_fedavg', 'A', 10.0, 0.58, 1.0),
    'b': frontier_rows.row('lus', 'B', 10.0, 0.40, 1.0),
  }
  store = frontier_rows.store(tmp_path, rows)
  kept = store.parent / 'runs' / 'study'
  _write_metrics(kept / 'a', [0.1, 0.5, 0.6, 0.52, 0.58])
  points = frontier.frontier_points_from_results(store, metric='test_accuracy')
  assert points[0].last_three == pytest.approx((0.6 + 0.52 + 0.58) / 3)
  assert points[1].last_three is None
  # One row lacks it: every point is its last evaluation, and the plot
  # says so and why.
  fig = frontier_plot.frontier_figure(points, metric='test_accuracy')
  ax = fig.axes[0]
  assert ax.get_ylabel() == 'test accuracy (%), at the last evaluation'
  footnote = fig.texts[-1].get_text()
  assert 'committed for 1 of 2 runs' in footnote
  assert 'Not the best round' in footnote
  frontier_plot.plt.close(fig)
  # Both rows have it (b from its table column): the mean of the last 3.
  rows['b'][frontier.LAST_THREE_COLUMN] = 0.41
  points = frontier.frontier_points_from_results(
    frontier_rows.store(tmp_path, rows), metric='test_accuracy'
  )
  fig = frontier_plot.frontier_figure(points, metric='test_accuracy')
  assert fig.axes[0].get_ylabel() == (
    'test accuracy (%), mean of the last 3 evaluations'
  )
  groups = frontier.frontier_groups(points, 'last_three')
  assert [g.mean for g in groups] == pytest.approx([0.5667, 0.41], abs=1e-4)
  frontier_plot.plt.close(fig)
  # A kept folder whose last evaluation is not the row's final: refused.
  rows['a']['final test metric'] = 0.3
  with pytest.raises(ValueError, match='the row says 0.3'):
    frontier.frontier_points_from_results(
      frontier_rows.store(tmp_path, rows), metric='test_accuracy'
    )


def test_pareto_front_keeps_only_undominated_points():
  # Upload (KB) and metric of five configurations: (2, 0.4) is beaten by
  # (1, 0.5) (less upload, higher metric), (4, 0.6) by (2, 0.7); (2, 0.7)
  # and (8, 0.9) each need their upload for their metric.
  xs = [1, 2, 2, 4, 8]
  ys = [0.5, 0.4, 0.7, 0.6, 0.9]
  assert frontier.pareto_front(xs, ys) == [0, 2, 4]
  # Equal points: the first; a higher upload for the same metric: beaten.
  assert frontier.pareto_front([1, 1, 3], [0.5, 0.5, 0.5]) == [0]
  assert frontier.pareto_front([], []) == []


def test_frontier_refuses_unequal_epsilon_and_mixed_groups(tmp_path):
  a = frontier.FrontierPoint('a', 'A', 10.0, 0.5, 1.0)
  b = frontier.FrontierPoint('b', 'B', 10.0, 0.6, 1.5)
  with pytest.raises(ValueError, match='epsilons 1 to 1.5'):
    frontier_plot.plot_frontier([a, b], tmp_path / 'f.png')
  c = frontier.FrontierPoint('a', 'A', 20.0, 0.6, 1.0)
  with pytest.raises(ValueError, match="group 'a' mixes uploads 10 to 20"):
    frontier.frontier_groups([a, c])
  with pytest.raises(ValueError, match='no points'):
    frontier_plot.plot_frontier([], tmp_path / 'f.png')


def test_frontier_from_two_stores_takes_each_row_from_its_own(tmp_path):
  first = frontier_rows.store(tmp_path / 'a', frontier_rows.STUDY)
  other = {
    'srht_100x': frontier_rows.row(
      'dp_fedavg', 'DP-FedAvg, SRHT 100x', 66.5, 0.66, 1.0, compression='100'
    )
  }
  second = frontier_rows.store(tmp_path / 'b', other)
  points = frontier.frontier_points_from_stores(
    [first, second], ['dp', 'srht_100x']
  )
  assert [p.group for p in points] == ['dp', 'srht_100x']
  assert points[1].method == 'dp_fedavg+compressed'
  assert len(frontier.frontier_points_from_stores([first, second])) == 8
  with pytest.raises(ValueError, match="in none or several: {'nope': \\[\\]}"):
    frontier.frontier_points_from_stores([first, second], ['nope'])
  with pytest.raises(ValueError, match='in none or several'):
    frontier.frontier_points_from_stores([first, first], ['dp'])
