"""Reading the DP event that a round of these aggregators released.

`released_event(factory, state, measurements)` is the one reader: it takes
the factory that built the aggregator, the aggregator's state after `next`
and that round's aggregator measurements (for a learning process,
`state.aggregator` and `output.metrics['aggregator']`), and returns the
round's event before sampling; `tff_dp.privacy.PrivacyLedger.record`
wraps it in the sampling that ran and composes the rounds. It works for
every factory in `tff_dp.aggregators`, bare, weighted (`.weighted()`) or
guarded (`finite_guard.FiniteGuardFactory`):

  * factories with a TFF DP state (`dp_fedavg`, `dp_randagg`, `cmp_fed`,
    `blur_lus`, FL-TOP-DP): TFF's `extract_dp_event_from_state` on every
    `DPAggregatorState` nested in the state, composed when there are
    several (CMP-Fed's two phases release on one cohort in one round);
  * factories whose state holds no accountable event define
    `released_event(state, measurements)` themselves: DPSFL and DPSFL-AC
    (their event is fixed at construction) and DDGauss (read from the
    noise scale, sensitivity and dimension that ran, in its measurements);
  * a non-private factory (UV-Fed, FetchSGD, DPRandAgg without noise)
    raises: it releases no event.
"""

from typing import NamedTuple, Optional

import attr
import dp_accounting

from tff_dp.aggregators import _tff_private

# Where TFF's `DifferentiallyPrivateFactory` puts its query's metrics.
DP_QUERY_METRICS = 'dp_query_metrics'


def to_python_numbers(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  """The event with NumPy scalars and bytes (as TFF's state holds them)
  as Python numbers and strings."""
  changes = {}
  for field in attr.fields(type(event)):
    value = getattr(event, field.name)
    if isinstance(value, dp_accounting.DpEvent):
      changes[field.name] = to_python_numbers(value)
    elif isinstance(value, (list, tuple)):
      changes[field.name] = [
        to_python_numbers(v) if isinstance(v, dp_accounting.DpEvent) else v
        for v in value
      ]
    elif hasattr(value, 'item'):
      changes[field.name] = value.item()
    elif isinstance(value, bytes):  # A string field, as TF returns it.
      changes[field.name] = value.decode()
  return attr.evolve(event, **changes) if changes else event


def events_in_state(state) -> list[dp_accounting.DpEvent]:
  """The events of the `DPAggregatorState`s nested in an aggregator state.

  Args:
    state: An aggregator's state after `next` (for a learning process,
      `state.aggregator`), in any nesting of dicts, sequences and attrs
      classes.

  Returns:
    One event per DP state, outermost first; empty if there is none.

  Raises:
    ExtractingDpEventFromInitialStateError (TFF's): On a state from
      `initialize`, whose event is a placeholder.
  """
  found = []

  def walk(x):
    if hasattr(x, 'dp_event') and hasattr(x, 'is_init_state'):
      found.append(
        to_python_numbers(_tff_private.extract_dp_event_from_state(x))
      )
      walk(x.agg_state)
      return
    if isinstance(x, dict):
      for v in x.values():
        walk(v)
    elif isinstance(x, (list, tuple)):
      for v in x:
        walk(v)
    elif hasattr(x, '__attrs_attrs__'):
      for f in x.__attrs_attrs__:
        walk(getattr(x, f.name))

  walk(state)
  return found


def round_event(state) -> dp_accounting.DpEvent:
  """The one event a round released, from its aggregator state.

  Args:
    state: The aggregator's state after `next` (`state.aggregator` of a
      learning process).

  Returns:
    The event of the state's single DP state, or the composition of its
    DP states' events (one round, one cohort).

  Raises:
    ValueError: If the state holds no DP state (DPSFL, a non-private
      factory) or an event no accountant takes (DDGauss); the message says
      where that factory's event is read instead.
  """
  events = events_in_state(state)
  if not events:
    raise ValueError(
      'This aggregator state holds no DP state, so no event can be read '
      'from it: a DPSFL factory states its event as factory.round_event() '
      '(dp_events.released_event(factory, state, measurements) reads every '
      'factory); a non-private factory (UV-Fed, FetchSGD, DPRandAgg without '
      'noise) releases none.'
    )
  if any(isinstance(e, dp_accounting.UnsupportedDpEvent) for e in events):
    raise ValueError(
      'This aggregator state holds an UnsupportedDpEvent (TFF records one '
      'for DDGauss): read its event with '
      'dp_events.released_event(factory, state, measurements), which '
      'calls ddgauss_accounting.round_event_from_measurements(measurements).'
    )
  return (
    events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)
  )


def released_event(factory, state, measurements) -> dp_accounting.DpEvent:
  """The DP event one round of `factory`'s aggregator released.

  Args:
    factory: The aggregation factory the process was built with (bare,
      `.weighted()` or `FiniteGuardFactory`-wrapped).
    state: The aggregator's state after `next` (`state.aggregator` of a
      learning process).
    measurements: That round's aggregator measurements
      (`output.metrics['aggregator']`).

  Returns:
    The round's event before sampling (replace-one or add/remove-one, as
    the factory's contract says).

  Raises:
    ValueError: If the factory releases no event (non-private), or its
      state holds none to read.
  """
  factory = unwrap(factory)
  own = getattr(factory, 'released_event', None)
  if own is not None:
    return own(state, measurements)
  return round_event(state)


def unwrap(factory):
  """The factory inside the weighting and non-finite wrappers."""
  while True:
    inner = getattr(factory, 'unweighted', None) or getattr(
      factory, 'guarded', None
    )
    if inner is None:
      return factory
    factory = inner


class ReleasedValues(NamedTuple):
  """What a round reports beside its event, read from its measurements.

  Attributes:
    clip: The clip the round ran with, where the aggregator reports it
      (adaptive clipping's current clip, DPSFL-AC's clip); None otherwise.
    dp_fraction_clipped: The DP estimate of the fraction of clients clipped
      (`dp_fedavg.gaussian_fixed(clipped_fraction_stddev=...)`), charged to
      the round's event; None when not released.
  """

  clip: Optional[float]
  dp_fraction_clipped: Optional[float]


def released_values(measurements) -> ReleasedValues:
  """The clip and DP fraction clipped a round reports (`ReleasedValues`).

  Args:
    measurements: The round's aggregator measurements
      (`output.metrics['aggregator']` of a learning process).
  """
  query = measurements.get(DP_QUERY_METRICS) or {}
  clip = query.get('clip', measurements.get('clip'))
  fraction = query.get('dp_fraction_clipped')
  return ReleasedValues(
    clip=None if clip is None else float(clip),
    dp_fraction_clipped=None if fraction is None else float(fraction),
  )
