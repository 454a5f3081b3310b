"""Reading the DP events that a round of these aggregators released.

`events_in_state(state)` applies TFF's `extract_dp_event_from_state`
(`tensorflow_federated.python.aggregators.differential_privacy`; TFF 0.87
does not export it as `tff.aggregators`) to every `DPAggregatorState`
nested in an aggregator state: `dp_fedavg.gaussian_fixed` and
`.gaussian_adaptive` (one), `dp_randagg.DPRandAggFactory` (one) and
`cmp_fed.cmp_fed` (one per phase), with numeric fields as Python numbers.
The other private factories keep no event in their state:
`ddgauss.round_event_from_measurements(measurements)` reads DDGauss's from
the round's measurements, and a DPSFL factory's `round_event()` is its
(fixed) event of every round. Each is one round's event before sampling;
the caller wraps it in the sampling it ran (`tff_dp.privacy.Sampling.wrap`)
and composes the rounds.
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
