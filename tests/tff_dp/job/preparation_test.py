"""Tests of a run's preparation: its method params and calibrated noise."""

import json

import pytest

from tff_dp import methods
from tff_dp.job import training

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
