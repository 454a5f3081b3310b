"""DP events: serialisation, merges and checks.

The events an aggregator releases, as dp_accounting values: to and from
JSON (`event_to_dict`, `event_from_dict`, TFF's named tuples), the merge of
several Gaussians on one cohort into one (`merge_gaussians`: 1/z^2 = sum
1/z_i^2, exact, and needed because dp_accounting's PLD accountant rejects a
sampled `ComposedDpEvent`), the replace-one form of a fixed-size round's
event and the checks the ledger runs on each event.
"""

import math
import numbers
from typing import Any, Optional

import attr
import dp_accounting

from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import ddgauss_accounting
from tff_dp.aggregators import dp_events


_EVENT_TYPES = {
  cls.__name__: cls
  for cls in (
    dp_accounting.GaussianDpEvent,
    dp_accounting.LaplaceDpEvent,
    dp_accounting.NoOpDpEvent,
    dp_accounting.NonPrivateDpEvent,
    dp_accounting.ComposedDpEvent,
    dp_accounting.SelfComposedDpEvent,
    dp_accounting.PoissonSampledDpEvent,
    dp_accounting.SampledWithoutReplacementDpEvent,
    dp_accounting.SampledWithReplacementDpEvent,
    dp_accounting.UnsupportedDpEvent,
    ddgauss_accounting.DiscreteGaussianSumDpEvent,
    correlated_noise.MatrixFactorizationDpEvent,
  )
}


# Events known only by an upper bound on their RDP curve (a theorem, not
# the divergence itself): accounted with generic subsampling bounds, no PLD.
CURVE_EVENTS = (ddgauss_accounting.DiscreteGaussianSumDpEvent,)


# Events of mechanisms whose round reveals its participant count (secure
# aggregation tells the server; the noise variance tells everyone).
PUBLIC_COUNT_EVENTS = (ddgauss_accounting.DiscreteGaussianSumDpEvent,)


def event_to_dict(event: dp_accounting.DpEvent) -> dict[str, Any]:
  """A JSON-able dict of a DpEvent (nested events included).

  Args:
    event: A dp_accounting event (or a `DiscreteGaussianSumDpEvent`).

  Returns:
    `{'type': class name, field: value, ...}`, nested events as such dicts.
  """
  out = {'type': type(event).__name__}
  for field in attr.fields(type(event)):
    value = getattr(event, field.name)
    if isinstance(value, dp_accounting.DpEvent):
      value = event_to_dict(value)
    elif isinstance(value, (list, tuple)):
      value = [event_to_dict(v) for v in value]
    out[field.name] = value
  return out


def event_from_dict(d: dict[str, Any]) -> dp_accounting.DpEvent:
  """Inverse of `event_to_dict`.

  Args:
    d: A dict `event_to_dict` wrote.

  Returns:
    The event.

  Raises:
    ValueError: If `d['type']` is not an event type the ledger knows.
  """
  cls = _EVENT_TYPES.get(d['type'])
  if cls is None:
    raise ValueError(f'Unknown DpEvent type {d["type"]!r}.')
  kwargs = {}
  for field in attr.fields(cls):
    value = d[field.name]
    if isinstance(value, dict) and 'type' in value:
      value = event_from_dict(value)
    elif isinstance(value, list):
      value = [event_from_dict(v) for v in value]
    kwargs[field.name] = value
  return cls(**kwargs)


def event_from_named_tuple(nt: Any) -> dp_accounting.DpEvent:
  """Converts TFF's stored `DpEvent.to_named_tuple()` value back to an event.

  TFF's `DifferentiallyPrivateFactory` keeps the released event in its state
  as `event.to_named_tuple()`; numeric fields come back as NumPy scalars and
  are converted to Python numbers.

  Args:
    nt: The stored named tuple (e.g. `state.dp_event`).

  Returns:
    The event, with Python numbers in its fields.
  """
  event = dp_accounting.DpEvent.from_named_tuple(nt)
  return dp_events.to_python_numbers(event)


def merge_gaussians(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  """Merges a composition of Gaussian events into one Gaussian (exact).

  `ComposedDpEvent([Gaussian(z_1), ..., Gaussian(z_k)])` (nested, and with
  `SelfComposedDpEvent` of Gaussians and `NoOpDpEvent`s) becomes
  `Gaussian(z)` with 1/z^2 = sum 1/z_i^2; a composition of
  `MatrixFactorizationDpEvent`s of one strategy (one round's correlated
  streams) becomes one of the same strategy, merged alike. Other events
  are returned as is.

  Args:
    event: Any event.

  Returns:
    The merged `GaussianDpEvent` (`NoOpDpEvent` if nothing is noised), or
    `event` itself if it is not such a composition.
  """
  inverse_sq = _gaussian_inverse_square(event)
  if inverse_sq is None:
    return _merge_correlated(event)
  if inverse_sq == 0:
    return dp_accounting.NoOpDpEvent()
  return dp_accounting.GaussianDpEvent(1.0 / math.sqrt(inverse_sq))


def _merge_correlated(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  """`ComposedDpEvent` of `MatrixFactorizationDpEvent`s of one strategy
  (nested, with `NoOpDpEvent`s) as one, 1/z^2 = sum 1/z_i^2; else `event`.

  Exact: the streams (CMP-Fed's two phases, DPSFL-AC's sketch and bit)
  each add `z_i c_i (C^-1 w_i)_t` for the same lower-triangular C, so
  their normalised releases stacked are one Gaussian MF mechanism whose
  rounds (the phases in release order: C kron I, still lower-triangular,
  so adaptive inputs are covered) carry a client's contribution of norm
  sqrt(sum 1/z_i^2) in every row block C touches. Its sensitivity under
  any participation pattern is C's times that norm, which is what
  `correlated` charges for `MatrixFactorizationDpEvent(z)`.
  """
  leaves = []

  def walk(e) -> bool:
    if isinstance(e, dp_accounting.NoOpDpEvent):
      return True
    if isinstance(e, correlated_noise.MatrixFactorizationDpEvent):
      leaves.append(e)
      return True
    if isinstance(e, dp_accounting.ComposedDpEvent):
      return all(walk(x) for x in e.events)
    return False

  if not isinstance(event, dp_accounting.ComposedDpEvent) or not walk(event):
    return event
  if not leaves:
    return dp_accounting.NoOpDpEvent()
  if len({e.strategy for e in leaves}) > 1:
    return event  # Different strategies: not one mechanism (refused later).
  if any(float(e.noise_multiplier) == 0 for e in leaves):
    return correlated_noise.MatrixFactorizationDpEvent(0.0, leaves[0].strategy)
  inverse_sq = sum(1.0 / float(e.noise_multiplier) ** 2 for e in leaves)
  return correlated_noise.MatrixFactorizationDpEvent(
    1.0 / math.sqrt(inverse_sq), leaves[0].strategy
  )


def gaussian_shares(event: dp_accounting.DpEvent) -> Optional[list[float]]:
  """Each part's share of a composed Gaussian round's privacy cost.

  For `ComposedDpEvent([Gaussian(z_1), ..., Gaussian(z_k)])` (one cohort,
  merged exactly as `merge_gaussians` does), part i's 1/z_i^2 over
  sum_j 1/z_j^2: the fraction of the merged event's inverse variance it
  adds (e.g. DPSFL-AC's clip bit against its sketch).

  Args:
    event: Any event.

  Returns:
    One share per part of a `ComposedDpEvent` whose parts are all finite
    Gaussian compositions (summing to 1); None for any other event.
  """
  if not isinstance(event, dp_accounting.ComposedDpEvent):
    return None
  parts = [_gaussian_inverse_square(e) for e in event.events]
  if any(x is None or math.isinf(x) for x in parts) or not sum(parts):
    return None
  total = sum(parts)
  return [x / total for x in parts]


def _gaussian_inverse_square(event) -> Optional[float]:
  if isinstance(event, dp_accounting.GaussianDpEvent):
    z = float(event.noise_multiplier)
    return math.inf if z == 0 else 1.0 / z**2
  if isinstance(event, dp_accounting.NoOpDpEvent):
    return 0.0
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    inner = _gaussian_inverse_square(event.event)
    return None if inner is None else inner * event.count
  if isinstance(event, dp_accounting.ComposedDpEvent):
    parts = [_gaussian_inverse_square(e) for e in event.events]
    return None if any(p is None for p in parts) else sum(parts)
  return None


def replace_one_event(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  """A merged Gaussian's (or a curve event's) event under replace-one.

  Replacing one client moves the clipped sum by up to twice what removing
  it does: a Gaussian's multiplier is halved, a
  `DiscreteGaussianSumDpEvent`'s sensitivity doubled (its tau term, which
  does not depend on the sensitivity, is unchanged).

  Args:
    event: A `GaussianDpEvent` or `DiscreteGaussianSumDpEvent` stated over
      add/remove-one sensitivity.

  Returns:
    The same mechanism's event over replace-one sensitivity.

  Raises:
    dp_accounting.UnsupportedEventError: If `event` is neither.
  """
  if isinstance(event, ddgauss_accounting.DiscreteGaussianSumDpEvent):
    return event.with_sensitivity_scaled(2.0)
  if not isinstance(event, dp_accounting.GaussianDpEvent):
    raise dp_accounting.UnsupportedEventError(
      'Fixed-size sampling is accounted for Gaussian mechanisms and '
      "DDGauss's DiscreteGaussianSumDpEvent only (replace-one sensitivity "
      f'2C). Found {event}; use Poisson sampling '
      '(--client_sampling_rate).'
    )
  return dp_accounting.GaussianDpEvent(event.noise_multiplier / 2)


def check_event(event: dp_accounting.DpEvent) -> None:
  """Raises if a Gaussian in `event` has a NaN or negative multiplier.

  dp_accounting's RDP accountant loops forever on a NaN multiplier (its
  fractional-order series never meets its stopping test), so the ledger
  checks every event it records.

  Args:
    event: Any event; nested events are checked too.

  Raises:
    ValueError: Naming the multiplier and its allowed range.
  """
  if isinstance(event, dp_accounting.GaussianDpEvent):
    z = event.noise_multiplier
    if isinstance(z, bool) or not (
      isinstance(z, numbers.Real) and not math.isnan(z) and z >= 0
    ):
      raise ValueError(
        'A GaussianDpEvent noise_multiplier must be a number >= 0. '
        f'Found {z!r}.'
      )
    return
  for field in attr.fields(type(event)):
    value = getattr(event, field.name)
    for v in value if isinstance(value, (list, tuple)) else [value]:
      if isinstance(v, dp_accounting.DpEvent):
        check_event(v)


def contains(event: dp_accounting.DpEvent, types) -> bool:
  """Whether `event` or an event nested in it is an instance of `types`."""
  if isinstance(event, types):
    return True
  for field in attr.fields(type(event)):
    value = getattr(event, field.name)
    values = value if isinstance(value, (list, tuple)) else [value]
    if any(
      isinstance(v, dp_accounting.DpEvent) and contains(v, types)
      for v in values
    ):
      return True
  return False


def has_non_private(event: dp_accounting.DpEvent) -> bool:
  return contains(event, dp_accounting.NonPrivateDpEvent)
