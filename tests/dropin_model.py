"""The drop-in tests' model of a user's own: a 1-D conv net on 24-step
series (which the project never uses), 3 clients a round of 12 examples
each (`client_data`), and `run_two_rounds`, which runs a process 2 rounds
and checks that the model moved and stayed finite."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


STEPS, FEATURES, CLASSES, CLIENTS = 24, 2, 3, 3
Z = 0.5  # Every private factory's noise multiplier.


def glorot(seed):
  # Seeded, so every test starts from the same model, run after run.
  return tf.keras.initializers.GlorotUniform(seed=seed)


def keras_model():
  layers = tf.keras.layers
  return tf.keras.Sequential(
    [
      layers.InputLayer(input_shape=(STEPS, FEATURES)),
      layers.Conv1D(4, 3, activation='relu', kernel_initializer=glorot(0)),
      layers.GlobalAveragePooling1D(),
      layers.Dense(CLASSES, kernel_initializer=glorot(1)),
    ]
  )


def model_fn():
  return tff.learning.models.from_keras_model(
    keras_model(),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    input_spec=(
      tf.TensorSpec([None, STEPS, FEATURES], tf.float32),
      tf.TensorSpec([None], tf.int32),
    ),
    metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
  )


def client_data():
  rng = np.random.default_rng(0)
  data = []
  for _ in range(CLIENTS):
    x = rng.normal(size=(12, STEPS, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=12).astype(np.int32)
    data.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
  return data


def sgd(lr):
  return tff.learning.optimizers.build_sgdm(lr)


def run_two_rounds(process):
  state = process.initialize()
  before = [np.array(w) for w in process.get_model_weights(state).trainable]
  data = client_data()
  for _ in range(2):
    output = process.next(state, data)
    state = output.state
  after = [np.array(w) for w in process.get_model_weights(state).trainable]
  assert all(np.all(np.isfinite(w)) for w in after)
  moved = sum(float(np.sum(np.abs(a - b))) for a, b in zip(after, before))
  assert moved > 0, 'the model did not move in 2 rounds'
  return state, output.metrics
