import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import contexts
from tff_dp.aggregators import dp_randagg
from tff_dp.client_works import fl_top
from tff_dp.tasks import medical
from tff_dp.tasks import task as task_lib


def test_select_top_k_by_accumulated_gradient():
  # A linear model y = w . x with squared loss: at w0 = 0 the gradient is
  # -2 x y, so |grad| ranks the coordinates by |x|: 4 > 3 > 2 > 1.
  model = tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        1, use_bias=False, kernel_initializer='zeros', input_shape=(4,)
      )
    ]
  )
  x = np.array([[1.0, -4.0, 2.0, 3.0]], np.float32)
  y = np.array([[1.0]], np.float32)
  idx = fl_top.select_top_k(
    model,
    tf.keras.losses.MeanSquaredError(),
    x,
    y,
    ratio=0.5,
    init_steps=1,
    learning_rate=0.01,
  )
  np.testing.assert_array_equal(idx, [1, 3])


def test_masks_from_indices():
  masks = fl_top.masks_from_indices(np.array([0, 4, 5]), [(2, 2), (2,)])
  np.testing.assert_array_equal(masks[0], [[1, 0], [0, 0]])
  np.testing.assert_array_equal(masks[1], [1, 1])


@pytest.mark.parametrize('ratio', [0.0, 1.5])
def test_bad_ratio(ratio):
  with pytest.raises(ValueError, match=r'top_k_ratio must be in \(0, 1\]'):
    fl_top.check_ratio(ratio)


def test_bad_init_steps():
  model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
  with pytest.raises(ValueError, match='init_steps must be an integer >= 1'):
    fl_top.select_top_k(
      model,
      tf.keras.losses.MeanSquaredError(),
      np.zeros((1, 2)),
      np.zeros((1, 1)),
      ratio=0.5,
      init_steps=0,
    )


@pytest.mark.usefixtures('shared_data_dir')
def test_untrained_weights_stay_w0_bit_for_bit(shared_data_dir):
  contexts.set_simulation_context()
  task = medical.load_heart_disease(shared_data_dir)
  model = task.model_builder()
  shapes = [tuple(v.shape) for v in model.trainable_variables]
  d = sum(int(np.prod(s)) for s in shapes)
  indices = np.arange(0, d, 7)  # Every 7th weight is trained.
  masks = fl_top.masks_from_indices(indices, shapes)
  work = fl_top.build_masked_client_work(
    task.model_fn,
    tff.learning.optimizers.build_sgdm(0.1, momentum=0.9),
    masks=masks,
  )
  initial = tff.learning.models.ModelWeights(
    trainable=[w.numpy() for w in model.trainable_variables], non_trainable=[]
  )
  preprocess = task_lib.client_preprocess_fn(32, seed=0)
  data = [preprocess(task.train_data.create_tf_dataset_for_client('va'))]
  out = work.next(work.initialize(), [initial], data)
  flat = np.concatenate([np.ravel(u) for u in out.result[0].update])
  untrained = np.setdiff1d(np.arange(d), indices)
  # Exactly zero update outside K: the weights there equal w0 bit for bit.
  assert np.all(flat[untrained] == 0.0)
  assert np.count_nonzero(flat[indices]) > 0.9 * len(indices)
  # The aggregator carries exactly the K values and decodes them back.
  factory = dp_randagg.DPRandAggFactory(
    0.0, 1, 10.0, num_coordinates=len(indices), fixed_indices=indices
  )
  value_type = tff.StructWithPythonType(
    [tff.TensorType(np.float32, s) for s in shapes], list
  )
  process = factory.create(value_type)
  agg = process.next(process.initialize(), [out.result[0].update])
  assert agg.measurements['num_coordinates'] == len(indices)
  for a, b in zip(agg.result, out.result[0].update):
    # Secure sum quantizes within +-clip: error far below the values.
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize('method', ['fl_top', 'fl_top_dp'])
def test_runner_fl_top_keeps_w0_outside_k(shared_data_dir, tmp_path, method):
  from tff_dp import tasks  # pylint: disable=g-import-not-at-top
  from tff_dp import training  # pylint: disable=g-import-not-at-top

  out = tmp_path / method
  summary = training.run_experiment(
    training.ExperimentConfig(
      task='fashion_mnist_iid',
      method=method,
      rounds=1,
      clients_per_round=5,
      noise_multiplier=0.5,
      delta=1e-4,
      top_k_ratio=0.01,
      local_epochs=2,
      local_steps=2,
      data_dir=str(shared_data_dir),
      output_dir=str(out),
    )
  )
  k = round(0.01 * 1_663_370)
  assert summary['bytes_per_client_per_round'] == {'down': 4 * k, 'up': 4 * k}
  w0 = tasks.load_task('fashion_mnist_iid').model_builder().get_weights()
  with np.load(out / 'final_model_weights.npz') as d:
    final = [d[f'trainable_{i}'] for i in range(len(w0))]
  changed = sum(int(np.sum(a != b)) for a, b in zip(final, w0))
  assert 0 < changed <= k  # Only Top-K weights ever move.
  assert (summary['epsilon_rdp'] is None) == (method == 'fl_top')
