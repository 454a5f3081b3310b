"""DPSFL's server state in sketch space and its update each round.

`SketchServer`, a base of `dpsfl.SketchAggregatorFactory`, builds the
server's TF computations: the initial state (the momentum and error
sketches, the clip C, the previous top-k indices T, the noise seed and,
with correlated noise, the streams' past) and the round's update: unit
noise for the sketch and DPSFL-AC's bit (independent, or correlated by
C^-1), the (noisy) mean sketch, DPSFL-AC's clip update, momentum, error
feedback and the top-k release.
"""

import collections
import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import correlated_noise


class SketchServer:
  """The server's steps of `dpsfl.SketchAggregatorFactory`, in sketch space.

  A base class: its methods read the attributes the factory's `__init__`
  sets (`_rows`, `_columns`, `_k`, `_momentum`, `_lr`, `_private`, `_z`,
  `_clients`, `_clip`, `_adaptive`, `_noise_seed`, `_noise`).
  """

  def _initial_server(self) -> tff.Computation:
    rows, cols, k = self._rows, self._columns, self._k

    @tff.tensorflow.computation
    def initial_server():
      state = collections.OrderedDict(
        momentum=tf.zeros([rows, cols]),
        error=tf.zeros([rows, cols]),
        clip=tf.constant(self._clip or 0.0, tf.float32),
        top_k=tf.zeros([k], tf.int32),
        seed=tf.constant(self._noise_seed, tf.int64),
      )
      if self._noise is not None:
        # Past unit-scale draws correlated by C^-1 (`correlate`): the
        # sketch's and the bit's streams.
        slots = correlated_noise.memory_slots(self._noise)
        state['noise_memory'] = collections.OrderedDict(
          table=tuple(tf.zeros([rows, cols]) for _ in range(slots)),
          bit=tuple(tf.zeros([]) for _ in range(slots)),
        )
      return state

    return initial_server

  def _server_update(
    self, sk, server_type, payload_type, hashes_type, unflatten
  ) -> tff.Computation:
    """The server step: noise, mean, clip update, momentum and top-k."""
    private = self._private

    @tff.tensorflow.computation(
      server_type, payload_type, hashes_type, tff.TensorType(np.float32)
    )
    def server_update(state, total, hashes, num_clients):
      seeds = tf.random.experimental.stateless_split(state['seed'], num=3)
      clip = state['clip']
      table_noise, bit_noise, noise_memory = self._unit_noise(state, seeds)
      mean = self._mean_sketch(total['table'], clip, num_clients, table_noise)
      new_clip, p_hat = self._next_clip(total['bit'], clip, bit_noise)
      momentum = self._momentum * state['momentum'] + mean
      error = state['error'] + self._lr * momentum
      idx, values = sk.top_k(error, self._k, hashes)
      delta = tf.scatter_nd(idx[:, None], values, [sk.dim])
      error = error - sk.sketch(delta, hashes)
      result = unflatten(delta)
      new_state = collections.OrderedDict(
        momentum=momentum,
        error=error,
        clip=new_clip,
        top_k=idx,
        seed=seeds[2],
      )
      if noise_memory is not None:
        new_state['noise_memory'] = noise_memory
      measurements = collections.OrderedDict(
        clip=clip if private else tf.constant(float('nan')),
        unclipped_probability=p_hat,
        num_clients=num_clients,
        sketch_norm=tf.norm(mean),
      )
      return new_state, result, measurements

    return server_update

  def _unit_noise(self, state, seeds):
    """`(sketch noise, bit noise, next noise memory)` at unit stddev.

    Independent: N(0, 1) draws from `seeds[0]` (sketch) and `seeds[1]`
    (bit), and no memory (None); all None for FetchSGD. With `noise`:
    those draws correlated by C^-1 (`correlated_noise.correlate`), in unit
    scale so that the clip DPSFL-AC moves each round scales the round's
    noise and not the past's.
    """
    if not self._private:
      return None, None, None
    table = tf.random.stateless_normal(
      [self._rows, self._columns], seed=seeds[0]
    )
    bit = tf.random.stateless_normal([], seed=seeds[1])
    if self._noise is None:
      return table, bit, None
    memory = state['noise_memory']
    table, table_memory = correlated_noise.correlate(
      self._noise, table, memory['table']
    )
    bit, bit_memory = correlated_noise.correlate(
      self._noise, bit, memory['bit']
    )
    return (
      table,
      bit,
      collections.OrderedDict(table=table_memory, bit=bit_memory),
    )

  def _mean_sketch(self, table_sum, clip, num_clients, unit_noise):
    """The (noisy) sum's mean: over the expected or the actual clients.

    The noise is `unit_noise` (`_unit_noise`) times z sqrt(rows) C.
    """
    if not self._private:
      return table_sum / tf.maximum(num_clients, 1.0)
    bound = math.sqrt(self._rows) * clip
    noise = unit_noise * (self._z * bound)
    return (table_sum * bound + noise) / self._clients

  def _next_clip(self, bit_sum, clip, unit_noise):
    """`(next clip, p_hat)`: DPSFL-AC's geometric update, else unchanged.

    The bit's noise is `unit_noise` (`_unit_noise`) times sigma_b.
    """
    adaptive = self._adaptive
    new_clip = clip
    p_hat = tf.constant(float('nan'))
    if adaptive is not None:
      bit_noise = unit_noise * adaptive.bit_noise_multiplier
      p_hat = (bit_sum + bit_noise) / self._clients
      new_clip = clip * tf.exp(
        adaptive.learning_rate * (adaptive.target_probability - p_hat)
      )
    return new_clip, p_hat
