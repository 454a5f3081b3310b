"""Low-rank adapters: train a rank-r update of frozen layers (tff.learning).

An adapted Dense or Conv2D layer keeps its weights W (and bias) frozen and
learns a low-rank update beside them (Hu et al. 2021, LoRA):

  y = activation(W x + b + B(A(x)))

A maps the layer's input to `rank` channels (a Dense of `rank` units, or a
Conv2D of `rank` filters with the layer's kernel size, strides and
padding), B maps them to the layer's outputs (a Dense, or a 1x1 Conv2D).
A starts at seeded random weights (public randomness) and B at zero, so
the adapted model starts as the model it wraps (its warm start, say).

Only A and B (and the layers named in `also_train`) are trainable, so
`tff.learning.models.from_keras_model` puts only them in
`ModelWeights.trainable`: every aggregator, DP and compressed, then sees
only them, and d, the noise calibration, the bytes up and the ledger
follow, as with `partial_training.TrainOnly`.

A TFF user's own model:

  builder = adapters.Adapters(my_keras_builder, ('dense1',), rank=4,
                              also_train=('logits',))
  model_fn = lambda: tff.learning.models.from_keras_model(builder(), ...)

`--adapter_layers` and `--adapter_rank` do the same to a task's model.
"""

import dataclasses
from typing import Callable, Optional

import tensorflow as tf

from tff_dp.tasks import partial_training


def adaptable(layer: tf.keras.layers.Layer) -> bool:
  """Whether `layer` takes adapters: a Dense, or a Conv2D with one group
  (exactly those types: Conv2DTranspose subclasses Conv2D with another
  kernel layout)."""
  if type(layer) is tf.keras.layers.Dense:  # pylint: disable=unidiomatic-typecheck
    return True
  return type(layer) is tf.keras.layers.Conv2D and layer.groups == 1  # pylint: disable=unidiomatic-typecheck


@tf.keras.utils.register_keras_serializable(package='tff_dp')
class LowRankAdapter(tf.keras.layers.Layer):
  """A frozen Dense or Conv2D layer plus a trainable rank-`rank` update.

  Named as the layer it wraps. Its trainable weights are the two factors'
  kernels (`adapter_a`, `adapter_b`); the wrapped layer's are frozen.
  Serializable (`get_config`), as TFF's client models are rebuilt from
  their config.
  """

  def __init__(
    self,
    inner: tf.keras.layers.Layer,
    rank: int,
    seed: Optional[int] = None,
    activation=None,
    **kwargs,
  ):
    super().__init__(**{'name': inner.name, **kwargs})
    if not adaptable(inner):
      raise ValueError(
        f'Only Dense and (ungrouped) Conv2D layers take adapters. Layer '
        f'{inner.name!r} is a {type(inner).__name__}.'
      )
    self.rank = rank
    self.seed = seed
    self.inner = inner
    inner.trainable = False
    # The activation goes after the sum: W x + b + B(A(x)).
    self.activation = tf.keras.activations.get(
      inner.activation if activation is None else activation
    )
    inner.activation = tf.keras.activations.linear
    init_a = tf.keras.initializers.GlorotUniform(seed=seed)
    if isinstance(inner, tf.keras.layers.Dense):
      self.down = tf.keras.layers.Dense(
        rank, use_bias=False, kernel_initializer=init_a, name='adapter_a'
      )
      self.up = tf.keras.layers.Dense(
        inner.units,
        use_bias=False,
        kernel_initializer='zeros',
        name='adapter_b',
      )
    else:
      self.down = tf.keras.layers.Conv2D(
        rank,
        inner.kernel_size,
        strides=inner.strides,
        padding=inner.padding,
        dilation_rate=inner.dilation_rate,
        data_format=inner.data_format,
        use_bias=False,
        kernel_initializer=init_a,
        name='adapter_a',
      )
      self.up = tf.keras.layers.Conv2D(
        inner.filters,
        1,
        data_format=inner.data_format,
        use_bias=False,
        kernel_initializer='zeros',
        name='adapter_b',
      )

  def get_config(self):
    config = super().get_config()
    config.update(
      inner=tf.keras.layers.serialize(self.inner),
      rank=self.rank,
      seed=self.seed,
      activation=tf.keras.activations.serialize(self.activation),
    )
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    inner = tf.keras.layers.deserialize(config.pop('inner'))
    return cls(inner, **config)

  def call(self, x):
    return self.activation(self.inner(x) + self.up(self.down(x)))


def adapter_weights(layer: tf.keras.layers.Layer, rank: int) -> int:
  """The number of weights rank-`rank` adapters on `layer` add."""
  if isinstance(layer, tf.keras.layers.Dense):
    fan_in = int(layer.kernel.shape[0])
    return rank * (fan_in + layer.units)
  if isinstance(layer, tf.keras.layers.Conv2D):
    kh, kw, fan_in, _ = (int(d) for d in layer.kernel.shape)
    return rank * (kh * kw * fan_in + layer.filters)
  raise ValueError(f'Layer {layer.name!r} takes no adapters.')


def check(
  model: tf.keras.Model,
  layers: tuple[str, ...],
  rank: int,
  also_train: tuple[str, ...] = (),
) -> None:
  """Raises unless `layers` are distinct Dense / Conv2D top-level layers of
  `model`, `also_train` its other weighted layers, and `rank` in
  [1, min(fan-in, outputs)) of every adapted layer.

  Raises:
    ValueError: naming the bad value and what is allowed.
  """
  names = [l.name for l in model.layers if adaptable(l) and l.weights]
  unknown = [n for n in layers if n not in names]
  if not layers or unknown or len(set(layers)) != len(layers):
    raise ValueError(
      f'adapter_layers must name distinct Dense or Conv2D layers of '
      f'{model.name!r}, at least one: {names}. Found {list(layers)!r}.'
    )
  if also_train:
    partial_training.check_layer_names(model, also_train)
  both = sorted(set(layers) & set(also_train))
  if both:
    raise ValueError(
      f'train_layers and adapter_layers must not share a layer (an '
      f"adapted layer's own weights stay frozen). Found {both} in both."
    )
  if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
    raise ValueError(f'adapter_rank must be an integer >= 1. Found {rank!r}.')
  for name in layers:
    layer = model.get_layer(name)
    fan_in = layer.kernel.shape.num_elements() // int(layer.kernel.shape[-1])
    outputs = int(layer.kernel.shape[-1])
    limit = min(fan_in, outputs)
    if rank >= limit:
      raise ValueError(
        f'adapter_rank must be in [1, {limit - 1}] for layer {name!r} '
        f'({fan_in} inputs, {outputs} outputs: a rank-{limit} update is '
        f'no smaller than the layer). Found {rank}.'
      )


@dataclasses.dataclass(frozen=True)
class Adapters:
  """A model builder whose models train rank-`rank` adapters on `layers`
  and, fully, the layers in `also_train`; every other weight is frozen
  (picklable).

  Attributes:
    builder: Returns a fresh Keras model.
    layers: The top-level Dense / Conv2D layers to adapt, by name.
    rank: The adapters' rank.
    also_train: Further top-level layers to train in full.
    seed: Seeds the adapters' A factors (public randomness), each layer's
      from `seed` and its position.
  """

  builder: Callable[[], tf.keras.Model]
  layers: tuple[str, ...]
  rank: int
  also_train: tuple[str, ...] = ()
  seed: Optional[int] = 0

  def __post_init__(self):
    for field in ('layers', 'also_train'):
      value = getattr(self, field)
      if isinstance(value, str) or not all(isinstance(n, str) for n in value):
        raise TypeError(
          f'{field} must be a sequence of layer names. Found {value!r}.'
        )
      object.__setattr__(self, field, tuple(value))

  def __call__(self) -> tf.keras.Model:
    model = self.builder()
    check(model, self.layers, self.rank, self.also_train)
    for layer in model.layers:
      layer.trainable = layer.name in self.also_train
    positions = {name: i for i, name in enumerate(self.layers)}

    def adapt(layer):
      if layer.name not in positions:
        return layer  # The same layer, its weights (warm start) kept.
      seed = (
        None if self.seed is None else self.seed * 1000 + positions[layer.name]
      )
      return LowRankAdapter(layer, self.rank, seed)

    return tf.keras.models.clone_model(model, clone_function=adapt)
