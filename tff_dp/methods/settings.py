"""The settings every run has, each declared once (`RunSettings`).

Each field is a setting: its default, its help, its allowed range and, for
a few, its flag name, the value saved configs without it ran with, and
whether the method builders see it. From these declarations come the absl
flags of `python -m tff_dp.run`, `config.json`, the checks run when a
config is created, and the builders' view (`registry.MethodParams`). A
method's own settings are declared the same way, in its options dataclass
(`options.Options`).
"""

import dataclasses
from typing import Any, Optional

from tff_dp import privacy
from tff_dp.methods import public_data
from tff_dp import tasks as tasks_lib
from tff_dp.tasks import public as public_sets
from tff_dp.methods import options

# Field metadata: the method builders see this setting (`MethodParams`).
BUILDERS = 'builders'
# Field metadata: a resume may change it (`checkpoints.check_same_config`): it
# says where and how fast a run goes, or what it may do, not what it
# computes.
EXECUTION_ONLY = 'execution_only'

# `--noise`'s values, named once: independent noise each round, or noise
# correlated across rounds by banded matrix factorisation or by a buffered
# linear Toeplitz strategy.
IID, BANDED, BLT = 'iid', 'banded', 'blt'
NOISES = (IID, BANDED, BLT)


def _setting(
  default: Any,
  help: str,  # pylint: disable=redefined-builtin
  *,
  builders: bool = False,
  execution_only: bool = False,
  **kwargs,
) -> Any:
  """A run setting (`options.option`), seen by the builders if `builders`."""
  return options.option(
    default,
    help,
    metadata={BUILDERS: builders, EXECUTION_ONLY: execution_only},
    **kwargs,
  )


def _known_task(name, value):
  if value not in tasks_lib.TASKS:
    raise ValueError(
      f'Unknown task {value!r}; choose one of {sorted(tasks_lib.TASKS)}.'
    )


def _method_names() -> tuple[str, ...]:
  # The registry fills in after this module is imported.
  from tff_dp.methods import registry  # pylint: disable=g-import-not-at-top

  return tuple(sorted(registry.METHODS))


def _known_method(name, value):
  if value not in _method_names():
    raise ValueError(
      f'Unknown method {value!r}; choose one of {list(_method_names())}.'
    )


def _concurrency(name, value):
  if (
    isinstance(value, bool)
    or not isinstance(value, int)
    or value == 0
    or value < -1
  ):
    raise ValueError(f'{name} must be -1 (no cap) or >= 1. Found {value!r}.')


def parse_workers(value: Optional[str]) -> list[str]:
  """'h1:p1,h2:p2' -> ['h1:p1', 'h2:p2'] (checked)."""
  if not value:
    return []
  out = []
  for item in value.split(','):
    host, sep, port = item.strip().rpartition(':')
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(
        f'workers must be host:port items with a port in [1, 65535]. '
        f'Found {item!r}.'
      )
    out.append(f'{host}:{int(port)}')
  return out


def _workers(name, value):
  del name
  parse_workers(value)


def parse_task_options(items) -> tuple[tuple[str, object], ...]:
  """`['a=1', 'b=x']` -> `(('a', 1), ('b', 'x'))`; raises on a bad item."""
  out = []
  for item in items:
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


def _public_sets() -> tuple[str, ...]:
  return tuple(sorted(public_sets.SETS))


def parse_layer_names(items, flag: str = 'train_layers') -> tuple[str, ...]:
  """`['dense1,logits', 'conv2']` -> `('dense1', 'logits', 'conv2')`."""
  names = [n.strip() for item in items for n in item.split(',')]
  if not all(names):
    raise ValueError(
      f'--{flag} must be layer names, comma separated. Found {items!r}.'
    )
  if len(set(names)) != len(names):
    raise ValueError(f'--{flag} names a layer twice. Found {items!r}.')
  return tuple(names)


def parse_adapter_layers(items) -> tuple[str, ...]:
  return parse_layer_names(items, 'adapter_layers')


def _bands(name, value):
  if value == 'auto':
    return
  # An int as well as its digits: a config built in Python, or a
  # `round_speed.parse_method` spec (which reads `bands=4` as JSON).
  if isinstance(value, int) and not isinstance(value, bool):
    value = str(value)
  if not (isinstance(value, str) and value.isdigit() and int(value) >= 1):
    raise ValueError(
      f"{name} must be 'auto' or an integer >= 1. Found {value!r}."
    )


_INT1 = options.integer(1)
_INT0 = options.integer(0)
_POSITIVE = options.number(positive=True)
_UNIT = options.interval(0, 1, '(]')
_MOMENTUM = options.interval(0, 1, '[)')


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """The settings every run has (a method's own are in its options).

  Sampling: `client_sampling_rate` (Poisson, each client with probability
  q) or `clients_per_round` (fixed-size, uniform without replacement); if
  neither is set, 10 clients are expected per round (Poisson for private
  methods, fixed-size otherwise). Noise (private methods):
  `noise_multiplier`, or `target_epsilon` with `delta` to calibrate it.
  Each value is checked when the settings are created.
  """

  task: str = _setting(
    'fashion_mnist_iid',
    'Federated task.',
    check=_known_task,
    choices=lambda: tuple(sorted(tasks_lib.TASKS)),
  )
  method: str = _setting(
    'dp_fedavg',
    'Training method (a registry entry, tff_dp/methods/).',
    check=_known_method,
    choices=_method_names,
  )
  rounds: int = _setting(10, 'Federated rounds (>= 1).', check=_INT1)
  client_sampling_rate: Optional[float] = _setting(
    None,
    'Poisson sampling: each client joins a round with this probability, in '
    '(0, 1]. Exclusive with --clients_per_round.',
    check=_UNIT,
  )
  clients_per_round: Optional[int] = _setting(
    None,
    'Fixed-size sampling: this many clients uniformly without replacement. '
    'Default (neither flag): 10 expected clients, Poisson for DP methods.',
    check=_INT1,
  )
  noise_multiplier: Optional[float] = _setting(
    None,
    'Noise stddev over clip (DP methods, >= 0).',
    check=options.number(positive=False),
  )
  target_epsilon: Optional[float] = _setting(
    None,
    'Calibrate the noise multiplier to this epsilon over --rounds (needs '
    '--delta).',
    check=_POSITIVE,
  )
  delta: Optional[float] = _setting(
    None,
    'DP delta in (0, 1); default min(1e-5, 1/N).',
    check=options.interval(0, 1, '()'),
  )
  accountant: str = _setting(
    'rdp',
    'Accountant used to calibrate the noise.',
    choices=('rdp', 'pld'),
  )
  participation: str = _setting(
    'independent',
    'Participation schema. independent: Poisson or fixed-size sampling of '
    'all clients each round. cyclic_poisson: the clients split into '
    '--participation_groups fixed groups (public, by --seed), round t '
    'samples group t mod b, each member with probability b x '
    '--client_sampling_rate (the same expected cohort, on average over '
    'the groups); accounted as '
    'amplified banded MF (banded or iid noise, bands <= groups). cyclic: '
    'the same draws, accounted without amplification (b-min-separation: '
    'any strategy, BLT included). See docs/privacy.md.',
    choices=('independent', 'cyclic_poisson', 'cyclic'),
  )
  participation_groups: Optional[int] = _setting(
    None,
    'Cyclic participation: the number of groups b (>= 1). Default: the '
    "banded strategy's bands (--bands), else required.",
    check=_INT1,
  )
  participation_partition: str = _setting(
    'by_client_id',
    'Cyclic participation: how clients are dealt into groups. '
    "by_client_id: each client's group is a public hash of its id and "
    '--seed alone, so adding or removing a client moves no other client '
    '(the guarantee holds for add/remove-one neighbouring); group sizes '
    'vary (binomial). balanced: a --seed permutation of all clients dealt '
    "round-robin (sizes within one), but every client's group depends on "
    'the population, so the guarantee holds for zero-out neighbouring '
    "only (a client's data replaced by data that contributes nothing, the "
    'population fixed). See docs/privacy.md.',
    choices=privacy.PARTITIONS,
    legacy='balanced',
  )
  noise: str = _setting(
    IID,
    'DP noise across rounds. iid: independent each round (DP-FedAvg). '
    'banded: banded matrix factorisation (--bands), correlated over '
    'rounds, optimised at setup for server SGD with --server_momentum. '
    'blt: buffered linear Toeplitz (--blt_buffers). Correlated noise needs '
    'cyclic --participation and a method that supports it.',
    choices=NOISES,
  )
  bands: str = _setting(
    'auto',
    "--noise=banded's number of bands: an integer >= 1, or auto (the b of "
    'least expected error at --target_epsilon, with b groups under '
    'cyclic_poisson participation, as amplified banded MF picks it).',
    check=_bands,
  )
  blt_buffers: int = _setting(
    2,
    "--noise=blt's number of buffers (>= 1): the noise state holds this "
    'many model-sized vectors.',
    check=_INT1,
  )
  clip: float = _setting(
    1.0,
    'L2 clip of client updates (initial if adaptive).',
    check=_POSITIVE,
    builders=True,
  )
  public_batch: str = _setting(
    'random',
    'FL-TOP on image tasks: the public batch that picks the Top-K weights, '
    '10 random EMNIST digits drawn from --seed (Kerkouche et al. draw 10 '
    'random MNIST images) or the first digit of each class (the '
    'first_per_class rows of benchmarks/results/seed004_fashion.md).',
    choices=public_data.MODES,
    legacy='first_per_class',
    builders=True,
  )
  clip_from_public_round: bool = _setting(
    False,
    "Kerkouche et al.'s clip rule (dp_fedavg, fl_top_dp, fl_basic_dp): "
    "replace --clip by the update norm of one local round (this run's "
    "local schedule) on the server's public batch, trained on the Top-K "
    'weights (fl_top_dp), the median over 100 random K-subsets '
    '(fl_basic_dp) or all weights.',
    builders=True,
  )
  batch_size: int = _setting(
    10, 'Local batch size.', check=_INT1, builders=True
  )
  local_epochs: int = _setting(
    1, "Local passes over a client's data.", check=_INT1, builders=True
  )
  local_steps: Optional[int] = _setting(
    None,
    'Cap on local steps per round (default none).',
    check=_INT1,
    builders=True,
  )
  client_lr: float = _setting(
    0.05, 'Client learning rate.', check=_POSITIVE, builders=True
  )
  client_momentum: float = _setting(
    0.0, 'Client momentum, in [0, 1).', check=_MOMENTUM, builders=True
  )
  client_lr_decay: float = _setting(
    1.0,
    'Client lr multiplied by this every round (round t: client_lr x '
    'decay^(t-1)), in (0, 1]; Guo et al. (CMP-Fed) decay by 0.99. 1: '
    'constant.',
    check=_UNIT,
  )
  server_lr: float = _setting(1.0, 'Server learning rate.', check=_POSITIVE)
  server_momentum: float = _setting(
    0.0, 'Server momentum, in [0, 1).', check=_MOMENTUM
  )
  seed: int = _setting(
    0,
    'Seed of the public randomness: model initialisation, sketch hashes, '
    "DP-RandAgg/FL-BASIC coordinates, CMP-Fed's V_0. Never the DP noise or "
    'the client sampling (see --noise_seed).',
    check=_INT0,
    builders=True,
  )
  noise_seed: Optional[int] = _setting(
    None,
    'Seed of the privacy-relevant randomness (DP noise, client sampling, '
    'local shuffles). Default: unset, drawn from OS entropy and kept only '
    'in the checkpointed server state. Setting it makes the run '
    'reproducible for research, and the DP guarantee then assumes this '
    'seed is SECRET and UNIQUE: whoever knows it can regenerate and '
    'subtract the noise, and two runs of different configurations with one '
    "seed reveal a client's update exactly. A seed already used for "
    'another configuration in the same output tree is refused '
    '(--allow_noise_seed_reuse). Use a large random integer (python -c '
    '"import secrets; print(secrets.randbits(63))"). Its value is never '
    'written to the outputs.',
    check=_INT0,
    builders=True,
  )
  clip_source: Optional[str] = _setting(
    None,
    'How --clip was chosen, if from client data outside the privacy ledger '
    '(e.g. "median update norm of a non-private run"): recorded in '
    "summary.json's privacy.tuning_outside_ledger.",
  )
  eval_every: int = _setting(
    1, 'Evaluate every N rounds (and the last).', check=_INT1
  )
  checkpoint_every: int = _setting(
    10,
    'Checkpoint every N rounds (and the last). Rounds are released '
    '(metrics.csv, TensorBoard, progress lines) N at a time, once the '
    'checkpoint that covers them is on disk.',
    check=_INT1,
  )
  keep_checkpoints: bool = _setting(
    False,
    "Keep the run's secret state (secret/checkpoints/: the learning "
    'state, the ledger, the noise and client-sampling RNG state) after the '
    'run finishes. Default: deleted once the final outputs are written, so '
    'that the run folder holds only what may be released.',
    execution_only=True,
  )
  background_evaluation: bool = _setting(
    True,
    'Evaluate in a child Python process beside training, while the next '
    'round trains (same metrics to the bit; one more process and its '
    "memory). False: evaluate on the training process's main thread "
    'between rounds.',
    execution_only=True,
  )
  max_concurrent_computation_calls: int = _setting(
    3,
    "Concurrent client computations in TFF's runtime (-1: no cap).",
    check=_concurrency,
    execution_only=True,
  )
  intra_op_threads: int = _setting(
    1,
    "TF intra-op threads per client computation in TFF's worker (0: TF "
    'default).',
    check=_INT0,
    execution_only=True,
  )
  inter_op_threads: int = _setting(
    4,
    "TF inter-op threads of TFF's worker, shared by the concurrent client "
    'computations (0: TF default, one per core).',
    check=_INT0,
    execution_only=True,
  )
  device: Optional[str] = _setting(
    None,
    "TF device for client training, e.g. /GPU:0 (default: TF's placement, "
    'the CPU on a CPU machine). Not verified on a GPU here.',
  )
  data_dir: Optional[str] = _setting(
    None,
    'Data directory (default: $TFF_DP_DATA_DIR, then ../shared/data next '
    'to the repository).',
  )
  download: bool = _setting(
    True,
    "When the task's data is not found locally, download its canonical "
    'public source into the Keras cache ($KERAS_HOME/datasets, default '
    '~/.keras/datasets), checksum-verified, as tf.keras.datasets does. '
    '--nodownload (or TFF_DP_NO_DOWNLOAD=1) forbids it: a missing dataset '
    'then ends the job with one line saying where to place it.',
    execution_only=True,
  )
  output_dir: Optional[str] = _setting(
    None,
    'Where metrics.csv, tensorboard/, summary.json and the secret '
    'checkpoints (secret/checkpoints/) go; rerunning resumes from it.',
    flag_name='root_output_dir',
  )
  task_kwargs: tuple[tuple[str, Any], ...] = _setting(
    (),
    'NAME=VALUE passed to the task loader (repeatable), e.g. '
    'clients_per_unit=100 or server_batch_size=356 for physionet2012 '
    '(ints, floats and strings).',
    flag_name='task_option',
    parse=parse_task_options,
  )
  # A warm start on public data (tff_dp.job.public_pretrain).
  public_data: Optional[str] = _setting(
    None,
    'A public set the server may train on at no privacy cost (examples '
    "matching a client's or a test example are removed): "
    'emnist_byclass_test (for --task=emnist with --task_option='
    'drop_nist_test_writers=1), fashion_mnist_opt_in (the '
    'Fashion-MNIST tasks, with --task_option=public_clients=N). See Public '
    'data and partial training in the docs.',
    choices=_public_sets,
  )
  public_pretrain_steps: int = _setting(
    0,
    'Warm start: SGD steps of central training on --public_data before '
    'round 1 (0: start from the seeded initial weights). No privacy cost; '
    "the run's summary records it.",
    check=_INT0,
  )
  public_pretrain_batch_size: int = _setting(
    32, 'Batch size of the warm start (integer >= 1).', check=_INT1
  )
  public_pretrain_lr: float = _setting(
    0.05,
    'Learning rate of the warm start (SGD, momentum 0.9; > 0).',
    check=_POSITIVE,
  )
  initial_weights: Optional[str] = _setting(
    None,
    "Warm start from a user's saved weights: a Keras .weights.h5 / .h5 / "
    '.keras file or an .npz of w0, w1, ... in model.weights order, which '
    'the user states are public (no client data of this run). No privacy '
    "cost; the run's summary records the file and its SHA-256. Not with "
    '--public_pretrain_steps.',
  )
  train_layers: tuple[str, ...] = _setting(
    (),
    'Train only these layers of the model privately, by name (comma '
    "separated or repeated, e.g. dense1,logits; a task model's layers "
    'with weights are named conv1, conv2, dense1, ..., logits); the rest '
    'stay at their initial (or warm-started) weights. Clients clip, noise '
    'and upload only the trained part: d, the noise calibration, the bytes '
    'up and the ledger follow. Default: all layers (with '
    '--adapter_layers: none but the adapters).',
    parse=parse_layer_names,
  )
  adapter_layers: tuple[str, ...] = _setting(
    (),
    'Train low-rank adapters on these Dense or Conv2D layers, by name '
    '(LoRA: y = activation(W x + b + B(A x)), W and b frozen, B starting at '
    'zero); with them only the adapters and --train_layers train. Default: '
    'none.',
    parse=parse_adapter_layers,
  )
  adapter_rank: int = _setting(
    4,
    'Rank of the --adapter_layers adapters (integer >= 1, below each '
    "adapted layer's inputs and outputs; set only with --adapter_layers).",
    check=_INT1,
  )
  release_non_private_metrics: bool = _setting(
    False,
    'Also write what the privacy ledger does NOT cover, into the run '
    "folder's non_private/ (metrics.csv, summary.json, tensorboard/, "
    'diagnostics.jsonl): cohort sizes, train loss, client metrics, pre-clip '
    'update norms and fraction clipped, non-finite counts, byte totals and '
    'timings, and test metrics of tasks whose test examples belong to '
    'clients (EMNIST). Default: off, so the run folder holds only the '
    'model, test metrics on data no client holds, epsilon and bytes per '
    'client.',
    legacy=True,
    builders=True,
  )
  update_diagnostics: bool = _setting(
    True,
    'With --release_non_private_metrics: also the pre-clip distribution of '
    'client update norms (mean, std, quantiles, fraction clipped, '
    'diagnostics.jsonl histograms; not DP). Computed only then.',
    builders=True,
  )
  allow_noise_seed_reuse: bool = _setting(
    False,
    'Research only: run even if this --noise_seed was used for a different '
    'configuration in the same output tree (the parent of '
    '--root_output_dir). Two runs with one noise seed let anyone who sees '
    'both subtract the noise: the summary then says the guarantee does not '
    'hold.',
    execution_only=True,
  )
  workers: Optional[str] = _setting(
    None,
    "host:port,... of running TFF worker_binary processes: each round's "
    'clients are split over them (see the README, "Scale-out").',
    check=_workers,
    execution_only=True,
  )
  local_workers: int = _setting(
    0,
    'Start this many worker_binary processes on this machine and split '
    'each round over them (each with --max_concurrent_computation_calls, '
    '--intra_op_threads and --inter_op_threads).',
    check=_INT0,
    execution_only=True,
  )
  fuse_client_work: bool = _setting(
    False,
    "Compile each round through TFF's MapReduceForm so that all of a "
    "client's work is one TensorFlow call (bit-identical results; methods "
    'it cannot express, e.g. CMP-Fed, run as built).',
    execution_only=True,
  )

  def __post_init__(self):
    options.check_fields(self)


def fields_where(key: str) -> tuple[dataclasses.Field, ...]:
  """The `RunSettings` fields whose metadata `key` is true."""
  return tuple(f for f in dataclasses.fields(RunSettings) if f.metadata[key])


def legacy_defaults() -> dict[str, Any]:
  """What a saved config without the key ran with, for the settings whose
  default changed after runs were recorded."""
  return options.legacy_defaults(RunSettings)
