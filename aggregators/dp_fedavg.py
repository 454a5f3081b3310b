"""DP-FedAvg aggregation (McMahan et al. 2018; Andrew et al. 2021), seeded.

TFF's `DifferentiallyPrivateFactory.gaussian_fixed` and `.gaussian_adaptive`
with the seeded queries of `dp_queries`: each client's update is clipped to
L2 norm C, and the server releases (sum + N(0, (z C)^2 I)) / m for the
public expected cohort m. The adaptive clip moves C geometrically towards a
private quantile of the update norms, its clipped count noised so that the
round's effective multiplier is z: 1/z^2 = 1/z_sum^2 + (2 sigma_b)^-2.
See docs/papers/dp_fedavg.md for the paper's reading and derivations.
"""

import math
from typing import Optional

import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp.aggregators import _tff_private
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import mf_strategy
from tff_dp.aggregators import weighting


class DPFactory(
  tff.aggregators.DifferentiallyPrivateFactory, weighting.Weightable
):
  """TFF's `DifferentiallyPrivateFactory`, with `weighted()` (uniform).

  Built by `gaussian_fixed` and `gaussian_adaptive`; the query
  (`dp_queries`) owns clipping and noise, TFF's factory placement and
  transport.

  Client: sends its update clipped to L2 norm C (guarded against
  non-finite and overflowing updates: `finite_guard.clip_flat`) and, for
  the adaptive clip, the bit [norm <= C] - 0.5 (for the DP fraction
  clipped, [norm > C] - 0.5), summed over the cohort by the inner
  `record_aggregation_factory`.

  Server: releases (sum + N(0, (z_sum C)^2 I)) / m, m the public expected
  cohort; with the adaptive clip, the next C, and with
  `clipped_fraction_stddev`, the DP fraction of the cohort clipped. Noise is
  drawn from a seed in the state, advanced every round, so a resumed run
  continues the same noise stream.

  DP event (in the state's `dp_event`, TFF's `DPAggregatorState`): under
  add/remove-one, where one client moves the sum by at most C and the bit
  sum by at most 0.5, `GaussianDpEvent(z)` for the fixed clip, and
  `ComposedDpEvent([GaussianDpEvent(z_sum), GaussianDpEvent(sigma_b /
  0.5)])` with the adaptive clip or the DP fraction clipped (one Gaussian
  of effective multiplier z once merged: `tff_dp.privacy`). Under
  replace-one (fixed-size sampling) the sensitivities double, which
  `tff_dp.privacy` accounts. Read it with
  `tff_dp.aggregators.dp_events.released_event(factory, state,
  measurements)`, the one documented reader of a round's event.

  State: `DPAggregatorState(query_state, agg_state, dp_event,
  is_init_state)`; the query state holds the clip, the noise stddevs and
  the seeds.

  Measurements (`OrderedDict`):
    dp_query_metrics: The query's: empty for the fixed clip; `clip` (the
      current clip) for the adaptive clip; `clip` and `dp_fraction_clipped`
      with `clipped_fraction_stddev`.
    dp: The inner aggregation's measurements (empty for TFF's
      `SumFactory`; `SecureSumFactory`'s clipped counts and thresholds).
  """


class CorrelatedDPFactory(DPFactory):
  """`DPFactory` whose noise is correlated across rounds (DP-MF).

  The query (`correlated_noise.CorrelatedGaussianSumQuery`, normalised by
  the public expected cohort) keeps past noise of the value's shape in its
  state, so it is built in `create` from the value type; everything else
  is `DPFactory`'s contract, with the round's event a
  `correlated_noise.MatrixFactorizationDpEvent`, accounted over the whole
  run by `tff_dp.privacy.correlated`. Built by `gaussian_fixed(...,
  noise=strategy)`.
  """

  def __init__(
    self,
    clip: float,
    stddev: float,
    strategy: mf_strategy.Strategy,
    clients_per_round: float,
    noise_seed: dp_queries.NoiseSeed,
    record_aggregation_factory,
  ):
    self._mf_args = (clip, stddev, strategy, noise_seed)
    self._denominator = float(clients_per_round)
    # A query of the right class for `DifferentiallyPrivateFactory`'s check;
    # `create` builds the one of the value's shape.
    super().__init__(self._build_query([]), record_aggregation_factory)

  @property
  def strategy(self) -> mf_strategy.Strategy:
    return self._mf_args[2]

  def _build_query(self, specs):
    clip, stddev, strategy, seed = self._mf_args
    return tfp.NormalizedQuery(
      correlated_noise.CorrelatedGaussianSumQuery(
        clip, stddev, strategy, specs, seed
      ),
      denominator=self._denominator,
    )

  def create(self, value_type):
    specs = tff.types.type_to_tf_tensor_specs(value_type)
    return DPFactory(
      self._build_query(specs), self._record_aggregation_factory
    ).create(value_type)


def _check(name: str, value, *, positive: bool) -> None:
  ok = (
    isinstance(value, (int, float))
    and math.isfinite(value)
    and (value > 0 if positive else value >= 0)
  )
  if not ok:
    kind = '> 0' if positive else '>= 0'
    raise ValueError(f'{name} must be a finite number {kind}. Found {value!r}.')


def _check_fraction_stddev(
  noise_multiplier: float, clipped_fraction_stddev: float
) -> None:
  """The DP fraction clipped's noise: > 0 and above `noise_multiplier / 2`."""
  _check('clipped_fraction_stddev', clipped_fraction_stddev, positive=True)
  if noise_multiplier >= 2 * clipped_fraction_stddev:
    raise ValueError(
      f'clipped_fraction_stddev must exceed noise_multiplier / 2 = '
      f'{noise_multiplier / 2:g} (its release takes a share of the noise '
      f'budget). Found {clipped_fraction_stddev!r}.'
    )


def _check_adaptive_args(
  noise_multiplier: float,
  clients_per_round: float,
  initial_clip: float,
  target_unclipped_quantile: float,
  learning_rate: float,
  clipped_count_stddev: Optional[float],
) -> None:
  """`gaussian_adaptive`'s arguments, or ValueError saying what to pass."""
  _check('noise_multiplier', noise_multiplier, positive=False)
  _check('clients_per_round', clients_per_round, positive=True)
  _check('initial_clip', initial_clip, positive=True)
  _check('learning_rate', learning_rate, positive=False)
  if not 0 <= target_unclipped_quantile <= 1:
    raise ValueError(
      'target_unclipped_quantile must be in [0, 1]. Found '
      f'{target_unclipped_quantile!r}.'
    )
  if clipped_count_stddev is not None:
    _check('clipped_count_stddev', clipped_count_stddev, positive=False)
  # TFF's split needs the count's noise above z / 2 (its own error names
  # neither the cohort nor what to pass).
  count = (
    0.05 * clients_per_round
    if clipped_count_stddev is None
    else clipped_count_stddev
  )
  if noise_multiplier > 0 and noise_multiplier >= 2 * count:
    where = (
      f'clipped_count_stddev={clipped_count_stddev!r}'
      if clipped_count_stddev is not None
      else f'the default clipped_count_stddev, 0.05 x clients_per_round = '
      f'{count:g} at clients_per_round={clients_per_round!r}'
    )
    raise ValueError(
      f'gaussian_adaptive: noise_multiplier={noise_multiplier!r} needs '
      f'clipped_count_stddev > noise_multiplier / 2 = '
      f'{noise_multiplier / 2:g}, and got {where}. Pass a larger '
      f"clipped_count_stddev (at {noise_multiplier:g}, the sum's multiplier "
      f'becomes {noise_multiplier / 0.75**0.5:.3g}), use more than '
      f'{10 * noise_multiplier:g} clients per round, or use gaussian_fixed.'
    )


def _independent_noise_factory(
  noise_multiplier: float,
  clients_per_round: float,
  clip: float,
  noise_seed: dp_queries.NoiseSeed,
  clipped_fraction_stddev: Optional[float],
  record_aggregation_factory: Optional[
    tff.aggregators.UnweightedAggregationFactory
  ],
) -> DPFactory:
  """`gaussian_fixed`'s factory for noise independent across rounds.

  Its arguments as `gaussian_fixed` checked them (`noise` None); with
  `clipped_fraction_stddev`, the query also releases the DP fraction
  clipped (`dp_queries.ClippedFractionSumQuery`).
  """
  if clipped_fraction_stddev is not None:
    _check_fraction_stddev(noise_multiplier, clipped_fraction_stddev)
    value_z, count_stddev = _tff_private.adaptive_clip_noise_params(
      noise_multiplier, float(clients_per_round), clipped_fraction_stddev
    )
    query = tfp.NormalizedQuery(
      dp_queries.ClippedFractionSumQuery(
        clip,
        clip * value_z,
        count_stddev,
        float(clients_per_round),
        noise_seed,
      ),
      denominator=float(clients_per_round),
    )
    return DPFactory(query, record_aggregation_factory)
  query = tfp.NormalizedQuery(
    dp_queries.SeededGaussianSumQuery(
      clip, clip * noise_multiplier, noise_seed
    ),
    denominator=float(clients_per_round),
  )
  return DPFactory(query, record_aggregation_factory)


def gaussian_fixed(
  noise_multiplier: float,
  clients_per_round: float,
  clip: float,
  *,
  noise_seed: dp_queries.NoiseSeed = None,
  clipped_fraction_stddev: Optional[float] = None,
  noise: Optional[mf_strategy.Strategy] = None,
  record_aggregation_factory: Optional[
    tff.aggregators.UnweightedAggregationFactory
  ] = None,
) -> DPFactory:
  """DP-FedAvg with a fixed clip: mean of clipped updates plus Gaussian noise.

  Each client's update is clipped to L2 norm `clip`; the sum gets
  N(0, (noise_multiplier * clip)^2) noise and is divided by the expected
  cohort size `clients_per_round` (a public constant, as Poisson sampling
  requires). The round's event is `GaussianDpEvent(noise_multiplier)`
  (composed with the fraction clipped's when it is released); the
  measurements and the neighbouring relation are `DPFactory`'s contract.

  Args:
    noise_multiplier: Noise stddev over clip, finite >= 0.
    clients_per_round: Expected clients per round (the denominator),
      finite > 0.
    clip: L2 clipping norm, finite > 0.
    noise_seed: None (default): a secret seed from OS entropy; an int or a
      pair of ints in int64: reproducible noise (keep it secret: whoever
      knows it can subtract the noise).
    clipped_fraction_stddev: None (default), or the noise stddev (finite
      > 0, above `noise_multiplier / 2`) of a DP estimate of the fraction
      of the cohort whose update was clipped, released each round as the
      measurement `dp_query_metrics/dp_fraction_clipped` and charged to
      the round's event (`dp_queries.ClippedFractionSumQuery`). The sum's
      multiplier is then raised as adaptive clipping's is (1/z^2 =
      1/z_sum^2 + (2 sigma_b)^-2), so `noise_multiplier` stays the
      effective one.
    noise: None (default): noise independent across rounds. An
      `mf_strategy.Strategy` (`optimize_banded`, `optimize_blt`): noise
      correlated across rounds, `noise_multiplier * clip * (C^-1 w)_t`
      (`CorrelatedDPFactory`); the run must then be accounted with a
      cyclic participation schema (`tff_dp.privacy.correlated`). Not with
      `clipped_fraction_stddev`.
    record_aggregation_factory: Inner sum (default `tff.aggregators.
      SumFactory`); `tff.aggregators.SecureSumFactory` for secure sum.

  Returns:
    The aggregation factory (`.weighted()` for `build_weighted_fed_avg`).

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  _check('noise_multiplier', noise_multiplier, positive=False)
  _check('clients_per_round', clients_per_round, positive=True)
  _check('clip', clip, positive=True)
  correlated_noise.check_noise(noise)
  if noise is not None:
    if clipped_fraction_stddev is not None:
      raise ValueError(
        'clipped_fraction_stddev is not supported with correlated noise '
        '(its release would need its own accounting). Pass one of them.'
      )
    return CorrelatedDPFactory(
      clip,
      clip * noise_multiplier,
      noise,
      clients_per_round,
      noise_seed,
      record_aggregation_factory,
    )
  return _independent_noise_factory(
    noise_multiplier,
    clients_per_round,
    clip,
    noise_seed,
    clipped_fraction_stddev,
    record_aggregation_factory,
  )


def gaussian_adaptive(
  noise_multiplier: float,
  clients_per_round: float,
  *,
  initial_clip: float = 0.1,
  target_unclipped_quantile: float = 0.5,
  learning_rate: float = 0.2,
  clipped_count_stddev: Optional[float] = None,
  noise_seed: Optional[int] = None,
  record_aggregation_factory: Optional[
    tff.aggregators.UnweightedAggregationFactory
  ] = None,
) -> DPFactory:
  """DP-FedAvg with the adaptive clip of Andrew et al. (2021).

  The clip follows a private geometric quantile estimate of the update
  norms. `noise_multiplier` is the *effective* multiplier of the round: it is
  split between the sum and the clipped-count (TFF's
  `adaptive_clip_noise_params`), so the released event, two Gaussians,
  merges to `GaussianDpEvent(noise_multiplier)`; the measurements and the
  neighbouring relation are `DPFactory`'s contract.

  Args:
    noise_multiplier: The round's effective noise multiplier z, finite >= 0.
    clients_per_round: Expected clients per round (the mean's and the
      quantile estimate's denominator), finite > 0.
    initial_clip: The first round's clip, finite > 0.
    target_unclipped_quantile: The fraction of updates the clip should
      leave unclipped, in [0, 1].
    learning_rate: The geometric step: the clip changes by at most a factor
      exp(learning_rate) a round, finite >= 0.
    clipped_count_stddev: The clipped count's noise stddev, finite >= 0 and
      above `noise_multiplier / 2` when `noise_multiplier` > 0; None:
      0.05 x `clients_per_round` (TFF's default; a small cohort at the
      default raises a ValueError that says what to pass).
    noise_seed: None (default): secret seeds from OS entropy; an int s:
      reproducible noise from the seeds (s, 0) and (s, 1) (keep it secret).
    record_aggregation_factory: Inner sum (default `tff.aggregators.
      SumFactory`); `tff.aggregators.SecureSumFactory` for secure sum.

  Returns:
    The aggregation factory (`.weighted()` for `build_weighted_fed_avg`).

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  _check_adaptive_args(
    noise_multiplier,
    clients_per_round,
    initial_clip,
    target_unclipped_quantile,
    learning_rate,
    clipped_count_stddev,
  )
  value_z, count_stddev = _tff_private.adaptive_clip_noise_params(
    noise_multiplier, float(clients_per_round), clipped_count_stddev
  )
  query = dp_queries.SeededQuantileAdaptiveClipSumQuery(
    initial_l2_norm_clip=initial_clip,
    noise_multiplier=value_z,
    target_unclipped_quantile=target_unclipped_quantile,
    learning_rate=learning_rate,
    clipped_count_stddev=count_stddev,
    expected_num_records=float(clients_per_round),
    geometric_update=True,
    seed=noise_seed,
  )
  query = tfp.NormalizedQuery(query, denominator=float(clients_per_round))
  return DPFactory(query, record_aggregation_factory)
