"""A run's configuration: `ExperimentConfig` and its validation (every bad
value is named with its allowed range before any data loads)."""

import dataclasses
import pathlib
import tempfile
from typing import Any, Optional


from absl import logging

from tff_dp import methods as methods_lib
from tff_dp import public_data
from tff_dp import tasks as tasks_lib

# Settings that say where and how fast a run goes, or what it may do, not
# what it computes: a resume may change them (`outputs.check_same_config`).
EXECUTION_ONLY = (
  'allow_noise_seed_reuse',
  'fuse_client_work',
  'workers',
  'local_workers',
  'max_concurrent_computation_calls',
  'intra_op_threads',
  'inter_op_threads',
)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """Everything a run depends on; recorded in `summary.json`.

  Sampling: `client_sampling_rate` (Poisson, each client with probability
  q) or `clients_per_round` (fixed-size, uniform without replacement); if
  neither is set, 10 clients are expected per round (Poisson for private
  methods, fixed-size otherwise). Noise (private methods):
  `noise_multiplier`, or `target_epsilon` with `delta` to calibrate it.

  The fields are what every run has; `options` holds the chosen method's
  own (its `Method.options` dataclass, `tff_dp/methods/`). `create` and
  `replace` take both by flag name, and `to_dict` writes both flat, as the
  flags are named.
  """

  task: str = 'fashion_mnist_iid'
  method: str = 'dp_fedavg'
  rounds: int = 10
  client_sampling_rate: Optional[float] = None
  clients_per_round: Optional[int] = None
  noise_multiplier: Optional[float] = None
  target_epsilon: Optional[float] = None
  delta: Optional[float] = None
  accountant: str = 'rdp'
  clip: float = 1.0
  # FL-TOP's public batch on image tasks and seed 004's public-round clip:
  # 10 random EMNIST digits from `seed`, or the first of each class (before
  # #24; public_data.MODES, methods.LEGACY_DEFAULTS).
  public_batch: str = 'random'
  # Seed 004's clip rule: --clip is replaced by the update norm of one local
  # round on the public batch (methods.PUBLIC_ROUND_CLIP_METHODS).
  clip_from_public_round: bool = False
  batch_size: int = 10
  local_epochs: int = 1
  local_steps: Optional[int] = None
  client_lr: float = 0.05
  client_momentum: float = 0.0
  # Seed 001: the local lr "decays at a rate of 0.99 at each round"; 1: none.
  client_lr_decay: float = 1.0
  server_lr: float = 1.0
  server_momentum: float = 0.0
  seed: int = 0
  # None: noise and sampling from OS entropy (secret); see the docstring.
  noise_seed: Optional[int] = None
  # How --clip was chosen, if from client data outside the ledger (recorded
  # in the summary's privacy section), e.g. 'clip_from_fedavg'.
  clip_source: Optional[str] = None
  eval_every: int = 1
  checkpoint_every: int = 10
  max_concurrent_computation_calls: int = 3
  intra_op_threads: int = 1
  inter_op_threads: int = 4
  device: Optional[str] = None
  data_dir: Optional[str] = None
  output_dir: Optional[str] = None
  task_kwargs: tuple[tuple[str, Any], ...] = ()
  # Non-private outputs (cohort sizes, train loss, pre-clip norms,
  # timings, ...) are written to `non_private/` only when True; the
  # default run writes only what the ledger covers (`outputs.split_row`).
  release_non_private_metrics: bool = False
  # With release_non_private_metrics: also the pre-clip update-norm
  # diagnostics (computed only then).
  update_diagnostics: bool = True
  # Research only: let --noise_seed be reused for another configuration in
  # the same output tree (`noise_seeds.check_and_register`); the guarantee
  # then does not hold against anyone who sees both runs.
  allow_noise_seed_reuse: bool = False
  workers: Optional[str] = None
  local_workers: int = 0
  # Compile the round through MapReduceForm: one TF call per client
  # (`tff_dp.fusion`; bit-identical results, falls back when not possible).
  fuse_client_work: bool = False
  # The method's own options (`methods.METHODS[method].options`; None:
  # its defaults). `create` and `replace` take them by flag name.
  options: Optional[methods_lib.options.Options] = None

  def __post_init__(self):
    method = methods_lib.METHODS.get(self.method)
    if method is None:
      return  # `validate` names the unknown method.
    if self.options is None:
      object.__setattr__(self, 'options', method.options())
    elif type(self.options) is not method.options:
      raise ValueError(
        f'Method {self.method!r} takes options '
        f'{method.options.__name__}. Found {type(self.options).__name__}.'
      )

  @classmethod
  def create(cls, **flat) -> 'ExperimentConfig':
    """A config from settings by flag name, the method's options included.

    An option of another method (not of `method`) is ignored with a warning
    that names the methods that take it, as `python -m tff_dp.run` does, so
    that a recorded command keeps running; a name no method knows raises.
    """
    common_names = {f.name for f in dataclasses.fields(cls)} - {'options'}
    common = {k: v for k, v in flat.items() if k in common_names}
    rest = {k: v for k, v in flat.items() if k not in common_names}
    method = methods_lib.METHODS.get(common.get('method', cls.method))
    if method is None:
      return cls(**common)  # `validate` names the unknown method.
    return cls(**common, options=method_options(method, rest))

  def replace(self, **flat) -> 'ExperimentConfig':
    """A copy with settings changed by flag name (see `create`).

    Options the new method shares with the old one are kept.
    """
    changes = dict(flat)
    kept = {}
    method = methods_lib.METHODS.get(changes.get('method', self.method))
    if method is not None:
      names = {f.name for f in methods_lib.options.flag_fields(method.options)}
      kept = {k: v for k, v in self.options_flat().items() if k in names}
    return ExperimentConfig.create(**{**self._common(), **kept, **changes})

  def _common(self) -> dict[str, Any]:
    """The fields every run has, by name (not the method's options)."""
    return {
      f.name: getattr(self, f.name)
      for f in dataclasses.fields(self)
      if f.name != 'options'
    }

  def options_flat(self) -> dict[str, Any]:
    return {} if self.options is None else self.options.to_flat()

  def flat(self) -> dict[str, Any]:
    """Every setting by its flag name (the noise seed's value included)."""
    return {**self._common(), **self.options_flat()}

  def validate(self) -> None:
    """Raises ValueError naming the bad value and its allowed range."""
    if self.task not in tasks_lib.TASKS:
      raise ValueError(
        f'Unknown task {self.task!r}; choose one of '
        f'{sorted(tasks_lib.TASKS)}.'
      )
    if self.method not in methods_lib.METHODS:
      raise ValueError(
        f'Unknown method {self.method!r}; choose one of '
        f'{sorted(methods_lib.METHODS)}.'
      )
    for name in (
      'rounds',
      'batch_size',
      'local_epochs',
      'eval_every',
      'checkpoint_every',
    ):
      check_int(name, getattr(self, name), 1)
    if self.local_steps is not None:
      check_int('local_steps', self.local_steps, 1)
    check_int('seed', self.seed, 0)
    if self.noise_seed is not None:
      check_int('noise_seed', self.noise_seed, 0)
    if self.client_sampling_rate is not None:
      if self.clients_per_round is not None:
        raise ValueError(
          'Set client_sampling_rate (Poisson sampling) or '
          'clients_per_round (fixed-size), not both.'
        )
      q = self.client_sampling_rate
      if not (isinstance(q, (int, float)) and 0 < q <= 1):
        raise ValueError(
          f'client_sampling_rate must be in (0, 1]. Found {q!r}.'
        )
    if self.clients_per_round is not None:
      check_int('clients_per_round', self.clients_per_round, 1)
    for name in ('client_lr', 'server_lr', 'clip'):
      check_float(name, getattr(self, name), positive=True)
    d = self.client_lr_decay
    if not (isinstance(d, (int, float)) and 0 < d <= 1):
      raise ValueError(f'client_lr_decay must be in (0, 1]. Found {d!r}.')
    for name in ('client_momentum', 'server_momentum'):
      v = getattr(self, name)
      if not 0 <= v < 1:
        raise ValueError(f'{name} must be in [0, 1). Found {v!r}.')
    if self.noise_multiplier is not None:
      check_float('noise_multiplier', self.noise_multiplier, positive=False)
      if self.target_epsilon is not None:
        raise ValueError('Set noise_multiplier or target_epsilon, not both.')
    if self.target_epsilon is not None:
      check_float('target_epsilon', self.target_epsilon, positive=True)
      if self.delta is None:
        raise ValueError('target_epsilon needs delta: set --delta in (0, 1).')
    if self.delta is not None and not 0 < self.delta < 1:
      raise ValueError(f'delta must be in (0, 1). Found {self.delta!r}.')
    if self.accountant not in ('rdp', 'pld'):
      raise ValueError(
        f"accountant must be 'rdp' or 'pld'. Found {self.accountant!r}."
      )
    if self.max_concurrent_computation_calls == 0 or (
      self.max_concurrent_computation_calls < -1
    ):
      raise ValueError(
        'max_concurrent_computation_calls must be -1 (no cap) or >= 1. '
        f'Found {self.max_concurrent_computation_calls!r}.'
      )
    check_int('intra_op_threads', self.intra_op_threads, 0)
    check_int('inter_op_threads', self.inter_op_threads, 0)
    parse_workers(self.workers)  # Raises on a bad host:port.
    check_int('local_workers', self.local_workers, 0)
    public_data.check_mode(self.public_batch)
    method = methods_lib.METHODS[self.method]
    self.options.check_run(self)
    if self.clip_from_public_round:
      if not method.public_round_clip:
        raise ValueError(
          'clip_from_public_round is for methods '
          f'{methods_lib.PUBLIC_ROUND_CLIP_METHODS}. Found method='
          f'{self.method!r}.'
        )
      if self.clip_source:
        raise ValueError(
          'Set clip_from_public_round or clip_source, not both: the clip '
          f'comes from one place. Found clip_source={self.clip_source!r}.'
        )
    method.preflight()
    if (
      method.private
      and self.noise_multiplier is None
      and (self.target_epsilon is None)
    ):
      raise ValueError(
        f'Method {self.method!r} is private: set '
        '--noise_multiplier (>= 0) or --target_epsilon with '
        '--delta.'
      )

  def to_dict(self) -> dict[str, Any]:
    """The config as written to config.json and summary.json.

    The noise seed's value is never written: only whether it was given.
    """
    d = self.flat()
    d['task_kwargs'] = dict(self.task_kwargs)
    d['noise_seed'] = noise_seed_status(self.noise_seed)
    return d


def method_options(method, flat: dict[str, Any]):
  """`method`'s options from settings by flag name (see `create`)."""
  known = methods_lib.option_fields()
  names = {f.name for f in methods_lib.options.flag_fields(method.options)}
  unknown = sorted(set(flat) - set(known))
  if unknown:
    raise ValueError(
      f'Unknown setting(s) {unknown}: not a common setting and not an '
      'option of any method.'
    )
  for name in sorted(set(flat) - names):
    logging.warning(
      '%s is an option of %s, not of method %r: ignored.',
      name,
      ', '.join(known[name][1]),
      method.name,
    )
  return method.options(**{k: v for k, v in flat.items() if k in names})


def noise_seed_status(noise_seed: Optional[int]) -> str:
  """What the outputs say of the noise seed (never its value)."""
  if noise_seed is None:
    return 'secret: drawn from OS entropy, kept only in the server state'
  return (
    'given by --noise_seed (reproducible research run): the guarantee '
    'assumes this seed is kept secret and used for no other configuration'
  )


def check_int(name, value, minimum):
  """Raises ValueError unless `value` is an integer >= `minimum`."""
  methods_lib.options.integer(minimum)(name, value)


def check_float(name, value, *, positive):
  """Raises ValueError unless `value` is finite and > 0 (or >= 0)."""
  methods_lib.options.number(positive=positive)(name, value)


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


def check_output_dir(path: Optional[str]) -> Optional[pathlib.Path]:
  """Creates `path` and proves it writable, or raises ValueError."""
  if not path:
    return None
  out = pathlib.Path(path)
  try:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out, prefix='.write_test'):
      pass
  except OSError as e:
    raise ValueError(
      f'root_output_dir {str(out)!r} is not writable: {e}. '
      'Choose a directory you can write to.'
    ) from e
  return out
