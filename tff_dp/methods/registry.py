"""The method registry: `Method`, what its builders get (`MethodParams`),
and `register`; the techniques register themselves from their modules."""

import dataclasses
from typing import Any, Callable, Mapping, Optional

import dp_accounting
import tensorflow_federated as tff

from tff_dp.methods import communication
from tff_dp.aggregators import correlated_noise
from tff_dp.client_works import diagnostics
from tff_dp.methods import options as options_lib
from tff_dp.methods import settings
from tff_dp.methods import style as style_lib


class _Params:
  """Methods of `MethodParams` (its fields are derived below)."""

  @classmethod
  def from_config(
    cls,
    config: Mapping[str, Any],
    *,
    num_model_params: int,
    expected_clients_per_round: float,
    noise_multiplier: float = 0.0,
    noise_strategy=None,
    num_frozen_params: int = 0,
  ) -> 'MethodParams':
    """The params of a run's flat config (`ExperimentConfig.flat()`, or a
    saved config.json).

    Used by `preparation.prepare` and to rebuild a finished run's
    aggregator from its saved config, so both take the same path. A key the
    config lacks takes its legacy value where it has one (the behaviour a
    run recorded before the setting existed), else the field's default.
    """
    method = METHODS[config.get('method', 'dp_fedavg')]
    legacy = settings.legacy_defaults()
    common = {}
    for f in settings.fields_where(settings.BUILDERS):
      if f.name in config:
        common[f.name] = config[f.name]
      elif f.name in legacy:
        common[f.name] = legacy[f.name]
    return cls(
      num_model_params=num_model_params,
      num_frozen_params=num_frozen_params,
      expected_clients_per_round=expected_clients_per_round,
      noise_multiplier=noise_multiplier,
      noise_strategy=noise_strategy,
      options=options_lib.from_flat(method.options, config, legacy=True),
      **common,
    )

  @property
  def builds_diagnostics(self) -> bool:
    """Whether the non-private update-norm diagnostics are built: only when
    they are released (`update_diagnostics` and
    `release_non_private_metrics`)."""
    return self.update_diagnostics and self.release_non_private_metrics

  def replace_options(self, **changes) -> 'MethodParams':
    return dataclasses.replace(
      self, options=dataclasses.replace(self.options, **changes)
    )


# What a method's builders may depend on: the values resolved for this run
# (the model size, the expected cohort, the noise multiplier and the
# method's options, where its setup also puts what it computes, e.g.
# FL-TOP's Top-K indices), and the run settings marked for the builders
# (`settings.BUILDERS`), with their declared defaults.
MethodParams = dataclasses.make_dataclass(
  'MethodParams',
  [
    ('num_model_params', int),
    ('expected_clients_per_round', float),
    ('noise_multiplier', float, dataclasses.field(default=0.0)),
    # None: iid noise; else the `mf_strategy.Strategy` of --noise.
    ('noise_strategy', Any, dataclasses.field(default=None)),
    # Weights of frozen layers (--train_layers): broadcast, never trained.
    ('num_frozen_params', int, dataclasses.field(default=0)),
    *(
      (f.name, f.type, dataclasses.field(default=f.default))
      for f in settings.fields_where(settings.BUILDERS)
    ),
    (
      'options',
      options_lib.Options,
      dataclasses.field(default=options_lib.Options()),
    ),
  ],
  bases=(_Params,),
  frozen=True,
)
MethodParams.__module__ = __name__
MethodParams.__doc__ = """What a method's builders may depend on.

The run's resolved values (`num_model_params`: the trained weights, d;
`num_frozen_params`: the frozen layers' weights; `expected_clients_per_round`,
`noise_multiplier`, `noise_strategy`: `tff_dp.job.noise_plan`), the run
settings marked for the builders (`settings.BUILDERS`: the clip, seeds,
local schedule, public batch and what is released) and `options`: the
chosen method's own options (`Method.options`), where its setup also puts
what it computes.
"""


def client_metrics_fn(p: MethodParams):
  """Update-norm diagnostics at `p.clip`, if `p.builds_diagnostics`."""
  if not p.builds_diagnostics:
    return None
  return diagnostics.update_norm_metrics(p.clip)


def client_angle_metrics_fn(p: MethodParams):
  """Norms and angles to the last global step (`track_global_update`)."""
  if not p.builds_diagnostics:
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
      before sampling, as planned: used to calibrate the noise. The ledger
      records what the aggregator says it released
      (`tff_dp.aggregators.dp_events.released_event`).
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
    public_round_clip: Whether it takes `clip_from_public_round` (its
      setup then sets the clip from one local round on public data).
    correlated_noise: Whether its aggregator takes `--noise=banded|blt`
      (`MethodParams.noise_strategy`), and its `round_event` says so.
    style: Its label, colour and marker in every plot (`style.Style`).
    ceiling: Whether its runs draw the non-private ceiling in frontier
      plots (FedAvg).
    docs_page: Its page under docs/ (the paper's reading and its results),
      which names the method.
    public_selection: What its `setup` chooses on the server's public
      batch, in words, for the summary's tuning steps ('' if nothing).
    public_round_clip_rule: How its clip from one public round is taken
      beyond the full update's norm, in words ('' for the plain rule).
    reveals_cohort_size: Whether its round reveals the cohort's size
      (secure aggregation's count): a Poisson-sampled run's epsilon then
      rests on an assumption (`privacy.POISSON_COUNT_ASSUMPTION`), and its
      round event is one of `privacy.PUBLIC_COUNT_EVENTS`.
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
  preflight: Callable[[], None] = lambda: None
  resolve: Optional[Callable[[MethodParams, Any], MethodParams]] = None
  setup: Optional[
    Callable[[MethodParams, Any, Optional[str]], MethodParams]
  ] = None
  build_client_work: Optional[Callable[[MethodParams, Callable, Any], Any]] = (
    None
  )
  extra_download_bytes: Callable[[MethodParams], int] = lambda p: 0
  public_round_clip: bool = False
  correlated_noise: bool = False
  style: Optional[style_lib.Style] = None
  ceiling: bool = False
  docs_page: Optional[str] = None
  public_selection: str = ''
  public_round_clip_rule: str = ''
  reveals_cohort_size: bool = False

  def download_bytes(self, params: MethodParams) -> int:
    """The global model, float32, broadcast to each participant (frozen
    layers included: TFF's broadcast sends the whole model each round)."""
    return communication.dense_float32_bytes(
      params.num_model_params + params.num_frozen_params
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
  """`GaussianDpEvent(z)`; with correlated noise (`p.noise_strategy`), the
  round's `MatrixFactorizationDpEvent`."""
  if p.noise_strategy is None:
    return dp_accounting.GaussianDpEvent(z)
  return correlated_noise.MatrixFactorizationDpEvent(
    z, correlated_noise.strategy_json(p.noise_strategy)
  )


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
  """Every setting's legacy value: what a saved config without the key ran
  with (resumes and rebuilt aggregators fill missing keys from it, never
  from today's defaults)."""
  out = settings.legacy_defaults()
  for method in METHODS.values():
    out.update(options_lib.legacy_defaults(method.options))
  return out
