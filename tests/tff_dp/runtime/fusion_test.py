"""Fused client work (MapReduceForm) equals the process as built."""

import numpy as np
import pytest
import tensorflow as tf

from tff_dp.runtime import fusion
from tff_dp.job import training

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def _config(method, noise=0.7, **kwargs):
  base = dict(
    task='heart_disease',
    method=method,
    rounds=2,
    clients_per_round=3,
    noise_multiplier=noise,
    delta=1e-3,
    clip=0.5,
    batch_size=16,
    client_lr=0.1,
    fuse_client_work=False,
    # Runs compared bit for bit: reproducible noise and sampling.
    noise_seed=0,
    background_evaluation=False,  # Inline: no evaluation child to start.
  )
  base.update(kwargs)
  return training.ExperimentConfig.create(**base)


def _prepared(method, noise=0.7, **kwargs):
  config = _config(method, noise, **kwargs)
  config.validate()
  prepared = training.prepare(config)
  ids = prepared.task.train_data.client_ids[:3]
  data = [prepared.round_data(config, ids, r) for r in range(2)]
  return prepared.process, data


def _run(process, data):
  state = process.initialize()
  for round_data in data:
    out = process.next(state, round_data)
    state = out.state
  # The state keeps its Python containers (the runner reads its fields).
  assert type(state).__name__ == 'LearningAlgorithmState', type(state)
  return process.get_model_weights(state), out.metrics


def _leaves(structure):
  return [np.asarray(x) for x in tf.nest.flatten(structure)]


def _paths(structure, prefix=''):
  """{'a/b': leaf} for a nested mapping or sequence."""
  if isinstance(structure, dict):
    items = structure.items()
  elif isinstance(structure, (list, tuple)):
    items = enumerate(structure)
  else:
    return {prefix: np.asarray(structure)}
  out = {}
  for key, value in items:
    out.update(_paths(value, f'{prefix}/{key}'))
  return out


@pytest.mark.parametrize(
  'method, noise', [('dp_fedavg', 0.7), ('dp_fedavg_adaptive', 0.1)]
)
def test_fused_process_is_bit_identical(method, noise):
  process, data = _prepared(method, noise)
  fused, reason = fusion.fuse(process)
  assert reason is None
  assert fused is not process
  assert fused.next.type_signature == process.next.type_signature
  weights, metrics = _run(process, data)
  fused_weights, fused_metrics = _run(fused, data)
  for a, b in zip(_leaves(weights), _leaves(fused_weights), strict=True):
    np.testing.assert_array_equal(a, b)
  # Same metric names and values (diagnostics, DP metrics, counts).
  flat, fused_flat = _paths(metrics), _paths(fused_metrics)
  assert flat.keys() == fused_flat.keys()
  assert len(flat) > 5, flat.keys()
  for key, value in flat.items():
    np.testing.assert_array_equal(value, fused_flat[key], err_msg=key)


def test_two_phase_process_is_left_unchanged():
  process, _ = _prepared('cmp_fed', cmp_rank=1)
  fused, reason = fusion.fuse(process)
  assert fused is process
  assert reason


# `make test-slow`; the fused process's fast smoke is
# test_fused_process_is_bit_identical.
@pytest.mark.slow
def test_runner_with_fused_client_work_equals_unfused(tmp_path):
  summaries, weights = [], []
  for fuse in (False, True):
    out = tmp_path / f'fuse_{fuse}'
    config = _config(
      'dp_fedavg',
      clients_per_round=None,
      client_sampling_rate=0.75,
      output_dir=str(out),
      fuse_client_work=fuse,
    )
    summaries.append(training.run_experiment(config))
    with np.load(out / 'final_model_weights.npz') as d:
      weights.append({k: d[k] for k in d.files})
  assert weights[0].keys() == weights[1].keys()
  for key in weights[0]:
    np.testing.assert_array_equal(weights[0][key], weights[1][key])
  assert summaries[0]['epsilon_rdp'] == summaries[1]['epsilon_rdp'] > 0
