"""The method registry: `Method`, what its builders get (`MethodParams`),
and `register`; the techniques register themselves from their modules."""

import dataclasses
from typing import Any, Callable, Mapping, Optional

import dp_accounting
import tensorflow_federated as tff

from tff_dp import communication
from tff_dp.client_works import diagnostics
from tff_dp.methods import options as options_lib

# Settings every run has whose default changed after runs were recorded
# with the old behaviour (a method's own options say theirs in their
# field, `options.option(legacy=...)`). A saved config that lacks one of
# these keys ran with the value here: resuming a run
# (`outputs.check_same_config`) and rebuilding a finished run's aggregator
# (`MethodParams.from_config`) fill missing keys from it, not from today's
# defaults, so that an old run is never resumed or rebuilt with a
# behaviour it did not have.
# Runs recorded before `release_non_private_metrics` existed wrote every
# non-private output.
COMMON_LEGACY_DEFAULTS: dict[str, Any] = {
  'public_batch': 'first_per_class',
  'release_non_private_metrics': True,
}


@dataclasses.dataclass(frozen=True)
class MethodParams:
  """What a method's builders may depend on.

  The run's settings every method may use, and `options`: the chosen
  method's own options (`Method.options`), where its setup also puts what
  it computes (e.g. FL-TOP's Top-K indices).
  """

  num_model_params: int
  expected_clients_per_round: float
  noise_multiplier: float = 0.0
  clip: float = 1.0
  seed: int = 0
  # None: every aggregator draws a secret noise seed (OS entropy).
  noise_seed: Optional[int] = None
  public_batch: str = 'random'
  # Seed 004's clip rule: S from one local round on the public batch
  # (`Method.public_round_clip`); `clip` is then replaced by S in setup.
  clip_from_public_round: bool = False
  # The local schedule (the public round runs it like a client).
  batch_size: int = 10
  local_epochs: int = 1
  local_steps: Optional[int] = None
  client_lr: float = 0.05
  client_momentum: float = 0.0
  # Non-private measurements (update-norm diagnostics, CMP-Fed's client
  # norms) are built only when the run releases them.
  release_non_private_metrics: bool = False
  update_diagnostics: bool = False
  options: options_lib.Options = options_lib.Options()

  @classmethod
  def from_config(
    cls,
    config: Mapping[str, Any],
    *,
    num_model_params: int,
    expected_clients_per_round: float,
    noise_multiplier: float = 0.0,
  ) -> 'MethodParams':
    """The params of a run's flat config (`ExperimentConfig.flat()`, or a
    saved config.json).

    Used by `training.prepare` and to rebuild a finished run's aggregator
    from its saved config, so both take the same path. A key the config
    lacks takes its legacy value where it has one (the behaviour a run
    recorded before the setting existed), else the field's default.
    """
    method = METHODS[config.get('method', 'dp_fedavg')]
    derived = {
      'num_model_params',
      'expected_clients_per_round',
      'noise_multiplier',
      'options',
    }
    common = {}
    for f in dataclasses.fields(cls):
      if f.name in derived:
        continue
      if f.name in config:
        common[f.name] = config[f.name]
      elif f.name in COMMON_LEGACY_DEFAULTS:
        common[f.name] = COMMON_LEGACY_DEFAULTS[f.name]
    # Diagnostics are computed only when released.
    common['update_diagnostics'] = bool(
      common.get('update_diagnostics', False)
      and common.get('release_non_private_metrics', False)
    )
    return cls(
      num_model_params=num_model_params,
      expected_clients_per_round=expected_clients_per_round,
      noise_multiplier=noise_multiplier,
      options=options_lib.from_flat(method.options, config, legacy=True),
      **common,
    )

  def replace_options(self, **changes) -> 'MethodParams':
    return dataclasses.replace(
      self, options=dataclasses.replace(self.options, **changes)
    )


def client_metrics_fn(p: MethodParams):
  """Update-norm diagnostics at `p.clip`, if `p.update_diagnostics`."""
  if not p.update_diagnostics:
    return None
  return diagnostics.update_norm_metrics(p.clip)


def client_angle_metrics_fn(p: MethodParams):
  """Norms and angles to the last global step (`track_global_update`)."""
  if not p.update_diagnostics:
    return None
  return diagnostics.update_norm_metrics(p.clip, with_angle=True)


AggregatorBuilder = Callable[
  [MethodParams],
  Optional[
    tff.aggregators.UnweightedAggregationFactory
    | tff.aggregators.WeightedAggregationFactory
  ],
]


@dataclasses.dataclass(frozen=True)
class Method:
  """A training method.

  Attributes:
    name: Registry key.
    description: One line for `--help` and the summary.
    private: Whether it releases DP events (then a delta is required).
    build_aggregator: `MethodParams -> factory` (None: example-weighted mean).
    upload_bytes: `MethodParams -> bytes` one client uploads per round.
    options: Its options dataclass (`options.Options` if none); its fields
      are the method's flags.
    round_event: `(noise_multiplier, MethodParams) -> DpEvent` of one round
      before sampling: used to calibrate noise, and recorded for methods
      whose aggregator keeps no event in its state.
    event_from_state: Whether the recorded event is read from the
      aggregator state (TFF's `DPAggregatorState.dp_event`).
    extra_download_bytes: Bytes sent down besides the float32 model.
    resolve: `(params, sampling) -> params`, run before the noise is
      calibrated (DDGauss resolves its smallest released cohort here).
    setup: `(params, task, data_dir) -> params`, run once before the
      process is built (FL-TOP selects its Top-K weights here).
    build_client_work: `(params, client_model_fn, client_optimizer) ->
      ClientWorkProcess` for methods that change local training (default:
      TFF's model-delta training).
    preflight: Raises ValueError if this process cannot run the method
      (checked before any data is loaded).
    event_from_measurements: If set, maps the round's aggregator
      measurements to the recorded event (for aggregators whose event
      is read from what ran, e.g. DDGauss's noise scale).
    public_round_clip: Whether it takes `clip_from_public_round` (its
      setup then sets the clip from one local round on public data).
  """

  name: str
  description: str
  private: bool
  build_aggregator: AggregatorBuilder
  upload_bytes: Callable[[MethodParams], int]
  options: type = options_lib.Options
  round_event: Optional[
    Callable[[float, MethodParams], dp_accounting.DpEvent]
  ] = None
  event_from_state: bool = False
  preflight: Callable[[], None] = lambda: None
  resolve: Optional[Callable[[MethodParams, Any], MethodParams]] = None
  setup: Optional[
    Callable[[MethodParams, Any, Optional[str]], MethodParams]
  ] = None
  build_client_work: Optional[Callable[[MethodParams, Callable, Any], Any]] = (
    None
  )
  extra_download_bytes: Callable[[MethodParams], int] = lambda p: 0
  event_from_measurements: Optional[
    Callable[[Mapping[str, Any]], dp_accounting.DpEvent]
  ] = None
  public_round_clip: bool = False

  def download_bytes(self, params: MethodParams) -> int:
    """The global model, float32, broadcast to each participant."""
    return communication.dense_float32_bytes(
      params.num_model_params
    ) + self.extra_download_bytes(params)

  def cost(self, params: MethodParams) -> communication.CommunicationCost:
    return communication.CommunicationCost(
      self.download_bytes(params), self.upload_bytes(params)
    )


def dense_upload(p: MethodParams) -> int:
  return communication.dense_float32_bytes(p.num_model_params)


def weighted_dense_upload(p: MethodParams) -> int:
  # The update and its example-count weight.
  return communication.dense_float32_bytes(p.num_model_params + 1)


def gaussian(z: float, p: MethodParams) -> dp_accounting.DpEvent:
  del p
  return dp_accounting.GaussianDpEvent(z)


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
  if method.name in METHODS:
    raise ValueError(f'Method {method.name!r} is already registered.')
  if not (
    isinstance(method.options, type)
    and issubclass(method.options, options_lib.Options)
  ):
    raise TypeError(
      f'Method {method.name!r}: options must be an options.Options '
      f'dataclass. Found {method.options!r}.'
    )
  METHODS[method.name] = method
  return method


def option_fields() -> dict[str, tuple[dataclasses.Field, list[str]]]:
  """Every method option: name -> (its field, the methods that take it).

  An option two methods share (e.g. through a common base class) is one
  field; two different fields under one name are an error.
  """
  out: dict[str, tuple[dataclasses.Field, list[str]]] = {}
  for name, method in sorted(METHODS.items()):
    for f in options_lib.flag_fields(method.options):
      if f.name in out:
        seen, users = out[f.name]
        if seen is not f and (
          seen.default != f.default or seen.metadata != f.metadata
        ):
          raise ValueError(
            f'Option {f.name!r} is declared twice, differently (methods '
            f'{users} and {name!r}): declare it once and share the class.'
          )
        users.append(name)
      else:
        out[f.name] = (f, [name])
  return out


def legacy_defaults() -> dict[str, Any]:
  """Every setting's legacy value (see `COMMON_LEGACY_DEFAULTS`)."""
  out = dict(COMMON_LEGACY_DEFAULTS)
  for method in METHODS.values():
    out.update(options_lib.legacy_defaults(method.options))
  return out
