"""Client sampling: its checks, the events it wraps, and its JSON."""

import json

import dp_accounting
import pytest

from tff_dp import privacy


def test_a_cyclic_ledger_saved_before_partitions_reads_back_balanced():
  # Cyclic runs dealt their groups from a permutation of the population
  # before `partition` existed; a resumed one must keep saying so.
  for how in privacy.PARTITIONS:
    sampling = privacy.Sampling(
      'cyclic_poisson', 300, rate=0.4, groups=4, partition=how
    )
    saved = json.loads(privacy.PrivacyLedger(sampling, 1e-3).to_json())
    assert saved['sampling']['partition'] == how
    again = privacy.PrivacyLedger.from_json(json.dumps(saved)).sampling
    assert again == sampling
    del saved['sampling']['partition']
    old = privacy.PrivacyLedger.from_json(json.dumps(saved)).sampling
    assert old.partition == 'balanced'
  # Poisson and fixed-size sampling have no groups: nothing is written.
  poisson = privacy.Sampling('poisson', 300, rate=0.1)
  assert 'partition' not in poisson.to_dict()
  assert privacy.Sampling.from_dict(poisson.to_dict()) == poisson


def test_fixed_size_rejects_non_gaussian_events():
  sampling = privacy.Sampling('fixed', 100, clients_per_round=10)
  with pytest.raises(dp_accounting.UnsupportedEventError, match='Poisson'):
    sampling.wrap(dp_accounting.LaplaceDpEvent(1.0))


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(mode='poisson', num_clients=10, rate=0.0), r'in \(0, 1\]'),
    (dict(mode='poisson', num_clients=10, rate=1.5), r'in \(0, 1\]'),
    (
      dict(mode='fixed', num_clients=10, clients_per_round=11),
      r'clients_per_round must be an integer in \[1, 10\]',
    ),
    (dict(mode='uniform', num_clients=10), 'sampling mode must be one of'),
    (dict(mode='poisson', num_clients=0, rate=0.5), 'num_clients must be'),
  ],
)
def test_bad_sampling(kwargs, match):
  with pytest.raises(ValueError, match=match):
    privacy.Sampling(**kwargs)
