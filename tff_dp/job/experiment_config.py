"""A run's configuration: `ExperimentConfig` and its validation (every bad
value is named with its allowed range before any data loads)."""

import dataclasses
import json
import pathlib
import tempfile
from typing import Any, Optional


from absl import logging

from tff_dp import methods as methods_lib
from tff_dp.job import noise_plan
from tff_dp.methods import settings

# Settings that say where and how fast a run goes, or what it may do, not
# what it computes: a resume may change them (`checkpoints.check_same_config`).
EXECUTION_ONLY = tuple(
  f.name for f in settings.fields_where(settings.EXECUTION_ONLY)
)

# 'h1:p1,h2:p2' -> ['h1:p1', 'h2:p2'], checked (the --workers setting).
parse_workers = settings.parse_workers


class ConfigError(ValueError):
  """A run refused before training for the user's error: a bad setting, an
  output directory that holds a run with other settings or released rounds
  that no readable checkpoint covers, or a noise seed registered for another
  configuration. `python -m tff_dp.run` prints its message as one line."""


@dataclasses.dataclass(frozen=True)
class ExperimentConfig(settings.RunSettings):
  """Everything a run depends on; recorded in `summary.json`.

  The settings every run has (`settings.RunSettings`, each declared once
  there with its default, help and check) and `options`: the chosen
  method's own (its `Method.options` dataclass, `tff_dp/methods/`).
  `create` and `replace` take both by flag name, and `to_dict` writes both
  flat, as the flags are named. Each value is checked on creation; the
  checks that join several settings run in `validate`.
  """

  # The method's own options (`methods.METHODS[method].options`; None:
  # its defaults). `create` and `replace` take them by flag name.
  options: Optional[methods_lib.options.Options] = None

  def __post_init__(self):
    super().__post_init__()
    method = methods_lib.METHODS[self.method]
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
      return cls(**common)  # Raises, naming the unknown method.
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

  def validate(self) -> 'ExperimentConfig':
    """Checks the settings that depend on each other; returns the config.

    Each value on its own is checked when the config is created; this
    raises ValueError naming the values that do not go together, and runs
    the method's own run checks and preflight.
    """
    if self.client_sampling_rate is not None and (
      self.clients_per_round is not None
    ):
      raise ValueError(
        'Set client_sampling_rate (Poisson sampling) or '
        'clients_per_round (fixed-size), not both.'
      )
    if self.noise_multiplier is not None and self.target_epsilon is not None:
      raise ValueError('Set noise_multiplier or target_epsilon, not both.')
    if self.target_epsilon is not None and self.delta is None:
      raise ValueError('target_epsilon needs delta: set --delta in (0, 1).')
    method = methods_lib.METHODS[self.method]
    noise_plan.check(self)
    if self.noise != settings.IID and not (
      method.private and method.correlated_noise
    ):
      supported = sorted(
        name for name, m in methods_lib.METHODS.items() if m.correlated_noise
      )
      raise ValueError(
        f'--noise={self.noise} is not supported by method {self.method!r}; '
        f'methods with correlated noise: {supported}.'
      )
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
    if self.public_data is not None and not self.public_pretrain_steps:
      raise ValueError(
        f'public_data={self.public_data!r} is used only by a warm start: '
        'set --public_pretrain_steps >= 1 too.'
      )
    if self.adapter_rank != 4 and not self.adapter_layers:
      raise ValueError(
        f'adapter_rank applies only with --adapter_layers. Found '
        f'adapter_rank={self.adapter_rank!r} and no adapter layers.'
      )
    if self.initial_weights is not None and self.public_pretrain_steps:
      raise ValueError(
        'Set one warm start: --initial_weights or --public_pretrain_steps, '
        f'not both. Found initial_weights={self.initial_weights!r}, '
        f'public_pretrain_steps={self.public_pretrain_steps!r}.'
      )
    if self.public_pretrain_steps and self.public_data is None:
      raise ValueError(
        'public_pretrain_steps needs public data to train on: set '
        f'--public_data. Found public_pretrain_steps='
        f'{self.public_pretrain_steps!r}.'
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
    return self

  def to_dict(self) -> dict[str, Any]:
    """The config as written to config.json and summary.json.

    The noise seed's value is never written: only whether it was given.
    """
    d = self.flat()
    d['task_kwargs'] = dict(self.task_kwargs)
    d['noise_seed'] = noise_seed_status(self.noise_seed)
    return d


def with_settings_added_since(saved: dict[str, Any]) -> dict[str, Any]:
  """A config dict saved by an earlier version (`to_dict`, JSON-read), with
  every setting added since filled in as that run had it: its legacy value
  where the new default changed the behaviour, else today's default (see
  `methods.LEGACY_DEFAULTS`). Keys already in `saved` are kept as saved.

  A resume (`checkpoints.check_same_config`) and the noise-seed registry
  (`noise_seeds`) compare a saved configuration through this, so a setting
  added after a run started is not taken for a change of configuration.
  """
  defaults = json.loads(
    json.dumps(ExperimentConfig(method=saved['method']).to_dict())
  )
  legacy = json.loads(json.dumps(methods_lib.LEGACY_DEFAULTS))
  out = dict(saved)
  for name, value in defaults.items():
    out.setdefault(name, legacy.get(name, value))
  return out


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
