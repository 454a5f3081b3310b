"""One-shot empirical privacy estimate with canary clients, a check that the
noise is fresh every round, and the planted bugs the audit must catch.

After Andrew et al., "One-shot Empirical Privacy Estimation for Federated
Learning" (ICLR 2024): k canary clients each send a fixed random direction
u_i (a unit vector in the model space) scaled to `canary_norm`, in every
round they take part; after training, the sum of the releases is projected
on each canary's direction and on k fresh null directions that never took
part. If the mechanism is mu-GDP for one client, the observed projections
are shifted by about mu null standard deviations; the estimate fits both
as Gaussians of one variance, takes mu_hat = (mean observed - mean null) /
std null and converts it to epsilon at delta with the Gaussian-DP curve
(Dong, Roth, Su 2019): delta(eps) = Phi(-eps/mu + mu/2) - e^eps
Phi(-eps/mu - mu/2).

One estimate is noisy (standard error about sqrt(2/k + mu^2/(2k)): +-0.1
in mu for k = 300), so it comes with a confidence interval: under that
Gaussian model, t = mu_hat / sqrt(1/k_obs + 1/k_null) follows a noncentral
t distribution with k_null - 1 degrees of freedom and noncentrality
mu / sqrt(1/k_obs + 1/k_null), and inverting it in the noncentrality gives
exact one-sided bounds `mu_lower` and `mu_upper`, each at level
`confidence` (together a two-sided interval at level 2 * confidence - 1).
The test of a mechanism is `ledger epsilon >= epsilon_lower`
(`AuditResult.flagged` is its negation): a correct mechanism passes with
probability >= `confidence` whatever the seeds, while one that adds less
noise, or clips less, than its ledger assumes shows up as `epsilon_lower`
above the ledger's epsilon. The point estimate alone is not a test: for a
correct mechanism it exceeds a tight ledger for about half of all seeds.

What the audit compares against, and how:
* Canaries beyond the clip. `audit_method` sends canaries of norm
  `CANARY_CLIP_RATIO` (3) times the clip: a mechanism that clips sends
  them at the clip (the shift the ledger allows), one that does not clip
  shifts them three times as far.
* The ledger's own event path. Every round's event is read the way the
  runner reads it (`tff_dp.aggregators.dp_events.released_event`: from
  the aggregator state, or as the factory declares it, from its
  measurements for DDGauss) and recorded in a
  `tff_dp.privacy.PrivacyLedger` of the sampling that ran; the ledger
  epsilon is that ledger's `epsilon()`, the smaller of its RDP and PLD
  values (both are upper bounds). A bug that also misstates the event
  (half the noise, and an event that says full noise) is caught; one
  whose event honestly says what ran is not a bug.
* Sampling. With `sampling_rate` q < 1 each canary takes part in each
  round independently with probability q (null directions never), and
  the ledger records Poisson-sampled events. A canary's shift is then
  q T C on average and varies with how often it took part, so the
  interval takes the canaries' own variance when it exceeds the null's
  (never narrower than the equal-variance one). The one-shot estimate of
  a sampled Gaussian mechanism is about mu = q sqrt(T) / z, below the
  accountants' sampled bound (whose CLT limit is q sqrt(T (e^{1/z^2} -
  1)), Dong et al.), so a correct mechanism passes there too.
* Where the audit looks (`Probe`). By default the final model delta (the
  sum of the results). A mechanism that releases less than the update
  needs canaries aligned with what it keeps, or a projection in the space
  where it adds its noise, to have power: random-k and Top-K canaries
  restricted to the round's public coordinates (`canary_values`); DPSFL's
  noised sketch, read from the server state, with the canaries' sketches
  as directions (`release`, `embed`). A probe that reads server state is
  white-box: it audits the release the ledger accounts for, of which the
  rest is post-processing. CMP-Fed's final delta U V^T projected on a
  canary is already its phase-2 payload's projection, which canaries
  beyond the clip fill; its phase-1 release is not audited on its own, so
  it audits at about 1/sqrt(2) of its ledger's mu (still enough to catch
  half the noise).

The final-model statistic cannot see noise that repeats across rounds
(identical noise every round adds up like one draw scaled by the number of
rounds, which looks like *more* privacy), although the round-to-round
difference of such releases is the difference of the rounds' data, free of
noise. `noise_reuse_check` catches it: each round gets its own canaries,
which take part in that round only; the releases are projected off the
span of all canaries, and what is left (the noise, for a linear
mechanism) is tested for correlation between every pair of rounds. A
mechanism that feeds its released aggregate into later rounds (DPSFL's
error feedback) correlates there legitimately: check it on the fresh
release (DPSFL's probe reads the round's noised sketch).

Planted bugs (`PLANTED_BUGS`, `planted_dp_fedavg`, `planted_method`,
`with_half_noise`) are DP-FedAvg queries that report the event of the
correct mechanism while they skip the clip, add half the noise or never
advance their noise seed, and any private method built with half its
noise multiplier while declaring the full one: the audit's calibration
(`tests/tff_dp/reporting/audit_test.py`, `benchmarks/privacy_audit.py`).
"""

import dataclasses
import math
from typing import Any, Callable, Optional, Sequence, Union

import dp_accounting
import numpy as np
from scipy import optimize
from scipy import stats
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp import methods as methods_lib
from tff_dp import privacy
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import dp_events
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import finite_guard
from tff_dp.aggregators import mf_strategy

# Canaries' norm over the clip in `audit_method`: far enough beyond the
# clip that a missing clip shifts them three times the allowed distance.
CANARY_CLIP_RATIO = 3.0
PLANTED_BUGS = ('no_clip', 'half_noise', 'reused_noise')


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
  _check_confidence(confidence)
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


@dataclasses.dataclass(frozen=True)
class AuditResult:
  """The audit's estimate of mu and epsilon, with confidence bounds.

  `mu_lower`/`epsilon_lower` and `mu_upper`/`epsilon_upper` are one-sided
  bounds at level `confidence` each (see `gaussian_shift_interval`).
  `events` are the rounds' events as the audit read them (unsampled), and
  `ledger_epsilon_rdp`/`ledger_epsilon_pld` the epsilon at `delta` of a
  `PrivacyLedger` that recorded them under Poisson sampling at
  `sampling_rate` (NaN without an event reader; PLD NaN where the ledger
  has none).
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
  sampling_rate: float = 1.0
  canary_norm: float = float('nan')
  participation: float = 1.0
  events: tuple = ()
  ledger_epsilon_rdp: float = float('nan')
  ledger_epsilon_pld: float = float('nan')

  @property
  def ledger_epsilon(self) -> float:
    """The ledger's tightest epsilon: the smaller of its RDP and PLD
    values (PLD may be NaN); NaN without a ledger."""
    values = [
      e
      for e in (self.ledger_epsilon_pld, self.ledger_epsilon_rdp)
      if not math.isnan(e)
    ]
    return min(values) if values else float('nan')

  @property
  def ledger_accountant(self) -> str:
    """'PLD' or 'RDP': which accountant gave `ledger_epsilon` ('' if none)."""
    if math.isnan(self.ledger_epsilon):
      return ''
    return 'PLD' if self.ledger_epsilon == self.ledger_epsilon_pld else 'RDP'

  @property
  def flagged(self) -> bool:
    """Whether `epsilon_lower` exceeds the recorded ledger's epsilon.

    Raises:
      ValueError: If the audit ran without an event reader (no ledger).
    """
    if math.isnan(self.ledger_epsilon):
      raise ValueError(
        'This audit recorded no events: pass event_fn (or use '
        'audit_method), or compare with consistent_with(epsilon).'
      )
    return not self.consistent_with(self.ledger_epsilon)

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


# `(state before the round, canaries' nominal updates [n, dim]) -> the
# updates they send [n, dim]`.
CanaryFn = Callable[[Any, np.ndarray], np.ndarray]
# `(state before, state after, result) -> the round's release, flat`.
ReleaseFn = Callable[[Any, Any, Any], np.ndarray]
# `directions [n, dim] -> their images in the release's space [n, m]`.
EmbedFn = Callable[[np.ndarray], np.ndarray]
# `(state after the round, its measurements) -> the round's DpEvent`.
EventFn = Callable[[Any, Any], dp_accounting.DpEvent]


@dataclasses.dataclass(frozen=True)
class Probe:
  """What the canaries send and where the audit looks.

  The default (all None) sends the canaries' updates as they are and
  projects the flat result of each round (the final model delta).

  Attributes:
    canary_values: The updates the canaries send, from the state before
      the round (e.g. restricted to the round's public coordinates).
    release: The release the ledger's event accounts for (e.g. a noised
      sketch the server keeps in its state).
    embed: The linear map taking update directions into the release's
      space (e.g. the count sketch); the images are normalised, and the
      canaries' and the null directions' projections are taken on them.
  """

  canary_values: Optional[CanaryFn] = None
  release: Optional[ReleaseFn] = None
  embed: Optional[EmbedFn] = None


Aggregator = Union[
  tff.aggregators.UnweightedAggregationFactory, tff.templates.AggregationProcess
]


def _check_ints(*named) -> None:
  for name, value, low in named:
    if (
      isinstance(value, bool)
      or not isinstance(value, (int, np.integer))
      or value < low
    ):
      raise ValueError(f'{name} must be an integer >= {low}. Found {value!r}.')


def _check_positive(name: str, value) -> None:
  if not (
    isinstance(value, (int, float, np.floating))
    and not isinstance(value, bool)
    and math.isfinite(value)
    and value > 0
  ):
    raise ValueError(f'{name} must be a finite number > 0. Found {value!r}.')


def _shape(shape, dim: int) -> list[int]:
  shape = list(shape) if shape is not None else [dim]
  if int(np.prod(shape)) != dim:
    raise ValueError(f'shape {shape} must hold dim={dim} scalars.')
  return shape


def _unit_directions(rng: np.random.Generator, n: int, dim: int):
  directions = rng.standard_normal((n, dim))
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  return directions


def _process(aggregator: Aggregator, shape) -> tff.templates.AggregationProcess:
  """`aggregator`'s process over float32 tensors of `shape`."""
  if isinstance(aggregator, tff.templates.AggregationProcess):
    return aggregator
  if not isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory):
    raise TypeError(
      'Expected a tff.aggregators.UnweightedAggregationFactory or an '
      f'AggregationProcess. Found {type(aggregator)!r}.'
    )
  return aggregator.create(tff.TensorType(np.float32, shape))


def _run_rounds(
  aggregator: Aggregator,
  shape,
  cohorts: Sequence[np.ndarray],
  probe: Probe,
  event_fn: Optional[EventFn],
):
  """One round per cohort of nominal updates; (releases, events)."""
  process = _process(aggregator, shape)
  state = process.initialize()
  releases, events = [], []
  for nominal in cohorts:
    values = nominal
    if probe.canary_values is not None:
      values = np.asarray(probe.canary_values(state, nominal), np.float64)
      if values.shape != nominal.shape:
        raise ValueError(
          f'Probe.canary_values must return shape {nominal.shape}. Found '
          f'{values.shape}.'
        )
    out = process.next(
      state, [v.astype(np.float32).reshape(shape) for v in values]
    )
    if probe.release is None:
      release = np.asarray(out.result, np.float64).ravel()
    else:
      release = np.asarray(
        probe.release(state, out.state, out.result), np.float64
      ).ravel()
    releases.append(release)
    if event_fn is not None:
      events.append(event_fn(out.state, out.measurements))
    state = out.state
  return releases, events


def _embedded(directions: np.ndarray, probe: Probe) -> np.ndarray:
  """The unit images of `directions` in the release's space."""
  if probe.embed is None:
    return directions
  images = np.asarray(probe.embed(directions), np.float64)
  images = images.reshape(directions.shape[0], -1)
  norms = np.linalg.norm(images, axis=1, keepdims=True)
  if not np.all(norms > 0):
    raise ValueError('Probe.embed mapped a direction to 0.')
  return images / norms


def audit_aggregator(
  aggregator: Aggregator,
  *,
  dim: int,
  num_canaries: int,
  rounds: int,
  canary_norm: float,
  delta: float,
  seed: int = 0,
  shape: Optional[Sequence[int]] = None,
  confidence: float = 0.95,
  sampling_rate: float = 1.0,
  probe: Optional[Probe] = None,
  event_fn: Optional[EventFn] = None,
) -> AuditResult:
  """Runs `rounds` of an aggregator on canaries only; estimates epsilon.

  Args:
    aggregator: An unweighted aggregation factory over float32 tensors of
      `shape`, or a process already created for them (reused, e.g. for a
      mechanism that is slow to build).
    dim: The number of scalars (canary directions are nearly orthogonal
      when dim >> num_canaries).
    num_canaries: k >= 2 canaries (and k null directions).
    rounds: Rounds, >= 1.
    canary_norm: The canaries' norm, > 0 (above the clip: then a missing
      clip shows).
    delta: The delta of the estimate and of the ledger, in (0, 1).
    seed: Seeds the directions and the canaries' participation (public
      randomness of the audit, not the mechanism's noise).
    shape: The tensor shape (default `[dim]`), e.g. a matrix for CMP-Fed.
    confidence: The level of each one-sided bound, in [0.5, 1).
    sampling_rate: q in (0, 1]: each canary takes part in each round with
      probability q, independently (1: every round).
    probe: Where the audit looks (default: the final model delta).
    event_fn: Reads each round's DpEvent from the state after it and its
      measurements; the events are recorded in a Poisson-sampled
      `PrivacyLedger` of rate `sampling_rate` over the k canaries.

  Returns:
    An `AuditResult`; `result.flagged` with an `event_fn`, else compare a
    ledger with `result.consistent_with(eps)`.

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  _check_audit_args(
    dim, num_canaries, rounds, canary_norm, delta, confidence, sampling_rate
  )
  probe = probe or Probe()
  shape = _shape(shape, dim)
  rng = np.random.default_rng(seed)
  directions = _unit_directions(rng, 2 * num_canaries, dim)
  canaries = directions[:num_canaries]
  takes_part = _participation(rng, rounds, num_canaries, sampling_rate)
  cohorts = [canary_norm * canaries[mask] for mask in takes_part]
  releases, events = _run_rounds(aggregator, shape, cohorts, probe, event_fn)
  projections = _embedded(directions, probe) @ sum(releases)
  shift = gaussian_shift_interval(
    projections[:num_canaries],
    projections[num_canaries:],
    confidence=confidence,
    equal_variance=sampling_rate == 1,
  )
  eps_rdp = eps_pld = float('nan')
  if event_fn is not None:
    eps_rdp, eps_pld = _ledger_epsilon(
      events, num_canaries, sampling_rate, delta
    )
  return AuditResult(
    **_shift_fields(shift, delta),
    num_canaries=num_canaries,
    rounds=rounds,
    sampling_rate=float(sampling_rate),
    canary_norm=float(canary_norm),
    participation=float(takes_part.mean()),
    events=tuple(events),
    ledger_epsilon_rdp=float(eps_rdp),
    ledger_epsilon_pld=float(eps_pld),
  )


def _check_audit_args(
  dim, num_canaries, rounds, canary_norm, delta, confidence, sampling_rate
) -> None:
  """`audit_aggregator`'s argument checks (ValueError naming the range)."""
  _check_ints(
    ('dim', dim, 1), ('num_canaries', num_canaries, 2), ('rounds', rounds, 1)
  )
  _check_confidence(confidence)
  _check_positive('canary_norm', canary_norm)
  if not 0 < delta < 1:
    raise ValueError(f'delta must be in (0, 1). Found {delta!r}.')
  if not (isinstance(sampling_rate, (int, float)) and 0 < sampling_rate <= 1):
    raise ValueError(
      f'sampling_rate must be in (0, 1]. Found {sampling_rate!r}.'
    )


def _participation(
  rng: np.random.Generator, rounds: int, num_canaries: int, sampling_rate
) -> np.ndarray:
  """`[rounds, num_canaries]` booleans: who takes part in which round.

  Draws from `rng` only when `sampling_rate` < 1 (Poisson participation).
  """
  if sampling_rate == 1:
    return np.ones((rounds, num_canaries), bool)
  return rng.random((rounds, num_canaries)) < sampling_rate


def _ledger_epsilon(
  events, num_canaries: int, sampling_rate, delta: float
) -> tuple[float, float]:
  """(RDP, PLD) epsilon of `events` in a Poisson-sampled ledger of the
  canaries at `sampling_rate`."""
  ledger = privacy.PrivacyLedger(
    privacy.Sampling('poisson', int(num_canaries), rate=float(sampling_rate)),
    delta,
  )
  for event in events:
    ledger.record(event)
  return ledger.epsilon()


def _shift_fields(shift: ShiftEstimate, delta: float) -> dict[str, Any]:
  """`AuditResult`'s estimate fields from a shift interval, at `delta`."""
  return dict(
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
  )


def runner_event_fn(
  method: methods_lib.Method, params: methods_lib.MethodParams
) -> EventFn:
  """Reads a round's event as the runner does: `dp_events.released_event`
  of the method's aggregator (`method_aggregator`), its state and its
  measurements."""
  factory = method_aggregator(method, params)

  def event_fn(state, measurements) -> dp_accounting.DpEvent:
    return dp_events.released_event(factory, state, measurements)

  return event_fn


class DeclaredEventFactory(tff.aggregators.UnweightedAggregationFactory):
  """`inner`'s aggregation, declaring `event` as each round's release
  (`dp_events.released_event`) whatever ran: a planted ledger bug."""

  def __init__(self, inner, event: dp_accounting.DpEvent):
    self._inner, self._event = inner, event

  def create(self, value_type) -> tff.templates.AggregationProcess:
    return self._inner.create(value_type)

  def released_event(self, state, measurements) -> dp_accounting.DpEvent:
    del state, measurements
    return self._event


def method_aggregator(
  method: methods_lib.Method, params: methods_lib.MethodParams
) -> tff.aggregators.UnweightedAggregationFactory:
  """The method's aggregator as the runner builds it (finite guard first).

  Raises:
    ValueError: If the method is not private or its aggregator is not an
      unweighted factory.
  """
  if not method.private:
    raise ValueError(
      f'Method {method.name!r} is not private: there is no ledger to audit.'
    )
  aggregator = method.build_aggregator(params)
  if not isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory):
    raise ValueError(
      f'Method {method.name!r} builds {type(aggregator)!r}; the audit runs '
      'unweighted aggregators.'
    )
  return finite_guard.FiniteGuardFactory(aggregator)


def audit_method(
  method: methods_lib.Method,
  params: methods_lib.MethodParams,
  *,
  shape: Sequence[int],
  num_canaries: int,
  rounds: int,
  delta: float,
  canary_norm: Optional[float] = None,
  sampling_rate: float = 1.0,
  probe: Optional[Probe] = None,
  seed: int = 0,
  confidence: float = 0.95,
  aggregator: Optional[Aggregator] = None,
) -> AuditResult:
  """Audits a method's aggregator against the ledger of what it released.

  The aggregator is `method_aggregator(method, params)` (or `aggregator`,
  e.g. that factory's process, already created); each round's event is
  read by `runner_event_fn(method, params)`.

  Args:
    method: A private method (a registry entry, or a planted one).
    params: Its params; `num_model_params` must be prod(shape), and
      `expected_clients_per_round` should be q * num_canaries.
    shape: The tensor shape of the value.
    num_canaries: k >= 2.
    rounds: Rounds, >= 1.
    delta: In (0, 1).
    canary_norm: Default `CANARY_CLIP_RATIO` x `params.clip`.
    sampling_rate: Poisson rate q of the canaries, in (0, 1].
    probe: Where the audit looks (default: the final model delta).
    seed: Seeds the directions and the participation.
    confidence: The level of each one-sided bound, in [0.5, 1).
    aggregator: The process or factory to run instead of building one.

  Returns:
    An `AuditResult` with its ledger: `result.flagged` is the verdict.

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  dim = int(np.prod(shape))
  if params.num_model_params != dim:
    raise ValueError(
      f'params.num_model_params must be prod(shape) = {dim}. Found '
      f'{params.num_model_params!r}.'
    )
  if aggregator is None:
    aggregator = method_aggregator(method, params)
  return audit_aggregator(
    aggregator,
    dim=dim,
    shape=shape,
    num_canaries=num_canaries,
    rounds=rounds,
    canary_norm=(
      CANARY_CLIP_RATIO * params.clip if canary_norm is None else canary_norm
    ),
    delta=delta,
    seed=seed,
    confidence=confidence,
    sampling_rate=sampling_rate,
    probe=probe,
    event_fn=runner_event_fn(method, params),
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
  aggregator: Aggregator,
  *,
  dim: int,
  num_canaries: int,
  canary_norm: float,
  rounds: int = 2,
  seed: int = 0,
  shape: Optional[Sequence[int]] = None,
  alpha: float = 1e-3,
  probe: Optional[Probe] = None,
  strategy: Optional[mf_strategy.Strategy] = None,
) -> NoiseReuseResult:
  """Checks that an aggregator's process draws fresh noise every round.

  Round t's clients are `num_canaries` canaries of their own (random
  directions at `canary_norm`) that take part in round t only. Each
  round's release is projected off the span of all `rounds *
  num_canaries` canary directions (their images, with a probe's
  `embed`); with fresh noise the residuals of two rounds are independent,
  while noise repeated (or negated) from round to round makes them
  (anti)correlated, and the rounds' difference would release the
  difference of their canaries free of noise. A mechanism that
  legitimately feeds its released aggregate into later rounds (server
  momentum, error feedback on released values) correlates too: check its
  fresh release with a probe.

  Args:
    aggregator: An unweighted aggregation factory over float32 tensors of
      `shape`, or a process created for them.
    dim: The number of scalars, > rounds * num_canaries (the residual has
      m - rounds * num_canaries dimensions, m the release's size;
      hundreds or more for power).
    num_canaries: Canaries per round, >= 1.
    canary_norm: The canaries' norm, > 0.
    rounds: Rounds, >= 2; every pair of rounds is compared.
    seed: Seeds the directions.
    shape: The tensor shape (default `[dim]`).
    alpha: The false-alarm probability for fresh noise, in (0, 1).
    probe: Where the check looks (default: each round's result).
    strategy: For noise correlated across rounds by design
      (`mf_strategy.Strategy`, `dp_fedavg.gaussian_fixed(noise=...)`): the
      residuals are whitened by C first (row t becomes `sum_j C[t, j]
      r_j`, the fresh draw `w_t` of a correct stream), so the correlation
      the strategy puts in passes and a stream whose draws repeat is
      still caught. Default None: the rounds' noise must be independent.

  Returns:
    A `NoiseReuseResult`; `reused` is the verdict. A round whose residual
    is exactly 0 (no noise outside the canaries' span) counts as reused
    noise: its difference from any round is noise-free.

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  _check_reuse_args(dim, num_canaries, rounds, canary_norm, alpha)
  probe = probe or Probe()
  shape = _shape(shape, dim)
  rng = np.random.default_rng(seed)
  canaries = _unit_directions(rng, rounds * num_canaries, dim)
  cohorts = [
    canary_norm * canaries[t * num_canaries : (t + 1) * num_canaries]
    for t in range(rounds)
  ]
  images = _embedded(canaries, probe)
  basis, kept = _canary_span(images)
  releases, _ = _run_rounds(aggregator, shape, cohorts, probe, None)
  residuals = [r - basis @ (basis.T @ r) for r in releases]
  if strategy is not None:
    # The projection is the same linear map every round, so whitening
    # after it is whitening the releases' noise.
    residuals = list(strategy.matrix(rounds) @ np.stack(residuals))
  corr, z = _pairwise_statistics(residuals, kept)
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
    residual_dim=images.shape[1] - rounds * num_canaries,
  )


def _check_reuse_args(dim, num_canaries, rounds, canary_norm, alpha) -> None:
  """`noise_reuse_check`'s argument checks (ValueError naming the range)."""
  _check_ints(
    ('dim', dim, 1), ('num_canaries', num_canaries, 1), ('rounds', rounds, 2)
  )
  if not 0 < alpha < 1:
    raise ValueError(f'alpha must be in (0, 1). Found {alpha!r}.')
  _check_positive('canary_norm', canary_norm)
  if dim <= rounds * num_canaries:
    raise ValueError(
      f'dim must be > rounds * num_canaries = {rounds * num_canaries}. '
      f'Found {dim!r}.'
    )


def _canary_span(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """An orthonormal basis of the canaries' images, and 1 - leverage.

  Raises:
    ValueError: If the release has no more scalars than there are images.
  """
  if images.shape[1] <= images.shape[0]:
    raise ValueError(
      f'The release has {images.shape[1]} scalars: it must have more than '
      f'rounds * num_canaries = {images.shape[0]}.'
    )
  basis, _ = np.linalg.qr(images.T)
  # 1 - leverage: the share of a coordinate's variance the projection keeps.
  kept = np.maximum(1 - np.sum(basis**2, axis=1), 1e-12)
  return basis, kept


def _pairwise_statistics(
  residuals: Sequence[np.ndarray], kept: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """(cosines, self-normalized z) of every pair of rounds' residuals.

  `kept` is 1 - leverage per coordinate (`NoiseReuseResult`). A pair
  with a zero residual or scale counts as identical noise (1, inf).
  """
  rounds = len(residuals)
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
  return corr, z


class _PlantedGaussianSumQuery(dp_queries.SeededGaussianSumQuery):
  """DP-FedAvg's sum query with one planted bug; its event is the correct
  mechanism's, `GaussianDpEvent(stddev / l2_norm_clip)`."""

  def __init__(self, bug: str, l2_norm_clip: float, stddev: float, seed):
    if bug not in PLANTED_BUGS:
      raise ValueError(f'bug must be one of {PLANTED_BUGS}. Found {bug!r}.')
    super().__init__(l2_norm_clip, stddev, seed)
    self._bug = bug

  def preprocess_record_impl(self, params, record):
    if self._bug != 'no_clip':
      return super().preprocess_record_impl(params, record)
    return record, tf.linalg.global_norm(tf.nest.flatten(record))

  def get_noised_result(self, sample_state, global_state):
    if self._bug == 'half_noise':
      result, new_state, _ = super().get_noised_result(
        sample_state, global_state._replace(stddev=global_state.stddev / 2)
      )
      event = dp_accounting.GaussianDpEvent(
        global_state.stddev / global_state.l2_norm_clip
      )
      return result, new_state._replace(stddev=global_state.stddev), event
    result, new_state, event = super().get_noised_result(
      sample_state, global_state
    )
    if self._bug == 'reused_noise':
      new_state = global_state  # The seed never advances.
    return result, new_state, event


def planted_dp_fedavg(
  bug: str,
  noise_multiplier: float,
  clients_per_round: float,
  clip: float,
  *,
  noise_seed: dp_queries.NoiseSeed = None,
) -> dp_fedavg.DPFactory:
  """A broken `dp_fedavg.gaussian_fixed` whose state holds the correct event.

  Args:
    bug: One of `PLANTED_BUGS`: 'no_clip' (noise for `clip`, nothing
      clipped), 'half_noise' (noise multiplier / 2 added) or
      'reused_noise' (the noise seed never advances: the same noise every
      round).
    noise_multiplier: The multiplier the event reports, >= 0.
    clients_per_round: The mean's denominator, > 0.
    clip: The clip the noise is calibrated to, > 0.
    noise_seed: As for `dp_fedavg.gaussian_fixed`.

  Raises:
    ValueError: On an unknown bug or a bad argument.
  """
  # Validates the numbers.
  dp_fedavg.gaussian_fixed(noise_multiplier, clients_per_round, clip)
  query = tfp.NormalizedQuery(
    _PlantedGaussianSumQuery(bug, clip, clip * noise_multiplier, noise_seed),
    denominator=float(clients_per_round),
  )
  return dp_fedavg.DPFactory(query)


class _ReusedCorrelatedQuery(correlated_noise.CorrelatedGaussianSumQuery):
  """The correlated-noise query with its seed never advanced: the same
  draw `w` every round, correlated by `C^-1` as a correct stream is."""

  def get_noised_result(self, sample_state, global_state):
    result, new_state, event = super().get_noised_result(
      sample_state, global_state
    )
    return result, new_state._replace(seed=global_state.seed), event


class _PlantedCorrelatedFactory(dp_fedavg.CorrelatedDPFactory):
  def _build_query(self, specs):
    clip, stddev, strategy, seed = self._mf_args
    return tfp.NormalizedQuery(
      _ReusedCorrelatedQuery(clip, stddev, strategy, specs, seed),
      denominator=self._denominator,
    )


def planted_correlated_reuse(
  strategy: mf_strategy.Strategy,
  noise_multiplier: float,
  clients_per_round: float,
  clip: float,
  *,
  noise_seed: dp_queries.NoiseSeed = None,
) -> dp_fedavg.DPFactory:
  """`dp_fedavg.gaussian_fixed(..., noise=strategy)` whose noise seed
  never advances (one draw repeated through `C^-1`), its event the correct
  one: what `noise_reuse_check(..., strategy=strategy)` must catch.

  Raises:
    ValueError: On a bad argument (as `gaussian_fixed`).
  """
  dp_fedavg.gaussian_fixed(
    noise_multiplier, clients_per_round, clip, noise=strategy
  )
  return _PlantedCorrelatedFactory(
    clip,
    clip * noise_multiplier,
    strategy,
    clients_per_round,
    noise_seed,
    None,
  )


def planted_method(bug: str) -> methods_lib.Method:
  """DP-FedAvg with a planted bug, its event read from its state (as
  `dp_fedavg`'s is); not registered."""
  if bug not in PLANTED_BUGS:
    raise ValueError(f'bug must be one of {PLANTED_BUGS}. Found {bug!r}.')
  dp_fedavg_method = methods_lib.METHODS['dp_fedavg']
  return dataclasses.replace(
    dp_fedavg_method,
    name=f'dp_fedavg_planted_{bug}',
    description=f'DP-FedAvg with a planted bug ({bug}).',
    build_aggregator=lambda p: planted_dp_fedavg(
      bug,
      p.noise_multiplier,
      p.expected_clients_per_round,
      p.clip,
      noise_seed=p.noise_seed,
    ),
    setup=None,
  )


def with_half_noise(method: methods_lib.Method) -> methods_lib.Method:
  """`method` built with half its noise multiplier, declaring the full one.

  Its factory declares `method.round_event(z, params)` (the params' z) as
  its release (`DeclaredEventFactory`), so the ledger claims twice the
  noise that runs. Not registered.

  Raises:
    ValueError: If the method declares no round event (not private).
  """
  if method.round_event is None:
    raise ValueError(f'Method {method.name!r} declares no round event.')

  def build(p: methods_lib.MethodParams):
    return DeclaredEventFactory(
      method.build_aggregator(
        dataclasses.replace(p, noise_multiplier=p.noise_multiplier / 2)
      ),
      method.round_event(p.noise_multiplier, p),
    )

  return dataclasses.replace(
    method,
    name=f'{method.name}_planted_half_noise',
    description=f'{method.description} Planted bug: half the noise.',
    build_aggregator=build,
  )
