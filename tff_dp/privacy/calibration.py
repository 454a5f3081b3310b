"""Calibration: the smallest noise multiplier that meets a target (epsilon,
delta) over a run (`calibrate_noise_multiplier`, `calibrate_event`,
`calibrate_pld_below`, `calibrate_correlated` for correlated noise), and
the band count of banded matrix factorisation (`choose_bands`). Every
search asks dp_accounting's accountants; none computes epsilon by hand.
"""

import dataclasses
import math
from typing import Callable, Sequence

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp

from tff_dp.aggregators import mf_strategy
from tff_dp.privacy import accountants
from tff_dp.privacy import correlated
from tff_dp.privacy import ledger
from tff_dp.privacy import sampling as sampling_lib


def calibrate_noise_multiplier(
  target_epsilon: float,
  delta: float,
  rounds: int,
  sampling: sampling_lib.Sampling,
  *,
  round_event_fn: Callable[[float], dp_accounting.DpEvent] = (
    dp_accounting.GaussianDpEvent
  ),
  accountant: str = 'rdp',
) -> float:
  """Smallest noise multiplier whose `rounds` rounds meet (epsilon, delta).

  Each round's event is `round_event_fn(z)`, and the run's `rounds` of them
  under `sampling` are `sampling.run_event` (self-composed, or for the
  cyclic modes one correlated-noise mechanism); dp_accounting's
  `calibrate_dp_mechanism` searches z to a tolerance of 1e-4.

  Args:
    target_epsilon: Target epsilon, finite and > 0.
    delta: Target delta, in (0, 1).
    rounds: Number of rounds, an integer >= 1.
    sampling: The client sampling.
    round_event_fn: Maps the noise multiplier to one round's (unsampled)
      event, e.g. two Gaussians for a two-phase mechanism.
    accountant: 'rdp' or 'pld' (PLD needs Poisson sampling and an event
      with a PLD: not DDGauss's, `pld_unavailable_reason`).

  Returns:
    The noise multiplier z (noise stddev over the clip) at which the
    chosen accountant's epsilon is at most `target_epsilon`.

  Raises:
    ValueError: On bad arguments, for `accountant='pld'` with fixed-size
      sampling or an event the PLD accountant cannot state, or if the PLD
      search finds no bracket.
  """
  _check_calibration_args(target_epsilon, delta, rounds, sampling, accountant)

  def event_fn(z):
    return sampling.run_event(round_event_fn(z), rounds)

  if accountant == 'pld':
    reason = ledger.pld_unavailable_reason(event_fn(1.0), sampling)
    if reason is not None:
      raise ValueError(
        f"accountant='pld' cannot calibrate this round event: {reason} Use "
        "accountant='rdp'."
      )

  return calibrate_event(
    event_fn,
    target_epsilon,
    delta,
    accountant,
    sampling.rdp_accountant,
    sampling.pld_accountant,
  )


def calibrate_event(
  event_fn: Callable[[float], dp_accounting.DpEvent],
  target_epsilon: float,
  delta: float,
  accountant: str,
  make_rdp: Callable[[], rdp.RdpAccountant],
  make_pld: Callable[[], pld.PLDAccountant],
) -> float:
  """The smallest z with `event_fn(z)` within (target_epsilon, delta):
  dp_accounting's search to 1e-4 with `make_rdp`'s accountant, then, for
  `accountant='pld'`, with `make_pld`'s below the RDP multiplier
  (`calibrate_pld_below`). Arguments checked by the callers."""
  z_rdp = float(
    dp_accounting.calibrate_dp_mechanism(
      make_rdp,
      event_fn,
      target_epsilon,
      delta,
      bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
      tol=1e-4,
    )
  )
  if accountant == 'rdp':
    return z_rdp
  return calibrate_pld_below(event_fn, target_epsilon, delta, make_pld, z_rdp)


def _check_calibration_args(
  target_epsilon, delta, rounds, sampling: sampling_lib.Sampling, accountant
) -> None:
  """`calibrate_noise_multiplier`'s argument checks.

  Raises:
    ValueError: Naming the bad argument and its allowed range.
  """
  check_calibration_args(target_epsilon, delta, rounds, accountant)
  if accountant == 'pld' and sampling.mode == 'fixed':
    raise ValueError(
      'The PLD accountant does not support fixed-size sampling; use '
      "accountant='rdp' with fixed-size sampling."
    )


def check_calibration_args(target_epsilon, delta, rounds, accountant) -> None:
  """A calibration's target, delta, rounds and accountant name.

  Raises:
    ValueError: Naming the bad argument and its allowed range.
  """
  if not target_epsilon > 0 or not math.isfinite(target_epsilon):
    raise ValueError(
      f'target_epsilon must be a finite number > 0. Found {target_epsilon!r}.'
    )
  if not 0 < delta < 1:
    raise ValueError(f'delta must be in (0, 1). Found {delta!r}.')
  if not isinstance(rounds, int) or rounds < 1:
    raise ValueError(f'rounds must be an integer >= 1. Found {rounds!r}.')
  if accountant not in ('rdp', 'pld'):
    raise ValueError(
      f"accountant must be 'rdp' or 'pld'. Found {accountant!r}."
    )


def calibrate_pld_below(
  event_fn: Callable[[float], dp_accounting.DpEvent],
  target_epsilon: float,
  delta: float,
  make_accountant: Callable[[], pld.PLDAccountant],
  z_rdp: float,
) -> float:
  """The PLD accountant's multiplier, searched below the RDP one `z_rdp`.

  Raises:
    ValueError: If no bracket is found within six halvings of `z_rdp`.
  """
  # PLD is tighter than RDP, so its multiplier is below z_rdp. Search a
  # bracket below it: PLDs of very small multipliers exhaust memory.
  upper = z_rdp
  for _ in range(6):
    lower = upper / 2
    eps_lower = make_accountant().compose(event_fn(lower)).get_epsilon(delta)
    if eps_lower > target_epsilon:
      return float(
        dp_accounting.calibrate_dp_mechanism(
          make_accountant,
          event_fn,
          target_epsilon,
          delta,
          bracket_interval=dp_accounting.ExplicitBracketInterval(lower, upper),
          tol=1e-4,
        )
      )
    upper = lower
  raise ValueError('PLD calibration found no bracket; use the RDP accountant.')


def calibrate_correlated(
  strategy: mf_strategy.Strategy,
  target_epsilon: float,
  delta: float,
  rounds: int,
  participation: correlated.Participation,
  accountant: str = 'rdp',
) -> float:
  """The smallest noise multiplier z whose `rounds` rounds meet (epsilon,
  delta) by `accountant` ('rdp' or 'pld'); dp_accounting's search to 1e-4.

  Raises:
    ValueError: On a bad argument (named with its allowed range).
  """
  check_calibration_args(target_epsilon, delta, rounds, accountant)
  correlated.mf_sensitivity(
    strategy, rounds, participation
  )  # The schema's checks, once.

  def event_fn(z):
    return correlated.mf_run_event(strategy, z, rounds, participation)

  return calibrate_event(
    event_fn,
    target_epsilon,
    delta,
    accountant,
    lambda: accountants.RdpAccountant(neighboring_relation=correlated.RELATION),
    lambda: accountants.PldAccountant(neighboring_relation=correlated.RELATION),
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
  within-group rate `correlated.group_rate(rate, bands)`), sorted by
  expected error:
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
    participation = correlated.Participation(b, correlated.group_rate(rate, b))
    z = calibrate_correlated(
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
