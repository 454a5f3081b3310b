"""One-shot empirical privacy estimate with canary clients, and a check
that the noise is fresh every round.

After Andrew et al., "One-shot Empirical Privacy Estimation for Federated
Learning" (ICLR 2024): k canary clients each send a fixed random direction
u_i (unit vectors in the model space, scaled to `canary_norm`, so clipped
to the clip) in every round they take part; after training, the final
model delta is projected on each canary's direction and on k fresh null
directions that never took part. If the mechanism is mu-GDP for one
client, the observed projections are shifted by about mu null standard
deviations; the estimate fits both as Gaussians of one variance, takes
mu_hat = (mean observed - mean null) / std null and converts it to
epsilon at delta with the Gaussian-DP curve (Dong, Roth, Su 2019):
delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2).

One estimate is noisy (standard error about sqrt(2/k + mu^2/(2k)): +-0.1
in mu for k = 300), so it comes with a confidence interval: under that
Gaussian model, t = mu_hat / sqrt(1/k_obs + 1/k_null) follows a noncentral
t distribution with k_null - 1 degrees of freedom and noncentrality
mu / sqrt(1/k_obs + 1/k_null), and inverting it in the noncentrality gives
exact one-sided bounds `mu_lower` and `mu_upper`, each at level
`confidence` (together a two-sided interval at level 2 * confidence - 1).
They are deterministic given the projections. The test of a mechanism is
`ledger epsilon >= epsilon_lower` (`AuditResult.consistent_with`): a
correct mechanism passes with probability >= `confidence` whatever the
seeds, while one that adds less noise, or does not clip, than the ledger
assumes shows up as `epsilon_lower` above the ledger's epsilon
(`tests/tff_dp/audit_test.py` plants both). The point estimate alone is
not a test: for a correct mechanism it exceeds a tight ledger for about
half of all seeds.

Here it runs directly on an aggregation process (the part of a round that
must be private), with the canaries as the only clients of every round:
the setting of Andrew et al.'s "final model" statistic with full
participation.

The final-model statistic cannot see noise that repeats across rounds
(identical noise every round adds up like one draw scaled by the number of
rounds, which looks like *more* privacy), although the round-to-round
difference of such releases is the difference of the rounds' data, free of
noise. `noise_reuse_check` catches it: each round gets its own canaries,
which take part in that round only; the releases are projected off the
span of all canaries, and what is left (the noise, for a linear
mechanism) is tested for correlation between every pair of rounds.
"""

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np
from scipy import optimize
from scipy import stats
import tensorflow_federated as tff


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
  confidence under the model (two Gaussian samples of one variance whose
  means differ by mu standard deviations).
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


def _check_confidence(confidence) -> None:
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
) -> ShiftEstimate:
  """Estimates the shift of `observed` from `null` in null std units.

  The model: observed ~ N(m + mu * s, s^2) and null ~ N(m, s^2),
  independent samples. With mu_hat = (mean(observed) - mean(null)) /
  std(null) (ddof=1) and c = sqrt(1/len(observed) + 1/len(null)),
  mu_hat / c has the noncentral t distribution with len(null) - 1 degrees
  of freedom and noncentrality mu / c; inverting its cdf in the
  noncentrality gives exact confidence bounds on mu (width shrinking like
  1/sqrt(n)).

  Args:
    observed: The canaries' projections, >= 1 finite values.
    null: The null directions' projections, >= 2 finite values.
    confidence: The level of each one-sided bound, in [0.5, 1).

  Returns:
    A `ShiftEstimate`; if the null's std is 0, mu and its bounds are +-inf
    (NaN if the means are equal too).

  Raises:
    ValueError: On too few or non-finite values, or a bad `confidence`.
  """
  _check_confidence(confidence)
  observed = np.asarray(observed, np.float64).ravel()
  null = np.asarray(null, np.float64).ravel()
  if observed.size < 1 or null.size < 2:
    raise ValueError(
      'Need >= 1 observed and >= 2 null values. Found '
      f'{observed.size} and {null.size}.'
    )
  if not (np.all(np.isfinite(observed)) and np.all(np.isfinite(null))):
    raise ValueError('observed and null must be finite.')
  diff = float(observed.mean() - null.mean())
  null_std = float(np.std(null, ddof=1))
  k_obs, k_null = observed.size, null.size
  if null_std > 0:
    mu = diff / null_std
    c = math.sqrt(1 / k_obs + 1 / k_null)
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
    observed_std=float(np.std(observed, ddof=1)) if k_obs > 1 else 0.0,
    null_mean=float(null.mean()),
    null_std=null_std,
    num_observed=k_obs,
    num_null=k_null,
  )


@dataclasses.dataclass(frozen=True)
class AuditResult:
  """The audit's estimate of mu and epsilon, with confidence bounds.

  `mu_lower`/`epsilon_lower` and `mu_upper`/`epsilon_upper` are one-sided
  bounds at level `confidence` each (see `gaussian_shift_interval`).
  """

  epsilon_estimate: float
  epsilon_lower: float
  epsilon_upper: float
  mu_estimate: float
  mu_lower: float
  mu_upper: float
  confidence: float
  delta: float
  observed_mean: float
  observed_std: float
  null_mean: float
  null_std: float
  num_canaries: int
  rounds: int

  def consistent_with(self, ledger_epsilon: float) -> bool:
    """Whether `ledger_epsilon` (at this delta) >= `epsilon_lower`.

    A mechanism that is as private as its ledger says passes with
    probability >= `confidence`; False is evidence, at that level, that
    the mechanism leaks more than its ledger accounts for.

    Args:
      ledger_epsilon: The ledger's epsilon at `delta` for the rounds run.

    Returns:
      `epsilon_lower <= ledger_epsilon`.
    """
    return bool(self.epsilon_lower <= ledger_epsilon)


def _check_ints(*named) -> None:
  for name, value, low in named:
    if not isinstance(value, (int, np.integer)) or value < low:
      raise ValueError(f'{name} must be an integer >= {low}. Found {value!r}.')


def _shape(shape, dim: int) -> list[int]:
  shape = list(shape) if shape is not None else [dim]
  if int(np.prod(shape)) != dim:
    raise ValueError(f'shape {shape} must hold dim={dim} scalars.')
  return shape


def _unit_directions(rng: np.random.Generator, n: int, dim: int):
  directions = rng.standard_normal((n, dim))
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  return directions


def _releases(factory, shape, cohorts) -> list[np.ndarray]:
  """Runs one round of `factory`'s process per cohort; the flat releases."""
  process = factory.create(tff.TensorType(np.float32, shape))
  state = process.initialize()
  releases = []
  for cohort in cohorts:
    values = [v.astype(np.float32).reshape(shape) for v in cohort]
    out = process.next(state, values)
    state = out.state
    releases.append(np.asarray(out.result, np.float64).ravel())
  return releases


def audit_aggregator(
  factory: tff.aggregators.UnweightedAggregationFactory,
  *,
  dim: int,
  num_canaries: int,
  rounds: int,
  canary_norm: float,
  delta: float,
  seed: int = 0,
  shape: Optional[Sequence[int]] = None,
  confidence: float = 0.95,
) -> AuditResult:
  """Runs `rounds` of `factory` on canaries only; estimates epsilon.

  Args:
    factory: An unweighted aggregator over float32 tensors of `shape`.
    dim: The number of scalars (canary directions are nearly orthogonal
      when dim >> num_canaries).
    num_canaries: k >= 2 canaries (and k null directions).
    rounds: Rounds, >= 1; every canary takes part in each.
    canary_norm: The canaries' norm (at or above the clip).
    delta: The delta of the estimate, in (0, 1).
    seed: Seeds the directions.
    shape: The tensor shape (default `[dim]`), e.g. a matrix for CMP-Fed.
    confidence: The level of each one-sided bound, in [0.5, 1).

  Returns:
    An `AuditResult`; compare a ledger with `result.consistent_with(eps)`.

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  _check_ints(
    ('dim', dim, 1), ('num_canaries', num_canaries, 2), ('rounds', rounds, 1)
  )
  _check_confidence(confidence)
  if not 0 < delta < 1:
    raise ValueError(f'delta must be in (0, 1). Found {delta!r}.')
  shape = _shape(shape, dim)
  rng = np.random.default_rng(seed)
  directions = _unit_directions(rng, 2 * num_canaries, dim)
  canaries, null = directions[:num_canaries], directions[num_canaries:]
  cohort = list(canary_norm * canaries)
  total = sum(_releases(factory, shape, [cohort] * rounds))
  shift = gaussian_shift_interval(
    canaries @ total, null @ total, confidence=confidence
  )
  return AuditResult(
    epsilon_estimate=gdp_epsilon(shift.mu, delta),
    epsilon_lower=gdp_epsilon(shift.mu_lower, delta),
    epsilon_upper=gdp_epsilon(shift.mu_upper, delta),
    mu_estimate=shift.mu,
    mu_lower=shift.mu_lower,
    mu_upper=shift.mu_upper,
    confidence=shift.confidence,
    delta=float(delta),
    observed_mean=shift.observed_mean,
    observed_std=shift.observed_std,
    null_mean=shift.null_mean,
    null_std=shift.null_std,
    num_canaries=num_canaries,
    rounds=rounds,
  )


@dataclasses.dataclass(frozen=True)
class NoiseReuseResult:
  """Cross-round correlation of the noise left after removing the data.

  `correlations[s, t]` is the cosine between rounds s and t's residuals
  (~N(0, 1/m) for independent noise in m dimensions, 1 for identical
  noise, -1 for negated noise), `z_scores[s, t]` the self-normalized
  statistic sum_j x_sj x_tj / sqrt(sum_j x_sj^2 x_tj^2 / (1 - h_j)),
  where h_j is the leverage of coordinate j in the canaries' span (it
  corrects for the projection): ~N(0, 1) for independent zero-mean noise
  of any per-coordinate scale, about sqrt(m / 3) for identical Gaussian
  noise. `reused` is
  max |z| > `threshold`, the two-sided Bonferroni bound at level `alpha`
  over the round pairs.
  """

  reused: bool
  max_abs_correlation: float
  max_abs_z: float
  threshold: float
  alpha: float
  correlations: np.ndarray
  z_scores: np.ndarray
  rounds: int
  residual_dim: int


def noise_reuse_check(
  factory: tff.aggregators.UnweightedAggregationFactory,
  *,
  dim: int,
  num_canaries: int,
  canary_norm: float,
  rounds: int = 2,
  seed: int = 0,
  shape: Optional[Sequence[int]] = None,
  alpha: float = 1e-3,
) -> NoiseReuseResult:
  """Checks that `factory`'s process draws fresh noise every round.

  Round t's clients are `num_canaries` canaries of their own (random
  directions at `canary_norm`) that take part in round t only. Each
  round's release is projected off the span of all `rounds *
  num_canaries` canary directions; with fresh noise the residuals of two
  rounds are independent, while noise repeated (or negated) from round to
  round makes them (anti)correlated, and the rounds' difference would
  release the difference of their canaries free of noise. A mechanism
  that legitimately feeds its released aggregate into later rounds
  (server momentum, error feedback on released values) correlates too:
  check its fresh-noise component.

  Args:
    factory: An unweighted aggregator over float32 tensors of `shape`.
    dim: The number of scalars, > rounds * num_canaries (the residual has
      dim - rounds * num_canaries dimensions; hundreds or more for power).
    num_canaries: Canaries per round, >= 1.
    canary_norm: The canaries' norm, > 0.
    rounds: Rounds, >= 2; every pair of rounds is compared.
    seed: Seeds the directions.
    shape: The tensor shape (default `[dim]`).
    alpha: The false-alarm probability for fresh noise, in (0, 1).

  Returns:
    A `NoiseReuseResult`; `reused` is the verdict. A round whose residual
    is exactly 0 (no noise outside the canaries' span) counts as reused
    noise: its difference from any round is noise-free.

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  _check_ints(
    ('dim', dim, 1), ('num_canaries', num_canaries, 1), ('rounds', rounds, 2)
  )
  if not 0 < alpha < 1:
    raise ValueError(f'alpha must be in (0, 1). Found {alpha!r}.')
  if not (isinstance(canary_norm, (int, float)) and canary_norm > 0):
    raise ValueError(f'canary_norm must be > 0. Found {canary_norm!r}.')
  if dim <= rounds * num_canaries:
    raise ValueError(
      f'dim must be > rounds * num_canaries = {rounds * num_canaries}. '
      f'Found {dim!r}.'
    )
  shape = _shape(shape, dim)
  rng = np.random.default_rng(seed)
  canaries = _unit_directions(rng, rounds * num_canaries, dim)
  cohorts = [
    list(canary_norm * canaries[t * num_canaries : (t + 1) * num_canaries])
    for t in range(rounds)
  ]
  basis, _ = np.linalg.qr(canaries.T)
  # 1 - leverage: the share of a coordinate's variance the projection keeps.
  kept = np.maximum(1 - np.sum(basis**2, axis=1), 1e-12)
  residuals = [
    r - basis @ (basis.T @ r) for r in _releases(factory, shape, cohorts)
  ]
  corr = np.eye(rounds)
  z = np.zeros((rounds, rounds))
  for s in range(rounds):
    for t in range(s + 1, rounds):
      x, y = residuals[s], residuals[t]
      norms = np.linalg.norm(x) * np.linalg.norm(y)
      scale = math.sqrt(float(np.sum((x * y) ** 2 / kept)))
      if norms == 0 or scale == 0:
        corr[s, t], z[s, t] = 1.0, float('inf')
      else:
        corr[s, t] = float(x @ y) / norms
        z[s, t] = float(x @ y) / scale
      corr[t, s], z[t, s] = corr[s, t], z[s, t]
  pairs = rounds * (rounds - 1) // 2
  threshold = float(stats.norm.isf(alpha / (2 * pairs)))
  off = ~np.eye(rounds, dtype=bool)
  max_z = float(np.max(np.abs(z[off])))
  return NoiseReuseResult(
    reused=bool(max_z > threshold),
    max_abs_correlation=float(np.max(np.abs(corr[off]))),
    max_abs_z=max_z,
    threshold=threshold,
    alpha=float(alpha),
    correlations=corr,
    z_scores=z,
    rounds=rounds,
    residual_dim=dim - rounds * num_canaries,
  )
