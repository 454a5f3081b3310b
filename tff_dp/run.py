r"""Runs (or resumes) a federated training job.

Example, DP-FedAvg on Fashion-MNIST at a target (1, 1e-4)-DP:

  python -m tff_dp.run --task=fashion_mnist_iid --method=dp_fedavg \
      --rounds=180 --client_sampling_rate=0.016667 --target_epsilon=1 \
      --delta=1e-4 --clip=1.0 --local_epochs=10 --local_steps=10 \
      --root_output_dir=runs/dp_fedavg

Rerunning the same command after an interruption resumes from the last
checkpoint in --root_output_dir (ledger included).
"""

import dataclasses
import os
import sys
import typing


def _method_from_argv(argv) -> str:
  for i, arg in enumerate(argv):
    if arg.startswith('--method='):
      return arg.split('=', 1)[1]
    if arg == '--method' and i + 1 < len(argv):
      return argv[i + 1]
  return ''


from tff_dp import processes  # noqa: E402  (light: no TensorFlow)

# TFF_DP_JEMALLOC=auto (or a path) runs this process on jemalloc
# (`processes.rerun_under_jemalloc`, README "Memory over long runs"):
# re-executed here, before TensorFlow loads.
# Otherwise glibc's malloc gets a fixed arena count and mmap threshold
# (`processes.tune_glibc_malloc`, TFF_DP_GLIBC_MALLOC=none to skip), set
# while this process has one thread.
_GLIBC_MALLOC = {}
if __name__ == '__main__':
  try:
    processes.rerun_under_jemalloc()
    _GLIBC_MALLOC = processes.tune_glibc_malloc()
  except ValueError as e:
    sys.exit(f'tff_dp.run: {e}')

# DDGauss needs protobuf's pure-Python backend (see
# `tff_dp.aggregators.ddgauss.protobuf_supports_ddgauss`), which must be
# chosen before TensorFlow imports protobuf: decided from argv, here.
if _method_from_argv(sys.argv[1:]) == 'ddgauss':
  os.environ.setdefault('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION', 'python')

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from tff_dp import methods  # noqa: E402
from tff_dp import public_data  # noqa: E402
from tff_dp.methods import options as options_lib  # noqa: E402
from tff_dp import tasks  # noqa: E402
from tff_dp import training  # noqa: E402
from tff_dp import experiment_config  # noqa: E402

_D = training.ExperimentConfig()

_TASK = flags.DEFINE_enum(
  'task', _D.task, sorted(tasks.TASKS), 'Federated task.'
)
_METHOD = flags.DEFINE_enum(
  'method',
  _D.method,
  sorted(methods.METHODS),
  'Training method: '
  + '; '.join(
    f'{k}: {m.description}' for k, m in sorted(methods.METHODS.items())
  ),
)
_ROUNDS = flags.DEFINE_integer('rounds', _D.rounds, 'Federated rounds (>= 1).')
_RATE = flags.DEFINE_float(
  'client_sampling_rate',
  None,
  'Poisson sampling: each client joins a round with this probability, in '
  '(0, 1]. Exclusive with --clients_per_round.',
)
_CLIENTS = flags.DEFINE_integer(
  'clients_per_round',
  None,
  'Fixed-size sampling: this many clients uniformly without replacement. '
  'Default (neither flag): 10 expected clients, Poisson for DP methods.',
)
_NOISE = flags.DEFINE_float(
  'noise_multiplier', None, 'Noise stddev over clip (DP methods, >= 0).'
)
_TARGET_EPS = flags.DEFINE_float(
  'target_epsilon',
  None,
  'Calibrate the noise multiplier to this epsilon '
  'over --rounds (needs --delta).',
)
_DELTA = flags.DEFINE_float(
  'delta', None, 'DP delta in (0, 1); default min(1e-5, 1/N).'
)
_ACCOUNTANT = flags.DEFINE_enum(
  'accountant',
  _D.accountant,
  ['rdp', 'pld'],
  'Accountant used to calibrate the noise.',
)
_CLIP = flags.DEFINE_float(
  'clip', _D.clip, 'L2 clip of client updates (initial if adaptive).'
)
_PUBLIC_BATCH = flags.DEFINE_enum(
  'public_batch',
  _D.public_batch,
  list(public_data.MODES),
  'FL-TOP on image tasks: the public batch that picks the Top-K weights, '
  '10 random EMNIST digits drawn from --seed (seed 004 draws 10 random MNIST '
  'images) or the first digit of each class (runs before issue #24).',
)
_CLIP_PUBLIC = flags.DEFINE_bool(
  'clip_from_public_round',
  _D.clip_from_public_round,
  "Seed 004's clip rule (dp_fedavg, fl_top_dp, fl_basic_dp): replace --clip "
  "by the update norm of one local round (this run's local schedule) on "
  "the server's public batch, trained on the Top-K weights (fl_top_dp), "
  'the median over 100 random K-subsets (fl_basic_dp) or all weights.',
)
_BATCH = flags.DEFINE_integer('batch_size', _D.batch_size, 'Local batch size.')
_EPOCHS = flags.DEFINE_integer(
  'local_epochs', _D.local_epochs, "Local passes over a client's data."
)
_STEPS = flags.DEFINE_integer(
  'local_steps', None, 'Cap on local steps per round (default none).'
)
_CLIENT_LR = flags.DEFINE_float(
  'client_lr', _D.client_lr, 'Client learning rate.'
)
_LR_DECAY = flags.DEFINE_float(
  'client_lr_decay',
  _D.client_lr_decay,
  'Client lr multiplied by this every round (round t: client_lr x '
  'decay^(t-1)), in (0, 1]; seed 001 decays by 0.99. 1: constant.',
)
_MOMENTUM = flags.DEFINE_float(
  'client_momentum', _D.client_momentum, 'Client momentum.'
)
_SERVER_LR = flags.DEFINE_float(
  'server_lr', _D.server_lr, 'Server learning rate.'
)
_SERVER_MOMENTUM = flags.DEFINE_float(
  'server_momentum', _D.server_momentum, 'Server momentum.'
)
_SEED = flags.DEFINE_integer(
  'seed',
  _D.seed,
  'Seed of the public randomness: model initialisation, sketch hashes, '
  "DP-RandAgg/FL-BASIC coordinates, CMP-Fed's V_0. Never the DP noise or "
  'the client sampling (see --noise_seed).',
)
_NOISE_SEED = flags.DEFINE_integer(
  'noise_seed',
  None,
  'Seed of the privacy-relevant randomness (DP noise, client sampling, '
  'local shuffles). Default: unset, drawn from OS entropy and kept only in '
  'the checkpointed server state. Setting it makes the run reproducible '
  'for research, and the DP guarantee then assumes this seed is SECRET '
  'and UNIQUE: whoever knows it can regenerate and subtract the noise, '
  'and two runs of different configurations with one seed reveal a '
  "client's update exactly. A seed already used for another configuration "
  'in the same output tree is refused (--allow_noise_seed_reuse). Use a '
  'large random integer (python -c "import secrets; '
  'print(secrets.randbits(63))"). Its value is never written to the '
  'outputs.',
)
_EVAL_EVERY = flags.DEFINE_integer(
  'eval_every', _D.eval_every, 'Evaluate every N rounds (and the last).'
)
_CKPT_EVERY = flags.DEFINE_integer(
  'checkpoint_every',
  _D.checkpoint_every,
  'Checkpoint every N rounds (and the last).',
)
_CONCURRENCY = flags.DEFINE_integer(
  'max_concurrent_computation_calls',
  _D.max_concurrent_computation_calls,
  "Concurrent client computations in TFF's runtime (-1: no cap).",
)
_THREADS = flags.DEFINE_integer(
  'intra_op_threads',
  _D.intra_op_threads,
  "TF intra-op threads per client computation in TFF's worker (0: TF "
  'default).',
)
_INTER_THREADS = flags.DEFINE_integer(
  'inter_op_threads',
  _D.inter_op_threads,
  "TF inter-op threads of TFF's worker, shared by the concurrent client "
  'computations (0: TF default, one per core).',
)
_DEVICE = flags.DEFINE_string(
  'device',
  None,
  'TF device for client training, e.g. /GPU:0 (default: '
  "TF's placement, the CPU on a CPU machine). Not verified on a GPU "
  'here.',
)
_TASK_OPTIONS = flags.DEFINE_multi_string(
  'task_option',
  [],
  'NAME=VALUE passed to the task loader (repeatable), e.g. '
  'clients_per_unit=100 or server_batch_size=356 for physionet2012 '
  '(ints, floats and strings).',
)
_RELEASE_NON_PRIVATE = flags.DEFINE_boolean(
  'release_non_private_metrics',
  _D.release_non_private_metrics,
  'Also write what the privacy ledger does NOT cover, into the run '
  "folder's non_private/ (metrics.csv, summary.json, tensorboard/, "
  'diagnostics.jsonl): cohort sizes, train loss, client metrics, pre-clip '
  'update norms and fraction clipped, non-finite counts, byte totals and '
  'timings, and test metrics of tasks whose test examples belong to '
  'clients (EMNIST). Default: off, so the run folder holds only the model, '
  'test metrics on data no client holds, epsilon and bytes per client.',
)
_DIAGNOSTICS = flags.DEFINE_boolean(
  'update_diagnostics',
  _D.update_diagnostics,
  'With --release_non_private_metrics: also the pre-clip distribution of '
  'client update norms (mean, std, quantiles, fraction clipped, '
  'diagnostics.jsonl histograms; not DP). Computed only then.',
)
_ALLOW_SEED_REUSE = flags.DEFINE_boolean(
  'allow_noise_seed_reuse',
  _D.allow_noise_seed_reuse,
  'Research only: run even if this --noise_seed was used for a different '
  'configuration in the same output tree (the parent of '
  '--root_output_dir). Two runs with one noise seed let anyone who sees '
  'both subtract the noise: the summary then says the guarantee does not '
  'hold.',
)
_FUSE = flags.DEFINE_boolean(
  'fuse_client_work',
  _D.fuse_client_work,
  "Compile each round through TFF's MapReduceForm so that all of a "
  "client's work is one TensorFlow call (bit-identical results; methods it "
  'cannot express, e.g. CMP-Fed, run as built). Saved 4-10% of an '
  'overhead-bound round here, under 1% of the benchmark round with the '
  'default worker threads.',
)
_CLIP_PROBE = flags.DEFINE_integer(
  'clip_from_fedavg_rounds',
  0,
  'If > 0: set --clip to --clip_fraction of the average update norm of '
  'this many rounds of non-private FedAvg first (seed 003; a tuning step '
  'outside the privacy ledger).',
)
_CLIP_SOURCE = flags.DEFINE_string(
  'clip_source',
  None,
  'How --clip was chosen, if from client data outside the privacy ledger '
  '(e.g. "median update norm of a non-private run"): recorded in '
  "summary.json's privacy.tuning_outside_ledger.",
)
_CLIP_FRACTION = flags.DEFINE_float(
  'clip_fraction', 0.5, 'Fraction of the FedAvg update norm, in (0, 1].'
)
_WORKERS = flags.DEFINE_string(
  'workers',
  None,
  "host:port,... of running TFF worker_binary processes: each round's "
  'clients are split over them (see the README, "Scale-out").',
)
_LOCAL_WORKERS = flags.DEFINE_integer(
  'local_workers',
  0,
  'Start this many worker_binary processes on this machine and split each '
  'round over them (each with --max_concurrent_computation_calls, '
  '--intra_op_threads and --inter_op_threads).',
)
_DATA_DIR = flags.DEFINE_string(
  'data_dir',
  None,
  'Data directory (default: $TFF_DP_DATA_DIR, then '
  '../shared/data next to the repository).',
)
_OUTPUT = flags.DEFINE_string(
  'root_output_dir',
  None,
  'Where metrics.csv, tensorboard/, checkpoints/ '
  'and summary.json go; rerunning resumes from it.',
)


def _option_type(field) -> type:
  """An option's value type (`Optional[float]` -> float)."""
  args = [a for a in typing.get_args(field.type) if a is not type(None)]
  return args[0] if args else field.type


def define_option_flags() -> dict[str, flags.FlagHolder]:
  """One flag per method option (`methods.option_fields`), under the
  option's name, with its help and the methods that take it."""
  holders = {}
  for name, (field, users) in methods.option_fields().items():
    help_ = f'{options_lib.help_of(field)} [{", ".join(users)}]'
    choices = options_lib.choices_of(field)
    kind = _option_type(field)
    if choices is not None:
      holders[name] = flags.DEFINE_enum(
        name, field.default, list(choices), help_
      )
    elif kind is bool:
      holders[name] = flags.DEFINE_bool(name, field.default, help_)
    elif kind is int:
      holders[name] = flags.DEFINE_integer(name, field.default, help_)
    elif kind is float:
      holders[name] = flags.DEFINE_float(name, field.default, help_)
    else:
      raise TypeError(f'Option {name!r}: no flag type for {field.type!r}.')
  return holders


# The methods' options, from their dataclasses (tff_dp/methods/).
_OPTIONS = define_option_flags()


def parse_task_options(options) -> tuple[tuple[str, object], ...]:
  """`['a=1', 'b=x']` -> `(('a', 1), ('b', 'x'))`; raises on a bad item."""
  out = []
  for item in options:
    name, sep, raw = item.partition('=')
    if not sep or not name.strip():
      raise ValueError(f'--task_option must be NAME=VALUE. Found {item!r}.')
    value: object = raw
    for cast in (int, float):
      try:
        value = cast(raw)
        break
      except ValueError:
        pass
    out.append((name.strip(), value))
  return tuple(out)


def config_from_flags() -> training.ExperimentConfig:
  """The run's config; an option flag of another method than --method is
  ignored with a warning (`ExperimentConfig.create`)."""
  takes = {
    f.name
    for f in options_lib.flag_fields(methods.METHODS[_METHOD.value].options)
  }
  method_options = {
    name: holder.value
    for name, holder in _OPTIONS.items()
    if name in takes or holder.present
  }
  return training.ExperimentConfig.create(
    **method_options,
    task=_TASK.value,
    method=_METHOD.value,
    rounds=_ROUNDS.value,
    client_sampling_rate=_RATE.value,
    clients_per_round=_CLIENTS.value,
    noise_multiplier=_NOISE.value,
    target_epsilon=_TARGET_EPS.value,
    delta=_DELTA.value,
    accountant=_ACCOUNTANT.value,
    clip=_CLIP.value,
    public_batch=_PUBLIC_BATCH.value,
    clip_from_public_round=_CLIP_PUBLIC.value,
    batch_size=_BATCH.value,
    local_epochs=_EPOCHS.value,
    local_steps=_STEPS.value,
    client_lr=_CLIENT_LR.value,
    client_momentum=_MOMENTUM.value,
    client_lr_decay=_LR_DECAY.value,
    server_lr=_SERVER_LR.value,
    server_momentum=_SERVER_MOMENTUM.value,
    seed=_SEED.value,
    noise_seed=_NOISE_SEED.value,
    clip_source=_CLIP_SOURCE.value,
    eval_every=_EVAL_EVERY.value,
    checkpoint_every=_CKPT_EVERY.value,
    max_concurrent_computation_calls=_CONCURRENCY.value,
    intra_op_threads=_THREADS.value,
    inter_op_threads=_INTER_THREADS.value,
    device=_DEVICE.value,
    data_dir=_DATA_DIR.value,
    output_dir=_OUTPUT.value,
    task_kwargs=parse_task_options(_TASK_OPTIONS.value),
    workers=_WORKERS.value,
    local_workers=_LOCAL_WORKERS.value,
    release_non_private_metrics=_RELEASE_NON_PRIVATE.value,
    update_diagnostics=_DIAGNOSTICS.value,
    allow_noise_seed_reuse=_ALLOW_SEED_REUSE.value,
    fuse_client_work=_FUSE.value,
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  # SIGTERM (a scheduler, `timeout`, `kill`) stops the job like Ctrl-C:
  # atexit ends the TFF worker; the last checkpoint is kept.
  processes.exit_on_signals()
  logging.info(
    'Memory allocator: %s%s',
    processes.loaded_jemalloc() or 'glibc malloc',
    ''.join(f' {k}={v}' for k, v in _GLIBC_MALLOC.items()),
  )
  try:
    config = config_from_flags()
    config.validate()
    if _CLIP_PROBE.value < 0:
      raise ValueError(
        f'clip_from_fedavg_rounds must be >= 0. Found {_CLIP_PROBE.value!r}.'
      )
    experiment_config.check_output_dir(config.output_dir)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  if _CLIP_PROBE.value:
    try:
      clip = training.clip_from_fedavg(
        config, _CLIP_PROBE.value, _CLIP_FRACTION.value
      )
    except ValueError as e:
      raise app.UsageError(str(e)) from e
    print(
      f'clip = {_CLIP_FRACTION.value:g} x FedAvg mean update norm over '
      f'{_CLIP_PROBE.value} rounds = {clip:.6g}'
    )
    config = dataclasses.replace(
      config,
      clip=clip,
      clip_source=(
        f'{_CLIP_FRACTION.value:g} x the mean update norm of '
        f'{_CLIP_PROBE.value} rounds of non-private FedAvg on client data '
        '(--clip_from_fedavg_rounds; outside the privacy ledger)'
      ),
    )
  summary = training.run_experiment(config)
  final = '  '.join(f'{k} {v:.4f}' for k, v in summary['final'].items())
  eps = ''
  if summary['epsilon_rdp'] is not None:
    eps = (
      f"  epsilon {summary['epsilon_rdp']:.3f} (RDP) "
      f"{summary['epsilon_pld']:.3f} (PLD) at delta {summary['delta']:g}"
    )
  print(f'final: {final}{eps}')


if __name__ == '__main__':
  app.run(main)
