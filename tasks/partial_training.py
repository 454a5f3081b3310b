"""Train only some of a Keras model's layers, for `tff.learning`.

`tff.learning.models.from_keras_model` puts a Keras model's trainable
weights in `ModelWeights.trainable` and the rest in `non_trainable`. Client
work trains and sends only the trainable part, and every aggregation
factory is built on its type, so freezing layers before the model reaches
TFF shrinks what is clipped, noised, compressed and uploaded, with no change
to the aggregators: d, the noise's energy and the bytes up follow.

A TFF user's own model:

  builder = partial_training.TrainOnly(my_keras_builder, ('dense1', 'logits'))
  model_fn = lambda: tff.learning.models.from_keras_model(builder(), ...)

`--train_layers` does the same to a task's model.
"""

import dataclasses
from typing import Callable, Sequence

import tensorflow as tf


def weighted_layer_names(model: tf.keras.Model) -> list[str]:
  """The names of the model's top-level layers that hold weights."""
  return [layer.name for layer in model.layers if layer.weights]


def check_layer_names(model: tf.keras.Model, names: Sequence[str]) -> None:
  """Raises unless every name is a top-level layer of `model` with weights.

  Raises:
    ValueError: naming the unknown (or weightless) layers and the model's
      layers with weights.
  """
  known = weighted_layer_names(model)
  unknown = [n for n in names if n not in known]
  if unknown or not names:
    raise ValueError(
      f'train_layers must name layers of {model.name!r} that hold weights, '
      f'at least one: {known}. Found {list(names)!r}'
      + (f' ({unknown} not among them).' if unknown else '.')
    )


def freeze_all_but(model: tf.keras.Model, names: Sequence[str]) -> None:
  """Makes every top-level layer but `names` non-trainable, in place.

  Raises:
    ValueError: If `names` is empty or names a layer `model` lacks (or
      one without weights).
  """
  check_layer_names(model, names)
  for layer in model.layers:
    layer.trainable = layer.name in names


@dataclasses.dataclass(frozen=True)
class TrainOnly:
  """A model builder whose models train only `layers` (picklable).

  Attributes:
    builder: Returns a fresh Keras model.
    layers: The names of the top-level layers to train.
  """

  builder: Callable[[], tf.keras.Model]
  layers: tuple[str, ...]

  def __post_init__(self):
    if not callable(self.builder):
      raise TypeError(f'builder must be callable. Found {self.builder!r}.')
    if isinstance(self.layers, str) or not all(
      isinstance(n, str) for n in self.layers
    ):
      raise TypeError(
        f'layers must be a sequence of layer names. Found {self.layers!r}.'
      )
    object.__setattr__(self, 'layers', tuple(self.layers))

  def __call__(self) -> tf.keras.Model:
    model = self.builder()
    freeze_all_but(model, self.layers)
    return model


def count_weights(model: tf.keras.Model) -> tuple[int, int]:
  """`(trainable, frozen)` numbers of the model's scalar weights."""

  def size(weights):
    return int(sum(int(tf.size(w)) for w in weights))

  return size(model.trainable_weights), size(model.non_trainable_weights)
