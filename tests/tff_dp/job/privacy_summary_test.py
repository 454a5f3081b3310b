"""Tests of summary.json's privacy section."""

import pytest

from tff_dp import methods
from tff_dp.job import training
from tff_dp.job import privacy_summary
from tff_dp import privacy

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def test_tuning_outside_ledger_names_cmp_feds_two_clips():
  config = training.ExperimentConfig.create(
    task='heart_disease',
    method='cmp_fed',
    clip=1.0,
    cmp_clip_u=0.05,
    clip_source='median rule on a probe run',
  )
  steps = privacy_summary.tuning_outside_ledger(
    config, methods.METHODS['cmp_fed']
  )
  assert 'clips C1 0.05, C2 1: median rule on a probe run' in steps
  config = config.replace(method='dp_fedavg')
  steps = privacy_summary.tuning_outside_ledger(
    config, methods.METHODS['dp_fedavg']
  )
  assert 'clip 1: median rule on a probe run' in steps


@pytest.mark.parametrize(
  'task, public_set',
  [
    ('physionet2012', 'patients held out of every client'),
    ('fashion_mnist_iid', 'EMNIST digits stand in'),
  ],
)
def test_tuning_outside_ledger_names_fl_tops_public_set(task, public_set):
  config = training.ExperimentConfig.create(task=task, method='fl_top_dp')
  steps = privacy_summary.tuning_outside_ledger(
    config, methods.METHODS['fl_top_dp']
  )
  (mask,) = (s for s in steps if 'Top-K mask' in s)
  assert public_set in mask


def test_client_held_test_metrics_count_as_tuning_once_released():
  class _Task:
    test_held_by_clients = True

  method = methods.METHODS['dp_fedavg']
  config = training.ExperimentConfig.create(
    task='emnist', method='dp_fedavg', noise_multiplier=1.0
  )
  assert privacy_summary._client_test_tuning(config, _Task()) == []  # pylint: disable=protected-access
  released = config.replace(release_non_private_metrics=True)
  (step,) = privacy_summary._client_test_tuning(released, _Task())  # pylint: disable=protected-access
  assert 'held-out examples' in step
  assert privacy_summary.tuning_outside_ledger(released, method) == []


class _Clients:
  client_ids = [str(i) for i in range(225)]


def test_population_says_who_left_it():
  class _Task:
    train_data = _Clients()
    writers_dropped = ()

  config = training.ExperimentConfig.create(task='emnist', method='dp_fedavg')
  assert privacy_summary.population(config, _Task()) == (
    'the 225 training clients'
  )
  _Task.writers_dropped = ('hsf_4',)
  words = privacy_summary.population(config, _Task())
  assert words.startswith(
    'the 225 training clients; writers of partition(s) hsf_4 left'
  )
  assert 'drop_nist_test_writers' in words
  _Task.writers_dropped = ()
  opted_in = config.replace(
    task='fashion_mnist_iid', task_kwargs=(('public_clients', 60),)
  )
  assert privacy_summary.population(opted_in, _Task()) == (
    'the 225 training clients; the opt-in clients are public and left the '
    'population'
  )


def test_ddgauss_under_poisson_sampling_says_its_guarantee_is_not_rigorous():
  from tff_dp.aggregators import ddgauss_accounting  # pylint: disable=g-import-not-at-top

  class _Task:
    test_held_by_clients = True
    train_data = _Clients()
    writers_dropped = ()

  event = ddgauss_accounting.round_event_from_measurements(
    dict(
      min_clients=19.0,
      scaled_local_stddev=8988.6005859375,
      scaled_inflated_l2=30015.53515625,
      padded_dim=1206590.0,
    )
  )
  sections = {}
  for mode, kwargs in (
    ('poisson', dict(client_sampling_rate=0.1)),
    ('fixed', dict(clients_per_round=30)),
  ):
    sampling = privacy.Sampling(
      mode,
      300,
      rate=kwargs.get('client_sampling_rate'),
      clients_per_round=kwargs.get('clients_per_round'),
    )
    ledger = privacy.PrivacyLedger(sampling, 0.00333333)
    ledger.record(event)
    config = training.ExperimentConfig.create(
      task='emnist', method='ddgauss', noise_multiplier=1.0, **kwargs
    )
    sections[mode] = privacy_summary.privacy_section(
      config, _Task(), methods.METHODS['ddgauss'], sampling, ledger
    )
  poisson = sections['poisson']
  assert poisson['population'] == 'the 225 training clients'
  assert poisson['guarantee_holds'] is False
  assert poisson['guarantee_caveat'].startswith('Not rigorous: DDGauss under')
  # Fixed-size cohorts rest on a milder assumption (every sampled client
  # takes part), named as such.
  assert sections['fixed']['guarantee_caveat'] == (
    'Rests on an assumption the ledger does not charge (privacy.assumptions).'
  )
  assert privacy_summary.guarantee_caveat([], None) is None
  assert 'a/b' in privacy_summary.guarantee_caveat([], 'a/b')
