r"""Where the seconds of TFF's client work go: per step, per client, per op.

`benchmarks.round_speed`'s `floor_local` (TFF's client work over the
benchmark's 100 clients, nothing aggregated) is the floor under the
README's job. This benchmark splits it:

1. **Per step and per client** (`--part=clients`): `floor_local` rounds at
   1 and 10 local steps a client, each in a fresh process, on the runner's
   worker settings (3 concurrent client computations) and on one
   computation at a time; the CPU seconds of a round (the process and its
   TFF worker) fitted as `clients x (fixed + steps x per_step)`. The two
   concurrency settings together show how much two cores slow each other's
   steps (memory bandwidth: the dense layer and the momentum update stream
   the 6.4 MB weight matrix several times a step).
2. **Per op** (`--part=ops`): one client step as TFF's model-delta client
   work runs it (`forward_pass`, the gradient, TFF's SGD with momentum
   0.5, the weights assigned), traced by TF's profiler in this process on
   one thread, 50 steps; each op's time grouped by layer and pass.
   This is the `tensorflow` wheel, not TFF's worker build (whose steps
   `benchmarks/plain_tf_loop.py` measured at about 0.8x the wheel's CPU):
   read it for the shares.
3. **Precision** (`--part=precision`): the same Keras step in float32 and
   in Keras's `mixed_bfloat16` policy, alternated, CPU ms a step: the size
   of the one lever left inside a step (the job trains in float32).

  python -m benchmarks.round_anatomy --rounds=3 \
    --output=benchmarks/results/round_anatomy.md

Run it on an otherwise idle machine: the CPU seconds of a step grow when
another process shares the memory bandwidth.
"""

import glob
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

# TF, TFF and Keras at module level: Keras models built after a lazy TF
# import inside absl's app.run fail to trace (as `round_speed` notes).
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

from benchmarks import anatomy_report  # noqa: E402
from benchmarks import results_table  # noqa: E402
from benchmarks import speed_stats  # noqa: E402
from tasks import models  # noqa: E402

_PART = flags.DEFINE_enum(
  'part', 'all', ['all', 'clients', 'ops', 'precision'], 'What to measure.'
)
_ROUNDS = flags.DEFINE_integer(
  'rounds', 3, 'Timed rounds of each floor_local run (after a warm-up).'
)
_STEPS = flags.DEFINE_integer('steps', 50, 'Traced or timed client steps.')
_OUTPUT = flags.DEFINE_string(
  'output', 'benchmarks/results/round_anatomy.md', 'Results markdown file.'
)

MOMENTUM = anatomy_report.MOMENTUM
# (local steps, concurrent calls): the runner's 3, and one at a time.
CLIENT_RUNS = ((1, 3), (10, 3), (1, 1), (10, 1))


def _client_run(steps: int, calls: int, rounds: int) -> dict:
  cmd = [
    sys.executable,
    '-m',
    'benchmarks.round_speed',
    '--mode=floor_local_knobs',
    f'--local_steps={steps}',
    f'--concurrency={calls}',
    f'--client_momentum={MOMENTUM}',
    f'--rounds={rounds}',
  ]
  result = speed_stats.worker_result(
    cmd, f'floor_local at {steps} steps, {calls} calls'
  )
  return {
    'steps': steps,
    'calls': calls,
    'wall_s': statistics.median(result['seconds']),
    'cpu_s': statistics.median(result['cpu_seconds']),
  }


def measure_clients(rounds: int) -> dict:
  """The `floor_local` runs and the per-step / per-client fit per calls."""
  runs = [_client_run(s, c, rounds) for s, c in CLIENT_RUNS]
  fits = {}
  for calls in sorted({c for _, c in CLIENT_RUNS}):
    by_steps = {r['steps']: r for r in runs if r['calls'] == calls}
    per_step, fixed = anatomy_report.fit_client_costs(
      by_steps[1]['cpu_s'], by_steps[10]['cpu_s']
    )
    fits[str(calls)] = {
      'per_step_ms': per_step * 1e3,
      'fixed_per_client_ms': fixed * 1e3,
      'steps_share': 1000 * per_step / by_steps[10]['cpu_s'],
      'cores': by_steps[10]['cpu_s'] / by_steps[10]['wall_s'],
    }
  return {'runs': runs, 'fits': fits}


def _tff_client_step(momentum: float = MOMENTUM):
  """One step of TFF's model-delta client work, as a `tf.function`."""

  rng = np.random.default_rng(0)
  batch = (
    tf.constant(rng.random((10, 28, 28, 1), np.float32)),
    tf.constant(rng.integers(0, 10, 10, dtype=np.int32)),
  )
  spec = tf.nest.map_structure(
    lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), batch
  )
  model = tff.learning.models.from_keras_model(
    models.create_cnn_mcmahan((28, 28, 1), 10, seed=0),
    input_spec=spec,
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
  )
  trainable = tuple(model.trainable_variables)
  optimizer = tff.learning.optimizers.build_sgdm(0.05, momentum=momentum)
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
  state = optimizer.initialize(specs)

  @tf.function
  def step(state):
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    grads = tape.gradient(output.loss, trainable)
    state, updated = optimizer.next(state, trainable, grads)
    for v, u in zip(trainable, updated):
      v.assign(u)
    return state

  return step, state


def measure_ops(steps: int) -> dict:
  """One TFF client step's op times (ms a step), traced on one thread."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top

  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  step, state = _tff_client_step()
  for _ in range(20):  # Trace and warm up.
    state = step(state)
  c0, t0 = time.process_time(), time.perf_counter()
  for _ in range(steps):
    state = step(state)
  cpu_ms = (time.process_time() - c0) / steps * 1e3
  wall_ms = (time.perf_counter() - t0) / steps * 1e3
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    for _ in range(steps):
      state = step(state)
    tf.profiler.experimental.stop()
    (path,) = glob.glob(f'{logdir}/**/*.xplane.pb', recursive=True)
    space = xplane_pb2.XSpace()
    with open(path, 'rb') as f:
      space.ParseFromString(f.read())
  events = []
  for plane in space.planes:
    for line in plane.lines:
      if not line.name.startswith('tf_Compute'):
        continue
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name
        if anatomy_report.is_op_event(name):
          events.append((name, event.duration_ps / 1e9))
  groups = anatomy_report.group_op_times(events, steps)
  return {
    'cpu_ms': cpu_ms,
    'wall_ms': wall_ms,
    'ops_ms': sum(groups.values()),
    'groups': dict(sorted(groups.items(), key=lambda kv: -kv[1])),
  }


def measure_precision(steps: int, cycles: int = 3) -> dict:
  """CPU ms a Keras step in float32 and in mixed_bfloat16, alternated."""

  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  rng = np.random.default_rng(0)
  x = tf.constant(rng.random((10, 28, 28, 1), np.float32))
  y = tf.constant(rng.integers(0, 10, 10))
  loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def make(policy):
    tf.keras.mixed_precision.set_global_policy(policy)
    model = models.create_cnn_mcmahan(seed=0)
    optimizer = tf.keras.optimizers.SGD(0.05, momentum=MOMENTUM)

    @tf.function
    def step():
      with tf.GradientTape() as tape:
        value = loss(y, tf.cast(model(x), tf.float32))
      grads = tape.gradient(value, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for _ in range(10):
      step()
    return step

  policies = ('float32', 'mixed_bfloat16')
  steps_fns = {p: make(p) for p in policies}
  tf.keras.mixed_precision.set_global_policy('float32')
  cpu = {p: [] for p in policies}
  for _ in range(cycles):
    for p in policies:
      c0 = time.process_time()
      for _ in range(steps):
        steps_fns[p]()
      cpu[p].append((time.process_time() - c0) / steps * 1e3)
  return {p: statistics.median(v) for p, v in cpu.items()} | {
    'cycles': {p: v for p, v in cpu.items()}
  }


def main(argv):
  del argv
  start = time.perf_counter()
  part = _PART.value
  result = {}
  if part in ('all', 'clients'):
    result['clients'] = measure_clients(_ROUNDS.value)
  if part in ('all', 'ops'):
    result['ops'] = measure_ops(_STEPS.value)
  if part in ('all', 'precision'):
    result['precision'] = measure_precision(_STEPS.value * 4)
  result['wall_s'] = time.perf_counter() - start
  command = results_table.command_line()
  markdown = anatomy_report.render(
    result, command, results_table.machine(), results_table.today()
  )
  markdown += f'\nThe run took {result["wall_s"]:.0f} s.\n'
  with open(_OUTPUT.value, 'w') as f:
    f.write(markdown)
  json_path = os.path.splitext(_OUTPUT.value)[0] + '.json'
  with open(json_path, 'w') as f:
    json.dump(
      result | {'command': command, 'date': results_table.today()},
      f,
      indent=2,
    )
  print(markdown)


if __name__ == '__main__':
  app.run(main)
