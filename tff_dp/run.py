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
from tff_dp.aggregators import cmp_fed  # noqa: E402
from tff_dp.aggregators import count_sketch  # noqa: E402
from tff_dp.aggregators import dp_randagg  # noqa: E402
from tff_dp.aggregators import dpsfl  # noqa: E402
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
_QUANTILE = flags.DEFINE_float(
  'target_unclipped_quantile',
  _D.target_unclipped_quantile,
  'Adaptive clipping target quantile.',
)
_CLIP_LR = flags.DEFINE_float(
  'clip_learning_rate',
  _D.clip_learning_rate,
  'Adaptive clipping learning rate.',
)
_BITS = flags.DEFINE_integer(
  'ddgauss_bits', _D.ddgauss_bits, 'DDGauss bit width of the modular sum.'
)
_MIN_CLIENTS = flags.DEFINE_integer(
  'ddgauss_min_clients',
  None,
  'DDGauss: smallest cohort whose round is released (rounds below it '
  'release a zero update), an integer in [2, expected cohort]. Default: '
  'the cohort under fixed-size sampling, the 1% quantile of the cohort '
  'under Poisson sampling.',
)
_RANDAGG = flags.DEFINE_float(
  'randagg_fraction',
  _D.randagg_fraction,
  'DP-RandAgg: fraction k/d of coordinates sent each round, in (0, 1].',
)
_RANDAGG_SCOPE = flags.DEFINE_enum(
  'randagg_clip_scope',
  _D.randagg_clip_scope,
  list(dp_randagg.CLIP_SCOPES),
  'DP-RandAgg: clip the whole update to --clip before taking its k '
  "coordinates (update, seed 001's baseline) or only the k-vector (payload, "
  'runs before issue #24).',
)
_BLUR_LAMBDA = flags.DEFINE_float(
  'blur_lambda', _D.blur_lambda, 'BLUR: lambda of the proximal hinge (>= 0).'
)
_LUS_SPARSITY = flags.DEFINE_float(
  'lus_sparsity', _D.lus_sparsity, 'LUS: sparsity c = 1 - s/d in [0, 1).'
)
_TOP_K = flags.DEFINE_float(
  'top_k_ratio',
  _D.top_k_ratio,
  'FL-TOP: fraction K/d of weights trained and sent, in (0, 1].',
)
_TOP_K_CLIP = flags.DEFINE_bool(
  'top_k_nonprivate_clip',
  _D.top_k_nonprivate_clip,
  'Non-private FL-TOP/FL-BASIC: clip the K values at --clip and divide by '
  'the expected cohort, as runs before issue #24 did (seed 004 does not '
  'clip them; off by default).',
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
_SKETCH_ROWS = flags.DEFINE_integer(
  'sketch_rows', _D.sketch_rows, 'Count-sketch rows (>= 1; sketch methods).'
)
_SKETCH_COLUMNS = flags.DEFINE_integer(
  'sketch_columns', _D.sketch_columns, 'Count-sketch columns (>= 1).'
)
_SKETCH_K = flags.DEFINE_integer(
  'sketch_k', _D.sketch_k, 'Coordinates recovered per round, in [1, d].'
)
_SKETCH_MOMENTUM = flags.DEFINE_float(
  'sketch_momentum', _D.sketch_momentum, 'Sketch-space momentum in [0, 1).'
)
_SKETCH_HASHING = flags.DEFINE_enum(
  'sketch_hashing',
  _D.sketch_hashing,
  list(count_sketch.HASHINGS),
  'Count-sketch hashes: murmur (per coordinate; reproduces earlier runs) or '
  'block (a cyclic shift and a sign per block of columns coordinates: same '
  'collision probability 1/columns, about 4x cheaper to sketch).',
)
_SKETCH_LR = flags.DEFINE_float(
  'sketch_lr',
  _D.sketch_lr,
  'Sketch methods: the step applied from the momentum sketch to the error '
  "sketch (> 0; FetchSGD's lr; keep --server_lr at 1). With "
  '--sketch_momentum rho the steady step is sketch_lr / (1 - rho).',
)
_DPSFL_P = flags.DEFINE_float(
  'dpsfl_target_probability',
  _D.dpsfl_target_probability,
  'DPSFL-AC: target fraction of clients whose clipping impact on the last '
  'top-k is within --dpsfl_impact_threshold, in (0, 1).',
)
_DPSFL_GAMMA = flags.DEFINE_float(
  'dpsfl_impact_threshold',
  _D.dpsfl_impact_threshold,
  'DPSFL-AC: the clipping-impact bound gamma (> 0).',
)
_DPSFL_BIT_NOISE = flags.DEFINE_float(
  'dpsfl_bit_noise',
  _D.dpsfl_bit_noise,
  "DPSFL-AC: the bit sum's noise stddev (>= 0), composed in the ledger; "
  'default: expected clients per round / 20 (Andrew et al. 2021).',
)
_DPSFL_RULE = flags.DEFINE_enum(
  'dpsfl_impact_rule',
  _D.dpsfl_impact_rule,
  list(dpsfl.IMPACT_RULES),
  "DPSFL-AC's clipping-impact test on the last top-k: relative (clip error "
  '/ norm of the top-k part <= gamma, in (0, 1)) or absolute (clip error <= '
  'gamma; runs before issue #24).',
)
_DPSFL_CLIP_LR = flags.DEFINE_float(
  'dpsfl_clip_lr', _D.dpsfl_clip_lr, 'DPSFL-AC: geometric clip step (> 0).'
)
_CMP_RANK = flags.DEFINE_integer(
  'cmp_rank', _D.cmp_rank, 'CMP-Fed / UV-Fed rank r per layer (>= 1).'
)
_CMP_LAYOUT = flags.DEFINE_enum(
  'cmp_layout',
  _D.cmp_layout,
  list(cmp_fed.LAYOUTS),
  "CMP-Fed/UV-Fed: U on each kernel's output side (out_in, PyTorch's and "
  "PowerSGD's), input side (in_out, runs before issue #24) or smaller side.",
)
_CMP_VECTORS = flags.DEFINE_enum(
  'cmp_vectors_phase',
  _D.cmp_vectors_phase,
  list(cmp_fed.VECTOR_PHASES),
  'CMP-Fed/UV-Fed: the phase whose clipped payload carries the biases: v '
  '(under --cmp_clip_v) or u (under --cmp_clip_u; runs before issue #24).',
)
_CMP_CLIP_U = flags.DEFINE_float(
  'cmp_clip_u', None, 'CMP-Fed phase-1 clip C1 (> 0; default --clip).'
)
_CMP_CLIP_V = flags.DEFINE_float(
  'cmp_clip_v', None, 'CMP-Fed phase-2 clip C2 (> 0; default --clip).'
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
  'for research, and the DP guarantee then assumes this seed is kept '
  'secret: whoever knows it can regenerate and subtract the noise. Its '
  'value is never written to the outputs.',
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
_DIAGNOSTICS = flags.DEFINE_boolean(
  'update_diagnostics',
  _D.update_diagnostics,
  'Log the pre-clip distribution of client update norms (mean, std, '
  'quantiles, fraction clipped; not DP: a simulation diagnostic).',
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
  return training.ExperimentConfig(
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
    target_unclipped_quantile=_QUANTILE.value,
    clip_learning_rate=_CLIP_LR.value,
    ddgauss_bits=_BITS.value,
    ddgauss_min_clients=_MIN_CLIENTS.value,
    randagg_fraction=_RANDAGG.value,
    randagg_clip_scope=_RANDAGG_SCOPE.value,
    blur_lambda=_BLUR_LAMBDA.value,
    lus_sparsity=_LUS_SPARSITY.value,
    top_k_ratio=_TOP_K.value,
    top_k_nonprivate_clip=_TOP_K_CLIP.value,
    public_batch=_PUBLIC_BATCH.value,
    clip_from_public_round=_CLIP_PUBLIC.value,
    sketch_rows=_SKETCH_ROWS.value,
    sketch_columns=_SKETCH_COLUMNS.value,
    sketch_k=_SKETCH_K.value,
    sketch_momentum=_SKETCH_MOMENTUM.value,
    sketch_hashing=_SKETCH_HASHING.value,
    sketch_lr=_SKETCH_LR.value,
    dpsfl_target_probability=_DPSFL_P.value,
    dpsfl_impact_threshold=_DPSFL_GAMMA.value,
    dpsfl_bit_noise=_DPSFL_BIT_NOISE.value,
    dpsfl_clip_lr=_DPSFL_CLIP_LR.value,
    dpsfl_impact_rule=_DPSFL_RULE.value,
    cmp_rank=_CMP_RANK.value,
    cmp_clip_u=_CMP_CLIP_U.value,
    cmp_clip_v=_CMP_CLIP_V.value,
    cmp_layout=_CMP_LAYOUT.value,
    cmp_vectors_phase=_CMP_VECTORS.value,
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
    update_diagnostics=_DIAGNOSTICS.value,
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
