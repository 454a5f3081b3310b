"""A Gaussian sum query whose noise is correlated across rounds (DP-MF).

`CorrelatedGaussianSumQuery` is `dp_queries.SeededGaussianSumQuery` with
the round's independent draw `w_t ~ N(0, stddev^2)` replaced by the
strategy's correlated noise `y_t = (C^-1 w)_t` (`mf_strategy`): the clip,
the seed and its advance are the same, so a one-band strategy with `c_0 =
1` releases the same bits as DP-FedAvg's query for the same seed. The
state keeps what `C y = w` needs of the past: the last `bands - 1` noise
structures (banded) or one buffer structure per theta (BLT), each the
shape of the record. It is secret server state, like the seed.
`ProjectedCorrelatedGaussianSumQuery` streams the noise in a larger space
(the model's d coordinates) and releases its projection on the round's
public coordinates (DP-RandAgg's random k); `correlate` is the recurrence
both use, and that DPSFL's sketch-space noise uses too.

DpEvent: `MatrixFactorizationDpEvent(stddev / l2_norm_clip, strategy)`, one
per round. It is not a per-round guarantee: the rounds are one Gaussian
mechanism together, and only the whole run has an epsilon, computed by
`tff_dp.privacy.correlated` from the number of rounds, the strategy and the
participation schema (`tff_dp.privacy` refuses to compose these events as
if independent).
"""

import json
from typing import NamedTuple, Sequence

import attr
import dp_accounting
import tensorflow as tf

from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import mf_strategy


@attr.define(frozen=True)
class MatrixFactorizationDpEvent(dp_accounting.DpEvent):
  """One round of a correlated-noise Gaussian sum (not composable alone).

  Attributes:
    noise_multiplier: The stddev of each `w_t` coordinate over the clip.
    strategy: `json.dumps(Strategy.to_dict())` of the strategy.
  """

  noise_multiplier: float
  strategy: str


def check_noise(noise, *, private: bool = True, needs: str = '') -> None:
  """Checks the `noise=` argument of a factory with correlated noise.

  Raises:
    ValueError: Unless `noise` is None or an `mf_strategy.Strategy`; or if
      it is a strategy and the factory is not `private` (the message says
      it `needs` that).
  """
  if noise is None:
    return
  if not isinstance(noise, mf_strategy.Strategy):
    raise ValueError(
      'noise must be None or an mf_strategy.Strategy. Found '
      f'{type(noise).__name__}: {noise!r}.'
    )
  if not private:
    raise ValueError(
      f'noise (correlated across rounds) needs {needs}, or noise=None.'
    )


def strategy_from_json(text: str) -> mf_strategy.Strategy:
  """The `mf_strategy.Strategy` of a `MatrixFactorizationDpEvent`."""
  d = json.loads(text)
  if d['kind'] == mf_strategy.BANDED:
    return mf_strategy.banded(d['coefficients'])
  return mf_strategy.blt(d['theta'], d['omega'])


def strategy_json(strategy: mf_strategy.Strategy) -> str:
  return json.dumps(strategy.to_dict(), sort_keys=True)


class CorrelatedGaussianSumQuery(dp_queries.SeededGaussianSumQuery):
  """A seeded Gaussian sum query with noise `C^-1 w` correlated over rounds.

  Record: a structure of float tensors with `record_specs`, clipped as
  `SeededGaussianSumQuery`'s. Release: the clipped sum plus `y_t`, where
  `w_t` is the seeded draw DP-FedAvg's query would add and `C y = w`
  (banded: `y_t = (w_t - sum_j c_j y_{t-j}) / c_0`; BLT: `y_t = w_t -
  sum_i omega_i s_i`, `s_i <- theta_i s_i + y_t`). DpEvent:
  `MatrixFactorizationDpEvent`.

  Args:
    l2_norm_clip: The clip, > 0.
    stddev: The stddev of each `w_t` coordinate, >= 0.
    strategy: The `mf_strategy.Strategy`.
    record_specs: The record's structure of `tf.TensorSpec`s (the noise
      state has its shape).
    seed: As `SeededGaussianSumQuery`'s.

  Raises:
    ValueError: On a bad seed, or a record spec that is not float32.
  """

  class _GlobalState(NamedTuple):
    l2_norm_clip: tf.Tensor
    stddev: tf.Tensor
    seed: tf.Tensor
    # Banded: the last bands - 1 noise structures, oldest first. BLT: one
    # buffer structure per theta.
    memory: tuple

  def __init__(
    self,
    l2_norm_clip: float,
    stddev: float,
    strategy: mf_strategy.Strategy,
    record_specs,
    seed: dp_queries.NoiseSeed,
  ):
    super().__init__(l2_norm_clip, stddev, seed)
    bad = [s for s in tf.nest.flatten(record_specs) if s.dtype != tf.float32]
    if bad:
      raise ValueError(
        f'Correlated noise needs float32 records. Found {bad!r}.'
      )
    self._strategy = strategy
    self._specs = record_specs
    self._event_strategy = strategy_json(strategy)
    self._slots = memory_slots(strategy)

  @property
  def strategy(self) -> mf_strategy.Strategy:
    return self._strategy

  def _zeros(self):
    return tf.nest.map_structure(
      lambda s: tf.zeros(s.shape, s.dtype), self._specs
    )

  def make_global_state(self, l2_norm_clip, stddev, seed=None, memory=None):
    if memory is None:
      memory = tuple(self._zeros() for _ in range(self._slots))
    return self._GlobalState(
      tf.cast(l2_norm_clip, tf.float32),
      tf.cast(stddev, tf.float32),
      dp_queries.seed_tensor(self._seed) if seed is None else seed,
      memory,
    )

  def initial_global_state(self):
    return self.make_global_state(self._l2_norm_clip, self._stddev)

  def get_noised_result(self, sample_state, global_state):
    seeds = tf.random.experimental.stateless_split(global_state.seed, num=2)
    # The draw DP-FedAvg's query would add (0 + noise is the noise's bits).
    w = dp_queries.add_stateless_gaussian_noise(
      tf.nest.map_structure(tf.zeros_like, sample_state),
      global_state.stddev,
      seeds[0],
    )
    y, memory = self._correlate(w, global_state.memory)
    result = tf.nest.map_structure(tf.add, sample_state, y)
    event = MatrixFactorizationDpEvent(
      global_state.stddev / global_state.l2_norm_clip, self._event_strategy
    )
    new_state = global_state._replace(seed=seeds[1], memory=memory)
    return result, new_state, event

  def _correlate(self, w, memory: Sequence):
    return correlate(self._strategy, w, memory)


def memory_slots(strategy: mf_strategy.Strategy) -> int:
  """How many record-shaped structures the noise state keeps: `bands - 1`
  (banded) or one buffer per theta (BLT)."""
  if strategy.kind == mf_strategy.BANDED:
    return len(strategy.coefficients) - 1
  return len(strategy.theta)


def correlate(strategy: mf_strategy.Strategy, w, memory: Sequence):
  """`(y_t, next memory)`: the round's correlated noise from its draw.

  Solves row t of `C y = w` (banded: `y_t = (w_t - sum_j c_j y_{t-j}) /
  c_0`; BLT: `y_t = w_t - sum_i omega_i s_i`, `s_i <- theta_i s_i + y_t`)
  for a structure of tensors `w`, with `memory` the `memory_slots`
  structures of `w`'s shape (zeros before the first round).
  """
  s = strategy
  if s.kind == mf_strategy.BANDED:
    c = s.coefficients
    y = w
    # memory[-j] is y_{t-j}.
    for j in range(1, len(c)):
      y = tf.nest.map_structure(lambda a, b, cj=c[j]: a - cj * b, y, memory[-j])
    if c[0] != 1.0:
      y = tf.nest.map_structure(lambda a: a / c[0], y)
    new_memory = (tuple(memory[1:]) + (y,)) if memory else ()
    return y, new_memory
  y = w
  for omega, buffer in zip(s.omega, memory):
    y = tf.nest.map_structure(lambda a, b, o=omega: a - o * b, y, buffer)
  new_memory = tuple(
    tf.nest.map_structure(lambda b, v, t=theta: t * b + v, buffer, y)
    for theta, buffer in zip(s.theta, memory)
  )
  return y, new_memory


class ProjectedCorrelatedGaussianSumQuery(CorrelatedGaussianSumQuery):
  """Correlated noise in the full d-dim space, released at k coordinates.

  For DP-RandAgg and FL-BASIC-DP, whose k coordinates change every round:
  the record is the client's k-vector at the round's coordinates I_t
  (clipped to `l2_norm_clip` as `SeededGaussianSumQuery` clips), and the
  release is the clipped sum plus `y_t[I_t]`, where `y_t = (C^-1 w)_t`
  streams over rounds in all d coordinates (`w_t ~ N(0, stddev^2 I_d)`).
  That is the public projection onto I_t of the full-space MF release of
  the clients' vectors scattered to I_t (each of norm at most the clip,
  zero elsewhere), so the noise cancels across rounds in the model's own
  coordinates, and the round's event is `MatrixFactorizationDpEvent(stddev
  / l2_norm_clip, strategy)` as for the full-space query.

  The query recomputes I_t from the public coordinate seed with
  `draw_coordinates(seed) -> (indices, next seed)`, the chain the
  aggregator draws from: its state holds a copy of that seed, started
  where the aggregator's starts and advanced once a round, as the
  aggregator's is.

  Args:
    l2_norm_clip: As `CorrelatedGaussianSumQuery`'s.
    stddev: As `CorrelatedGaussianSumQuery`'s.
    strategy: As `CorrelatedGaussianSumQuery`'s.
    seed: As `CorrelatedGaussianSumQuery`'s.
    dim: d, the full space's size (the noise state holds `memory_slots`
      float32 vectors of it).
    coordinate_seed: The coordinate chain's first (public) seed, int64 [2].
    draw_coordinates: Stateless `(round seed) -> (k int32 indices, next
      seed)`, TF ops.
  """

  class _GlobalState(NamedTuple):
    l2_norm_clip: tf.Tensor
    stddev: tf.Tensor
    seed: tf.Tensor
    memory: tuple
    coordinate_seed: tf.Tensor

  def __init__(
    self,
    l2_norm_clip: float,
    stddev: float,
    strategy: mf_strategy.Strategy,
    *,
    dim: int,
    coordinate_seed,
    draw_coordinates,
    seed: dp_queries.NoiseSeed,
  ):
    super().__init__(
      l2_norm_clip,
      stddev,
      strategy,
      tf.TensorSpec([int(dim)], tf.float32),
      seed,
    )
    self._coordinate_seed = coordinate_seed
    self._draw = draw_coordinates

  def make_global_state(
    self, l2_norm_clip, stddev, seed=None, memory=None, coordinate_seed=None
  ):
    if memory is None:
      memory = tuple(self._zeros() for _ in range(self._slots))
    if coordinate_seed is None:
      coordinate_seed = tf.constant(self._coordinate_seed, tf.int64)
    return self._GlobalState(
      tf.cast(l2_norm_clip, tf.float32),
      tf.cast(stddev, tf.float32),
      dp_queries.seed_tensor(self._seed) if seed is None else seed,
      memory,
      coordinate_seed,
    )

  def get_noised_result(self, sample_state, global_state):
    seeds = tf.random.experimental.stateless_split(global_state.seed, num=2)
    w = dp_queries.add_stateless_gaussian_noise(
      self._zeros(), global_state.stddev, seeds[0]
    )
    y, memory = self._correlate(w, global_state.memory)
    indices, next_coordinate_seed = self._draw(global_state.coordinate_seed)
    result = sample_state + tf.gather(y, indices)
    event = MatrixFactorizationDpEvent(
      global_state.stddev / global_state.l2_norm_clip, self._event_strategy
    )
    new_state = global_state._replace(
      seed=seeds[1], memory=memory, coordinate_seed=next_coordinate_seed
    )
    return result, new_state, event
