import numpy as np
import pytest
import tensorflow as tf

from tff_dp.tasks import models


def _count(model):
  return int(sum(np.prod(w.shape) for w in model.weights))


@pytest.mark.parametrize(
  'builder, kwargs, params',
  [
    # 832 + 51,264 + 1,606,144 + 5,130 (seed 001: "1.6 million").
    (models.create_cnn_mcmahan, dict(), 1_663_370),
    # 320 + 18,496 + 1,179,776 + 7,998 (seed 000: "about 1.0M").
    (models.create_cnn_2layers, dict(), 1_206_590),
    # 784 * 200 + 200 + 200 * 10 + 10 (seed 003's 159K MLP).
    (
      models.create_image_mlp,
      dict(input_shape=(28, 28, 1), num_classes=10),
      159_010,
    ),
    (
      models.create_image_mlp,
      dict(input_shape=(32, 32, 3), num_classes=10),
      616_610,
    ),
  ],
)
def test_parameter_counts(builder, kwargs, params):
  assert _count(builder(**kwargs)) == params


def test_resnet18_gn():
  model = models.create_resnet18_gn((32, 32, 3), 10, seed=0)
  assert 11_000_000 < _count(model) < 11_300_000
  assert not any(
    isinstance(l, tf.keras.layers.BatchNormalization) for l in model.layers
  )
  assert any(
    isinstance(l, tf.keras.layers.GroupNormalization) for l in model.layers
  )
  out = model(tf.zeros((2, 32, 32, 3)))
  assert out.shape == (2, 10)


def test_seeded_initialisation_is_deterministic():
  a = models.create_cnn_mcmahan(seed=7).get_weights()
  b = models.create_cnn_mcmahan(seed=7).get_weights()
  c = models.create_cnn_mcmahan(seed=8).get_weights()
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not np.array_equal(a[0], c[0])


def test_mlp_single_logit():
  model = models.create_mlp(12, 1, (8,), seed=0)
  assert model(tf.zeros((3, 12))).shape == (3, 1)


def test_stateless_dropout_mask_is_a_function_of_seed_and_input():
  x = tf.random.stateless_normal((64, 40, 40), seed=[1, 2]) + 3.0
  y = tf.random.stateless_normal((64, 40, 40), seed=[3, 4]) + 3.0
  first = models.StatelessDropout(0.25, seed=10)
  second = models.StatelessDropout(0.25, seed=10)
  # Order independence: a fresh layer applied to (y, x) gives each input
  # the mask the first layer gave it under (x, y).
  fx, fy = first(x, training=True), first(y, training=True)
  sy, sx = second(y, training=True), second(x, training=True)
  np.testing.assert_array_equal(fx.numpy(), sx.numpy())
  np.testing.assert_array_equal(fy.numpy(), sy.numpy())
  # Another input or another seed gives another mask.
  assert not np.array_equal(fx.numpy() == 0, fy.numpy() == 0)
  other_seed = models.StatelessDropout(0.25, seed=11)(x, training=True)
  mask_x, mask_other = fx.numpy() == 0, other_seed.numpy() == 0
  assert 0.15 < np.mean(mask_x != mask_other) < 0.5
  # Rate: 102,400 independent units; 5 standard deviations is 0.0068.
  assert abs(mask_x.mean() - 0.25) < 0.0068
  assert abs((fy.numpy() == 0).mean() - 0.25) < 0.0068
  # Kept units scaled by 1 / (1 - rate), dropped ones zero.
  np.testing.assert_allclose(
    fx.numpy()[~mask_x], x.numpy()[~mask_x] / 0.75, rtol=1e-6
  )


def test_stateless_dropout_is_identity_at_inference_and_checks_rate():
  x = tf.random.stateless_normal((8, 5), seed=[1, 2])
  layer = models.StatelessDropout(0.5, seed=1)
  np.testing.assert_array_equal(layer(x).numpy(), x.numpy())
  np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
  for bad in (-0.1, 1.0, 1.5):
    with pytest.raises(ValueError, match=rf'rate={bad}.*\[0, 1\)'):
      models.StatelessDropout(bad)
  config = layer.get_config()
  restored = models.StatelessDropout.from_config(config)
  assert (restored.rate, restored.seed) == (0.5, 1)
