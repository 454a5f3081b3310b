"""The speed benchmark's statistics and its floor check (no timing)."""

import pytest

from benchmarks import round_speed


def _block(seconds, clients=None):
  out = {'seconds': seconds, 'cpu_seconds': [2 * s for s in seconds]}
  if clients is not None:
    out['clients'] = clients
  return out


def test_summarize_pools_cycles_and_normalises_per_100_clients():
  stats = round_speed.summarize(
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


def test_floor_violation_is_reported_beyond_the_floors_spread():
  stats = {
    'floor_2x1': {'median': 10.0, 'min': 9.5, 'max': 10.5},  # 10% spread.
    'arith_limit': {'median': 3.0},  # Below the floor by design.
    'stock_tuned': {'median': 9.2},  # Within the noise: allowed.
    'ours': {'median': 8.5},  # 15% under: the floor is wrong.
  }
  (message,) = round_speed.floor_violations(stats)
  assert message.startswith('ours: 8.50 s per 100 clients < floor 9.00')
  assert round_speed.floor_violations({'ours': {'median': 1.0}}) == []
