"""Low-rank adapters: what they train, what they start at, what they refuse."""

import functools
import pickle

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.tasks import adapters
from tff_dp.tasks import models
from tff_dp.tasks import public
from tff_dp.tasks import task as task_lib

CNN = functools.partial(models.create_cnn_mcmahan, (28, 28, 1), 10, 0)


def _x(n=3, seed=0):
  return np.random.default_rng(seed).random((n, 28, 28, 1), np.float32)


def test_adapters_start_at_the_wrapped_model_and_train_only_their_factors():
  builder = adapters.Adapters(
    CNN, ('conv2', 'dense1'), 4, also_train=('logits',)
  )
  model, base = builder(), CNN()
  np.testing.assert_array_equal(model(_x()).numpy(), base(_x()).numpy())
  assert [w.name for w in model.trainable_weights] == [
    'conv2/adapter_a/kernel:0',
    'conv2/adapter_b/kernel:0',
    'dense1/adapter_a/kernel:0',
    'dense1/adapter_b/kernel:0',
    'logits/kernel:0',
    'logits/bias:0',
  ]
  # conv2: A is 5x5x32 -> 4, B 1x1x4 -> 64; dense1: 3136 x 4 + 4 x 512.
  assert adapters.adapter_weights(base.get_layer('conv2'), 4) == 3456
  assert adapters.adapter_weights(base.get_layer('dense1'), 4) == 14592
  trained = sum(int(tf.size(w)) for w in model.trainable_weights)
  assert trained == 3456 + 14592 + 5130
  frozen = sum(int(tf.size(w)) for w in model.non_trainable_weights)
  assert frozen == 1_663_370 - 5130


def test_an_adapter_adds_its_low_rank_product_before_the_activation():
  model = adapters.Adapters(CNN, ('dense1',), 2)()
  layer = model.get_layer('dense1')
  rng = np.random.default_rng(1)
  layer.up.kernel.assign(rng.normal(size=(2, 512)).astype(np.float32))
  h = rng.normal(size=(5, 3136)).astype(np.float32)
  w, b = (v.numpy() for v in layer.inner.weights)
  a, up = layer.down.kernel.numpy(), layer.up.kernel.numpy()
  want = np.maximum(h @ w + b + (h @ a) @ up, 0)
  np.testing.assert_allclose(layer(h).numpy(), want, rtol=1e-5, atol=1e-5)


def test_adapters_keep_a_warm_start_and_pickle():
  warm = [w * 0 + 0.01 * i for i, w in enumerate(CNN().get_weights())]
  builder = adapters.Adapters(
    public.WarmStart(CNN, tuple(warm)), ('dense1',), 3, seed=5
  )
  again = pickle.loads(pickle.dumps(builder))
  for model in (builder(), again()):
    inner = model.get_layer('dense1').inner
    np.testing.assert_array_equal(inner.kernel.numpy(), warm[4])
    np.testing.assert_array_equal(model.get_layer('conv1').kernel, warm[0])
  # The A factors come from the seed: the same seed, the same A.
  a1 = builder().get_layer('dense1').down.kernel.numpy()
  np.testing.assert_array_equal(a1, again().get_layer('dense1').down.kernel)


def test_tff_trains_only_the_adapters():
  builder = adapters.Adapters(CNN, ('dense1',), 2)
  spec = (
    tf.TensorSpec([None, 28, 28, 1], tf.float32),
    tf.TensorSpec([None], tf.int32),
  )

  def model_fn():
    return tff.learning.models.from_keras_model(
      builder(),
      input_spec=spec,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

  process = tff.learning.algorithms.build_unweighted_fed_avg(
    model_fn, tff.learning.optimizers.build_sgdm(0.5)
  )
  state = process.initialize()
  before = process.get_model_weights(state)
  assert [np.shape(w) for w in before.trainable] == [(3136, 2), (2, 512)]
  data = tf.data.Dataset.from_tensor_slices(
    (_x(8), np.arange(8, dtype=np.int32) % 10)
  ).batch(4)
  state = process.next(state, [data, data]).state
  after = process.get_model_weights(state)
  for a, b in zip(before.non_trainable, after.non_trainable):
    np.testing.assert_array_equal(a, b)
  assert not np.allclose(before.trainable[1], after.trainable[1])


@pytest.mark.parametrize(
  'layers, rank, also, message',
  [
    (('pool1',), 2, (), r"Dense or Conv2D layers .*\['conv1', 'conv2'"),
    ((), 2, (), 'at least one'),
    (('dense1',), 512, (), r'adapter_rank must be in \[1, 511\]'),
    (('conv1',), 25, (), r'adapter_rank must be in \[1, 24\]'),
    (('dense1',), 0, (), 'adapter_rank must be an integer >= 1. Found 0'),
    (('dense1',), 2, ('dense1',), r"share a layer.*\['dense1'\]"),
    (('dense1',), 2, ('dense9',), r"train_layers must name.*\['dense9'\]"),
  ],
)
def test_bad_adapters_are_named(layers, rank, also, message):
  with pytest.raises(ValueError, match=message):
    adapters.Adapters(CNN, layers, rank, also_train=also)()


def test_the_client_model_rebuilt_from_config_computes_the_same():
  # TFF's client models are rebuilt from the model's config with zero
  # initializers (`task.zero_initialized_builder`), then given the weights.
  builder = adapters.Adapters(
    CNN, ('conv2', 'dense1'), 3, also_train=('logits',)
  )
  model = builder()
  rng = np.random.default_rng(2)
  for w in model.trainable_weights:
    w.assign(rng.normal(size=w.shape).astype(np.float32) * 0.05)
  client = task_lib.zero_initialized_builder(builder)()
  assert [w.name for w in client.trainable_weights] == [
    w.name for w in model.trainable_weights
  ]
  assert [w.shape for w in client.non_trainable_weights] == [
    w.shape for w in model.non_trainable_weights
  ]
  client.set_weights(model.get_weights())
  np.testing.assert_allclose(client(_x()), model(_x()), rtol=1e-5, atol=1e-6)
  assert client.get_layer('dense1').activation is tf.keras.activations.relu


def test_transposed_and_grouped_convolutions_take_no_adapters():
  def builder():
    return tf.keras.Sequential(
      [
        tf.keras.layers.InputLayer(input_shape=(8, 8, 4)),
        tf.keras.layers.Conv2DTranspose(4, 3, name='up'),
        tf.keras.layers.Conv2D(4, 3, groups=2, name='grouped'),
        tf.keras.layers.Conv2D(4, 3, name='plain'),
      ]
    )

  for name in ('up', 'grouped'):
    with pytest.raises(ValueError, match=r"layers of .*: \['plain'\]"):
      adapters.Adapters(builder, (name,), 1)()
