"""FL-BASIC(-DP): a random K-subset per round, shared by clients and server."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp.aggregators import dp_randagg
from tff_dp.client_works import fl_top
from tff_dp.tasks import medical
from tff_dp.tasks import task as task_lib

K = 40
SEED = 3


@pytest.fixture(scope='module')
def heart(shared_data_root):
  return medical.load_heart_disease(shared_data_root)


def _expected_indices(d, rounds):
  seed = tf.constant(dp_randagg.initial_coordinate_seed(SEED))
  out = []
  for _ in range(rounds):
    idx, seed = dp_randagg.draw_random_coordinates(seed, d, K)
    out.append(idx.numpy())
  return out


def test_subset_is_the_aggregators_fresh_each_round_rest_bit_exact(heart):
  contexts.set_simulation_context()
  model = heart.model_builder()
  shapes = [tuple(v.shape) for v in model.trainable_variables]
  d = sum(int(np.prod(s)) for s in shapes)
  work = fl_top.build_random_subset_client_work(
    heart.model_fn,
    tff.learning.optimizers.build_sgdm(0.1, momentum=0.9),
    num_coordinates=K,
    seed=SEED,
  )
  factory = dp_randagg.DPRandAggFactory(
    0.0, 1, 100.0, num_coordinates=K, seed=SEED
  )
  value_type = tff.StructWithPythonType(
    [tff.TensorType(np.float32, s) for s in shapes], list
  )
  agg = factory.create(value_type)
  initial = tff.learning.models.ModelWeights(
    trainable=[w.numpy() for w in model.trainable_variables], non_trainable=[]
  )
  preprocess = task_lib.client_preprocess_fn(32, seed=0)
  data = [preprocess(heart.train_data.create_tf_dataset_for_client('va'))]
  expected = _expected_indices(d, 2)
  assert not np.array_equal(expected[0], expected[1])
  state, agg_state = work.initialize(), agg.initialize()
  for round_indices in expected:
    out = work.next(state, [initial], data)
    state = out.state
    update = out.result[0].update
    flat = np.concatenate([np.ravel(u) for u in update])
    others = np.setdiff1d(np.arange(d), round_indices)
    # Outside the round's subset the weights did not move, bit for bit.
    assert np.all(flat[others] == 0.0)
    assert np.count_nonzero(flat[round_indices]) > 0.8 * K
    # The aggregator drew the same K: decoding loses nothing.
    agg_out = agg.next(agg_state, [update])
    agg_state = agg_out.state
    decoded = np.concatenate([np.ravel(a) for a in agg_out.result])
    np.testing.assert_allclose(decoded, flat, atol=1e-4)
  # Hyperparameters are still reachable with the extra state.
  hparams = work.get_hparams(state)
  assert float(hparams['learning_rate']) == pytest.approx(0.1)
  state = work.set_hparams(state, {**hparams, 'learning_rate': 0.5})
  assert float(work.get_hparams(state)['learning_rate']) == 0.5


@pytest.mark.parametrize('k', [0, 10**9])
def test_bad_k(heart, k):
  with pytest.raises(ValueError, match=r'num_coordinates must be an integer'):
    fl_top.build_random_subset_client_work(
      heart.model_fn,
      tff.learning.optimizers.build_sgdm(0.1),
      num_coordinates=k,
      seed=0,
    )


@pytest.mark.parametrize('method', ['fl_basic', 'fl_basic_dp'])
def test_runner_method_bytes_and_accounting(heart, tmp_path, method):
  from tff_dp.job import training  # pylint: disable=g-import-not-at-top

  summary = training.run_experiment(
    training.ExperimentConfig.create(
      task='heart_disease',
      method=method,
      rounds=2,
      clients_per_round=2,
      noise_multiplier=0.5,
      delta=1e-3,
      clip=0.5,
      top_k_ratio=0.05,
      batch_size=16,
      output_dir=str(tmp_path / method),
      background_evaluation=False,
    )
  )
  d = summary['num_model_params']
  k = round(0.05 * d)
  # Whole model and the round's K indices down; K values up.
  assert summary['bytes_per_client_per_round'] == {
    'down': 4 * d + 4 * k,
    'up': 4 * k,
  }
  assert (summary['epsilon_rdp'] is None) == (method == 'fl_basic')
