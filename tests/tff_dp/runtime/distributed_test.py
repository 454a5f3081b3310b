"""Rounds split over TFF worker_binary processes on loopback."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import distributed
from tff_dp.job import experiment_config
from tff_dp.job import training

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def _config(tmp_path, name, **kw):
  base = dict(
    task='heart_disease',
    method='dp_fedavg',
    rounds=3,
    clients_per_round=4,
    noise_multiplier=0.5,
    delta=1e-3,
    batch_size=32,
    checkpoint_every=1,
    output_dir=str(tmp_path / name),
    # Runs compared bit for bit: reproducible noise and sampling.
    noise_seed=0,
    # Compares the byte totals, a non-private output.
    release_non_private_metrics=True,
    background_evaluation=False,  # Inline: no evaluation child to start.
  )
  base.update(kw)
  return training.ExperimentConfig.create(**base)


def _weights(path):
  with np.load(path / 'final_model_weights.npz') as d:
    return {k: d[k] for k in d.files}


@pytest.mark.parametrize(
  'method',
  # CMP-Fed's two phases over workers: `make test-slow`.
  ['dp_fedavg', pytest.param('cmp_fed', marks=pytest.mark.slow)],
)
def test_two_local_workers_equal_the_single_process_run(tmp_path, method):
  # dp_fedavg is split over both workers (mergeable form); CMP-Fed's two
  # dependent phases are not mergeable and run whole on the first worker.
  one = training.run_experiment(_config(tmp_path, 'one', method=method))
  two = training.run_experiment(
    _config(tmp_path, 'two', method=method, local_workers=2)
  )
  a, b = _weights(tmp_path / 'one'), _weights(tmp_path / 'two')
  for k in a:
    # Equal up to float32 summation order (partial sums are merged).
    np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)
  assert one['epsilon_rdp'] == two['epsilon_rdp']
  assert one['bytes_up_total'] == two['bytes_up_total']
  # Both workers were ended.
  assert not distributed._STARTED  # pylint: disable=protected-access
  # And TFF still runs in this process: the context over the ended workers
  # is gone (a computation used to wait on them forever).
  assert _one() == 1


@tff.tensorflow.computation
def _one():
  return tf.constant(1)


# `make test-slow`; the workers' fast smoke is the dp_fedavg case above.
@pytest.mark.slow
def test_a_dead_worker_stops_the_run_and_a_rerun_resumes(tmp_path):
  workers = distributed.start_local_workers(2)
  targets = ','.join(t for _, t in workers)

  def kill_second(round_num):
    if round_num == 1:
      distributed.stop_workers([workers[1][0]])

  config = _config(tmp_path, 'run', workers=targets)
  with pytest.raises(RuntimeError, match='failed on the TFF workers'):
    training.run_experiment(config, round_callback=kill_second)
  distributed.stop_workers([p for p, _ in workers])
  # Fresh workers, the same command otherwise: resumes from round 1.
  summary = training.run_experiment(_config(tmp_path, 'run', local_workers=2))
  assert summary['rounds_completed'] == 3
  training.run_experiment(_config(tmp_path, 'ref'))
  a, b = _weights(tmp_path / 'run'), _weights(tmp_path / 'ref')
  for k in a:
    np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('bad', ['localhost', 'h:0', 'h:99999', ':80'])
def test_bad_workers_flag(bad):
  with pytest.raises(ValueError, match='host:port'):
    experiment_config.parse_workers(bad)
