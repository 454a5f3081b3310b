import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.tasks import client_data
from tff_dp.tasks import medical
from tff_dp.tasks import task as task_lib


def _tiny():
  x = np.arange(12, dtype=np.uint8).reshape(6, 2)
  y = np.array([0, 1, 0, 1, 1, 0], np.uint8)
  return client_data.ArrayClientData(
    x,
    y,
    [np.array([4, 0]), np.array([1, 2, 3]), np.array([5])],
    client_ids=['a', 'b', 'c'],
  )


def test_slices_and_elements():
  cd = _tiny()
  assert cd.client_ids == ['a', 'b', 'c']
  assert cd.client_sizes().tolist() == [2, 3, 1]
  x, y = cd.client_arrays('a')
  np.testing.assert_array_equal(x, [[8, 9], [0, 1]])
  el = list(cd.create_tf_dataset_for_client('b'))
  assert len(el) == 3
  np.testing.assert_allclose(el[0]['x'].numpy(), [2 / 255, 3 / 255])
  assert el[0]['y'].dtype == tf.int32


@pytest.mark.parametrize(
  'element_fn, dtype',
  [
    (client_data.scale_uint8_images, np.uint8),
    (client_data.float_features, np.float64),
  ],
)
def test_client_elements_equal_a_per_element_map_bit_for_bit(element_fn, dtype):
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, size=(40, 7, 3)).astype(dtype)
  if dtype == np.float64:
    x = rng.normal(size=(40, 7, 3))
  y = rng.integers(0, 10, size=40).astype(np.uint8)
  cd = client_data.ArrayClientData(
    x, y, [np.arange(0, 25), np.arange(25, 40)], element_fn=element_fn
  )
  for c in cd.client_ids:
    xs, ys = cd.client_arrays(c)
    mapped = tf.data.Dataset.from_tensor_slices((xs, ys)).map(element_fn)
    ours = cd.create_tf_dataset_for_client(c)
    assert ours.element_spec == mapped.element_spec == cd.element_type_structure
    for a, b in zip(ours, mapped, strict=True):
      for k in ('x', 'y'):
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())
        assert a[k].numpy().tobytes() == b[k].numpy().tobytes()


def _rss_mb() -> float:
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  raise AssertionError('no VmRSS')


def test_making_client_datasets_keeps_no_memory():
  # A `Dataset.map` per client dataset kept about 76 KB each in TF 2.14
  # (1,500 datasets: about 110 MB); the runner makes 100 a round.
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, size=(600, 28, 28, 1)).astype(np.uint8)
  y = rng.integers(0, 10, size=600).astype(np.uint8)
  cd = client_data.ArrayClientData(
    x, y, [np.arange(i, i + 10) for i in range(0, 600, 10)]
  )
  ids = cd.client_ids

  def make(n):
    for i in range(n):
      cd.create_tf_dataset_for_client(ids[i % len(ids)])

  make(300)  # Warm-up: allocator pools, op caches.
  before = _rss_mb()
  make(1500)
  growth = _rss_mb() - before
  assert growth < 25, f'{growth:.0f} MB kept by 1,500 client datasets'


def test_serializable_fn_matches_eager_in_tff():
  cd = _tiny()

  @tff.tensorflow.computation(np.str_)
  def count_and_sum(client_id):
    ds = cd.serializable_dataset_fn(client_id)
    return ds.reduce(np.float32(0.0), lambda s, e: s + tf.reduce_sum(e['x']))

  for c in cd.client_ids:
    eager = sum(
      float(tf.reduce_sum(e['x'])) for e in cd.create_tf_dataset_for_client(c)
    )
    assert count_and_sum(c) == pytest.approx(eager, rel=1e-6)


def test_bad_inputs():
  with pytest.raises(ValueError, match='at least one client'):
    client_data.ArrayClientData(np.zeros((2, 1)), np.zeros(2), [])
  with pytest.raises(ValueError, match='must be unique'):
    client_data.ArrayClientData(
      np.zeros((2, 1)),
      np.zeros(2),
      [np.array([0]), np.array([1])],
      client_ids=['a', 'a'],
    )
  with pytest.raises(ValueError, match="Unknown client id 'z'"):
    _tiny().client_arrays('z')


def test_preprocess_fn_batches_and_caps_steps():
  ds = tf.data.Dataset.range(25).map(
    lambda i: collections.OrderedDict(x=i, y=i)
  )
  out = list(
    task_lib.client_preprocess_fn(4, num_epochs=2, max_steps=5, seed=0)(ds)
  )
  assert len(out) == 5 and all(len(b['x']) == 4 for b in out)
  with pytest.raises(ValueError, match='batch_size must be an integer >= 1'):
    task_lib.client_preprocess_fn(0)
  with pytest.raises(ValueError, match='max_steps must be None or an integer'):
    task_lib.client_preprocess_fn(2, max_steps=0)


def test_task_model_fn_runs_fedavg_round(shared_data_dir):
  """The task's model_fn drops into tff.learning's FedAvg as is."""
  task = medical.load_heart_disease(shared_data_dir)
  process = tff.learning.algorithms.build_weighted_fed_avg(
    task.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1)
  )
  preprocess = task_lib.client_preprocess_fn(16, seed=0)
  data = [
    preprocess(task.train_data.create_tf_dataset_for_client(c))
    for c in task.train_data.client_ids
  ]
  state = process.initialize()
  out = process.next(state, data)
  train = out.metrics['client_work']['train']
  assert train['num_examples'] == int(task.train_data.client_sizes().sum())
  assert set(train) >= {'loss', 'balanced_accuracy', 'auroc'}
  assert np.isfinite(train['loss'])


def test_to_baseline_task(shared_data_dir):
  task = medical.load_heart_disease(shared_data_dir)
  baseline = task.to_baseline_task()
  assert isinstance(baseline, tff.simulation.baselines.BaselineTask)
  assert baseline.datasets.train_data.client_ids == task.train_data.client_ids
  test = baseline.datasets.get_centralized_test_data()
  assert sum(len(b['y']) for b in test) == len(task.test_y)
  client = baseline.datasets.train_data.client_ids[0]
  batch = next(
    iter(
      baseline.datasets.train_data.preprocess(
        baseline.datasets.train_preprocess_fn
      ).create_tf_dataset_for_client(client)
    )
  )
  assert batch['x'].shape[0] == 10
