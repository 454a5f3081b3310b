"""Model clipping (seed 003) and CE-FedAvg's difference clipping."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp import methods
from tff_dp.client_works import model_clip
from tff_dp.tasks import medical
from tff_dp.tasks import task as task_lib


@pytest.fixture(scope='module')
def heart(shared_data_root):
  return medical.load_heart_disease(shared_data_root)


def _flat(x):
  return np.concatenate([np.ravel(t) for t in x])


def test_clip_model_exact():
  w = [tf.constant([3.0, 0.0]), tf.constant([[4.0]])]
  np.testing.assert_allclose(
    _flat(model_clip.clip_model(w, 1.0)), [0.6, 0, 0.8]
  )
  np.testing.assert_allclose(_flat(model_clip.clip_model(w, 10.0)), [3, 0, 4])


def test_model_clipping_bounds_the_model_not_the_update(heart):
  contexts.set_simulation_context()
  model = heart.model_builder()
  initial = tff.learning.models.ModelWeights(
    trainable=[w.numpy() for w in model.trainable_variables], non_trainable=[]
  )
  w0 = _flat(initial.trainable)
  data = [
    task_lib.client_preprocess_fn(32, seed=0)(
      heart.train_data.create_tf_dataset_for_client('va')
    )
  ]
  opt = tff.learning.optimizers.build_sgdm(0.1)
  from tff_dp.client_works import _local_training  # pylint: disable=g-import-not-at-top

  ref = _local_training.build_client_work(
    heart.model_fn, opt, client_weighting=tff.learning.ClientWeighting.UNIFORM
  )
  trained = w0 - _flat(
    ref.next(ref.initialize(), [initial], data).result[0].update
  )
  norm = np.linalg.norm(trained)
  for clip, expect in ((norm * 10, trained), (norm / 4, trained / 4)):
    work = model_clip.build_model_clip_client_work(
      heart.model_fn, opt, clip=clip
    )
    update = _flat(
      work.next(work.initialize(), [initial], data).result[0].update
    )
    sent_model = w0 - update
    np.testing.assert_allclose(sent_model, expect, rtol=1e-4, atol=1e-5)
    assert np.linalg.norm(sent_model) <= clip * (1 + 1e-5)


def test_ce_fedavg_clips_the_update_difference():
  contexts.set_simulation_context()
  p = methods.MethodParams(num_model_params=3, expected_clients_per_round=2)
  p = dataclasses.replace(p, clip=1.0)
  factory = methods.METHODS['ce_fedavg'].build_aggregator(p)
  process = factory.create(tff.TensorType(np.float32, [3]))
  big = np.array([0.0, 30.0, 40.0], np.float32)  # Norm 50 -> 1.
  small = np.array([0.1, 0.0, 0.0], np.float32)
  out = process.next(process.initialize(), [big, small])
  # Uniform mean over the participants of the clipped differences.
  np.testing.assert_allclose(out.result, ([0, 0.6, 0.8] + small) / 2, atol=1e-6)


def test_bad_clip():
  with pytest.raises(ValueError, match='clip must be > 0'):
    model_clip.check_clip(0.0)
