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
