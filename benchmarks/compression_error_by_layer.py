r"""Where the linear decode's error lands, layer by layer, against the noise.

The plan (`linear_compression.added_error_share`) bounds the decode's total
squared error on the cohort's mean clipped update mu against the DP
noise's total energy d z^2 C^2 / n^2. The noise spreads evenly over the d
coordinates; the error need not. This measures, on the real Fashion-MNIST
task and the McMahan CNN (seed 001's setting: n = 100 clients of 10
examples, 10 local steps of batch 10, client SGD 0.05 with momentum 0.5,
clip C = 0.5, z = 1.185 for epsilon 1 over 180 rounds), each layer's share
of the decode error over its share of the noise (its d_l z^2 C^2 / n^2):
1 everywhere means the error is spread like the noise. Two model states:
the initial weights and after `--train_steps` steps of centralized SGD
(batch 64, 0.05; about where a private run ends). mu is the mean of one
cohort's clipped updates (no noise); the error is averaged over
`--seeds` draws of S.

  python -m benchmarks.compression_error_by_layer
"""

import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from benchmarks import results_table
from tff_dp.aggregators import linear_compression as lc
from tff_dp.tasks import fashion_mnist

_CLIENTS = flags.DEFINE_integer('clients', 100, 'Cohort size n.')
_CLIP = flags.DEFINE_float('clip', 0.5, 'Clip C of the updates.')
_Z = flags.DEFINE_float(
  'noise_multiplier', 1.1849987189460378, 'z (seed 001, epsilon 1).'
)
_COMPRESSIONS = flags.DEFINE_list('compressions', '100,1000', 'd / b.')
_SEEDS = flags.DEFINE_integer('seeds', 4, 'Draws of S averaged.')
_TRAIN_STEPS = flags.DEFINE_integer(
  'train_steps', 500, 'Centralized SGD steps to the second model state.'
)
_OUTPUT = flags.DEFINE_string(
  'output',
  'benchmarks/results/compression_error_by_layer.md',
  'Results markdown file.',
)

# The CNN's weight tensors, in order (kernels and biases).
_LAYERS = (
  'conv1 kernel',
  'conv1 bias',
  'conv2 kernel',
  'conv2 bias',
  'dense1 kernel',
  'dense1 bias',
  'dense2 kernel',
  'dense2 bias',
)
_SHOWN = ('conv2 kernel', 'dense1 kernel', 'dense2 kernel')


def _local_update(model, loss, x, y, weights):
  model.set_weights(weights)
  opt = tf.keras.optimizers.SGD(0.05, momentum=0.5)
  for _ in range(10):
    with tf.GradientTape() as tape:
      value = loss(y, model(x, training=True))
    grads = tape.gradient(value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
  return [a - b for a, b in zip(model.get_weights(), weights)]


def mean_clipped_update(task, model, weights, rng) -> list[np.ndarray]:
  """mu: the mean of n random clients' updates, each clipped to C."""
  loss = task.loss_builder()
  data = task.train_data
  ids = rng.choice(len(data.client_ids), _CLIENTS.value, replace=False)
  total = [np.zeros_like(w) for w in weights]
  for i in ids:
    x, y = data.client_arrays(data.client_ids[i])
    x = tf.constant(x.astype(np.float32) / 255.0)
    update = _local_update(model, loss, x, tf.constant(y), weights)
    norm = np.sqrt(sum(np.sum(u**2) for u in update))
    scale = min(1.0, _CLIP.value / norm)
    total = [t + scale * u for t, u in zip(total, update)]
  return [t / _CLIENTS.value for t in total]


def error_by_layer(mu, sketch, compression, seeds) -> np.ndarray:
  """Mean over seeds of ||(S^T S mu - mu)_l||^2 for each tensor l."""
  flat = np.concatenate([m.ravel() for m in mu]).astype(np.float32)
  bounds = np.cumsum([0] + [m.size for m in mu])
  s = lc._Sketch(sketch, flat.size, lc.num_rows(flat.size, compression))  # pylint: disable=protected-access
  out = np.zeros(len(mu))
  for seed in range(seeds):
    seed = tf.constant([seed, 11], tf.int64)
    err = s.decode(s.encode(tf.constant(flat), seed), seed).numpy() - flat
    out += [np.sum(err[a:b] ** 2) for a, b in zip(bounds[:-1], bounds[1:])]
  return out / seeds


def _train(task, model, steps):
  data = task.train_data
  xs, ys = zip(*(data.client_arrays(c) for c in data.client_ids))
  x = np.concatenate(xs).astype(np.float32) / 255.0
  y = np.concatenate(ys)
  model.compile(
    optimizer=tf.keras.optimizers.SGD(0.05), loss=task.loss_builder()
  )
  ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(60000, seed=0)
  model.fit(ds.batch(64).take(steps), epochs=1, verbose=0)
  return model.get_weights()


def main(argv):
  del argv
  start = time.perf_counter()
  tf.keras.utils.set_random_seed(0)
  task = fashion_mnist.load_fashion_mnist()
  model = task.model_builder()
  states = {'initial weights': model.get_weights()}
  states[f'after {_TRAIN_STEPS.value} SGD steps'] = _train(
    task, task.model_builder(), _TRAIN_STEPS.value
  )
  rng = np.random.default_rng(0)
  n, c, z = _CLIENTS.value, _CLIP.value, _Z.value
  rows, shares = {}, []
  for state, weights in states.items():
    mu = mean_clipped_update(task, model, weights, rng)
    sizes = np.array([m.size for m in mu])
    d = sizes.sum()
    signal = np.array([np.sum(m**2) for m in mu])
    ratio = np.sqrt(signal.sum()) / c
    noise = sizes * z**2 * c**2 / n**2
    shares.append(
      f'{state} (||mu|| / C = {ratio:.3f}): '
      + ', '.join(
        f'{name} {sizes[i] / d:.2%} of d, {signal[i] / signal.sum():.1%} '
        'of ||mu||^2'
        for i, name in enumerate(_LAYERS)
        if name in _SHOWN
      )
    )
    for compression in _COMPRESSIONS.value:
      for sketch in ('srht', 'srht_interleaved', 'count_sketch'):
        err = error_by_layer(mu, sketch, float(compression), _SEEDS.value)
        row = {
          'model state': state,
          '||mu|| / C': round(ratio, 3),
          'sketch': sketch,
          'compression': compression,
          'b': lc.num_rows(int(d), float(compression)),
          'error / noise: all': round(err.sum() / noise.sum(), 3),
        }
        for i, name in enumerate(_LAYERS):
          if name in _SHOWN:
            row[f'{name}: error / noise'] = round(err[i] / noise[i], 3)
        rows[f'{state}/{sketch}/{compression}'] = row
        print(row, flush=True)
  wall = round(time.perf_counter() - start, 1)
  for row in rows.values():
    row.update(
      seeds=_SEEDS.value,
      date=results_table.today(),
      **{'bench wall s': wall, 'command': results_table.command_line()},
    )
  results_table.replace_all(
    _OUTPUT.value,
    rows,
    title='Linear compression: the decode error by layer, over the noise',
    columns=list(next(iter(rows.values()))),
    notes=__doc__.split('\n\n')[1].replace('\n', ' ')
    + ' Layers: '
    + '; '.join(shares)
    + f'. Machine: {results_table.machine()}.',
  )


if __name__ == '__main__':
  app.run(main)
