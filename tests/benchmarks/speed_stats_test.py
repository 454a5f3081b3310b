"""The speed benchmark's statistics and its floor check (no timing)."""

import pytest

from benchmarks import speed_stats


def _block(seconds, clients=None):
  out = {'seconds': seconds, 'cpu_seconds': [2 * s for s in seconds]}
  if clients is not None:
    out['clients'] = clients
  return out


def test_summarize_pools_cycles_and_normalises_per_100_clients():
  stats = speed_stats.summarize(
    {
      'floor_2x1': [_block([10.0, 12.0]), _block([11.0, 13.0])],
      # 50 clients in 6 s is 12 s per 100 clients.
      'ours_readme': [
        _block([6.0, 6.0], clients=[50, 50]),
        _block([14.0], [100]),
      ],
    }
  )
  floor = stats['floor_2x1']
  assert floor['median'] == 11.5  # Over the 4 rounds of both cycles.
  assert (floor['min'], floor['max']) == (11.0, 12.0)  # Cycle medians.
  assert floor['rounds'] == 4
  assert floor['cores'] == pytest.approx(2.0)
  readme = stats['ours_readme']
  assert readme['median'] == 12.0
  assert (readme['min'], readme['max']) == (12.0, 14.0)
  # The mean keeps the slow round the median passes over.
  assert readme['mean'] == pytest.approx((12.0 + 12.0 + 14.0) / 3)


def test_cycle_ratios_pair_each_cycle_with_its_own_reference():
  stats = {
    'stock_user': {'cycle_medians': [20.0, 10.0, 15.0]},
    'ours_readme': {'cycle_medians': [16.0, 8.0, 10.0]},
  }
  assert speed_stats.cycle_ratios(stats, 'stock_user', 'ours_readme') == [
    1.25,
    1.25,
    1.5,
  ]
  assert speed_stats.cycle_ratios(stats, 'stock_tuned', 'ours_readme') == []


def test_floor_violation_pairs_each_cycle_with_its_own_floor():
  stats = {
    # The machine drifts: the floor's cycles differ by 2x.
    'floor_2x1': {'cycle_medians': [12.0, 8.0, 6.0]},
    'arith_limit': {'cycle_medians': [2.0, 2.0, 2.0]},  # Below by design.
    # Slower than the floor in one cycle: not a violation.
    'stock_tuned': {'cycle_medians': [10.0, 9.0, 6.5]},
    # Within 10% of its cycle's floor in one cycle: not a violation.
    'stock_default': {'cycle_medians': [11.0, 7.5, 3.0]},
    # Faster than its cycle's floor by more than 10% in every cycle.
    'ours': {'cycle_medians': [6.0, 6.0, 4.5]},
  }
  (message,) = speed_stats.floor_violations(stats)
  assert message == 'ours: 0.50, 0.75, 0.75 of floor_2x1 in its cycles'
  assert speed_stats.floor_violations({'ours': {'cycle_medians': [1.0]}}) == []


def test_every_floor_is_checked_and_floors_not_against_each_other():
  stats = {
    'floor_2x1': {'cycle_medians': [4.0, 4.0]},
    # A second floor, far below the first: not a violation of it.
    'floor_local': {'cycle_medians': [2.0, 2.0]},
    # Under floor_local by more than 10% in one cycle only: no violation.
    'ours': {'cycle_medians': [5.0, 1.5]},
    'stock_tuned': {'cycle_medians': [1.7, 1.7]},
  }
  assert speed_stats.floor_violations(stats) == [
    'stock_tuned: 0.42, 0.42 of floor_2x1 in its cycles',
    'stock_tuned: 0.85, 0.85 of floor_local in its cycles',
  ]


def test_job_phases_splits_the_jobs_rounds_per_100_clients():
  results = [
    {
      'seconds': [6.0, 4.0],
      'train_seconds': [4.0, 3.0],
      'eval_seconds': [1.0, 0.0],
      'round_seconds': [5.5, 3.5],
      'clients': [50, 100],
    }
  ]
  text = speed_stats.job_phases(results)
  # Per 100 clients: next 8 and 3, eval 2 and 0, rest 1 and 0.5, wall 12, 4.
  assert '5.50 s in `process.next`' in text
  assert '1.00 s of evaluation a round on average' in text
  assert '0.75 s of the rest' in text
  assert '8.00 s from the end of one round to the next' in text
  assert 'on the main thread, every' in text
  assert speed_stats.job_phases([]) == ''


def test_job_phases_leaves_a_background_evaluation_in_the_rest():
  results = [
    {
      'seconds': [6.0],
      'train_seconds': [4.0],
      'eval_seconds': [1.0],
      'round_seconds': [4.5],
      'clients': [100],
      'background_evaluation': True,
    }
  ]
  text = speed_stats.job_phases(results)
  assert '0.50 s of the rest' in text
  assert '1.00 s of evaluation a round on average (in the evaluation' in text


def test_worker_result_reads_the_last_result_line_or_names_the_failure():
  import sys  # pylint: disable=g-import-not-at-top

  script = 'print("RESULT {\\"a\\": 1}"); print("RESULT {\\"a\\": 2}")'
  got = speed_stats.worker_result([sys.executable, '-c', script], 'w')
  assert got == {'a': 2}
  with pytest.raises(RuntimeError, match='w2 failed:\n.*boom'):
    speed_stats.worker_result(
      [sys.executable, '-c', 'import sys; sys.exit("boom")'], 'w2'
    )
  with pytest.raises(RuntimeError, match='w3 failed'):
    speed_stats.worker_result([sys.executable, '-c', 'print(1)'], 'w3')
