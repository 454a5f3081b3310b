"""Registry of training methods: aggregator, privacy event, bytes.

A method turns `MethodParams` into a model aggregator (and, for techniques
that change local training, a client work), says whether it is private,
how one round's DP event depends on the noise multiplier (for calibration),
and what each participating client uploads. Later technique issues add
entries here; `python -m tff_dp.run --method=...` takes its choices from
`METHODS`.
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import communication
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl
from tff_dp import public_data
from tff_dp.client_works import blur
from tff_dp.client_works import diagnostics
from tff_dp.client_works import fl_top
from tff_dp.client_works import lus
from tff_dp.client_works import model_clip
from tff_dp import tasks as tasks_lib


# Settings whose default changed after runs were recorded with the old
# behaviour, and settings added with a default that is not the behaviour
# runs had before them: a saved config that lacks one of these keys ran with
# the value here. Resuming a run (`outputs.check_same_config`) and
# rebuilding a finished run's aggregator (`MethodParams.from_config`) fill
# missing keys from this map, not from today's defaults, so that an old run
# is never resumed or rebuilt with a behaviour it did not have. A setting
# added with a default equal to the old behaviour needs no entry.
LEGACY_DEFAULTS: dict[str, Any] = {
  'top_k_nonprivate_clip': True,
  'public_batch': 'first_per_class',
  'dpsfl_impact_rule': 'absolute',
  'cmp_layout': 'in_out',
  'cmp_vectors_phase': 'u',
  'randagg_clip_scope': 'payload',
}


@dataclasses.dataclass(frozen=True)
class MethodParams:
  """What a method's builders may depend on (all from flags)."""

  num_model_params: int
  expected_clients_per_round: float
  noise_multiplier: float = 0.0
  clip: float = 1.0
  seed: int = 0
  # None: every aggregator draws a secret noise seed (OS entropy).
  noise_seed: Optional[int] = None
  target_unclipped_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  ddgauss_bits: int = 20
  # DDGauss: public lower bound on the cohort of a released round
  # (`training.prepare` resolves None from the sampling).
  ddgauss_min_clients: Optional[int] = None
  randagg_fraction: float = 0.01
  # DP-RandAgg clips the whole update (seed 001) or only its k-vector
  # (dp_randagg.CLIP_SCOPES).
  randagg_clip_scope: str = 'update'
  blur_lambda: float = 0.4
  lus_sparsity: float = 0.7
  top_k_ratio: float = 0.005
  # Non-private FL-TOP / FL-BASIC: clip the K values at `clip` and divide by
  # the expected cohort (before #24) instead of the plain mean.
  top_k_nonprivate_clip: bool = False
  public_batch: str = 'random'
  # Seed 004's clip rule: S from one local round on the public batch
  # (`PUBLIC_ROUND_CLIP_METHODS`); `clip` is then replaced by S in setup.
  clip_from_public_round: bool = False
  # The local schedule (the public round runs it like a client).
  batch_size: int = 10
  local_epochs: int = 1
  local_steps: Optional[int] = None
  client_lr: float = 0.05
  client_momentum: float = 0.0
  top_k_indices: Optional[Any] = None
  top_k_masks: Optional[Any] = None
  update_diagnostics: bool = False
  sketch_rows: int = 5
  # k / columns = 0.1: a count sketch recovers only coordinates well above
  # ||g|| / sqrt(columns); the seed-002 study diverged at k / columns = 0.5
  # (defaults before issue #24: 20,000 and 5,000).
  sketch_columns: int = 100_000
  sketch_k: int = 10_000
  sketch_momentum: float = 0.9
  sketch_hashing: str = 'murmur'
  # The error-feedback step in sketch space (FetchSGD's lr; the server lr
  # must stay 1). With sketch momentum rho the steady step is lr / (1 - rho).
  sketch_lr: float = 1.0
  dpsfl_target_probability: float = 0.5
  dpsfl_impact_threshold: float = 0.1
  # None: expected clients / 20 (dpsfl.default_bit_noise).
  dpsfl_bit_noise: Optional[float] = None
  dpsfl_clip_lr: float = 0.2
  dpsfl_impact_rule: str = 'relative'
  cmp_rank: int = 4
  cmp_clip_u: Optional[float] = None
  cmp_clip_v: Optional[float] = None
  # U's side of each kernel and the phase carrying the vectors
  # (cmp_fed.LAYOUTS, cmp_fed.VECTOR_PHASES).
  cmp_layout: str = 'out_in'
  cmp_vectors_phase: str = 'v'
  model_shapes: tuple = ()

  @classmethod
  def from_config(
    cls,
    config: Mapping[str, Any],
    *,
    num_model_params: int,
    expected_clients_per_round: float,
    noise_multiplier: float = 0.0,
  ) -> 'MethodParams':
    """The params a run's config names (its fields of the same name).

    Used by `training.prepare` and to rebuild a finished run's aggregator
    from its saved config, so both take the same path. A key the config
    lacks takes its `LEGACY_DEFAULTS` value where it has one (the behaviour
    a run recorded before the setting existed), else the field's default.
    """
    derived = {
      'num_model_params',
      'expected_clients_per_round',
      'noise_multiplier',
    }
    return cls(
      num_model_params=num_model_params,
      expected_clients_per_round=expected_clients_per_round,
      noise_multiplier=noise_multiplier,
      **{
        f.name: config[f.name] if f.name in config else LEGACY_DEFAULTS[f.name]
        for f in dataclasses.fields(cls)
        if (f.name in config or f.name in LEGACY_DEFAULTS)
        and f.name not in derived
      },
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
    round_event: `(noise_multiplier, MethodParams) -> DpEvent` of one round
      before sampling: used to calibrate noise, and recorded for methods
      whose aggregator keeps no event in its state.
    event_from_state: Whether the recorded event is read from the
      aggregator state (TFF's `DPAggregatorState.dp_event`).
    extra_download_bytes: Bytes sent down besides the float32 model.
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
  """

  name: str
  description: str
  private: bool
  build_aggregator: AggregatorBuilder
  upload_bytes: Callable[[MethodParams], int]
  round_event: Optional[
    Callable[[float, MethodParams], dp_accounting.DpEvent]
  ] = None
  event_from_state: bool = False
  preflight: Callable[[], None] = lambda: None
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

  def download_bytes(self, params: MethodParams) -> int:
    """The global model, float32, broadcast to each participant."""
    return communication.dense_float32_bytes(
      params.num_model_params
    ) + self.extra_download_bytes(params)

  def cost(self, params: MethodParams) -> communication.CommunicationCost:
    return communication.CommunicationCost(
      self.download_bytes(params), self.upload_bytes(params)
    )


def _dense_upload(p: MethodParams) -> int:
  return communication.dense_float32_bytes(p.num_model_params)


def _weighted_dense_upload(p: MethodParams) -> int:
  # The update and its example-count weight.
  return communication.dense_float32_bytes(p.num_model_params + 1)


def _gaussian(z: float, p: MethodParams) -> dp_accounting.DpEvent:
  del p
  return dp_accounting.GaussianDpEvent(z)


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
  if method.name in METHODS:
    raise ValueError(f'Method {method.name!r} is already registered.')
  METHODS[method.name] = method
  return method


# FL-BASIC-DP's public clip: the median over this many random K-subsets
# (seed 004: "the same steps are repeated for 100 times, where a new random
# set of trainable weights with size K are selected each time").
PUBLIC_ROUND_TRIALS = 100
# The methods that take `clip_from_public_round` (FL-STD-DP is DP-FedAvg:
# seed 004, "when K = |T| = n, the scheme is equivalent to FL-STD").
PUBLIC_ROUND_CLIP_METHODS = ('dp_fedavg', 'fl_top_dp', 'fl_basic_dp')


def public_round_norms(p: MethodParams, task, data_dir, masks_list) -> list:
  """Seed 004's clip rule: update norms of one local round on public data.

  For each entry of `masks_list` (None: every weight trained), runs the
  run's local schedule (`batch_size`, `local_epochs`, `local_steps`,
  `client_lr`, `client_momentum`: the preprocessing and optimizer a client
  gets) on the server's public batch from w0, and returns the update's L2
  norm (`fl_top.public_round_norm`). The batch is public, so the clip it
  gives is not tuning on client data.
  """
  x, y = public_data.public_batch(
    task, data_dir, mode=p.public_batch, seed=p.seed
  )
  preprocess = tasks_lib.client_preprocess_fn(
    p.batch_size,
    num_epochs=p.local_epochs,
    max_steps=p.local_steps,
    seed=p.seed,
  )
  batches = preprocess(tf.data.Dataset.from_tensor_slices((x, y)))
  public_round = fl_top.PublicRound(
    task.model_builder(),
    task.loss_builder(),
    tff.learning.optimizers.build_sgdm(
      p.client_lr, momentum=p.client_momentum or None
    ),
  )
  return [public_round.norm(batches, masks) for masks in masks_list]


def _model_shapes(task) -> list:
  return [tuple(v.shape) for v in task.model_builder().trainable_variables]


def _public_clip_setup(masks_fn):
  """A setup that sets `clip` by the public-round rule when asked.

  `masks_fn(p, task) -> list of masks` (one entry per trial; the clip is
  their median norm).
  """

  def setup(p: MethodParams, task, data_dir) -> MethodParams:
    if not p.clip_from_public_round:
      return p
    norms = public_round_norms(p, task, data_dir, masks_fn(p, task))
    return dataclasses.replace(p, clip=float(np.median(norms)))

  return setup


register(
  Method(
    name='fedavg',
    description='FedAvg (McMahan et al. 2017), example-weighted, no DP.',
    private=False,
    build_aggregator=lambda p: None,
    upload_bytes=_weighted_dense_upload,
  )
)

register(
  Method(
    name='dp_fedavg',
    description=(
      'DP-FedAvg with a fixed clip (McMahan et al. 2018): '
      'clipped updates, Gaussian noise, uniform weights.'
    ),
    private=True,
    build_aggregator=lambda p: dp_fedavg.gaussian_fixed(
      p.noise_multiplier,
      p.expected_clients_per_round,
      p.clip,
      noise_seed=p.noise_seed,
    ),
    upload_bytes=_dense_upload,
    round_event=_gaussian,
    event_from_state=True,
    # --clip_from_public_round: the full update of one public round.
    setup=_public_clip_setup(lambda p, task: [None]),
  )
)

register(
  Method(
    name='dp_fedavg_adaptive',
    description=(
      'DP-FedAvg with adaptive clipping (Andrew et al. 2021); '
      '--clip is the initial clip.'
    ),
    private=True,
    build_aggregator=lambda p: dp_fedavg.gaussian_adaptive(
      p.noise_multiplier,
      p.expected_clients_per_round,
      initial_clip=p.clip,
      target_unclipped_quantile=p.target_unclipped_quantile,
      learning_rate=p.clip_learning_rate,
      noise_seed=p.noise_seed,
    ),
    upload_bytes=_dense_upload,
    round_event=_gaussian,  # The effective multiplier; the state has both.
    event_from_state=True,
  )
)


def _ddgauss_preflight() -> None:
  if not ddgauss.protobuf_supports_ddgauss():
    raise ValueError(
      "Method ddgauss needs protobuf's pure-Python backend: set "
      f'{ddgauss.PROTOBUF_ENV}=python before TensorFlow is imported '
      '(python -m tff_dp.run --method=ddgauss does so itself).'
    )


register(
  Method(
    name='ddgauss',
    description=(
      'DDGauss (Kairouz et al. 2021): distributed discrete '
      'Gaussian with secure sum; TFF DistributedDpSumFactory.'
    ),
    private=True,
    build_aggregator=lambda p: ddgauss.ddgauss_mean(
      p.noise_multiplier,
      p.expected_clients_per_round,
      p.clip,
      min_clients=p.ddgauss_min_clients,
      bits=p.ddgauss_bits,
    ),
    # One integer of `bits` bits per coordinate of the DFT-padded vector.
    upload_bytes=lambda p: communication.packed_bits_bytes(
      2 * ((p.num_model_params + 1) // 2), p.ddgauss_bits
    ),
    round_event=lambda z, p: ddgauss.planned_round_event(
      z,
      p.clip,
      p.expected_clients_per_round,
      p.num_model_params,
      p.ddgauss_bits,
      min_clients=p.ddgauss_min_clients,
    ),
    # The same event every round: h = min_clients - 1 shares, never the
    # realised count (a round below min_clients is withheld).
    event_from_measurements=ddgauss.round_event_from_measurements,
    preflight=_ddgauss_preflight,
  )
)


def _randagg_k(p: MethodParams) -> int:
  return max(1, int(round(p.randagg_fraction * p.num_model_params)))


register(
  Method(
    name='dp_randagg',
    description=(
      'DP-RandAgg (seed 001): k shared random coordinates per round, '
      'clipped, noised and secure-summed; --randagg_fraction = k/d.'
    ),
    private=True,
    build_aggregator=lambda p: dp_randagg.DPRandAggFactory(
      p.noise_multiplier,
      p.expected_clients_per_round,
      p.clip,
      num_coordinates=_randagg_k(p),
      seed=p.seed,
      noise_seed=p.noise_seed,
      clip_scope=p.randagg_clip_scope,
    ),
    upload_bytes=lambda p: dp_randagg.upload_bytes(_randagg_k(p)),
    # The round's k coordinate indices (int32) come down with the model.
    extra_download_bytes=lambda p: 4 * _randagg_k(p),
    round_event=_gaussian,
    event_from_state=True,
  )
)


def _dp_fedavg_aggregator(p: MethodParams):
  return dp_fedavg.gaussian_fixed(
    p.noise_multiplier,
    p.expected_clients_per_round,
    p.clip,
    noise_seed=p.noise_seed,
  )


def _dp_fedavg_client_work_method(name, description, build_client_work):
  """A method of local training `build_client_work` + DP-FedAvg aggregation.

  The update is sent dense through secure sum (LUS's zeros included, as in
  seed 000), so it uploads the full float32 update.
  """
  return Method(
    name=name,
    description=description,
    private=True,
    build_aggregator=_dp_fedavg_aggregator,
    upload_bytes=_dense_upload,
    round_event=_gaussian,
    event_from_state=True,
    build_client_work=build_client_work,
  )


register(
  _dp_fedavg_client_work_method(
    'blur',
    'BLUR (seed 000): local hinge-squared proximal term '
    'lambda/2 max(0, ||w - w_t||^2 - S^2) with S = --clip; DP-FedAvg.',
    lambda p, model_fn, opt: blur.build_blur_client_work(
      model_fn,
      opt,
      lam=p.blur_lambda,
      clip_norm=p.clip,
      extra_metrics_fn=client_metrics_fn(p),
    ),
  )
)
register(
  _dp_fedavg_client_work_method(
    'lus',
    'LUS (seed 000): per-layer top-s of |grad * delta| after local '
    'training, sparsity --lus_sparsity; DP-FedAvg.',
    lambda p, model_fn, opt: lus.build_lus_client_work(
      model_fn,
      opt,
      sparsity=p.lus_sparsity,
      extra_metrics_fn=client_metrics_fn(p),
    ),
  )
)
register(
  _dp_fedavg_client_work_method(
    'blur_lus',
    'BLUR and LUS together (seed 000, Alg. 2); DP-FedAvg.',
    lambda p, model_fn, opt: lus.build_lus_client_work(
      model_fn,
      opt,
      sparsity=p.lus_sparsity,
      blur_lam=p.blur_lambda,
      clip_norm=p.clip,
      extra_metrics_fn=client_metrics_fn(p),
    ),
  )
)


def _fl_top_setup(p: MethodParams, task, data_dir) -> MethodParams:
  x, y = public_data.public_batch(
    task, data_dir, mode=p.public_batch, seed=p.seed
  )
  indices = fl_top.select_top_k(
    task.model_builder(), task.loss_builder(), x, y, ratio=p.top_k_ratio
  )
  p = dataclasses.replace(
    p,
    top_k_indices=indices,
    top_k_masks=fl_top.masks_from_indices(indices, _model_shapes(task)),
  )
  # FL-TOP-DP: "S is set to the L2-norm of the Top-K weight update obtained
  # for this single training round" (trained on the Top-K weights only).
  return _public_clip_setup(lambda p, task: [p.top_k_masks])(p, task, data_dir)


def _fl_basic_public_masks(p: MethodParams, task) -> list:
  # "S is set to the median of these L2-norm values" over 100 random
  # K-subsets, drawn from the public seed.
  shapes = _model_shapes(task)
  rng = np.random.default_rng(p.seed)
  return [
    fl_top.random_masks(shapes, _top_k_count(p), int(s))
    for s in rng.integers(2**31, size=PUBLIC_ROUND_TRIALS)
  ]


def _top_k_count(p: MethodParams) -> int:
  return max(1, int(round(p.top_k_ratio * p.num_model_params)))


def _top_k_noise_and_clip(p: MethodParams, private: bool) -> tuple:
  """DPRandAggFactory's (noise_multiplier, clients_per_round, clip).

  The private versions clip and noise (seed 004, Alg. 3 lines 25-26: the
  compressed update "is then clipped (in Line 26) to obtain ... with
  L_2-norm at most S"); the non-private ones send the unclipped compressed
  update (Alg. 1: the server "updates the common model w_t with the
  average of these compressed updates (in Line 12)", no clip), unless
  `top_k_nonprivate_clip` keeps the pre-#24 clip at `clip`.
  """
  if private:
    return p.noise_multiplier, p.expected_clients_per_round, p.clip
  if p.top_k_nonprivate_clip:
    return 0.0, p.expected_clients_per_round, p.clip
  return None, p.expected_clients_per_round, None


def _fl_top_method(name: str, private: bool) -> Method:
  def aggregator(p: MethodParams):
    return dp_randagg.DPRandAggFactory(
      *_top_k_noise_and_clip(p, private),
      num_coordinates=len(p.top_k_indices),
      fixed_indices=p.top_k_indices,
      seed=p.seed,
      noise_seed=p.noise_seed,
      # Seed 004 clips the compressed update.
      clip_scope='payload',
    )

  return Method(
    name=name,
    description=(
      f'{"FL-TOP-DP" if private else "FL-TOP"} (seed 004): the server picks '
      'Top-K weights (--top_k_ratio) by |gradient| on a public batch; '
      'clients train only those and send their K values'
      + (', clipped and noised.' if private else ' (no clip).')
    ),
    private=private,
    build_aggregator=aggregator,
    upload_bytes=lambda p: 4 * _top_k_count(p),
    # Weights outside K stay w0, so only the K values come down.
    extra_download_bytes=lambda p: 4 * _top_k_count(p)
    - communication.dense_float32_bytes(p.num_model_params),
    round_event=_gaussian if private else None,
    event_from_state=private,
    setup=_fl_top_setup,
    build_client_work=lambda p, model_fn, opt: fl_top.build_masked_client_work(
      model_fn, opt, masks=p.top_k_masks, extra_metrics_fn=client_metrics_fn(p)
    ),
  )


register(_fl_top_method('fl_top', private=False))
register(_fl_top_method('fl_top_dp', private=True))


def _fl_basic_method(name: str, private: bool) -> Method:
  def aggregator(p: MethodParams):
    return dp_randagg.DPRandAggFactory(
      *_top_k_noise_and_clip(p, private),
      num_coordinates=_top_k_count(p),
      seed=p.seed,
      noise_seed=p.noise_seed,
      clip_scope='payload',
    )

  return Method(
    name=name,
    description=(
      f'{"FL-BASIC-DP" if private else "FL-BASIC"} (seed 004): clients train '
      'a random K-subset (--top_k_ratio) re-drawn every round, the rest '
      'reset after each step; K values sent'
      + (', clipped and noised.' if private else ' (no clip).')
    ),
    private=private,
    build_aggregator=aggregator,
    upload_bytes=lambda p: 4 * _top_k_count(p),
    # The whole model comes down, and the round's K indices (int32).
    extra_download_bytes=lambda p: 4 * _top_k_count(p),
    round_event=_gaussian if private else None,
    event_from_state=private,
    setup=_public_clip_setup(_fl_basic_public_masks),
    build_client_work=lambda p, model_fn, opt: (
      fl_top.build_random_subset_client_work(
        model_fn,
        opt,
        num_coordinates=_top_k_count(p),
        seed=p.seed,
        extra_metrics_fn=client_metrics_fn(p),
      )
    ),
  )


register(_fl_basic_method('fl_basic', private=False))
register(_fl_basic_method('fl_basic_dp', private=True))


def _dpsfl_adaptive(p: MethodParams) -> dpsfl.AdaptiveClip:
  return dpsfl.AdaptiveClip(
    target_probability=p.dpsfl_target_probability,
    impact_threshold=p.dpsfl_impact_threshold,
    bit_noise_multiplier=p.dpsfl_bit_noise,
    learning_rate=p.dpsfl_clip_lr,
    impact_rule=p.dpsfl_impact_rule,
  ).resolved(p.expected_clients_per_round)


def _sketch_method(name: str) -> Method:
  private = name != 'fetchsgd'
  adaptive = name == 'dpsfl_ac'

  def aggregator(p: MethodParams):
    return dpsfl.SketchAggregatorFactory(
      rows=p.sketch_rows,
      columns=p.sketch_columns,
      k=p.sketch_k,
      momentum=p.sketch_momentum,
      learning_rate=p.sketch_lr,
      hashing=p.sketch_hashing,
      noise_multiplier=p.noise_multiplier if private else None,
      clients_per_round=p.expected_clients_per_round if private else None,
      clip=p.clip if private else None,
      adaptive=_dpsfl_adaptive(p) if adaptive else None,
      seed=p.seed,
      noise_seed=p.noise_seed,
    )

  descriptions = {
    'fetchsgd': 'FetchSGD (Rothchild et al. 2020): count-sketched updates, '
    'server momentum and error feedback in sketch space, top-k unsketch; '
    'no DP.',
    'dpsfl': 'DPSFL (seed 002): FetchSGD with clipped sketches and Gaussian '
    'noise on their secure sum.',
    'dpsfl_ac': 'DPSFL-AC (seed 002): DPSFL with the clip adapted from noisy '
    'one-bit clipping-impact signals on the last top-k.',
  }
  return Method(
    name=name,
    description=descriptions[name]
    + ' --sketch_rows/--sketch_columns/--sketch_k/--sketch_hashing; use '
    'server lr 1.',
    private=private,
    build_aggregator=aggregator,
    upload_bytes=lambda p: dpsfl.upload_bytes(
      p.sketch_rows, p.sketch_columns, adaptive
    ),
    # Clients hold the model and apply the broadcast top-k update.
    extra_download_bytes=lambda p: dpsfl.download_bytes(p.sketch_k, adaptive)
    - communication.dense_float32_bytes(p.num_model_params),
    round_event=(
      (
        lambda z, p: dpsfl.round_event(
          z, _dpsfl_adaptive(p) if adaptive else None
        )
      )
      if private
      else None
    ),
  )


for _name in ('fetchsgd', 'dpsfl', 'dpsfl_ac'):
  register(_sketch_method(_name))


def _with_model_shapes(p: MethodParams, task, data_dir) -> MethodParams:
  del data_dir
  shapes = tuple(
    tuple(v.shape.as_list()) for v in task.model_builder().trainable_variables
  )
  return dataclasses.replace(p, model_shapes=shapes)


def _low_rank_method(name: str) -> Method:
  private = name == 'cmp_fed'

  def aggregator(p: MethodParams):
    options = dict(layout=p.cmp_layout, vectors_phase=p.cmp_vectors_phase)
    if not private:
      return cmp_fed.CMPFedFactory(p.cmp_rank, seed=p.seed, **options)
    return cmp_fed.CMPFedFactory(
      p.cmp_rank,
      noise_multiplier=p.noise_multiplier,
      clients_per_round=p.expected_clients_per_round,
      clip_u=p.cmp_clip_u if p.cmp_clip_u is not None else p.clip,
      clip_v=p.cmp_clip_v if p.cmp_clip_v is not None else p.clip,
      seed=p.seed,
      noise_seed=p.noise_seed,
      **options,
    )

  return Method(
    name=name,
    description=(
      'CMP-Fed (seed 001): rank --cmp_rank power iteration, U then V '
      'clipped (--cmp_clip_u, --cmp_clip_v; default --clip), noised and '
      'secure-summed, two phases a round.'
      if private
      else 'UV-Fed (seed 001): the rank --cmp_rank power iteration '
      'without clipping or noise.'
    ),
    private=private,
    build_aggregator=aggregator,
    upload_bytes=lambda p: cmp_fed.upload_bytes(p.model_shapes, p.cmp_rank),
    extra_download_bytes=lambda p: cmp_fed.extra_download_bytes(
      p.model_shapes, p.cmp_rank
    ),
    round_event=(
      (
        lambda z, p: dp_accounting.ComposedDpEvent(
          [dp_accounting.GaussianDpEvent(z)] * 2
        )
      )
      if private
      else None
    ),
    event_from_state=private,
    setup=_with_model_shapes,
  )


register(_low_rank_method('cmp_fed'))
register(_low_rank_method('uv_fed'))


register(
  Method(
    name='model_clip',
    description=(
      'Model clipping (seed 003): each client clips its trained model to '
      '--clip; the server averages the clipped models (no noise; keep the '
      'server lr 1 and no server momentum).'
    ),
    private=False,
    build_aggregator=lambda p: tff.aggregators.UnweightedMeanFactory(),
    upload_bytes=_dense_upload,
    build_client_work=lambda p, model_fn, opt: (
      model_clip.build_model_clip_client_work(
        model_fn, opt, clip=p.clip, extra_metrics_fn=client_metrics_fn(p)
      )
    ),
  )
)

register(
  Method(
    name='ce_fedavg',
    description=(
      'CE-FedAvg (seed 003): update-difference clipping to --clip, uniform '
      'mean over participants, no noise.'
    ),
    private=False,
    build_aggregator=lambda p: tff.aggregators.clipping_factory(
      p.clip, tff.aggregators.UnweightedMeanFactory()
    ),
    upload_bytes=_dense_upload,
  )
)
