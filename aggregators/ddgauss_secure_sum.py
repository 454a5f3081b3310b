"""DDGauss's secure-sum plumbing: the participant count and the gated sum.

`participant_count` secure-sums a one from each client.
`ThresholdSecureSumFactory` has every client contribute zeros when fewer
than `min_clients` take part (the server then sees the count and a zero
sum), and `NothingSumFactory` stands in for the clipped-count sum, which
DDGauss does not aggregate.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class ThresholdSecureSumFactory(tff.aggregators.UnweightedAggregationFactory):
  """Secure sum with a threshold abort below `min_clients` participants.

  Secure-sums the participant count first, broadcasts whether it reaches
  `min_clients`, and below it has every client contribute zeros to TFF's
  `SecureSumFactory(upper, lower)`: the server then sees the count and a
  zero sum, nothing derived from the clients' values.
  """

  def __init__(self, min_clients: int, upper: int, lower: int):
    self._min_clients = int(min_clients)
    self._inner = tff.aggregators.SecureSumFactory(upper, lower)

  def create(self, value_type):
    inner = self._inner.create(value_type)
    min_clients = self._min_clients

    @tff.tensorflow.computation(np.int32)
    def decide(count):
      return count >= min_clients

    @tff.tensorflow.computation(value_type, np.bool_)
    def gate(value, released):
      return tf.nest.map_structure(
        lambda v: tf.where(released, v, tf.zeros_like(v)), value
      )

    @tff.federated_computation(
      inner.initialize.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      released = tff.federated_broadcast(
        tff.federated_map(decide, participant_count())
      )
      return inner.next(state, tff.federated_map(gate, (value, released)))

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


class NothingSumFactory(tff.aggregators.UnweightedAggregationFactory):
  """Reads nothing from the clients; its result is zero at the server."""

  def create(self, value_type):
    @tff.tensorflow.computation
    def zeros():
      return tf.nest.map_structure(
        lambda s: tf.zeros(s.shape, s.dtype),
        tff.types.type_to_tf_tensor_specs(value_type),
      )

    @tff.federated_computation
    def init_fn():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
      init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS)
    )
    def next_fn(state, value):
      del value
      return tff.templates.MeasuredProcessOutput(
        state,
        tff.federated_eval(zeros, tff.SERVER),
        tff.federated_value((), tff.SERVER),
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


def participant_count():
  """The round's participant count at the server (secure sum of ones)."""
  return tff.federated_secure_sum_bitwidth(
    tff.federated_value(1, tff.CLIENTS), bitwidth=1
  )
