"""Guards against non-finite and overflowing client values.

`FiniteGuardFactory(inner)` zeroes every client value that holds a NaN or
an infinity, and scales one whose norm exceeds `MAX_NORM` = 1e18 down to
that norm, before `inner` sees it. `clip_flat`, through which every DP clip
in `tff_dp.aggregators` goes, is `tf.clip_by_global_norm` when the float32
norm is finite, else the value clipped in float64 (`bound_in_float64`), or
zeroed if it holds a NaN or an infinity. Clip what you noise, and guard
what you release.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import weighting

MAX_NORM = 1e18


def bound_in_float64(flat, bound):
  """`(flat zeroed if non-finite, then scaled to norm <= bound; flag; norm)`.

  The norm is computed in float64, so finite values whose float32 norm
  overflows are scaled, not turned into NaN: (1e20)^2 is inf in float32,
  and `tf.clip_by_global_norm` then returns NaNs (as its documentation
  says). `flag` is 1 (int32) if `flat` held a NaN or an infinity (then the
  result is zeros), else 0; `norm` is the float64 norm of the zeroed
  values.
  """
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in flat])
  zeroed = [tf.where(finite, t, tf.zeros_like(t)) for t in flat]
  norm = tf.sqrt(
    tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, tf.float64))) for t in zeroed])
  )
  scale = tf.minimum(
    tf.constant(1.0, tf.float64),
    tf.cast(bound, tf.float64)
    / tf.maximum(norm, tf.constant(1e-300, tf.float64)),
  )
  bounded = [tf.cast(tf.cast(t, tf.float64) * scale, t.dtype) for t in zeroed]
  return bounded, tf.cast(tf.logical_not(finite), tf.int32), norm


def clip_flat(flat, clip):
  """`(flat clipped to global L2 norm clip, its norm)`, safe on any input.

  Equal to `tf.clip_by_global_norm(flat, clip)` when the float32 norm is
  finite; otherwise `bound_in_float64` (a NaN or infinity gives zeros).
  The norm returned is float32 (infinite for a finite value whose norm
  overflows float32; 0 for a zeroed one). A compressed payload computed
  from a bounded update can still overflow (CMP-Fed's U = Delta V, a
  sketch's counters), which is why every DP clip here goes through it.
  """
  flat = list(flat)
  norm = tf.linalg.global_norm(flat)

  def fast():
    clipped, _ = tf.clip_by_global_norm(flat, clip, use_norm=norm)
    return clipped, norm

  def slow():
    bounded, _, norm64 = bound_in_float64(flat, clip)
    return bounded, tf.cast(norm64, tf.float32)

  return tf.cond(tf.math.is_finite(norm), fast, slow)


class FiniteGuardFactory(
  tff.aggregators.UnweightedAggregationFactory, weighting.Weightable
):
  """Zeroes non-finite client values, then aggregates with `inner`.

  A client value with a NaN or an infinity has no L2 norm to clip: TFF's
  clipping (and any `x * min(1, C / ||x||)`) turns it into NaNs that the
  sum carries into the model; and a finite value can still overflow a
  float32 norm, so that one huge client update would poison DP-FedAvg's
  sum. `tff_dp`'s client works already zero non-finite updates; this
  makes every DP aggregator safe on its own.

  Client: a value whose float32 norm is finite and at most `MAX_NORM` is
  passed on as it is. Otherwise, a value holding a NaN or an infinity is
  replaced by zeros (norm 0, within any clip), and a finite one whose norm
  (in float64) exceeds `MAX_NORM` is scaled to exactly that norm, keeping
  its direction. Each client also sends the bit "my value was
  non-finite", summed over the cohort.

  Server: `inner`'s process on the guarded values: its state (same type),
  result and DP event. For any clip below 1e18 a clipped contribution is
  unchanged (the direction times the clip) or zero, so the sensitivity
  `inner`'s event assumes still holds. `guarded` is `inner`, through which
  `tff_dp.aggregators.dp_events.released_event(factory, state,
  measurements)`, the one documented reader of a round's event, reads it.

  Measurements (`OrderedDict`): `inner`'s own, keeping their names when
  they are a structure of named elements without `non_finite_clients`,
  otherwise nested under `inner`; and `non_finite_clients` (int32), the
  number of clients whose value held a NaN or an infinity. The count is a
  cohort sum of a per-client bit and, like the update diagnostics, not
  differentially private (it is 0 in a healthy run).

  Args:
    inner: The `tff.aggregators.UnweightedAggregationFactory` to guard.

  Raises:
    TypeError: If `inner` is not an `UnweightedAggregationFactory`.
  """

  def __init__(self, inner: tff.aggregators.UnweightedAggregationFactory):
    if not isinstance(inner, tff.aggregators.UnweightedAggregationFactory):
      raise TypeError(
        'inner must be a tff.aggregators.UnweightedAggregationFactory. '
        f'Found {type(inner)!r}.'
      )
    self._inner = inner

  @property
  def guarded(self) -> tff.aggregators.UnweightedAggregationFactory:
    """The wrapped factory (`dp_events.released_event` reads its event)."""
    return self._inner

  def create(self, value_type) -> tff.templates.AggregationProcess:
    inner = self._inner.create(value_type)

    @tff.tensorflow.computation(value_type)
    def zero_if_non_finite(value):
      flat = tf.nest.flatten(value)
      # One float32 pass decides: a NaN/Inf value or an overflowing norm
      # makes it non-finite (or > MAX_NORM); only then the slow path runs.
      norm32 = tf.linalg.global_norm([tf.cast(t, tf.float32) for t in flat])
      ok = tf.logical_and(tf.math.is_finite(norm32), norm32 <= MAX_NORM)

      def slow():
        bounded, bad, _ = bound_in_float64(flat, MAX_NORM)
        return bounded, bad

      def fast():
        return [tf.identity(t) for t in flat], tf.constant(0, tf.int32)

      out, bad = tf.cond(ok, fast, slow)
      return tf.nest.pack_sequence_as(value, out), bad

    meas_type = inner.next.type_signature.result.measurements.member
    names = (
      [n for n, _ in tff.structure.iter_elements(meas_type)]
      if (isinstance(meas_type, tff.StructType))
      else []
    )
    flat_names = (
      bool(names) and all(names) and 'non_finite_clients' not in names
    )

    @tff.tensorflow.computation(meas_type, tff.TensorType(np.int32))
    def merge(inner_measurements, count):
      if flat_names:
        out = collections.OrderedDict((n, inner_measurements[n]) for n in names)
      else:
        out = collections.OrderedDict(inner=inner_measurements)
      out['non_finite_clients'] = count
      return out

    @tff.federated_computation(
      inner.initialize.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      clean, bad = tff.federated_map(zero_if_non_finite, value)
      out = inner.next(state, clean)
      measurements = tff.federated_map(
        merge, (out.measurements, tff.federated_sum(bad))
      )
      return tff.templates.MeasuredProcessOutput(
        out.state, out.result, measurements
      )

    return tff.templates.AggregationProcess(inner.initialize, next_fn)
