"""Client sampling: the cyclic modes' groups and draws."""

import collections

import numpy as np
import pytest

from tff_dp import privacy
from tff_dp import sampling as sampling_lib


def test_partition_is_balanced_public_and_seeded():
  groups = sampling_lib.partition(103, 4, seed=7)
  sizes = collections.Counter(groups.tolist())
  assert sorted(sizes) == [0, 1, 2, 3]
  assert max(sizes.values()) - min(sizes.values()) <= 1
  np.testing.assert_array_equal(groups, sampling_lib.partition(103, 4, 7))
  assert not np.array_equal(groups, sampling_lib.partition(103, 4, 8))
  with pytest.raises(ValueError, match=r'\[1, 103\]'):
    sampling_lib.partition(103, 104, 0)


@pytest.mark.parametrize('mode', ['cyclic_poisson', 'cyclic'])
def test_round_t_draws_only_from_group_t_mod_b_at_the_group_rate(mode):
  n, b, q = 600, 3, 0.5
  ids = [f'c{i}' for i in range(n)]
  sampling = privacy.Sampling(mode, n, rate=q, groups=b)
  groups = sampling_lib.partition(n, b, seed=11)
  member_of = dict(zip(ids, groups.tolist()))
  rng = np.random.default_rng(0)
  counts = []
  for t in range(1, 31):
    cohort = sampling_lib.sample_clients(
      sampling, ids, rng, round_num=t, partition_seed=11
    )
    assert {member_of[c] for c in cohort} <= {(t - 1) % b}
    counts.append(len(cohort))
  # Each member with probability q: mean q * n / b = 100, sd ~ 7 a round.
  assert np.mean(counts) == pytest.approx(
    sampling.expected_clients_per_round, abs=4 * 7 / np.sqrt(30)
  )
  assert sampling.expected_clients_per_round == pytest.approx(q * n / b)


def test_a_client_joins_at_most_one_round_in_b():
  n, b = 50, 5
  ids = [f'c{i}' for i in range(n)]
  sampling = privacy.Sampling('cyclic', n, rate=1.0, groups=b)
  rng = np.random.default_rng(1)
  last = {}
  for t in range(1, 41):
    for c in sampling_lib.sample_clients(
      sampling, ids, rng, round_num=t, partition_seed=3
    ):
      if c in last:
        assert t - last[c] == b
      last[c] = t
  assert len(last) == n  # Rate 1: every member of each group.
