"""Rounds of canary clients through an aggregator, as the audits run them.

`Probe` says what the canaries send and where an audit looks (by default
the flat result of each round, the final model delta); `run_rounds` runs
one round per cohort of the canaries' nominal updates and returns the
rounds' releases (and their events, read by an `EventFn`); `embedded`
maps directions into the release's space. Also the random unit
directions the canaries send and the argument checks the audits share.
"""

import dataclasses
import math
from typing import Any, Callable, Optional, Sequence, Union

import dp_accounting
import numpy as np
import tensorflow_federated as tff


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


def check_ints(*named) -> None:
  for name, value, low in named:
    if (
      isinstance(value, bool)
      or not isinstance(value, (int, np.integer))
      or value < low
    ):
      raise ValueError(f'{name} must be an integer >= {low}. Found {value!r}.')


def check_positive(name: str, value) -> None:
  if not (
    isinstance(value, (int, float, np.floating))
    and not isinstance(value, bool)
    and math.isfinite(value)
    and value > 0
  ):
    raise ValueError(f'{name} must be a finite number > 0. Found {value!r}.')


def shape(shape, dim: int) -> list[int]:
  shape = list(shape) if shape is not None else [dim]
  if int(np.prod(shape)) != dim:
    raise ValueError(f'shape {shape} must hold dim={dim} scalars.')
  return shape


def unit_directions(rng: np.random.Generator, n: int, dim: int):
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


def run_rounds(
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


def embedded(directions: np.ndarray, probe: Probe) -> np.ndarray:
  """The unit images of `directions` in the release's space."""
  if probe.embed is None:
    return directions
  images = np.asarray(probe.embed(directions), np.float64)
  images = images.reshape(directions.shape[0], -1)
  norms = np.linalg.norm(images, axis=1, keepdims=True)
  if not np.all(norms > 0):
    raise ValueError('Probe.embed mapped a direction to 0.')
  return images / norms
