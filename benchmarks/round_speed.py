r"""Seconds per federated round, ours beside stock TFF and the TF floor.

One Fashion-MNIST round of seed 001: the McMahan CNN (1,663,370 params),
100 clients x 10 local steps x batch 10 (10,000 examples), client SGD at
lr 0.05 with the job's --client_momentum (after --; or --client_momentum)
in every configuration, so all do the same training. Every
configuration runs in its own fresh process, in one invocation; with
--cycles > 1 they alternate (A B C ... A B C ...), so the machine's drift
falls on all of them:

  arith_limit   the round's FLOPs (TF's profiler) over the FLOP/s of two
                single-threaded matmul loops side by side;
  floor_2x1     the same cohort's local training (the same clients,
                datasets, model and steps) as a plain TF loop in two
                processes side by side, each on its own single-threaded
                TFF worker_binary (`benchmarks.plain_tf_loop`), each round
                started in both at once;
  plain_1x2     the same in one plain TF process on 2 threads;
  floor_local   the round's local training alone, on our runner's worker
                and thread settings: TFF's model-delta client work mapped
                over the same cohort (model broadcast, one scalar of each
                update summed back), with no aggregation of the updates,
                no clipping and no noise; the floor under our round in the
                runtime it runs in;
  stock_user    the reference: stock TFF as a user writes it, the loop of
                TFF's tutorials (`run_stock_user`): build_unweighted_fed_avg
                + gaussian_fixed, DATASET_ITERATOR, 2 concurrent calls, a
                fresh random cohort of 100 of 6,000 clients each round, each
                client's dataset built in the loop from the arrays;
  stock_user_fixed, stock_user_pipeline, stock_user_threads
                stock_user with one thing changed: the same 100 clients
                every round; our task loader's datasets; our runner's worker
                settings;
  stock_default tff.learning.algorithms.build_unweighted_fed_avg +
                DifferentiallyPrivateFactory.gaussian_fixed, TFF defaults;
  stock_tuned   the same with LoopImplementation.DATASET_ITERATOR and
                max_concurrent_computation_calls=2;
  stock_threads stock_tuned with our runner's worker settings instead (3
                concurrent calls, 1 intra-op and 4 inter-op threads): how
                much of our gain is the thread settings alone;
  ours_readme   what a user gets: `python -m tff_dp.run` with the job flags
                given after `--` (`make bench-speed` passes `make run`'s:
                Poisson cohorts of 100 expected clients, evaluation every
                5 rounds, a checkpoint every 10), each of --rounds rounds
                after the first timed from the end of the round before to
                its own end, both read from the job's log lines:
                evaluations and checkpoints count where they fall, and `s
                per 100 clients` normalises each round by its cohort;
  ours_readme_noeval, ours_readme_inline_eval, ours_readme_fixed,
  ours_readme_rare_checkpoints
                ours_readme with one thing changed (`README_VARIANTS`):
                evaluated at the last round only; evaluation on the main
                thread; a fixed-size cohort of 100; checkpointed at the
                last round only;
  ours          `python -m tff_dp.run`'s process for --method (default
                dp_fedavg), as `tff_dp.job.training.prepare` builds it, with
                the stock rows' fixed 100 clients and no diagnostics;
  ours_fused    ours with `--fuse_client_work` (one TF call per client a
                round through MapReduceForm; bit-identical results);
  ours_glibc    ours with the worker on glibc malloc
                (TFF_DP_WORKER_JEMALLOC=none) instead of jemalloc;
  ours_tf_threads  ours with TF's default worker thread pools (intra- and
                inter-op 0: one thread per core each) instead of 1 and 4;
  ours_calls2   ours with 2 concurrent client computations instead of 3;
  workers_1     ours over one local TFF worker_binary (`--local_workers=1`,
                2 concurrent calls): the scale-out path on one worker;
  workers_2     ours split over two local worker_binary processes
                (`--local_workers=2`, 1 concurrent call each: the same 2
                computations at a time as workers_1).

  python -m benchmarks.round_speed --rounds=5 \
      --configs=ours,workers_1,workers_2 \
      --output=benchmarks/results/workers_speed.md

  python -m benchmarks.round_speed --rounds=5 \
      --output=benchmarks/results/round_speed.md

  python -m benchmarks.round_speed --rounds=30 \
      --configs=floor_2x1,stock_default,stock_tuned,ours_readme \
      --output=benchmarks/results/round_speed_readme.md -- <make run's flags>

What a round's time holds: the stock, `ours*` and `floor_local` rounds
are timed from building the cohort's datasets (as a plain loop over TFF
builds them) to the end of `next`; `ours_readme` builds them one round
ahead on a thread, and evaluates in its evaluation process by default
(`--background_evaluation`); the floors' plain TF loops build theirs
before the clock starts.

Reported, per 100 clients: the median over every timed round of every
cycle, each cycle's median, the ratios of the medians to the floor and to
stock_tuned, and the peak RSS of the process and its worker_binary during
the rounds. The run fails when a configuration beats the floor by more
than `speed_stats.FLOOR_TOLERANCE` in every cycle (the floor is then
mis-measured).
"""

import collections
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Optional

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# TF and Keras are imported at module level: Keras models built after a
# lazy TF import inside absl's app.run fail to trace (seen with TF 2.14).
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

from benchmarks import job_watch  # noqa: E402
from benchmarks import speed_stats  # noqa: E402
from benchmarks import results_table  # noqa: E402
from benchmarks import rss  # noqa: E402
from tff_dp.runtime import composition  # noqa: E402
from tff_dp.runtime import contexts  # noqa: E402
from tff_dp import tasks  # noqa: E402
from tff_dp.job import training  # noqa: E402

_MODE = flags.DEFINE_string(
  'mode', 'all', 'all, or one configuration (a ' 'worker process).'
)
_METHOD = flags.DEFINE_string(
  'method',
  'dp_fedavg',
  'Our method to time, optionally with config overrides: '
  "'name:field=value[+field=value]' (e.g. fetchsgd:sketch_hashing=block).",
)
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Measured rounds (after warm-up).')
_CONCURRENCY = flags.DEFINE_integer(
  'concurrency',
  training.ExperimentConfig.max_concurrent_computation_calls,
  'Our max_concurrent_computation_calls.',
)
_INTER = flags.DEFINE_integer(
  'inter_op_threads',
  training.ExperimentConfig.inter_op_threads,
  "Our worker's TF inter-op threads.",
)
_OUTPUT = flags.DEFINE_string(
  'output', 'benchmarks/results/round_speed.md', 'Results markdown file.'
)
_MOMENTUM = flags.DEFINE_float(
  'client_momentum',
  None,
  "Every configuration's client momentum (default: the job's "
  '--client_momentum after --, else 0), so all train alike.',
)
_LOCAL_STEPS = flags.DEFINE_integer(
  'local_steps', 10, "floor_local_knobs' local steps a client."
)
_CYCLES = flags.DEFINE_integer(
  'cycles', 1, 'Times each configuration runs, alternated (mode=all).'
)
_CONFIGS = flags.DEFINE_list(
  'configs',
  'floor_2x1,plain_1x2,stock_default,stock_tuned,stock_threads,ours,ours_fused',
  'Configurations to run (mode=all).',
)

NUM_CLIENTS = 100
NOISE, CLIP = 1.185, 1.0


def _client_optimizer():
  """SGD at lr 0.05, with --client_momentum where it is not 0."""
  return tff.learning.optimizers.build_sgdm(
    0.05, momentum=_MOMENTUM.value or None
  )


def job_momentum(job_flags) -> float:
  """The job's --client_momentum (the last one given), else 0."""
  momentum = 0.0
  for flag in job_flags:
    if flag.startswith('--client_momentum='):
      momentum = float(flag.split('=', 1)[1])
  return momentum


def _time_rounds(process, state, make_data, rounds):
  """Rounds of `process`, each timed from building its cohort's datasets
  (`make_data`, as a plain loop over TFF does) to the end of `next`."""
  seconds, cpu = [], []
  with rss.PeakRss() as peak:
    for r in range(rounds + 1):
      c0 = rss.cpu_seconds()
      t0 = time.perf_counter()
      data = make_data(r)
      state = process.next(state, data).state
      if r > 0:  # Round 0 traces and warms up.
        seconds.append(time.perf_counter() - t0)
        cpu.append(rss.cpu_seconds() - c0)
      else:
        first = time.perf_counter() - t0
        peak.reset()
  return {
    'seconds': seconds,
    'cpu_seconds': cpu,
    'first_round': first,
    'peak_rss': peak.peak,
  }


def _fashion_clients(seed):
  task = tasks.load_task('fashion_mnist_iid')
  rng = np.random.default_rng(seed)
  ids = list(rng.choice(task.train_data.client_ids, NUM_CLIENTS, replace=False))
  return task, ids


def _set_stock_context(our_threads: bool, calls: Optional[int] = 2) -> None:
  """Stock TFF's local C++ context, with `calls` concurrent computations
  (None: TFF's default), or with our runner's worker settings (its
  concurrent calls, intra-op and inter-op threads) where `our_threads`."""
  ours = training.ExperimentConfig
  if our_threads:  # Read by the worker when it starts.
    os.environ.update(
      contexts.thread_env(ours.intra_op_threads, ours.inter_op_threads)
    )
    if calls is not None:
      calls = ours.max_concurrent_computation_calls
  if calls is None:
    tff.backends.native.set_sync_local_cpp_execution_context()
  else:
    tff.backends.native.set_sync_local_cpp_execution_context(
      max_concurrent_computation_calls=calls
    )


def run_stock(tuned: bool, rounds: int, threads: bool = False) -> dict:
  task, ids = _fashion_clients(0)
  if tuned:
    _set_stock_context(our_threads=threads)
    loop = tff.learning.LoopImplementation.DATASET_ITERATOR
  else:
    _set_stock_context(our_threads=threads, calls=None)
    loop = tff.learning.LoopImplementation.DATASET_REDUCE
  process = tff.learning.algorithms.build_unweighted_fed_avg(
    task.model_fn,
    client_optimizer_fn=_client_optimizer(),
    model_aggregator=tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      NOISE, NUM_CLIENTS, CLIP
    ),
    loop_implementation=loop,
  )
  preprocess = tasks.client_preprocess_fn(
    10, num_epochs=10, max_steps=10, seed=0
  )
  cd = task.train_data

  def make_data(r):
    del r
    return [preprocess(cd.create_tf_dataset_for_client(c)) for c in ids]

  return _time_rounds(process, process.initialize(), make_data, rounds)


# The user's loop (`stock_user`): TFF's tutorials' federation, built by
# hand from the Fashion-MNIST arrays: 6,000 clients of 10 examples each.
USER_CLIENTS = 6000


def run_stock_user(
  rounds: int,
  *,
  fixed_cohort: bool = False,
  our_pipeline: bool = False,
  our_threads: bool = False,
) -> dict:
  """`stock_user`: stock TFF as a user writes it, the reference (#104).

  `build_unweighted_fed_avg` with `gaussian_fixed(1.185, 100, 1.0)`,
  DATASET_ITERATOR, 2 concurrent calls, the CNN from Keras, a fresh random
  cohort of 100 of the 6,000 clients each round, each client's dataset
  built in the loop as `from_tensor_slices((x[idx], y[idx])).repeat(10)
  .batch(10)` from the arrays. Each keyword changes one thing:
  `fixed_cohort` the same 100 clients every round; `our_pipeline` our
  task loader's datasets (`ArrayClientData`, `client_preprocess_fn`'s
  shuffle buffer of 1,000, take(10)); `our_threads` our runner's worker
  settings (3 concurrent calls, 1 intra-op and 4 inter-op threads).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tasks import fashion_mnist  # pylint: disable=g-import-not-at-top
  from tasks import models  # pylint: disable=g-import-not-at-top

  _set_stock_context(our_threads=our_threads)
  rng = np.random.default_rng(0)
  if our_pipeline:
    task = tasks.load_task('fashion_mnist_iid')
    ids = task.train_data.client_ids

    def client_data(c, r):
      preprocess = tasks.client_preprocess_fn(
        10, num_epochs=10, max_steps=10, seed=r
      )
      return preprocess(task.train_data.create_tf_dataset_for_client(ids[c]))

  else:
    x_train, y_train, _, _ = fashion_mnist.load_arrays()
    x = (x_train[..., None] / 255.0).astype(np.float32)
    y = y_train.astype(np.int32)
    parts = np.array_split(rng.permutation(len(y)), USER_CLIENTS)

    def client_data(c, r):
      del r
      idx = parts[c]
      return (
        tf.data.Dataset.from_tensor_slices((x[idx], y[idx]))
        .repeat(10)
        .batch(10)
      )

  input_spec = client_data(0, 0).element_spec

  def model_fn():
    return tff.learning.models.from_keras_model(
      models.create_cnn_mcmahan((28, 28, 1), 10, seed=0),
      input_spec=input_spec,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )

  process = tff.learning.algorithms.build_unweighted_fed_avg(
    model_fn,
    client_optimizer_fn=_client_optimizer(),
    model_aggregator=tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      NOISE, NUM_CLIENTS, CLIP
    ),
    loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )
  fixed = rng.choice(USER_CLIENTS, NUM_CLIENTS, replace=False)

  def make_data(r):
    cohort = (
      fixed
      if fixed_cohort
      else rng.choice(USER_CLIENTS, NUM_CLIENTS, replace=False)
    )
    return [client_data(c, r) for c in cohort]

  return _time_rounds(process, process.initialize(), make_data, rounds)


def parse_method(spec: str) -> tuple[str, dict]:
  """`'name:field=value+field=value'` -> `(name, {field: value})`.

  Values are read as JSON where they parse (numbers, true/false) and kept
  as strings otherwise.
  """
  name, _, rest = spec.partition(':')
  overrides = {}
  for item in filter(None, rest.split('+')):
    field, sep, value = item.partition('=')
    if not sep:
      raise ValueError(f'Expected field=value in {spec!r}; found {item!r}.')
    try:
      overrides[field] = json.loads(value)
    except json.JSONDecodeError:
      overrides[field] = value
  return name, overrides


def run_ours(
  method: str,
  rounds: int,
  concurrency: int,
  local_workers: int = 0,
  fuse: bool = False,
  **settings,
) -> dict:
  """`settings`: ExperimentConfig fields beyond the benchmark's."""
  method, overrides = parse_method(method)
  config = training.ExperimentConfig.create(
    task='fashion_mnist_iid',
    method=method,
    rounds=rounds + 1,
    clients_per_round=NUM_CLIENTS,
    noise_multiplier=NOISE,
    delta=1e-4,
    clip=CLIP,
    batch_size=10,
    local_epochs=10,
    local_steps=10,
    client_lr=0.05,
    client_momentum=_MOMENTUM.value or 0.0,
    max_concurrent_computation_calls=concurrency,
    inter_op_threads=_INTER.value,
    local_workers=local_workers,
    fuse_client_work=fuse,
    update_diagnostics=False,  # Time the method, not the diagnostics.
  )
  config = config.replace(**{**settings, **overrides})
  config.validate()
  prepared = training.prepare(config)
  _, ids = _fashion_clients(0)

  def make_data(r):
    return prepared.round_data(config, ids, r)

  out = _time_rounds(
    prepared.process, prepared.process.initialize(), make_data, rounds
  )
  out['cost'] = {'down': prepared.cost.down, 'up': prepared.cost.up}
  return out


def run_local_floor(
  rounds: int, local_steps: int = 10, calls: Optional[int] = None
) -> dict:
  """`floor_local`: TFF's client work over the cohort, nothing aggregated.

  The same worker, thread settings, client model (zero initializers) and
  loop (DATASET_ITERATOR) as `ours`; the clients' updates stay on the
  worker (one scalar of each is summed back), so what remains is the
  round's local training and the cohort's datasets sent to the worker.
  `local_steps` (batches of 10 a client) and `calls` (concurrent client
  computations; None: the runner's) are `benchmarks.round_anatomy`'s knobs.
  """
  task, ids = _fashion_clients(0)
  ours = training.ExperimentConfig
  contexts.set_simulation_context(
    calls or ours.max_concurrent_computation_calls,
    intra_op_threads=ours.intra_op_threads,
    inter_op_threads=ours.inter_op_threads,
  )
  client_work = tff.learning.templates.build_model_delta_client_work(
    model_fn=task.client_model_fn(),
    optimizer=_client_optimizer(),
    client_weighting=tff.learning.ClientWeighting.UNIFORM,
    loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )
  init_fn = composition.initial_model_weights_computation(task.model_fn)
  next_type = client_work.next.type_signature

  @tff.tensorflow.computation(next_type.result.result.member)
  def first_entry(result):
    return result[0][0][0, 0, 0, 0]

  @tff.federated_computation(next_type.parameter[1], next_type.parameter[2])
  def local_only(weights, data):
    output = client_work.next(client_work.initialize(), weights, data)
    return tff.federated_sum(tff.federated_map(first_entry, output.result))

  @tff.federated_computation(
    tff.FederatedType(init_fn.type_signature.result, tff.SERVER),
    next_type.parameter[2],
  )
  def round_fn(weights, data):
    return local_only(tff.federated_broadcast(weights), data)

  class _LocalOnly:
    def next(self, state, data):
      round_fn(state, data)
      return Output(state)

  Output = collections.namedtuple('Output', ['state'])
  cd = task.train_data

  def make_data(r):
    preprocess = tasks.client_preprocess_fn(
      10, num_epochs=10, max_steps=local_steps, seed=r
    )
    return [preprocess(cd.create_tf_dataset_for_client(c)) for c in ids]

  return _time_rounds(_LocalOnly(), init_fn(), make_data, rounds)


def _start_shards(processes: int, threads: int):
  cmd = [
    sys.executable,
    '-m',
    'benchmarks.plain_tf_loop',
    f'--threads={threads}',
    f'--clients={NUM_CLIENTS}',
    f'--momentum={_MOMENTUM.value or 0.0}',
  ]
  procs = [
    subprocess.Popen(
      [*cmd, f'--shard={k}/{processes}'],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
    )
    for k in range(processes)
  ]
  for proc in procs:  # Each has loaded its clients and traced a round.
    while proc.stdout.readline().strip() != 'READY':
      if proc.poll() is not None:
        raise RuntimeError('A floor shard exited before it was ready.')
  return procs


def run_plain(processes: int, threads: int, rounds: int) -> dict:
  """The floor: the cohort's local training split over `processes` plain
  TF processes (`benchmarks.plain_tf_loop`), each round started in all of
  them at the same moment; a round lasts as long as its slowest shard."""
  procs = _start_shards(processes, threads)
  seconds, cpu = [], []
  try:
    for r in range(1, rounds + 1):
      for proc in procs:
        proc.stdin.write(f'GO {r}\n')
        proc.stdin.flush()
      outs = [json.loads(proc.stdout.readline()) for proc in procs]
      seconds.append(max(o['seconds'] for o in outs))
      cpu.append(sum(o['cpu_seconds'] for o in outs))
  finally:
    for proc in procs:
      proc.stdin.close()
      proc.wait(timeout=60)
  return {
    'seconds': seconds,
    'cpu_seconds': cpu,
    'peak_rss': None,
    'first_round': None,
  }


def run_arith_limit(processes: int = 2) -> dict:
  """The round's FLOPs over the FLOP/s of `processes` single-threaded
  matmul loops side by side: the arithmetic limit under the floor."""
  base = [sys.executable, '-m', 'benchmarks.plain_tf_loop']

  def output(proc):
    return json.loads(proc.communicate()[0].strip().splitlines()[-1])

  flops = subprocess.Popen(
    [*base, '--clients=2', 'FLOPS'], stdout=subprocess.PIPE, text=True
  )
  step_flops = output(flops)['step_flops']
  loops = [
    subprocess.Popen([*base, 'MATMUL'], stdout=subprocess.PIPE, text=True)
    for _ in range(processes)
  ]
  rate = sum(output(proc)['flops_per_second'] for proc in loops)
  # 100 clients x 10 steps of one batch of 10.
  round_flops = step_flops * NUM_CLIENTS * 10
  return {
    'seconds': [round_flops / rate],
    'round_tflop': round_flops / 1e12,
    'gflops_per_second': rate / 1e9,
    'peak_rss': None,
    'first_round': None,
  }


def _worker(mode: str) -> dict:
  if mode == 'floor_2x1':
    return run_plain(2, 1, _ROUNDS.value)
  if mode == 'floor_local':
    return run_local_floor(_ROUNDS.value)
  if mode == 'floor_local_knobs':  # benchmarks.round_anatomy's runs.
    return run_local_floor(
      _ROUNDS.value, _LOCAL_STEPS.value, calls=_CONCURRENCY.value
    )
  if mode == 'plain_1x2':
    return run_plain(1, 2, _ROUNDS.value)
  if mode == 'arith_limit':
    return run_arith_limit()
  if mode == 'stock_default':
    return run_stock(False, _ROUNDS.value)
  if mode == 'stock_tuned':
    return run_stock(True, _ROUNDS.value)
  if mode == 'stock_threads':
    return run_stock(True, _ROUNDS.value, threads=True)
  if mode == 'stock_user':
    return run_stock_user(_ROUNDS.value)
  if mode == 'stock_user_fixed':
    return run_stock_user(_ROUNDS.value, fixed_cohort=True)
  if mode == 'stock_user_pipeline':
    return run_stock_user(_ROUNDS.value, our_pipeline=True)
  if mode == 'stock_user_threads':
    return run_stock_user(_ROUNDS.value, our_threads=True)
  if mode == 'ours':
    return run_ours(_METHOD.value, _ROUNDS.value, _CONCURRENCY.value)
  if mode == 'ours_fused':
    return run_ours(_METHOD.value, _ROUNDS.value, _CONCURRENCY.value, fuse=True)
  if mode == 'ours_glibc':
    os.environ[contexts.WORKER_JEMALLOC_ENV] = 'none'
    return run_ours(_METHOD.value, _ROUNDS.value, _CONCURRENCY.value)
  if mode == 'ours_tf_threads':
    return run_ours(
      _METHOD.value,
      _ROUNDS.value,
      _CONCURRENCY.value,
      intra_op_threads=0,
      inter_op_threads=0,
    )
  if mode == 'ours_calls2':
    return run_ours(_METHOD.value, _ROUNDS.value, 2)
  if mode == 'workers_1':
    return run_ours(_METHOD.value, _ROUNDS.value, 2, local_workers=1)
  if mode == 'workers_2':
    return run_ours(_METHOD.value, _ROUNDS.value, 1, local_workers=2)
  raise app.UsageError(f'Unknown mode {mode!r}')


def _without(flags, name):
  """`flags` less every `--name=...`."""
  return [f for f in flags if not f.startswith(f'--{name}=')]


# `ours_readme` and its variants, each changing one thing in the job's
# flags (the last of a repeated flag wins).
README_VARIANTS = {
  'ours_readme': lambda flags: flags,
  # Evaluated at the last round only.
  'ours_readme_noeval': lambda flags: [*flags, '--eval_every=1000000'],
  'ours_readme_inline_eval': lambda flags: [
    *flags,
    '--nobackground_evaluation',
  ],
  'ours_readme_fixed': lambda flags: [
    *_without(flags, 'client_sampling_rate'),
    f'--clients_per_round={NUM_CLIENTS}',
  ],
  # Checkpointed at the last round only.
  'ours_readme_rare_checkpoints': lambda flags: [
    *flags,
    '--checkpoint_every=1000000',
  ],
}


def run_readme(job_flags, rounds: int) -> dict:
  """`python -m tff_dp.run <job_flags>` for rounds + 1 rounds, fresh.

  A round's seconds run from the end of the round before to its own end,
  both read from the job's log lines (`job_watch.round_ends`): everything
  the job did between them counts (evaluation, checkpoints, files).
  """
  import shutil  # pylint: disable=g-import-not-at-top

  run_dir = 'runs/bench_speed_readme'
  shutil.rmtree(run_dir, ignore_errors=True)
  samples = job_watch.run_job(job_flags, rounds + 1, run_dir)
  ends = job_watch.round_ends(open(f'{run_dir}/job.log').read())
  missing = [r for r in range(1, rounds + 2) if r not in ends]
  if missing:
    raise RuntimeError(f'No end logged for rounds {missing} in {run_dir}.')
  timed = [s for s in samples if s.round > 1]
  # Rows arrive a checkpoint at a time: the CPU used between two rows
  # that arrived apart, over the wall time between them.
  wall = job_watch.wall_per_round(samples)
  cpu = {}
  for prev, cur in zip(samples, samples[1:]):
    readings = (
      cur.python_cpu_s,
      cur.worker_cpu_s,
      prev.python_cpu_s,
      prev.worker_cpu_s,
    )
    if wall.get(cur.round) and None not in readings:
      cpu[cur.round] = (cur.python_cpu_s + cur.worker_cpu_s) - (
        prev.python_cpu_s + prev.worker_cpu_s
      )
  return {
    'cpu_seconds': list(cpu.values()),
    'cpu_wall_seconds': [wall[r] for r in cpu],
    'seconds': [ends[s.round] - ends[s.round - 1] for s in timed],
    'round_seconds': [s.round_seconds for s in timed],
    'train_seconds': [s.train_seconds for s in timed],
    'eval_seconds': [s.eval_seconds or 0.0 for s in timed],
    'clients': [s.sampled_clients for s in timed],
    'background_evaluation': _background_evaluation(job_flags),
    'first_round': samples[0].round_seconds,
    'peak_rss': max(
      (s.python_peak_mb + s.worker_peak_mb) * 2**20 for s in timed
    ),
  }


def _background_evaluation(job_flags) -> bool:
  """The job's --background_evaluation (the last one given; default on)."""
  value = True
  for flag in job_flags:
    if flag == '--nobackground_evaluation':
      value = False
    elif flag == '--background_evaluation':
      value = True
    elif flag.startswith('--background_evaluation='):
      value = flag.split('=', 1)[1].lower() in ('true', '1')
  return value


def _momentum(job_flags) -> float:
  if _MOMENTUM.value is not None:
    return _MOMENTUM.value
  return job_momentum(job_flags)


def _run_config(config: str, job_flags) -> dict:
  """One block of `config`: a fresh process, one warm-up round, then
  --rounds timed rounds."""
  if config in README_VARIANTS:
    if not job_flags:
      raise app.UsageError(f'{config} needs the job flags after --.')
    # make run's process: the timings are read from its log and its
    # released non-private metrics, without the update diagnostics that
    # releasing them would add (make run releases none).
    flags = README_VARIANTS[config](job_flags)
    return run_readme([*flags, '--noupdate_diagnostics'], _ROUNDS.value)
  cmd = [
    sys.executable,
    '-m',
    'benchmarks.round_speed',
    f'--mode={config}',
    f'--rounds={_ROUNDS.value}',
    f'--method={_METHOD.value}',
    f'--concurrency={_CONCURRENCY.value}',
    f'--inter_op_threads={_INTER.value}',
    f'--client_momentum={_momentum(job_flags)}',
  ]
  return speed_stats.worker_result(cmd, config)


def main(argv):
  job_flags = argv[1:]
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  if _MODE.value != 'all':
    result = _worker(_MODE.value)
    print('RESULT ' + json.dumps(result))
    return
  blocks: dict[str, list[dict]] = {c: [] for c in _CONFIGS.value}
  start = time.perf_counter()
  # A B C ... A B C ...: the machine's drift falls on every configuration.
  for cycle in range(_CYCLES.value):
    for config in _CONFIGS.value:
      blocks[config].append(_run_config(config, job_flags))
      med = statistics.median(speed_stats.per100(blocks[config][-1]))
      print(f'cycle {cycle + 1} {config}: median {med:.2f} s', flush=True)
  stats = speed_stats.summarize(blocks)
  _write_table(stats, blocks, job_flags, time.perf_counter() - start)
  print(json.dumps(stats, indent=2))
  violations = speed_stats.floor_violations(stats)
  if violations:
    raise RuntimeError(
      'Faster than the 2-core floor in every cycle, so the floor is '
      'mis-measured: ' + '; '.join(violations)
    )


_LABELS = {
  'ours_readme': 'ours_readme (tff_dp.run, the job flags after --)',
  'ours_readme_noeval': 'ours_readme, evaluated at the last round only',
  'ours_readme_inline_eval': 'ours_readme, evaluation on the main thread',
  'ours_readme_fixed': 'ours_readme, a fixed-size cohort of 100',
  'ours_readme_rare_checkpoints': (
    'ours_readme, checkpointed at the last round only'
  ),
  'stock_user': "stock_user: TFF's tutorials' loop (the reference)",
  'stock_user_fixed': 'stock_user, the same 100 clients every round',
  'stock_user_pipeline': "stock_user on our task loader's datasets",
  'stock_user_threads': "stock_user on our runner's worker settings",
}


def _label(name: str) -> str:
  if name in _LABELS:
    return _LABELS[name]
  if name.startswith(('ours', 'workers')):
    return f'{name} ({_METHOD.value})'
  return name


def _write_table(stats, blocks, job_flags, wall) -> None:
  command = (
    'python -m benchmarks.round_speed '
    f'--rounds={_ROUNDS.value} --cycles={_CYCLES.value} '
    f'--method={_METHOD.value} '
    f'--configs={",".join(_CONFIGS.value)} --output={_OUTPUT.value}'
  )
  if job_flags:
    command += ' -- ' + ' '.join(job_flags)

  def ratio(a, b):
    return (
      round(stats[a]['median'] / stats[b]['median'], 2)
      if (a in stats and b in stats)
      else ''
    )

  rows = {}
  for name, s in stats.items():
    by_cycle = speed_stats.cycle_ratios(stats, 'stock_user', name)
    rows[name] = {
      'configuration': _label(name),
      'median s per 100 clients': round(s['median'], 2),
      'mean s per 100 clients': round(s['mean'], 2),
      'cycle medians min-max': f'{s["min"]:.2f}-{s["max"]:.2f}',
      'cycle medians': ', '.join(f'{m:.2f}' for m in s['cycle_medians']),
      'rounds timed': s['rounds'],
      'cores busy': round(s['cores'], 2) if s['cores'] else '',
      'peak RSS GiB': round(s['peak_rss'] / 2**30, 2) if s['peak_rss'] else '',
      'x floor_2x1': ratio(name, 'floor_2x1'),
      'x floor_local': ratio(name, 'floor_local'),
      'stock_tuned / this': ratio('stock_tuned', name),
      'stock_user / this': ratio('stock_user', name),
      'stock_user / this by cycle': ', '.join(f'{r:.2f}' for r in by_cycle),
      'seed': 0,
      'date': results_table.today(),
      'bench wall s': round(wall, 1),
      'command': command,
    }
  if 'arith_limit' in blocks:
    a = blocks['arith_limit'][0]
    rows['arith_limit']['configuration'] = (
      f'arith_limit ({a["round_tflop"]:.2f} TFLOP a round at '
      f'{a["gflops_per_second"]:.0f} GFLOP/s of 2 matmul loops)'
    )
  phases = speed_stats.job_phases(blocks.get('ours_readme', []))
  results_table.replace_all(
    _OUTPUT.value,
    rows,
    title='Seconds per federated round',
    columns=list(next(iter(rows.values()))),
    notes=(
      'One Fashion-MNIST round of seed 001 (McMahan CNN, 1,663,370 '
      'params; 100 clients x 10 local steps x batch 10 = 10,000 '
      'examples; DP-FedAvg noise 1.185, clip 1; client SGD at lr 0.05 '
      f'with momentum {_momentum(job_flags)} in every configuration, the '
      "job's). Every configuration runs "
      f'in its own fresh process, {_CYCLES.value} times, alternated (A B C '
      "... A B C ...) so the machine's drift falls on all of them; each "
      f'block is one warm-up round and {_ROUNDS.value} timed rounds. The '
      'median is over every timed round of every cycle; min-max is the '
      "spread of the cycles' medians. Seconds are normalised per 100 "
      'clients (`ours_readme` has Poisson cohorts; each of its rounds '
      "runs from the end of the round before to its own in the job's "
      'log, with the checkpoints and evaluations that fall in it, and an '
      "evaluation process's work slows the rounds it overlaps; the mean "
      'counts every round). The stock, `ours*` and `floor_local` rounds '
      'include '
      "building the cohort's datasets; `ours_readme` builds them a round "
      "ahead on a thread; the floors' plain TF loops build theirs before "
      "the clock starts. `floor_2x1` is the same cohort's "
      'local training (the same clients, datasets, model and steps) as a '
      'plain TF loop in two processes side by side, each on its own '
      'single-threaded TFF worker_binary, each round started in both at '
      "once; `floor_local` is TFF's client work alone over the same "
      "cohort on our runner's worker settings (nothing aggregated, "
      "clipped or noised); `arith_limit` is the round's FLOPs (TF "
      'profiler) over the FLOP/s of two single-threaded matmul loops side '
      'by side. `x floor_*` and `stock_tuned / this` are ratios of the '
      f'medians. {phases}Machine: {results_table.machine()}.'
    ),
  )


if __name__ == '__main__':
  app.run(main)
