"""A plain TF training loop over Fashion-MNIST examples: the speed floor.

One process trains the McMahan CNN with SGD on `--examples` examples at
`--batch_size`, in a compiled `tf.function` step, with `--threads` intra-op
threads, and prints the seconds of the loop as JSON. Two of these side by
side, one thread each, over 5,000 examples each, are the 2-core floor of a
100-client x 10-step x batch-10 round.
"""

import json
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tff_dp.tasks import fashion_mnist  # noqa: E402
from tff_dp.tasks import models  # noqa: E402

_EXAMPLES = flags.DEFINE_integer('examples', 5000, 'Examples to train on.')
_BATCH = flags.DEFINE_integer('batch_size', 10, 'Batch size.')
_THREADS = flags.DEFINE_integer('threads', 1, 'Intra-op threads.')


def main(argv):
  del argv
  tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  x, y, _, _ = fashion_mnist.load_arrays()
  n = _EXAMPLES.value
  x = x[:n, ..., None].astype(np.float32) / 255.0
  y = y[:n].astype(np.int32)
  model = models.create_cnn_mcmahan(seed=0)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  opt = tf.keras.optimizers.SGD(0.05)

  @tf.function
  def step(xb, yb):
    with tf.GradientTape() as tape:
      loss = loss_fn(yb, model(xb, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(_BATCH.value)
  for xb, yb in ds.take(2):  # Trace and warm up.
    step(xb, yb)
  start = time.perf_counter()
  for xb, yb in ds:
    step(xb, yb)
  seconds = time.perf_counter() - start
  json.dump({'seconds': seconds, 'examples': n}, sys.stdout)


if __name__ == '__main__':
  app.run(main)
