"""Privacy of noise correlated across rounds (matrix factorisation): its
participation schemas, sensitivity and events.

The mechanism (`aggregators.mf_strategy`): round t releases the clipped sum
of its cohort plus `z * clip * (C^-1 w)_t`, `w_t` standard Gaussian, for a
lower-triangular Toeplitz strategy `C`. The stream is a post-processing of
`C x + z clip w`, one Gaussian mechanism over the whole run, so its
privacy rests on the L2 sensitivity of `C x` to one client, which depends
on which rounds a client can join. Both schemas here split the clients
into `groups` fixed groups (by a public seed; `tff_dp.job.cohorts.partition`)
and draw round t's cohort from group `t mod groups`, so a client's
participations are at least `groups` rounds apart. Neighbouring: add or
remove one client where each client's group is a function of its own id
(`partition='by_client_id'`); zero-out one client where the groups are a
permutation of the whole population (`'balanced'`, whose groups move when
a client is added; `sampling.Sampling`). The epsilon is the same number.

* **Cyclic Poisson (amplified banded MF)**, `Participation(groups, rate)`:
  each member of round t's group joins with probability `rate`. Theorem
  (Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu,
  "(Amplified) Banded Matrix Factorization: A unified approach to private
  training", NeurIPS 2023, https://arxiv.org/abs/2306.08153: Theorem 4,
  with Algorithm 2's block-cyclic Poisson sampling, as jax_privacy's
  `matrix_factorization.toeplitz.optimize_coefs_for_amplifications` cites
  them; the paper's own text was not at hand here): for
  a lower-triangular `C` with at most `groups` bands (`c_j = 0` for `j >=
  groups`) whose columns have L2 norm at most `kappa`, the run is as
  private as DP-SGD's Poisson-sampled Gaussian with noise multiplier
  `z / kappa` and sampling probability `rate`, composed over the
  `ceil(rounds / groups)` rounds a group can be visited:
  `SelfComposedDpEvent(PoissonSampledDpEvent(rate, GaussianDpEvent(z /
  kappa)), ceil(rounds / groups))`. Conditions checked: a banded strategy
  (not BLT) with `bands <= groups`; `rate` in (0, 1]; one noise multiplier
  for every round. One group and one band is DP-FedAvg's own event.
  jax_privacy's reference `accounting.amplified_bandmf_event` builds the
  same event (its multiplier assumes a unit largest column norm, its
  `sampling_prob` is the within-group rate, its composition count
  `ceil(iterations / num_bands)`); here `groups >= bands` is allowed, which
  only separates a client's participations further.
* **Min-separation without amplification**, `Participation(groups)`: every
  member of round t's group takes part, so a client joins at most
  `ceil(rounds / groups)` rounds, `groups` apart; the run is one
  `GaussianDpEvent(z / sens)` with `sens = mf_strategy.sensitivity(C,
  rounds, groups)`, the exact maximum over those patterns (for strategies
  that overlap across the separation, only non-negative, non-increasing
  columns, where the greedy pattern is proven worst; refused otherwise).
  Any strategy, BLT included.

After `t` rounds the epsilon is that of the first `t` rounds (the released
prefix depends only on the first `t` columns of `C`), so `mf_run_event(...,
rounds=t)` is the ledger's event after round t. Epsilon comes from
dp_accounting's RDP and PLD accountants on these events, never by hand
(`epsilon`); `calibration.calibrate_correlated` and `calibration.choose_bands`
solve for the noise and the bands.
"""

import dataclasses
import math
from typing import Optional

import dp_accounting

from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import mf_strategy
from tff_dp.privacy import accountants


@dataclasses.dataclass(frozen=True)
class Participation:
  """Cyclic participation over `groups` fixed groups of clients.

  Attributes:
    groups: b >= 1 groups; round t draws from group t mod b.
    rate: Poisson probability of each member of the round's group (cyclic
      Poisson, amplified); None: every member takes part (min-separation).

  Raises:
    ValueError: On `groups` < 1 or `rate` outside (0, 1], naming the value.
  """

  groups: int
  rate: Optional[float] = None

  def __post_init__(self):
    if not isinstance(self.groups, int) or self.groups < 1:
      raise ValueError(
        f'groups must be an integer >= 1. Found {self.groups!r}.'
      )
    if self.rate is not None and not 0 < self.rate <= 1:
      raise ValueError(
        'The within-group sampling rate must be in (0, 1]. Found '
        f'{self.rate!r}.'
      )

  @property
  def amplified(self) -> bool:
    return self.rate is not None

  def to_dict(self) -> dict:
    return {
      'schema': 'cyclic_poisson' if self.amplified else 'min_separation',
      'groups': self.groups,
      'rate': self.rate,
    }


def group_rate(rate: float, groups: int) -> float:
  """The within-group rate whose expected cohort equals Poisson sampling of
  all clients at `rate`: `rate * groups` (a group holds 1/groups of them).

  Raises:
    ValueError: If it exceeds 1 (fewer groups, or a lower rate, fit).
  """
  q = rate * groups
  if not 0 < q <= 1:
    raise ValueError(
      f'groups * client_sampling_rate must be in (0, 1]: {groups} * {rate!r}'
      f' = {q!r}. Use at most {int(1 / rate)} groups at this rate.'
    )
  return q


def mf_sensitivity(
  strategy: mf_strategy.Strategy, rounds: int, participation: Participation
) -> float:
  """The sensitivity the schema's event divides the multiplier by.

  Cyclic Poisson: `kappa`, the largest column norm of `C` over `rounds`.
  Min-separation: the maximum norm of a sum of columns `groups` apart.

  Raises:
    ValueError: Where the schema's conditions fail (module docstring).
  """
  if participation.amplified:
    if strategy.kind != mf_strategy.BANDED:
      raise ValueError(
        'Cyclic Poisson sampling (amplified banded MF) needs a banded '
        f'strategy; found {strategy.kind!r}. Use min-separation '
        'participation (no within-group rate) for BLT.'
      )
    if strategy.bands > participation.groups:
      raise ValueError(
        f'Amplified banded MF needs bands <= groups. Found {strategy.bands} '
        f'bands and {participation.groups} groups.'
      )
    # Column 0 is the longest; one participation per group visit.
    return mf_strategy.sensitivity(strategy, rounds, participation.groups, 1)
  return mf_strategy.sensitivity(strategy, rounds, participation.groups)


def mf_run_event(
  strategy: mf_strategy.Strategy,
  noise_multiplier: float,
  rounds: int,
  participation: Participation,
) -> dp_accounting.DpEvent:
  """The DP event of the first `rounds` rounds (module docstring).

  Args:
    strategy: The strategy `C` (its sensitivity is computed here, so its
      scale does not matter).
    noise_multiplier: z, the stddev of each `w_t` coordinate over the clip.
    rounds: Rounds run so far, >= 1.
    participation: The schema.

  Raises:
    ValueError: On a bad argument or a schema whose conditions fail.
  """
  if not noise_multiplier > 0 or not math.isfinite(noise_multiplier):
    raise ValueError(
      f'noise_multiplier must be finite and > 0. Found {noise_multiplier!r}.'
    )
  sens = mf_sensitivity(strategy, rounds, participation)
  gaussian = dp_accounting.GaussianDpEvent(noise_multiplier / sens)
  if not participation.amplified:
    return gaussian
  visits = -(-rounds // participation.groups)
  sampled = dp_accounting.PoissonSampledDpEvent(participation.rate, gaussian)
  return dp_accounting.SelfComposedDpEvent(sampled, visits)


def correlated_round(
  event: dp_accounting.DpEvent,
) -> tuple[mf_strategy.Strategy, float]:
  """(strategy, noise multiplier) of one round of a cyclic run: a
  `MatrixFactorizationDpEvent`'s, or the identity and z for an independent
  `GaussianDpEvent(z)` (DP-FedAvg is the one-band strategy).

  Raises:
    dp_accounting.UnsupportedEventError: For any other event.
  """
  if isinstance(event, correlated_noise.MatrixFactorizationDpEvent):
    return (
      correlated_noise.strategy_from_json(event.strategy),
      float(event.noise_multiplier),
    )
  if isinstance(event, dp_accounting.GaussianDpEvent):
    return mf_strategy.identity(), float(event.noise_multiplier)
  raise dp_accounting.UnsupportedEventError(
    f'Not a (correlated) Gaussian round: {event}.'
  )


RELATION = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def epsilon(event: dp_accounting.DpEvent, delta: float) -> tuple[float, float]:
  """(RDP epsilon, PLD epsilon) of an `mf_run_event` at `delta`, add/remove-one.

  Raises:
    ValueError: If `delta` is not in (0, 1).
  """
  if not 0 < delta < 1:
    raise ValueError(f'delta must be in (0, 1). Found {delta!r}.')
  rdp_eps = accountants.RdpAccountant(neighboring_relation=RELATION)
  pld_eps = accountants.PldAccountant(neighboring_relation=RELATION)
  return (
    float(rdp_eps.compose(event).get_epsilon(delta)),
    float(pld_eps.compose(event).get_epsilon(delta)),
  )
