"""The privacy ledger: the DP events a run released, sampled as the run
sampled its clients, and their epsilon (`PrivacyLedger`, `epsilon_of`).
"""

import itertools
import json
import math
from typing import Optional

import attr
import dp_accounting
from dp_accounting import pld

from tff_dp.privacy import events
from tff_dp.privacy import sampling as sampling_lib


# Ledger JSON version: 2 records fixed-size rounds with replace-one
# sensitivity 2C; version-1 ledgers (no 'version') recorded them with C.
LEDGER_VERSION = 2


class PrivacyLedger:
  """The per-round DP events of a run and their (epsilon, delta) guarantee.

  `record(event)` appends one round's released event (unsampled); the ledger
  applies the sampling (`Sampling.round_event`). `epsilon()` composes every
  recorded round with both accountants: as independent rounds, or, for the
  cyclic modes, as the one mechanism of the rounds run
  (`Sampling.run_event`: every round must have released the same event).
  State round-trips through `to_json`/`from_json` so a resumed run
  continues the same ledger.

  Args:
    sampling: The client sampling every recorded round ran under.
    delta: The delta of `epsilon()`, in (0, 1).

  Raises:
    ValueError: If `delta` is not in (0, 1).
  """

  def __init__(self, sampling: sampling_lib.Sampling, delta: float):
    if not 0 < delta < 1:
      raise ValueError(f'delta must be in (0, 1). Found {delta!r}.')
    self.sampling = sampling
    self.delta = float(delta)
    self._events: list[dp_accounting.DpEvent] = []
    self._cache: dict[int, tuple[float, float]] = {}

  @property
  def rounds(self) -> int:
    return len(self._events)

  @property
  def events(self) -> list[dp_accounting.DpEvent]:
    """The recorded per-round events, sampling applied (cyclic modes:
    Gaussians merged, the run's sampling in `composed_event`)."""
    return list(self._events)

  def record(self, event: dp_accounting.DpEvent) -> None:
    """Records one round's released (unsampled) event.

    Args:
      event: The event the round's aggregator released.

    Raises:
      TypeError: If `event` is not a `DpEvent`.
      ValueError: If a Gaussian in it has a NaN or negative multiplier.
      dp_accounting.UnsupportedEventError: If the sampling cannot state it
        (`Sampling.round_event`).
      ValueError: For a cyclic mode, if it differs from the rounds before
        (one strategy and multiplier for the whole run).
    """
    if not isinstance(event, dp_accounting.DpEvent):
      raise TypeError(f'Expected a DpEvent. Found {type(event)!r}.')
    event = self.sampling.round_event(event)
    if self.sampling.cyclic and self._events and event != self._events[0]:
      raise ValueError(
        f'Cyclic participation ({self.sampling.mode!r}) accounts one '
        'strategy and noise multiplier for every round; round '
        f'{len(self._events) + 1} released {event}, round 1 '
        f'{self._events[0]}. (A resumed run reads the strategy it started '
        "with from its folder's noise_plan.json; one whose folder lacks it "
        'optimised it again.)'
      )
    self._events.append(event)

  def composed_event(self) -> dp_accounting.DpEvent:
    """All rounds as one event: runs of equal rounds self-composed; for the
    cyclic modes, the run's event (`Sampling.run_event`)."""
    if self.sampling.cyclic:
      if not self._events:
        return dp_accounting.ComposedDpEvent([])
      return self.sampling.run_event(self._events[0], len(self._events))
    parts = []
    for event, group in itertools.groupby(self._events):
      n = len(list(group))
      parts.append(
        event if n == 1 else dp_accounting.SelfComposedDpEvent(event, n)
      )
    return dp_accounting.ComposedDpEvent(parts)

  def epsilon(self) -> tuple[float, float]:
    """(epsilon from RDP, epsilon from PLD) at `delta`; PLD NaN if unsupported.

    A run with no private round (only NoOp events) has epsilon 0; one with
    a non-private event has epsilon inf. Where the PLD epsilon is NaN,
    `pld_unavailable_reason()` says why.

    Returns:
      `(epsilon_rdp, epsilon_pld)` of all recorded rounds at `delta`.

    Raises:
      dp_accounting.UnsupportedEventError: If the RDP accountant cannot
        compose the recorded events.
    """
    key = len(self._events)
    if key not in self._cache:
      self._cache = {
        key: epsilon_of(self.composed_event(), self.sampling, self.delta)
      }
    return self._cache[key]

  def pld_unavailable_reason(self) -> Optional[str]:
    """Why `epsilon()`'s PLD epsilon is NaN; None where it is computed."""
    return pld_unavailable_reason(self.composed_event(), self.sampling)

  def assumptions(self) -> list[str]:
    """What the epsilon assumes beyond the recorded events (empty: nothing).

    A Poisson-sampled run of a mechanism whose participant count is public
    (`PUBLIC_COUNT_EVENTS`) rests on `POISSON_COUNT_ASSUMPTION`.
    """
    if not any(
      events.contains(e, events.PUBLIC_COUNT_EVENTS) for e in self._events
    ):
      return []
    if self.sampling.mode == 'poisson':
      return [sampling_lib.POISSON_COUNT_ASSUMPTION]
    return [sampling_lib.FIXED_COUNT_ASSUMPTION]

  def to_json(self) -> str:
    """The sampling, delta and recorded events, as `from_json` reads them."""
    return json.dumps(
      {
        'version': LEDGER_VERSION,
        'sampling': self.sampling.to_dict(),
        'delta': self.delta,
        'events': [events.event_to_dict(e) for e in self._events],
      }
    )

  @classmethod
  def from_json(cls, text: str) -> 'PrivacyLedger':
    """The ledger `to_json` wrote; version-1 fixed-size rounds corrected.

    A version-1 ledger (no 'version' key) recorded fixed-size rounds with
    the add/remove-one multiplier, as
    `SampledWithoutReplacementDpEvent(N, m, Gaussian(z))`; they are read
    back as `Gaussian(z / 2)` inside, what they released.

    Args:
      text: What `to_json` wrote.

    Returns:
      The ledger, its recorded events restored.
    """
    d = json.loads(text)
    ledger = cls(sampling_lib.Sampling.from_dict(d['sampling']), d['delta'])
    ledger._events = [events.event_from_dict(e) for e in d['events']]
    if d.get('version', 1) < 2:
      ledger._events = [
        attr.evolve(e, event=events.replace_one_event(e.event))
        if isinstance(e, dp_accounting.SampledWithoutReplacementDpEvent)
        else e
        for e in ledger._events
      ]
    return ledger


def epsilon_of(
  event: dp_accounting.DpEvent, sampling: sampling_lib.Sampling, delta: float
) -> tuple[float, float]:
  """(RDP epsilon, PLD epsilon) of an already-sampled event at `delta`.

  Infinite for both if any part of `event` is a `NonPrivateDpEvent`.

  Args:
    event: The composed, sampled event (e.g. `PrivacyLedger.composed_event`).
    sampling: The sampling it ran under (picks the neighbouring relation).
    delta: In (0, 1).

  Returns:
    `(epsilon_rdp, epsilon_pld)`; the PLD value is NaN where the PLD
    accountant is unavailable (`pld_unavailable_reason`).

  Raises:
    dp_accounting.UnsupportedEventError: If the RDP accountant does not
      support `event`.
  """
  if events.has_non_private(event):
    return math.inf, math.inf
  accountant = sampling.rdp_accountant()
  if not accountant.supports(event):
    raise dp_accounting.UnsupportedEventError(
      f'The RDP accountant does not support {event}.'
    )
  eps_rdp = accountant.compose(event).get_epsilon(delta)
  eps_pld = math.nan
  accountant = sampling.pld_accountant()
  if accountant is not None and accountant.supports(event):
    eps_pld = accountant.compose(event).get_epsilon(delta)
  return float(eps_rdp), float(eps_pld)


def pld_unavailable_reason(
  event: dp_accounting.DpEvent, sampling: sampling_lib.Sampling
) -> Optional[str]:
  """Why `epsilon_of` gives no PLD epsilon for `event`; None if it does.

  Args:
    event: The composed, sampled event.
    sampling: The sampling it ran under.

  Returns:
    A sentence naming the reason, or None where the PLD epsilon is computed
    (or the event is non-private: both epsilons are then infinite).
  """
  if events.has_non_private(event):
    return None
  if events.contains(event, events.CURVE_EVENTS):
    return (
      'The round event (DiscreteGaussianSumDpEvent, DDGauss) is known only '
      'by an upper bound on its RDP curve (Kairouz et al. 2021, Prop. 14); '
      'no privacy loss distribution follows from an RDP bound, so only the '
      'RDP epsilon is sound.'
    )
  accountant = sampling.pld_accountant()
  if accountant is None:
    return (
      "dp_accounting's PLD accountant does not support "
      'SampledWithoutReplacementDpEvent (fixed-size sampling); the RDP '
      'epsilon is the guarantee.'
    )
  if not accountant.supports(event):
    return f"dp_accounting's PLD accountant does not support {event}."
  return None


def pld_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
  """Epsilon at `delta` of an (already sampled) event by a PLD accountant.

  Args:
    event: An event the PLD accountant supports.
    delta: In (0, 1).

  Returns:
    dp_accounting's PLD epsilon.
  """
  return float(pld.PLDAccountant().compose(event).get_epsilon(delta))
