"""DP-FedAvg aggregation (McMahan et al. 2018; Andrew et al. 2021), seeded.

The same mechanisms as TFF's
`tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed` and
`.gaussian_adaptive` (TFF's factory owns placement and transport; the query
owns clipping and noise), with the queries of `dp_queries`: noise is drawn
from a seed kept in the aggregator state, so a resumed run continues the
same noise stream, and the clip is guarded against non-finite or
overflowing updates. The noise seed is secret by default
(`noise_seed=None`: 128 bits from OS entropy, kept only in the server
state); an int gives reproducible noise for research, and the guarantee
then assumes that int is kept secret.

Measurements (TFF's): `dp_query_metrics` (`clip`) and `dp`
(the inner aggregation's measurements). The released DpEvent is kept in the
state's `dp_event` (see `tff_dp.privacy.event_from_named_tuple`).
"""

import math
from typing import Optional

import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp.aggregators import _tff_private
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import weighting


class DPFactory(
  tff.aggregators.DifferentiallyPrivateFactory, weighting.Weightable
):
  """TFF's `DifferentiallyPrivateFactory`, with `weighted()` (uniform)."""


def _check(name: str, value, *, positive: bool) -> None:
  ok = (
    isinstance(value, (int, float))
    and math.isfinite(value)
    and (value > 0 if positive else value >= 0)
  )
  if not ok:
    kind = '> 0' if positive else '>= 0'
    raise ValueError(f'{name} must be a finite number {kind}. Found {value!r}.')


def gaussian_fixed(
  noise_multiplier: float,
  clients_per_round: float,
  clip: float,
  *,
  noise_seed: dp_queries.NoiseSeed = None,
  clipped_fraction_stddev: Optional[float] = None,
  record_aggregation_factory: Optional[
    tff.aggregators.UnweightedAggregationFactory
  ] = None,
) -> DPFactory:
  """DP-FedAvg with a fixed clip: mean of clipped updates plus Gaussian noise.

  Each client's update is clipped to L2 norm `clip`; the sum gets
  N(0, (noise_multiplier * clip)^2) noise and is divided by the expected
  cohort size `clients_per_round` (a public constant, as Poisson sampling
  requires).

  Args:
    noise_multiplier: Noise stddev over clip, >= 0.
    clients_per_round: Expected clients per round (the denominator), > 0.
    clip: L2 clipping norm, > 0.
    noise_seed: None (default): a secret seed from OS entropy; an int or a
      pair of ints: reproducible noise (keep it secret: whoever knows it can
      subtract the noise).
    clipped_fraction_stddev: None (default), or the noise stddev (> 0, above
      `noise_multiplier / 2`) of a DP estimate of the fraction of the cohort
      whose update was clipped, released each round as the measurement
      `dp_query_metrics/dp_fraction_clipped` and charged to the round's
      event (`dp_queries.ClippedFractionSumQuery`). The sum's multiplier is
      then raised as adaptive clipping's is (1/z^2 = 1/z_sum^2 +
      (2 sigma_b)^-2), so `noise_multiplier` stays the effective one.
    record_aggregation_factory: Inner sum (default `tff.aggregators.
      SumFactory`); `tff.aggregators.SecureSumFactory` for secure sum.

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  _check('noise_multiplier', noise_multiplier, positive=False)
  _check('clients_per_round', clients_per_round, positive=True)
  _check('clip', clip, positive=True)
  if clipped_fraction_stddev is not None:
    _check('clipped_fraction_stddev', clipped_fraction_stddev, positive=True)
    if noise_multiplier >= 2 * clipped_fraction_stddev:
      raise ValueError(
        f'clipped_fraction_stddev must exceed noise_multiplier / 2 = '
        f'{noise_multiplier / 2:g} (its release takes a share of the noise '
        f'budget). Found {clipped_fraction_stddev!r}.'
      )
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
  merges to `GaussianDpEvent(noise_multiplier)`. `noise_seed` as in
  `gaussian_fixed` (None: secret).

  The clipped count's noise `clipped_count_stddev` (default 0.05 x
  `clients_per_round`, TFF's) must exceed `noise_multiplier / 2`: a small
  cohort at the default raises a ValueError that says what to pass.

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
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
