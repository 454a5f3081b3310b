"""Reading the DP event that a round of these aggregators released.

`round_event(state)` is the round's one event, read from the aggregator
state after `next` (for a learning process, `state.aggregator`): TFF's
`extract_dp_event_from_state`
(`tensorflow_federated.python.aggregators.differential_privacy`; TFF 0.87
does not export it as `tff.aggregators`) applied to every
`DPAggregatorState` nested in it, composed when there are several (CMP-Fed's
two phases release on the same cohort in the same round, so they are one
round's event, sampled once). It reads `dp_fedavg.gaussian_fixed`,
`.gaussian_adaptive`, `dp_randagg.DPRandAggFactory` and `cmp_fed.cmp_fed`.
It raises, rather than return nothing, for a state it cannot account:
  * DDGauss (its TFF state holds an `UnsupportedDpEvent`): use
    `ddgauss.round_event_from_measurements(output.metrics['aggregator'])`;
  * DPSFL and DPSFL-AC (no DP state): use `factory.round_event()`;
  * a non-private factory (UV-Fed, FetchSGD, non-private DPRandAgg).
The event is before sampling: `tff_dp.privacy.PrivacyLedger.record` wraps
it in the sampling that ran and composes the rounds.
"""

import attr
import dp_accounting

from tff_dp.aggregators import _tff_private


def to_python_numbers(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  """The event with NumPy scalars (as TFF's state holds them) as Python's."""
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
      'from it: a DPSFL factory states its event as factory.round_event(); '
      'a non-private factory (UV-Fed, FetchSGD, DPRandAgg without noise) '
      'releases none.'
    )
  if any(isinstance(e, dp_accounting.UnsupportedDpEvent) for e in events):
    raise ValueError(
      'This aggregator state holds an UnsupportedDpEvent (TFF records one '
      'for DDGauss): read its event with '
      "ddgauss.round_event_from_measurements(output.metrics['aggregator'])."
    )
  return (
    events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)
  )
