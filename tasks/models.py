"""Keras models of the papers' tasks.

Every builder returns an uncompiled `tf.keras.Model` that outputs logits
(no softmax), so it pairs with `from_logits=True` losses and works with
`tff.learning.models.from_keras_model`. Builders take a `seed` for the initial
weights so that a run is reproducible without global random state. In the
CNNs and MLPs the layers that hold weights have fixed names (`conv1`,
`dense1`, ..., `logits`), the names `--train_layers` takes; ResNet-18 names
only its output layer (`logits`): Keras's automatic names, which its other
layers keep, change with every model built in a process.
"""

from typing import Optional, Sequence

import tensorflow as tf


def _init(seed: Optional[int], offset: int):
  if seed is None:
    return tf.keras.initializers.GlorotUniform()
  return tf.keras.initializers.GlorotUniform(seed=seed * 1000 + offset)


@tf.keras.utils.register_keras_serializable(package='tff_dp')
class StatelessDropout(tf.keras.layers.Layer):
  """Dropout whose mask is a pure function of its seed and its input.

  Keras' `Dropout(seed=s)` draws from a stateful random kernel. Inside a
  TFF round the clients share that kernel, so which mask a client gets
  depends on the order TFF happens to run them in, and two runs of the same
  seeded command differ (measured on the EMNIST CNN: round-1 train loss
  4.109972 vs 4.110605; identical with the dropout removed). Here the mask
  is `stateless_uniform(seed=[seed, fingerprint(x)]) >= rate`, with the
  fingerprint the bits of the float32 sum of the layer's input: the same
  client batch under the same weights gets the same mask in any order, and
  consecutive steps (whose weights differ) get fresh masks. The mask is not
  privacy-relevant randomness (the noise is drawn elsewhere).

  At inference (`training` false or None) it is the identity; in training
  kept units are scaled by 1 / (1 - rate), as Keras' `Dropout`.
  """

  def __init__(self, rate: float, seed: int = 0, **kwargs):
    super().__init__(**kwargs)
    if not 0.0 <= rate < 1.0:
      raise ValueError(f'StatelessDropout rate={rate!r}: must be in [0, 1).')
    if not -(2**31) <= int(seed) < 2**31:
      raise ValueError(f'StatelessDropout seed={seed!r}: must fit in int32.')
    self.rate = float(rate)
    self.seed = int(seed)

  def call(self, inputs, training=None):
    if not training or self.rate == 0.0:
      return tf.identity(inputs)
    fingerprint = tf.bitcast(
      tf.reduce_sum(tf.cast(inputs, tf.float32)), tf.int32
    )
    uniform = tf.random.stateless_uniform(
      tf.shape(inputs), seed=tf.stack([tf.constant(self.seed), fingerprint])
    )
    scaled = inputs / tf.cast(1.0 - self.rate, inputs.dtype)
    return tf.where(uniform >= self.rate, scaled, tf.zeros_like(inputs))

  def get_config(self):
    return dict(super().get_config(), rate=self.rate, seed=self.seed)


def create_cnn_mcmahan(
  input_shape: Sequence[int] = (28, 28, 1),
  num_classes: int = 10,
  seed: Optional[int] = None,
) -> tf.keras.Model:
  """The CNN of McMahan et al. (2017), as Guo et al. and Kerkouche et al. use.

  Two 5x5 convolutions (32 and 64 filters, 'same' padding, ReLU), each
  followed by 2x2 max pooling, a 512-unit ReLU dense layer and the output
  layer. With 28x28x1 inputs and 10 classes it has 1,663,370 parameters.
  """
  layers = tf.keras.layers
  return tf.keras.Sequential(
    [
      layers.InputLayer(input_shape=tuple(input_shape)),
      layers.Conv2D(
        32,
        5,
        padding='same',
        activation='relu',
        kernel_initializer=_init(seed, 0),
        name='conv1',
      ),
      layers.MaxPool2D(2, name='pool1'),
      layers.Conv2D(
        64,
        5,
        padding='same',
        activation='relu',
        kernel_initializer=_init(seed, 1),
        name='conv2',
      ),
      layers.MaxPool2D(2, name='pool2'),
      layers.Flatten(name='flatten'),
      layers.Dense(
        512, activation='relu', kernel_initializer=_init(seed, 2), name='dense1'
      ),
      layers.Dense(
        num_classes, kernel_initializer=_init(seed, 3), name='logits'
      ),
    ],
    name='cnn_mcmahan',
  )


def create_cnn_2layers(
  input_shape: Sequence[int] = (28, 28, 1),
  num_classes: int = 62,
  seed: Optional[int] = None,
) -> tf.keras.Model:
  """The "CNN-2-layers" of Reddi et al. (2021), Cheng et al.'s EMNIST model.

  Conv 3x3x32 and conv 3x3x64 ('valid', ReLU), 2x2 max pooling, dropout 0.25,
  dense 128 (ReLU), dropout 0.5, output layer: TFF's
  `simulation.baselines.emnist` conv-dropout model. 1,206,590 parameters
  for EMNIST-62 (Cheng et al. 2022 quote about 1.0M). The dropout is
  `StatelessDropout` (its masks a function of `seed` and the batch, so a
  seeded run is reproducible whatever order TFF runs the clients in); rows
  recorded before 2026-11-25 used Keras' stateful `Dropout` and cannot be
  rerun to the same number.
  """
  layers = tf.keras.layers
  dseed = (0 if seed is None else seed) * 1000 + 10
  return tf.keras.Sequential(
    [
      layers.InputLayer(input_shape=tuple(input_shape)),
      layers.Conv2D(
        32,
        3,
        activation='relu',
        kernel_initializer=_init(seed, 0),
        name='conv1',
      ),
      layers.Conv2D(
        64,
        3,
        activation='relu',
        kernel_initializer=_init(seed, 1),
        name='conv2',
      ),
      layers.MaxPool2D(2, name='pool'),
      StatelessDropout(0.25, seed=dseed, name='dropout1'),
      layers.Flatten(name='flatten'),
      layers.Dense(
        128, activation='relu', kernel_initializer=_init(seed, 2), name='dense1'
      ),
      StatelessDropout(0.5, seed=dseed + 1, name='dropout2'),
      layers.Dense(
        num_classes, kernel_initializer=_init(seed, 3), name='logits'
      ),
    ],
    name='cnn_2layers',
  )


def _conv(filters, kernel, strides, seed, offset):
  return tf.keras.layers.Conv2D(
    filters,
    kernel,
    strides=strides,
    padding='same',
    use_bias=False,
    kernel_initializer=(
      tf.keras.initializers.HeNormal()
      if seed is None
      else tf.keras.initializers.HeNormal(seed * 1000 + offset)
    ),
  )


def _group_norm(channels: int, groups: int):
  return tf.keras.layers.GroupNormalization(groups=min(groups, channels))


def create_resnet18_gn(
  input_shape: Sequence[int] = (32, 32, 3),
  num_classes: int = 10,
  *,
  groups: int = 2,
  seed: Optional[int] = None,
) -> tf.keras.Model:
  """ResNet-18 (He et al. 2016) with GroupNorm instead of BatchNorm.

  BatchNorm's running statistics do not suit federated averaging; GroupNorm
  (Hsieh et al. 2020, as in Reddi et al. 2021) does. CIFAR-style stem: one 3x3
  convolution, no max pooling; four stages of two basic blocks with 64, 128,
  256, 512 filters; global average pooling; output layer. 11.2M parameters
  for CIFAR-10 (Cheng et al. 2022 and Zhang et al. 2022 quote 11.1M).

  Args:
    input_shape: Input shape (H, W, C).
    num_classes: Output classes.
    groups: GroupNorm groups per layer (2, as in Hsieh et al.).
    seed: Initializer seed.
  """
  layers = tf.keras.layers
  inputs = tf.keras.Input(shape=tuple(input_shape))
  offset = 0
  x = _conv(64, 3, 1, seed, offset)(inputs)
  x = layers.ReLU()(_group_norm(64, groups)(x))
  for stage, filters in enumerate((64, 128, 256, 512)):
    for block in range(2):
      strides = 2 if (stage > 0 and block == 0) else 1
      shortcut = x
      offset += 3
      y = _conv(filters, 3, strides, seed, offset)(x)
      y = layers.ReLU()(_group_norm(filters, groups)(y))
      y = _conv(filters, 3, 1, seed, offset + 1)(y)
      y = _group_norm(filters, groups)(y)
      if strides != 1 or shortcut.shape[-1] != filters:
        shortcut = _conv(filters, 1, strides, seed, offset + 2)(shortcut)
        shortcut = _group_norm(filters, groups)(shortcut)
      x = layers.ReLU()(layers.Add()([y, shortcut]))
  x = layers.GlobalAveragePooling2D()(x)
  outputs = layers.Dense(
    num_classes, kernel_initializer=_init(seed, 999), name='logits'
  )(x)
  return tf.keras.Model(inputs, outputs, name='resnet18_gn')


def create_mlp(
  input_dim: int,
  num_classes: int = 2,
  hidden_units: Sequence[int] = (64, 32),
  seed: Optional[int] = None,
) -> tf.keras.Model:
  """A ReLU MLP for tabular data (the medical tasks) or flattened images.

  Kerkouche et al.'s medical model is in an appendix that is not in our
  copy, so the default (64, 32) hidden units is our choice; Zhang et al.
  2022's 2-layer MLP is `hidden_units=(200,)` on flattened inputs (159,010
  params on 28x28x1 with 10 classes, matching the 159K it quotes).
  """
  layers = tf.keras.layers
  model_layers = [layers.InputLayer(input_shape=(int(input_dim),))]
  for i, units in enumerate(hidden_units):
    model_layers.append(
      layers.Dense(
        units,
        activation='relu',
        kernel_initializer=_init(seed, i),
        name=f'dense{i + 1}',
      )
    )
  model_layers.append(
    layers.Dense(
      num_classes, kernel_initializer=_init(seed, 100), name='logits'
    )
  )
  return tf.keras.Sequential(model_layers, name='mlp')


def create_image_mlp(
  input_shape: Sequence[int],
  num_classes: int,
  hidden_units: Sequence[int] = (200,),
  seed: Optional[int] = None,
) -> tf.keras.Model:
  """Flattens an image and applies `create_mlp` (Zhang et al. 2022's MLP)."""
  flat = 1
  for d in input_shape:
    flat *= int(d)
  mlp = create_mlp(flat, num_classes, hidden_units, seed)
  return tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer(input_shape=tuple(input_shape)),
      tf.keras.layers.Flatten(),
    ]
    + mlp.layers,
    name='image_mlp',
  )
