"""One-shot empirical privacy estimate with canary clients: the audit's
entry points (`audit_aggregator`, `audit_method`) and its verdict
(`AuditResult`).

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
* Where the audit looks (`canary_rounds.Probe`). By default the final
  model delta (the sum of the results). A mechanism that releases less
  than the update needs canaries aligned with what it keeps, or a
  projection in the space where it adds its noise, to have power:
  random-k and Top-K canaries restricted to the round's public
  coordinates (`canary_values`); DPSFL's noised sketch, read from the
  server state, with the canaries' sketches as directions (`release`,
  `embed`). A probe that reads server state is white-box: it audits the
  release the ledger accounts for, of which the rest is post-processing.
  CMP-Fed's final delta U V^T projected on a canary is already its
  phase-2 payload's projection, which canaries beyond the clip fill; its
  phase-1 release is not audited on its own, so it audits at about
  1/sqrt(2) of its ledger's mu (still enough to catch half the noise).

Around it: the statistics in `gaussian_shift` (the shift interval and
the Gaussian-DP curve), the rounds of canaries in `canary_rounds`, the
check that the noise is fresh every round in `noise_reuse` and the
planted bugs the audit must catch in `planted_bugs`.
"""

import dataclasses
import math
from typing import Any, Optional, Sequence

import dp_accounting
import numpy as np
import tensorflow_federated as tff

from tff_dp import methods as methods_lib
from tff_dp import privacy
from tff_dp.aggregators import dp_events
from tff_dp.aggregators import finite_guard
from tff_dp.reporting import canary_rounds
from tff_dp.reporting import gaussian_shift


# Canaries' norm over the clip in `audit_method`: far enough beyond the
# clip that a missing clip shifts them three times the allowed distance.
CANARY_CLIP_RATIO = 3.0


@dataclasses.dataclass(frozen=True)
class AuditResult:
  """The audit's estimate of mu and epsilon, with confidence bounds.

  `mu_lower`/`epsilon_lower` and `mu_upper`/`epsilon_upper` are one-sided
  bounds at level `confidence` each (see
  `gaussian_shift.gaussian_shift_interval`).
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


def audit_aggregator(
  aggregator: canary_rounds.Aggregator,
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
  probe: Optional[canary_rounds.Probe] = None,
  event_fn: Optional[canary_rounds.EventFn] = None,
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
  probe = probe or canary_rounds.Probe()
  shape = canary_rounds.shape(shape, dim)
  rng = np.random.default_rng(seed)
  directions = canary_rounds.unit_directions(rng, 2 * num_canaries, dim)
  canaries = directions[:num_canaries]
  takes_part = _participation(rng, rounds, num_canaries, sampling_rate)
  cohorts = [canary_norm * canaries[mask] for mask in takes_part]
  releases, events = canary_rounds.run_rounds(
    aggregator, shape, cohorts, probe, event_fn
  )
  shift = _canary_shift(
    directions, releases, probe, num_canaries, confidence, sampling_rate
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


def _canary_shift(
  directions, releases, probe, num_canaries, confidence, sampling_rate
) -> gaussian_shift.ShiftEstimate:
  """The shift of the canaries' projections (the first `num_canaries`
  directions) on the summed releases from the null directions'."""
  projections = canary_rounds.embedded(directions, probe) @ sum(releases)
  return gaussian_shift.gaussian_shift_interval(
    projections[:num_canaries],
    projections[num_canaries:],
    confidence=confidence,
    equal_variance=sampling_rate == 1,
  )


def _check_audit_args(
  dim, num_canaries, rounds, canary_norm, delta, confidence, sampling_rate
) -> None:
  """`audit_aggregator`'s argument checks (ValueError naming the range)."""
  canary_rounds.check_ints(
    ('dim', dim, 1), ('num_canaries', num_canaries, 2), ('rounds', rounds, 1)
  )
  gaussian_shift.check_confidence(confidence)
  canary_rounds.check_positive('canary_norm', canary_norm)
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


def _shift_fields(
  shift: gaussian_shift.ShiftEstimate, delta: float
) -> dict[str, Any]:
  """`AuditResult`'s estimate fields from a shift interval, at `delta`."""
  return dict(
    epsilon_estimate=gaussian_shift.gdp_epsilon(shift.mu, delta),
    epsilon_lower=gaussian_shift.gdp_epsilon(shift.mu_lower, delta),
    epsilon_upper=gaussian_shift.gdp_epsilon(shift.mu_upper, delta),
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
) -> canary_rounds.EventFn:
  """Reads a round's event as the runner does: `dp_events.released_event`
  of the method's aggregator (`method_aggregator`), its state and its
  measurements."""
  factory = method_aggregator(method, params)

  def event_fn(state, measurements) -> dp_accounting.DpEvent:
    return dp_events.released_event(factory, state, measurements)

  return event_fn


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
  probe: Optional[canary_rounds.Probe] = None,
  seed: int = 0,
  confidence: float = 0.95,
  aggregator: Optional[canary_rounds.Aggregator] = None,
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
