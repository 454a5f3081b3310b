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
  assert message == 'ours: 0.50, 0.75, 0.75 of the floor in its cycles'
  assert speed_stats.floor_violations({'ours': {'cycle_medians': [1.0]}}) == []
