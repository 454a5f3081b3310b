"""The speed floor: a round's local training in a plain TF loop, no TFF.

One shard process trains its share of the benchmark's cohort (`--shard=k/n`
of the 100 clients `round_speed` draws) exactly as a round does: each
client's own dataset (batch 10, 10 epochs capped at 10 steps, shuffled by
the round), the McMahan CNN reset to the initial weights for every client,
SGD at lr 0.05 (with `--momentum`, as TFF's `build_sgdm`), on
`--threads` intra-op threads and one inter-op thread. Nothing is
aggregated, noised or sent back: it is the floor under any federated round
of the same work.

`--runtime=worker` (the default) runs the loop as one TF computation a
client (a `for` loop over the dataset in a `tf.function`, as TFF's
`DATASET_ITERATOR` loop) in a single-threaded TFF `worker_binary` of this
process: TFF's build of TF, the one every TFF round here runs in. Measured
one after the other on the same 30 clients (ad hoc, three rounds each,
not in a results file), a client's loop took 0.10 CPU seconds there and
0.13 in the `tensorflow` wheel, so a floor in the wheel was no floor: TFF
rounds beat it. `--runtime=python` keeps the
wheel's loop (a `Dataset.reduce` in one `tf.function`, which took 20%
less CPU a client there than a `for` loop, measured the same way).

The process warms up (one round, traced), prints `READY`, then runs one
round per `GO <round>` line on stdin and answers each with a JSON line of
the round's wall and CPU seconds (this process and its worker), so the
caller can start two shards' rounds at the same moment
(`round_speed.run_plain`). `FLOPS` prints the FLOPs of one training step
of one batch (TF's profiler over the traced graph) and `MATMUL` the FLOP/s
of a tight float32 matmul loop, and exits.
"""

import collections
import json
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tensorflow_federated as tff  # noqa: E402

from benchmarks import rss  # noqa: E402
from tff_dp.runtime import contexts  # noqa: E402
from tff_dp import tasks  # noqa: E402
from tff_dp.tasks import task as task_lib  # noqa: E402

_SHARD = flags.DEFINE_string(
  'shard', '0/2', 'k/n: this process trains k-th of n.'
)
_THREADS = flags.DEFINE_integer('threads', 1, 'Intra-op threads.')
_CLIENTS = flags.DEFINE_integer('clients', 100, 'Cohort size (all shards).')
_RUNTIME = flags.DEFINE_enum(
  'runtime',
  'worker',
  ['worker', 'python'],
  "Where the loop runs: a TFF worker_binary (TFF's TF build) or this "
  "process's tensorflow wheel.",
)
_MOMENTUM = flags.DEFINE_float(
  'momentum', 0.0, 'Client SGD momentum (as TFF build_sgdm); 0: plain SGD.'
)
_LR = 0.05


def _sgd_step(variables, grads, accumulators, momentum) -> None:
  """TFF's `build_sgdm` update: a = momentum a + g; v -= lr a (or v -= lr g
  without momentum)."""
  if not momentum:
    for v, g in zip(variables, grads):
      v.assign_sub(_LR * g)
    return
  for v, g, a in zip(variables, grads, accumulators):
    a.assign(momentum * a + g)
    v.assign_sub(_LR * a)


def cohort(num_clients: int) -> tuple:
  """The task and the benchmark's cohort (`round_speed._fashion_clients`)."""
  task = tasks.load_task('fashion_mnist_iid')
  rng = np.random.default_rng(0)
  ids = list(rng.choice(task.train_data.client_ids, num_clients, replace=False))
  return task, ids


def _trainer(model, momentum: float = 0.0):
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  initial = [tf.constant(v.numpy()) for v in model.trainable_variables]
  accumulators = [tf.Variable(tf.zeros_like(w)) for w in initial]

  def step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    _sgd_step(model.trainable_variables, grads, accumulators, momentum)

  def body(num_steps, batch):
    step(batch['x'], batch['y'])
    return num_steps + 1

  @tf.function
  def train_client(dataset):
    for v, w, a in zip(model.trainable_variables, initial, accumulators):
      v.assign(w)
      a.assign(tf.zeros_like(w))
    # `Dataset.reduce`: 20% less CPU a client than a `for` loop over the
    # dataset (AutoGraph's iterator loop) when measured side by side.
    num_steps = dataset.reduce(tf.constant(0), body)
    with tf.control_dependencies([num_steps]):
      return tf.identity(model.trainable_variables[0][0, 0, 0, 0])

  return step, train_client


def _round_data(task, ids, round_num):
  preprocess = tasks.client_preprocess_fn(
    10, num_epochs=10, max_steps=10, seed=round_num
  )
  cd = task.train_data
  return [preprocess(cd.create_tf_dataset_for_client(c)) for c in ids]


def step_flops(model, step, spec) -> int:
  """FLOPs of one training step on one batch (TF profiler, traced graph)."""
  concrete = tf.function(step).get_concrete_function(
    tf.TensorSpec([10, *spec['x'].shape[1:]], spec['x'].dtype),
    tf.TensorSpec([10], spec['y'].dtype),
  )
  del model
  opts = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
  opts['output'] = 'none'
  info = tf.compat.v1.profiler.profile(concrete.graph, options=opts)
  return int(info.total_float_ops)


def matmul_flops_per_second(seconds: float = 5.0, size: int = 512) -> float:
  """FLOP/s of a tight float32 matmul loop on this process's threads."""
  a = tf.random.stateless_normal([size, size], seed=[0, 1])

  @tf.function
  def chain(x, n):
    for _ in tf.range(n):
      x = tf.matmul(x, a) * 1e-3
    return x

  chain(a, tf.constant(2)).numpy()  # Trace.
  n, elapsed = 16, 0.0
  while elapsed < seconds:
    n *= 2
    t0 = time.perf_counter()
    chain(a, tf.constant(n)).numpy()
    elapsed = time.perf_counter() - t0
  return 2 * size**3 * n / elapsed


def _worker_round(task, initial, element_spec, momentum: float = 0.0):
  """`run_round(datasets)`: the same loop as `_trainer`, one TF graph a
  client, mapped over the shard's clients by a TFF computation on this
  process's worker (one scalar of each client's model summed back)."""
  builder = task_lib.zero_initialized_builder(task.model_builder)
  element_type = collections.OrderedDict(
    (k, tff.TensorType(v.dtype.as_numpy_dtype, v.shape))
    for k, v in element_spec.items()
  )

  @tff.tensorflow.computation(tff.SequenceType(element_type))
  def train_client(dataset):
    model = builder()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_variables
    accumulators = [tf.Variable(tf.zeros(v.shape)) for v in variables]

    @tf.function
    def train(dataset):
      for v, w in zip(variables, initial):
        v.assign(w)
      for batch in iter(dataset):
        with tf.GradientTape() as tape:
          loss = loss_fn(batch['y'], model(batch['x'], training=True))
        grads = tape.gradient(loss, variables)
        _sgd_step(variables, grads, accumulators, momentum)
      return tf.identity(variables[0][0, 0, 0, 0])

    return train(dataset)

  @tff.federated_computation(
    tff.FederatedType(tff.SequenceType(element_type), tff.CLIENTS)
  )
  def train_cohort(datasets):
    return tff.federated_sum(tff.federated_map(train_client, datasets))

  return train_cohort


def main(argv):
  tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  if 'MATMUL' in argv[1:]:
    print(json.dumps({'flops_per_second': matmul_flops_per_second()}))
    return
  k, n = (int(p) for p in _SHARD.value.split('/'))
  task, ids = cohort(_CLIENTS.value)
  mine = ids[k::n]
  model = task.model_builder()
  step, train_client = _trainer(model, _MOMENTUM.value)
  spec = next(iter(_round_data(task, mine[:1], 0)[0])).copy()
  if 'FLOPS' in argv[1:]:
    print(json.dumps({'step_flops': step_flops(model, step, spec)}))
    return
  run_round = lambda data: [np.asarray(train_client(d)) for d in data]
  if _RUNTIME.value == 'worker':
    # The shard's clients in one call, two client computations in flight:
    # the next client's dataset is ready while the worker's one thread
    # trains (both share its one inter-op thread), so it never waits.
    contexts.set_simulation_context(
      2, intra_op_threads=_THREADS.value, inter_op_threads=1
    )
    initial = [v.numpy() for v in model.trainable_variables]
    element_spec = _round_data(task, mine[:1], 0)[0].element_spec
    run_round = _worker_round(task, initial, element_spec, _MOMENTUM.value)
  try:
    _serve_rounds(task, mine, run_round)
  finally:
    if contexts.local_worker() is not None:
      contexts.local_worker().stop()


def _serve_rounds(task, mine, run_round) -> None:
  """Warm-up, READY, then one round per `GO <round>` line."""
  run_round(_round_data(task, mine, 0))  # Trace and warm up.
  print('READY', flush=True)
  for line in sys.stdin:
    command = line.split()
    if not command or command[0] != 'GO':
      break
    data = _round_data(task, mine, int(command[1]))
    c0, t0 = rss.cpu_seconds(), time.perf_counter()
    run_round(data)
    wall, cpu = time.perf_counter() - t0, rss.cpu_seconds() - c0
    print(json.dumps({'seconds': wall, 'cpu_seconds': cpu}), flush=True)


if __name__ == '__main__':
  app.run(main)
