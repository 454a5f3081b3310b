"""A guard that zeroes non-finite client values before an aggregator.

A client value with a NaN or an infinity has no L2 norm to clip: TFF's
clipping (and any `x * min(1, C / ||x||)`) turns it into NaNs that the sum
carries into the model. `FiniteGuardFactory(inner)` replaces every
non-finite client value by zeros (its contribution then has norm 0, within
any clip) before `inner` sees it, and counts those clients in the
measurement `non_finite_clients`, added beside the inner aggregator's own
measurements (which keep their names; an unnamed inner measurement is
nested under `inner`). The count is a cohort sum of a per-client bit and,
like the update diagnostics, not differentially private (it is 0 in a
healthy run). `tff_dp`'s client works already zero non-finite updates;
this makes every DP aggregator safe on its own.

Finite values can still overflow a float32 norm: (1e20)^2 is inf, and
`tf.clip_by_global_norm` then returns NaNs (as its documentation says), so
one huge client update would poison DP-FedAvg's sum. The guard therefore
also rescales any value whose norm (computed in float64) exceeds
`MAX_NORM` = 1e18 to exactly that norm, keeping its direction: for any
clip below 1e18 the clipped contribution is unchanged (the direction
times the clip), and the sensitivity the ledger assumes holds.

A compressed payload computed from a bounded update can still overflow
(CMP-Fed's U = Delta V, a sketch's counters), so every DP clip in
`tff_dp.aggregators` goes through `clip_flat`: `tf.clip_by_global_norm`
when the float32 norm is finite, else the payload clipped in float64, or
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
  """`(flat zeroed if non-finite, then scaled to norm <= bound; flag)`.

  The norm is computed in float64, so finite values whose float32 norm
  overflows are scaled, not turned into NaN. `flag` is 1 (int32) if `flat`
  held a NaN or an infinity (then the result is zeros), else 0.
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
  overflows float32; 0 for a zeroed one).
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
  """Zeroes non-finite client values, then aggregates with `inner`."""

  def __init__(self, inner: tff.aggregators.UnweightedAggregationFactory):
    if not isinstance(inner, tff.aggregators.UnweightedAggregationFactory):
      raise TypeError(
        'inner must be a tff.aggregators.UnweightedAggregationFactory. '
        f'Found {type(inner)!r}.'
      )
    self._inner = inner

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
