"""Tests of a run's config: its checks (through the runner, before any
training) and the legacy defaults that fill an old run's saved config."""

import pytest

from tff_dp import methods
from tff_dp.job import training

import job_testing

pytestmark = pytest.mark.usefixtures('shared_data_dir')


@pytest.mark.parametrize('name', sorted(methods.LEGACY_DEFAULTS))
def test_every_legacy_default_differs_from_today_and_fills_old_configs(name):
  legacy = methods.LEGACY_DEFAULTS[name]
  # The first method that takes the setting (any method for a common one).
  method = min(methods.option_fields().get(name, (None, ['dp_fedavg']))[1])
  config = training.ExperimentConfig.create(method=method)
  assert config.flat()[name] != legacy
  if not hasattr(methods.MethodParams, name) and (
    name not in methods.option_fields()
  ):
    # Not a builder setting: a resume reads it (`checkpoints.check_same_config`;
    # test_a_cyclic_run_from_before_partitions_resumes_balanced).
    return
  kwargs = dict(num_model_params=10, expected_clients_per_round=2.0)
  today = methods.MethodParams.from_config(config.flat(), **kwargs)
  old = methods.MethodParams.from_config({'method': method}, **kwargs)
  if name in methods.option_fields():
    today, old = today.options, old.options
  assert getattr(today, name) != legacy
  assert getattr(old, name) == legacy


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (
      dict(noise_multiplier=-1.0),
      r'noise_multiplier must be a finite number >= 0. Found -1.0',
    ),
    (
      dict(client_sampling_rate=0.0),
      r'client_sampling_rate must be in \(0, 1\]. Found 0.0',
    ),
    (
      dict(client_sampling_rate=1.5),
      r'client_sampling_rate must be in \(0, 1\]. Found 1.5',
    ),
    (dict(task='mnist'), r"Unknown task 'mnist'; choose one of"),
    (dict(method='magic'), r"Unknown method 'magic'; choose one of"),
    (
      dict(noise_multiplier=None, target_epsilon=1.0, delta=None),
      r'target_epsilon needs delta',
    ),
    (dict(rounds=0), r'rounds must be an integer >= 1. Found 0'),
    (dict(delta=1.0), r'delta must be in \(0, 1\). Found 1.0'),
    (dict(noise_multiplier=None), r'is private: set --noise_multiplier'),
    (dict(clients_per_round=3), r'not both'),
    (
      dict(method='blur', blur_lambda=-1.0),
      r'blur_lambda must be a finite number >= 0',
    ),
    (dict(method='lus', lus_sparsity=1.0), r'lus_sparsity must be in \[0, 1\)'),
    (
      dict(method='dp_randagg', randagg_fraction=0.0),
      r'randagg_fraction must be in \(0, 1\]',
    ),
    (
      dict(inter_op_threads=-1),
      r'inter_op_threads must be an integer >= 0. Found -1',
    ),
  ],
)
def test_bad_config_fails_before_training(tmp_path, kwargs, match):
  with pytest.raises(ValueError, match=match):
    training.run_experiment(job_testing.config(tmp_path, 'bad', **kwargs))
  assert not (tmp_path / 'bad' / 'metrics.csv').exists()


def test_unwritable_output_dir(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('not a directory')
  with pytest.raises(ValueError, match='is not writable'):
    training.run_experiment(job_testing.config(tmp_path, 'file/sub'))
