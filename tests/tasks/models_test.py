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
