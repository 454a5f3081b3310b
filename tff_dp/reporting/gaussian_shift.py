"""The audit's statistics: the shift of the canaries' projections from the
null directions', with exact confidence bounds, and the Gaussian-DP curve.

`gaussian_shift_interval` fits the observed and the null projections as
Gaussians, estimates their shift mu in null standard deviations and
inverts the noncentral t distribution of its t statistic in the
noncentrality for one-sided bounds at level `confidence`
(`ShiftEstimate`). `gdp_epsilon` converts mu to epsilon at delta with the
Gaussian-DP curve (Dong, Roth, Su 2019): delta(eps) = Phi(-eps/mu +
mu/2) - e^eps Phi(-eps/mu - mu/2).
"""

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import optimize
from scipy import stats


def gdp_epsilon(mu: float, delta: float) -> float:
  """Epsilon of a mu-GDP mechanism at delta.

  Args:
    mu: The GDP parameter; <= 0 gives 0, infinity gives infinity and NaN
      gives NaN.
    delta: In (0, 1).

  Returns:
    The smallest epsilon >= 0 at which mu-GDP is (epsilon, delta)-DP.

  Raises:
    ValueError: If delta is not in (0, 1).
  """
  if not 0 < delta < 1:
    raise ValueError(f'delta must be in (0, 1). Found {delta!r}.')
  if math.isnan(mu):
    return float('nan')
  if mu <= 0:
    return 0.0
  if math.isinf(mu):
    return float('inf')

  def gap(eps):
    return (
      stats.norm.cdf(-eps / mu + mu / 2)
      - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
      - delta
    )

  if gap(0.0) <= 0:
    return 0.0
  hi = 1.0
  while gap(hi) > 0:
    hi *= 2
    if hi > 1e4:
      return float('inf')
  return float(optimize.brentq(gap, 0.0, hi))


@dataclasses.dataclass(frozen=True)
class ShiftEstimate:
  """mu_hat = (mean observed - mean null) / std null, with its bounds.

  `mu_lower` and `mu_upper` are one-sided bounds at level `confidence`
  each: P(mu_lower <= mu) >= confidence and P(mu <= mu_upper) >=
  confidence under the model (two Gaussian samples whose means differ by
  mu null standard deviations). `variance_ratio` is the r^2 the interval
  used (1 under equal variances; see `gaussian_shift_interval`).
  """

  mu: float
  mu_lower: float
  mu_upper: float
  confidence: float
  observed_mean: float
  observed_std: float
  null_mean: float
  null_std: float
  num_observed: int
  num_null: int
  variance_ratio: float = 1.0


def check_confidence(confidence) -> None:
  if not (
    isinstance(confidence, (float, int, np.floating)) and 0.5 <= confidence < 1
  ):
    raise ValueError(f'confidence must be in [0.5, 1). Found {confidence!r}.')


def _noncentrality_bound(t: float, df: int, q: float) -> float:
  """The noncentrality delta at which P(T <= t) = q, T ~ nct(df, delta).

  P(T <= t) decreases in delta, so q = confidence gives a lower bound on
  delta and q = 1 - confidence an upper bound.
  """

  def gap(nc):
    return stats.nct.cdf(t, df, nc) - q

  step = max(1.0, abs(t))
  lo, hi = t - step, t + step
  for _ in range(200):
    if gap(lo) > 0:
      break
    lo -= step
    step *= 2
  step = max(1.0, abs(t))
  for _ in range(200):
    if gap(hi) < 0:
      break
    hi += step
    step *= 2
  glo, ghi = gap(lo), gap(hi)
  if np.isfinite(glo) and np.isfinite(ghi) and glo > 0 > ghi:
    return float(optimize.brentq(gap, lo, hi, xtol=1e-10, rtol=1e-12))
  # scipy's nct is out of range (|t| huge): its normal approximation,
  # T ~ N(delta, 1 + delta^2 / (2 df)), solved for delta.
  z = stats.norm.ppf(q)
  return float(t / (1 + z / math.sqrt(2 * df)))


def gaussian_shift_interval(
  observed: Sequence[float],
  null: Sequence[float],
  *,
  confidence: float = 0.95,
  equal_variance: bool = True,
) -> ShiftEstimate:
  """Estimates the shift of `observed` from `null` in null std units.

  The model: observed ~ N(m + mu * s, (r s)^2) and null ~ N(m, s^2),
  independent samples, with r = 1 if `equal_variance`. With mu_hat =
  (mean(observed) - mean(null)) / std(null) (ddof=1) and c = sqrt(r^2 /
  len(observed) + 1/len(null)), mu_hat / c has the noncentral t
  distribution with len(null) - 1 degrees of freedom and noncentrality
  mu / c (exact for r = 1); inverting its cdf in the noncentrality gives
  confidence bounds on mu (width shrinking like 1/sqrt(n)). Without
  `equal_variance`, r^2 is the ratio of the samples' variances when it
  exceeds 1 (sampled canaries: the shift varies with participation), and
  1 otherwise, so the interval is never narrower than the equal-variance
  one.

  Args:
    observed: The canaries' projections, >= 1 finite values (>= 2 without
      `equal_variance`).
    null: The null directions' projections, >= 2 finite values.
    confidence: The level of each one-sided bound, in [0.5, 1).
    equal_variance: Whether observed and null share one variance.

  Returns:
    A `ShiftEstimate`; if the null's std is 0, mu and its bounds are +-inf
    (NaN if the means are equal too).

  Raises:
    ValueError: On too few or non-finite values, or a bad `confidence`.
  """
  check_confidence(confidence)
  observed = np.asarray(observed, np.float64).ravel()
  null = np.asarray(null, np.float64).ravel()
  min_observed = 1 if equal_variance else 2
  if observed.size < min_observed or null.size < 2:
    raise ValueError(
      f'Need >= {min_observed} observed and >= 2 null values. Found '
      f'{observed.size} and {null.size}.'
    )
  if not (np.all(np.isfinite(observed)) and np.all(np.isfinite(null))):
    raise ValueError('observed and null must be finite.')
  diff = float(observed.mean() - null.mean())
  null_std = float(np.std(null, ddof=1))
  observed_std = float(np.std(observed, ddof=1)) if observed.size > 1 else 0.0
  k_obs, k_null = observed.size, null.size
  ratio = 1.0
  if not equal_variance and null_std > 0:
    ratio = max(1.0, (observed_std / null_std) ** 2)
  if null_std > 0:
    mu = diff / null_std
    c = math.sqrt(ratio / k_obs + 1 / k_null)
    t, df = mu / c, k_null - 1
    lower = c * _noncentrality_bound(t, df, confidence)
    upper = c * _noncentrality_bound(t, df, 1 - confidence)
  else:
    mu = math.copysign(float('inf'), diff) if diff else float('nan')
    lower = upper = mu
  return ShiftEstimate(
    mu=mu,
    mu_lower=lower,
    mu_upper=upper,
    confidence=float(confidence),
    observed_mean=float(observed.mean()),
    observed_std=observed_std,
    null_mean=float(null.mean()),
    null_std=null_std,
    num_observed=k_obs,
    num_null=k_null,
    variance_ratio=ratio,
  )
