"""Tests of a run's preparation: its method params and calibrated noise."""

import json

import numpy as np
import pytest

from tff_dp import methods
from tff_dp.job import preparation
from tff_dp.job import training
from tff_dp.job.experiment_config import ConfigError

import job_testing

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def test_method_params_from_a_saved_config_equal_the_runs():
  config = training.ExperimentConfig.create(
    task='fashion_mnist_iid',
    method='cmp_fed',
    cmp_rank=2,
    cmp_clip_u=0.5,
    clip=0.8,
    seed=3,
  )
  saved = json.loads(json.dumps(config.flat()))
  saved['noise_multiplier'] = 99.0  # The run's calibrated value wins.
  kwargs = dict(
    num_model_params=10,
    expected_clients_per_round=5.0,
    noise_multiplier=1.5,
  )
  from_run = methods.MethodParams.from_config(config.flat(), **kwargs)
  assert methods.MethodParams.from_config(saved, **kwargs) == from_run
  o = from_run.options
  assert (o.cmp_rank, o.cmp_clip_u, o.cmp_clip_v) == (
    2,
    0.5,
    None,
  )
  assert (from_run.clip, from_run.seed, from_run.noise_multiplier) == (
    0.8,
    3,
    1.5,
  )


def test_target_epsilon_calibration(tmp_path):
  summary = training.run_experiment(
    job_testing.config(
      tmp_path,
      'calibrated',
      rounds=3,
      noise_multiplier=None,
      target_epsilon=5.0,
    )
  )
  assert summary['epsilon_rdp'] == pytest.approx(5.0, abs=0.01)


def _one_round_keeps_the_frozen_weights(prepared, config):
  """`(before, after)` model weights of one round on every client,
  asserting the frozen (non-trainable) weights did not move."""
  process = prepared.process
  state = process.initialize()
  before = process.get_model_weights(state)
  ids = prepared.task.train_data.client_ids
  state = process.next(state, prepared.round_data(config, ids, 0)).state
  after = process.get_model_weights(state)
  for a, b in zip(before.non_trainable, after.non_trainable):
    np.testing.assert_array_equal(a, b)
  return before, after


def test_train_layers_trains_and_uploads_only_the_named_layers(tmp_path):
  # The heart MLP: dense1 (38 x 32 + 32) frozen, logits (32 + 1) trained.
  config = job_testing.config(
    tmp_path, 'head_only', rounds=1, train_layers=('logits',)
  )
  prepared = preparation.prepare(config)
  assert prepared.params.num_model_params == 33
  assert prepared.params.num_frozen_params == 1248
  # Up: the trained layer's update; down: the whole model, every round.
  assert (prepared.cost.up, prepared.cost.down) == (4 * 33, 4 * 1281)
  before, after = _one_round_keeps_the_frozen_weights(prepared, config)
  assert [np.shape(w) for w in after.trainable] == [(32, 1), (1,)]
  assert not np.allclose(before.trainable[0], after.trainable[0])


def test_train_layers_naming_a_missing_layer_is_a_config_error(tmp_path):
  config = job_testing.config(tmp_path, 'bad', train_layers=('conv1',))
  with pytest.raises(ConfigError, match=r"\['dense1', 'logits'\]"):
    preparation.prepare(config)


def test_adapters_train_and_upload_only_their_factors_and_the_named_layers(
  tmp_path,
):
  # The heart MLP: rank-2 adapters on dense1 (38 x 2 + 2 x 32), and logits
  # (32 + 1) in full; dense1's 38 x 32 + 32 frozen.
  config = job_testing.config(
    tmp_path,
    'adapters',
    rounds=1,
    adapter_layers=('dense1',),
    adapter_rank=2,
    train_layers=('logits',),
  )
  prepared = preparation.prepare(config)
  assert prepared.params.num_model_params == 140 + 33
  assert prepared.params.num_frozen_params == 1248
  assert (prepared.cost.up, prepared.cost.down) == (4 * 173, 4 * 1421)
  before, after = _one_round_keeps_the_frozen_weights(prepared, config)
  assert [np.shape(w) for w in after.trainable] == [
    (38, 2),
    (2, 32),
    (32, 1),
    (1,),
  ]
  assert not np.allclose(before.trainable[1], after.trainable[1])


def test_an_adapter_rank_too_large_is_a_config_error(tmp_path):
  config = job_testing.config(
    tmp_path, 'bad', adapter_layers=('dense1',), adapter_rank=32
  )
  with pytest.raises(ConfigError, match=r'--adapter_rank must be in \[1, 31\]'):
    preparation.prepare(config)
