"""Privacy accounting of noise correlated across rounds (matrix factorisation).

The mechanism (`aggregators.mf_strategy`): round t releases the clipped sum
of its cohort plus `z * clip * (C^-1 w)_t`, `w_t` standard Gaussian, for a
lower-triangular Toeplitz strategy `C`. The stream is a post-processing of
`C x + z clip w`, one Gaussian mechanism over the whole run, so its
privacy rests on the L2 sensitivity of `C x` to one client, which depends
on which rounds a client can join. Both schemas here split the clients
into `groups` fixed groups (by a public seed; `tff_dp.sampling.partition`)
and draw round t's cohort from group `t mod groups`, so a client's
participations are at least `groups` rounds apart. Neighbouring: add or
remove one client where each client's group is a function of its own id
(`partition='by_client_id'`); zero-out one client where the groups are a
permutation of the whole population (`'balanced'`, whose groups move when
a client is added; `privacy.Sampling`). The epsilon is the same number.

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
prefix depends only on the first `t` columns of `C`), so `run_event(...,
rounds=t)` is the ledger's event after round t. Epsilon comes from
dp_accounting's RDP and PLD accountants on these events, never by hand.
"""

import dataclasses
from typing import Sequence

import dp_accounting

from tff_dp import privacy
from tff_dp.aggregators import mf_strategy

_RELATION = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


# The schemas' events live in `tff_dp.privacy` (its ledger composes them);
# named here too, the module of their accounting.
Participation = privacy.Participation
group_rate = privacy.group_rate
sensitivity = privacy.mf_sensitivity
run_event = privacy.mf_run_event


def epsilon(event: dp_accounting.DpEvent, delta: float) -> tuple[float, float]:
  """(RDP epsilon, PLD epsilon) of a `run_event` at `delta`, add/remove-one.

  Raises:
    ValueError: If `delta` is not in (0, 1).
  """
  if not 0 < delta < 1:
    raise ValueError(f'delta must be in (0, 1). Found {delta!r}.')
  rdp_eps = privacy.RdpAccountant(neighboring_relation=_RELATION)
  pld_eps = privacy.PldAccountant(neighboring_relation=_RELATION)
  return (
    float(rdp_eps.compose(event).get_epsilon(delta)),
    float(pld_eps.compose(event).get_epsilon(delta)),
  )


def calibrate(
  strategy: mf_strategy.Strategy,
  target_epsilon: float,
  delta: float,
  rounds: int,
  participation: Participation,
  accountant: str = 'rdp',
) -> float:
  """The smallest noise multiplier z whose `rounds` rounds meet (epsilon,
  delta) by `accountant` ('rdp' or 'pld'); dp_accounting's search to 1e-4.

  Raises:
    ValueError: On a bad argument (named with its allowed range).
  """
  privacy.check_calibration_args(target_epsilon, delta, rounds, accountant)
  sensitivity(strategy, rounds, participation)  # The schema's checks, once.

  def event_fn(z):
    return run_event(strategy, z, rounds, participation)

  return privacy.calibrate_event(
    event_fn,
    target_epsilon,
    delta,
    accountant,
    lambda: privacy.RdpAccountant(neighboring_relation=_RELATION),
    lambda: privacy.PldAccountant(neighboring_relation=_RELATION),
  )


@dataclasses.dataclass(frozen=True)
class BandChoice:
  """One candidate of `choose_bands`: its strategy, calibrated multiplier
  and expected error (mean squared workload error per round, clip 1)."""

  bands: int
  strategy: mf_strategy.Strategy
  noise_multiplier: float
  error: float


def choose_bands(
  candidates: Sequence[int],
  *,
  rounds: int,
  rate: float,
  target_epsilon: float,
  delta: float,
  momentum: float = 0.0,
  accountant: str = 'rdp',
) -> list[BandChoice]:
  """Amplified banded MF at each `bands` in `candidates` (groups = bands,
  within-group rate `group_rate(rate, bands)`), sorted by expected error:
  the first is `--bands=auto`'s choice (as the amplified-BandMF paper picks
  b). Candidates whose group rate would exceed 1 are left out.

  The error of a choice is `z^2 * mf_strategy.expected_error(C, rounds,
  momentum, bands, 1)` with z calibrated to the target, `C` from
  `mf_strategy.optimize_banded`: the noise the workload sees per unit
  clip.

  Raises:
    ValueError: If no candidate fits the rate, or on a bad argument.
  """
  out = []
  for b in candidates:
    if b * rate > 1 or b > rounds:
      continue
    strategy = mf_strategy.optimize_banded(b, rounds, momentum)
    participation = Participation(b, group_rate(rate, b))
    z = calibrate(
      strategy, target_epsilon, delta, rounds, participation, accountant
    )
    err = z**2 * mf_strategy.expected_error(strategy, rounds, momentum, b, 1)
    out.append(BandChoice(b, strategy, z, err))
  if not out:
    raise ValueError(
      f'No candidate bands {list(candidates)!r} fit the rate {rate!r} '
      f'(bands * rate <= 1) and the horizon {rounds}.'
    )
  return sorted(out, key=lambda c: c.error)
