"""Client sampling: the cyclic modes' groups and draws."""

import collections

import numpy as np
import pytest

from tff_dp import privacy
from tff_dp.job import cohorts as sampling_lib


def test_balanced_partition_is_balanced_public_and_seeded():
  ids = [f'c{i}' for i in range(103)]
  groups = sampling_lib.partition(ids, 4, 7, 'balanced')
  sizes = collections.Counter(groups.tolist())
  assert sorted(sizes) == [0, 1, 2, 3]
  assert max(sizes.values()) - min(sizes.values()) <= 1
  np.testing.assert_array_equal(
    groups, sampling_lib.partition(ids, 4, 7, 'balanced')
  )
  assert not np.array_equal(
    groups, sampling_lib.partition(ids, 4, 8, 'balanced')
  )


@pytest.mark.parametrize('how', ['by_client_id', 'balanced'])
def test_partition_refuses_bad_groups_and_modes(how):
  ids = [f'c{i}' for i in range(103)]
  with pytest.raises(ValueError, match=r'\[1, 103\]'):
    sampling_lib.partition(ids, 104, 0, how)
  with pytest.raises(ValueError, match=r'\[1, 103\]'):
    sampling_lib.partition(ids, 0, 0, how)
  with pytest.raises(ValueError, match='by_client_id'):
    sampling_lib.partition(ids, 4, 0, 'sorted')


def test_by_client_id_groups_survive_adding_or_removing_a_client():
  # Add/remove-one neighbouring: the other clients' groups must not depend
  # on whether one client is there, wherever it sits in the order.
  ids = [f'writer_{i:04d}' for i in range(500)]
  groups = dict(zip(ids, sampling_lib.partition(ids, 7, 3).tolist()))
  for where in (0, 250, 500):
    added = ids[:where] + ['new_client'] + ids[where:]
    moved = dict(zip(added, sampling_lib.partition(added, 7, 3).tolist()))
    assert all(moved[c] == groups[c] for c in ids)
  removed = ids[:100] + ids[101:]
  again = dict(zip(removed, sampling_lib.partition(removed, 7, 3).tolist()))
  assert all(again[c] == groups[c] for c in removed)
  # Public and seeded; every group used, sizes binomial(500, 1/7): mean
  # 71.4, sd 7.8, so none is empty and none beyond 6 sd.
  sizes = collections.Counter(groups.values())
  assert sorted(sizes) == list(range(7))
  assert all(abs(n - 500 / 7) < 6 * 7.8 for n in sizes.values())
  assert groups != dict(zip(ids, sampling_lib.partition(ids, 7, 4).tolist()))


def test_balanced_groups_move_when_a_client_is_added():
  # Why 'balanced' is stated for zero-out neighbouring only.
  ids = [f'c{i}' for i in range(200)]
  before = sampling_lib.partition(ids, 4, 5, 'balanced')
  after = sampling_lib.partition(ids + ['new'], 4, 5, 'balanced')[:200]
  assert (before != after).sum() > 50
  assert (
    'zero-out'
    in privacy.Sampling(
      'cyclic_poisson', 200, rate=0.5, groups=4, partition='balanced'
    ).neighbouring_relation
  )
  assert privacy.Sampling(
    'cyclic_poisson', 200, rate=0.5, groups=4
  ).neighbouring_relation.startswith('add/remove one client')
  with pytest.raises(ValueError, match='by_client_id'):
    privacy.Sampling('cyclic', 200, rate=0.5, groups=4, partition='x')


@pytest.mark.parametrize('how', ['by_client_id', 'balanced'])
@pytest.mark.parametrize('mode', ['cyclic_poisson', 'cyclic'])
def test_round_t_draws_only_from_group_t_mod_b_at_the_group_rate(mode, how):
  n, b, q = 600, 3, 0.5
  ids = [f'c{i}' for i in range(n)]
  sampling = privacy.Sampling(mode, n, rate=q, groups=b, partition=how)
  groups = sampling_lib.partition(ids, b, 11, how)
  member_of = dict(zip(ids, groups.tolist()))
  rng = np.random.default_rng(0)
  counts, expected = [], []
  for t in range(1, 31):
    cohort = sampling_lib.sample_clients(
      sampling, ids, rng, round_num=t, partition_seed=11
    )
    assert {member_of[c] for c in cohort} <= {(t - 1) % b}
    counts.append(len(cohort))
    expected.append(q * np.sum(groups == (t - 1) % b))
  # Each member of the round's group with probability q: about 100 of
  # about 200, sd ~ 7 a round.
  assert np.mean(counts) == pytest.approx(
    np.mean(expected), abs=4 * 7 / np.sqrt(30)
  )
  # The denominator is public: q N / b whatever the groups' sizes.
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
