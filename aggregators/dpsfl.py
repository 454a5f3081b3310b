"""FetchSGD, DPSFL and DPSFL-AC: count-sketched updates.

`SketchAggregatorFactory` runs FetchSGD (Rothchild et al. 2020) and the
DPSFL paper's DPSFL and DPSFL-AC. Clients send sketches S_i (DPSFL: clipped
to ||S_i||_F <= sqrt(rows) C); the server forms the mean
S = (sum_i S_i + N(0, (z sqrt(rows) C)^2)) / n (FetchSGD: no noise, n the
participants), S_u <- rho S_u + S, S_e <- S_e + lr S_u, releases
Delta = top_k(S_e) and sets S_e <- S_e - S(Delta). DPSFL-AC adapts the clip:
C <- C exp(eta_C (p - p_hat)), p_hat = (sum_i b_i + N(0, sigma_b^2)) / n.

This module holds the factory, its client step and its builders; the
adaptive clip's rule and bit noise are in `dpsfl_adaptive_clip`, the
server's sketch-space state and update in `dpsfl_server`.
See docs/papers/dpsfl.md for the paper's reading and derivations.
"""

import collections
import math
from typing import Optional

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import _tff_private
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import count_sketch
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import dpsfl_adaptive_clip
from tff_dp.aggregators import dpsfl_server
from tff_dp.aggregators import finite_guard
from tff_dp.aggregators import mf_strategy
from tff_dp.aggregators import weighting


_EVENT_NAMES = ('sketch', 'clip_bit')


def _flat_spec(value_type):
  return _tff_private.flat_float_specs(value_type, 'Sketching')


def round_event(
  noise_multiplier: float,
  adaptive: Optional[dpsfl_adaptive_clip.AdaptiveClip],
  noise: Optional[mf_strategy.Strategy] = None,
) -> dp_accounting.DpEvent:
  """One round's release before sampling: the sketch's and the bit's
  (`GaussianDpEvent`s; with `noise`, `MatrixFactorizationDpEvent`s of that
  strategy)."""

  def gaussian(z):
    if noise is None:
      return dp_accounting.GaussianDpEvent(z)
    return correlated_noise.MatrixFactorizationDpEvent(
      z, correlated_noise.strategy_json(noise)
    )

  sketch = gaussian(noise_multiplier)
  if adaptive is None:
    return sketch
  if adaptive.bit_noise_multiplier is None:
    raise ValueError(
      'round_event needs the bit noise: pass adaptive.resolved('
      'clients_per_round).'
    )
  return dp_accounting.ComposedDpEvent(
    [sketch, gaussian(adaptive.bit_noise_multiplier)]
  )


def _check_sketch_args(rows, columns, k, momentum, learning_rate, hashing):
  """Checks the sketch's and the server's arguments (k against d later)."""
  count_sketch.check_table(rows, columns, hashing)
  count_sketch.check_int('k', k, 1)
  if not (isinstance(momentum, (int, float)) and 0 <= momentum < 1):
    raise ValueError(f'momentum must be in [0, 1). Found {momentum!r}.')
  if not learning_rate > 0:
    raise ValueError(f'learning_rate must be > 0. Found {learning_rate!r}.')


def _check_dp_args(noise_multiplier, clients_per_round, clip, adaptive):
  """Checks the DP arguments: all given (DPSFL) or none (FetchSGD)."""
  if noise_multiplier is None:
    if adaptive is not None or clip is not None:
      raise ValueError(
        'clip and adaptive need noise_multiplier (DPSFL); FetchSGD has none.'
      )
    return
  if not noise_multiplier >= 0:
    raise ValueError(
      f'noise_multiplier must be >= 0. Found {noise_multiplier!r}.'
    )
  if clients_per_round is None or not clients_per_round > 0:
    raise ValueError(
      f'clients_per_round must be > 0. Found {clients_per_round!r}.'
    )
  if clip is None or not clip > 0:
    raise ValueError(f'clip must be > 0. Found {clip!r}.')


def _check_k_within(k: int, dim: int) -> None:
  if k > dim:
    raise ValueError(
      f'k must be in [1, {dim}] (the number of scalars in the value). '
      f'Found {k!r}.'
    )


def _flatten(value):
  """The value's tensors as one float32 vector."""
  return tf.concat(
    [tf.reshape(tf.cast(v, tf.float32), [-1]) for v in tf.nest.flatten(value)],
    axis=0,
  )


class SketchAggregatorFactory(
  tff.aggregators.UnweightedAggregationFactory,
  weighting.Weightable,
  dpsfl_server.SketchServer,
):
  """FetchSGD, DPSFL or DPSFL-AC as an unweighted aggregation factory.

  The value (a structure of float tensors with d scalars in all) is
  flattened and count-sketched (`count_sketch.CountSketch`, `rows x
  columns` counters, hashes from the public `seed`).

  Each round the server broadcasts the sketch's hashes, the clip C and the
  previous round's top-k indices T. A client sends the `[rows, columns]`
  float32 sketch S(g) of its update g and one float32 bit:
    * FetchSGD (`noise_multiplier=None`): S(g) as is and the bit 0,
      summed in the clear (`tff.aggregators.SumFactory`).
    * DPSFL: S(g) scaled by f = min(1, sqrt(rows) C / ||S(g)||_F) and
      divided by sqrt(rows) C (entries in [-1, 1]; NaN/Inf counters are
      zeroed and a float32 norm overflow is clipped in float64, by
      `finite_guard.bound_in_float64`), and the bit 0, both secure-summed
      (`tff.aggregators.SecureSumFactory`, ranges [-1, 1] and [0, 1]).
    * DPSFL-AC: as DPSFL, with the bit b = 1[impact <= gamma], the
      clipping impact on T being (1 - f) (relative rule, or where g_T = 0)
      or (1 - f) ||g_T|| (absolute rule).

  The server adds N(0, (z sqrt(rows) C)^2) to every counter of the sum
  (private), takes the mean over `clients_per_round` (private) or over the
  participants (FetchSGD), updates the momentum sketch
  S_u <- rho S_u + mean and the error sketch S_e <- S_e + lr S_u, and
  releases the k-sparse Delta of S_e's k largest median estimates, in the
  value's own structure (S_e <- S_e - S(Delta)). DPSFL-AC also adds
  N(0, sigma_b^2) to the bit sum, p_hat = noisy sum / clients_per_round, and
  sets C <- C exp(eta_C (p - p_hat)). Noise is stateless, from a seed in the
  state (from `noise_seed`), split each round. Apply Delta with server SGD
  at learning rate 1 and no server momentum (momentum lives here).

  DP event (`round_event()`, also returned by `released_event(state,
  measurements)`, which `dp_events.released_event` calls; fixed at
  construction, before sampling): DPSFL `GaussianDpEvent(z)`; DPSFL-AC
  `ComposedDpEvent([GaussianDpEvent(z), GaussianDpEvent(sigma_b)])`, the
  sketch's and the bit's Gaussians on the same cohort. Neighbouring
  relation: add/remove-one client (client level: one client's whole
  clipped sketch added or removed), the sketch sum's L2 sensitivity
  sqrt(rows) C and the bit sum's 1. FetchSGD releases no event (both
  raise). Delta, the state and the measurements are post-processing of the
  noisy sums, except `num_clients`.

  State: `OrderedDict(server=OrderedDict(momentum, error, clip, top_k,
  seed), table_sum=..., bit_sum=...)`: the momentum and error sketches, the
  clip, T and the noise seed (with `noise`, also `noise_memory`, the
  correlated streams' past); the inner sums' states.

  Measurements (`OrderedDict`):
    * `clip`: the clip C used this round (NaN for FetchSGD);
    * `unclipped_probability`: p_hat (NaN unless DPSFL-AC);
    * `num_clients`: the number of participants, not noised (outside the
      DP event; the runner lists it among its non-private outputs);
    * `sketch_norm`: the Frobenius norm of the (noisy) mean sketch.

  Args:
    rows: Sketch rows, an integer >= 1.
    columns: Sketch columns, an integer >= 1.
    k: Coordinates released a round, an integer in [1, d] (d is checked by
      `create`).
    momentum: rho in [0, 1).
    learning_rate: lr > 0 scaling the momentum into the error sketch.
    noise_multiplier: z >= 0 (DPSFL / DPSFL-AC); None: FetchSGD.
    clients_per_round: Expected clients a round (the DP mean's
      denominator), > 0; required with `noise_multiplier`.
    clip: The clip C (initial, with `adaptive`), > 0; required with
      `noise_multiplier`.
    adaptive: DPSFL-AC's `dpsfl_adaptive_clip.AdaptiveClip` (its ranges
      there); None: a fixed clip. Its bit noise defaults to
      `clients_per_round` / 20; a warning is logged if it lowers the merged
      noise multiplier below `dpsfl_adaptive_clip.BIT_NOISE_WARNING_RATIO`
      of z.
    seed: Seeds the hashes (public randomness).
    noise_seed: Seeds the noise of the sketch and of DPSFL-AC's bit: None
      (default) draws a secret; an int s starts the stream (s, 7) (keep it
      secret).
    hashing: The count sketch's hash family, 'murmur' or 'block' ('block'
      needs d <= 1024 x columns; see `count_sketch`).
    noise: None (default): noise independent across rounds. An
      `mf_strategy.Strategy` (DPSFL, DPSFL-AC): the sketch's and the bit's
      noise correlated across rounds in sketch space, `z sqrt(rows) C_t
      (C^-1 w)_t` and `sigma_b (C^-1 v)_t` from unit-scale draws (so
      DPSFL-AC's moving clip scales only its own round), with the state's
      `server.noise_memory` holding the past; the events become
      `MatrixFactorizationDpEvent`s of that strategy, merged by the ledger
      as Gaussians are (`tff_dp.privacy.merge_gaussians`) and accounted over
      the run by `tff_dp.privacy.correlated`.

  Raises:
    ValueError: At construction, on a bad argument, naming it and its
      allowed range, or if `clip` or `adaptive` is given without
      `noise_multiplier`; at `create`, if k > d or 'block' hashing needs
      more than 1024 blocks. `round_event` and `released_event` raise for
      FetchSGD.
    TypeError: At `create`, if the value has a non-float tensor.
  """

  def __init__(
    self,
    *,
    rows: int,
    columns: int,
    k: int,
    momentum: float = 0.9,
    learning_rate: float = 1.0,
    noise_multiplier: Optional[float] = None,
    clients_per_round: Optional[float] = None,
    clip: Optional[float] = None,
    adaptive: Optional[dpsfl_adaptive_clip.AdaptiveClip] = None,
    seed: int = 0,
    noise_seed: dp_queries.NoiseSeed = None,
    hashing: str = 'murmur',
    noise: Optional[mf_strategy.Strategy] = None,
  ):
    """Checks the arguments (k against d at `create`); see the class doc."""
    _check_sketch_args(rows, columns, k, momentum, learning_rate, hashing)
    private = noise_multiplier is not None
    correlated_noise.check_noise(
      noise,
      private=private,
      needs='DPSFL or DPSFL-AC: pass noise_multiplier',
    )
    self._noise = noise
    _check_dp_args(noise_multiplier, clients_per_round, clip, adaptive)
    if adaptive is not None:
      adaptive.check()
      adaptive = adaptive.resolved(clients_per_round)
      dpsfl_adaptive_clip.warn_if_bit_noise_dominates(
        float(noise_multiplier), adaptive, float(clients_per_round)
      )
    self._rows, self._columns, self._k = int(rows), int(columns), int(k)
    self._momentum, self._lr = float(momentum), float(learning_rate)
    self._private = private
    self._z = float(noise_multiplier) if private else 0.0
    self._clients = float(clients_per_round) if private else None
    self._clip = float(clip) if private else None
    self._adaptive = adaptive
    self._seed = int(seed)
    if isinstance(noise_seed, (int, np.integer)):
      noise_seed = (int(noise_seed), 7)
    self._noise_seed = dp_queries.resolve_seed(noise_seed)
    self._hashing = hashing

  @property
  def private(self) -> bool:
    return self._private

  def round_event(self) -> dp_accounting.DpEvent:
    """The round's event before sampling (see the class docstring).

    Raises:
      ValueError: For FetchSGD, which releases no event.
    """
    if not self._private:
      raise ValueError('FetchSGD releases no DP event.')
    return round_event(self._z, self._adaptive, self._noise)

  def released_event(self, state, measurements) -> dp_accounting.DpEvent:
    """The round's event, as `dp_events.released_event` reads it.

    It is `round_event()`, fixed at construction: the state and the
    measurements are not read.

    Raises:
      ValueError: For FetchSGD, which releases no event.
    """
    del state, measurements
    return self.round_event()

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, flat_specs, sizes = _flat_spec(value_type)
    dim = sum(sizes)
    _check_k_within(self._k, dim)
    sk = count_sketch.CountSketch(
      self._rows, self._columns, dim, self._seed, hashing=self._hashing
    )
    initial_server = self._initial_server()
    server_type = initial_server.type_signature.result

    @tff.tensorflow.computation
    def make_hashes():
      return sk.hashes()

    hashes_type = make_hashes.type_signature.result
    encode = self._client_encode(sk, value_type, hashes_type, server_type.top_k)

    def unflatten(delta):
      parts = tf.split(delta, sizes)
      return tf.nest.pack_sequence_as(
        specs,
        [
          tf.cast(tf.reshape(p, s.shape), s.dtype)
          for p, s in zip(parts, flat_specs)
        ],
      )

    server_update = self._server_update(
      sk, server_type, encode.type_signature.result, hashes_type, unflatten
    )
    table_sum, bit_sum = self._inner_sums()
    return _aggregation_process(
      value_type,
      initial_server,
      make_hashes,
      encode,
      server_update,
      table_sum,
      bit_sum,
    )

  def _client_encode(
    self, sk, value_type, hashes_type, top_k_type
  ) -> tff.Computation:
    """The client step: the (clipped, scaled) sketch and the bit."""

    @tff.tensorflow.computation(
      value_type, hashes_type, tff.TensorType(np.float32), top_k_type
    )
    def encode(value, hashes, clip, top_k):
      g = _flatten(value)
      table = sk.sketch(g, hashes)
      if not self._private:
        return collections.OrderedDict(table=table, bit=tf.constant(0.0))
      # In [-1, 1] entrywise: the clipped sketch over its norm bound.
      scaled, factor = self._clip_sketch(table, clip)
      bit = tf.constant(0.0)
      if self._adaptive is not None:
        bit = self._impact_bit(g, top_k, factor)
      return collections.OrderedDict(table=scaled, bit=bit)

    return encode

  def _clip_sketch(self, table, clip):
    """`(table * f / bound, f)`, bound = sqrt(rows) C, f = min(1, b/||S||)."""
    bound = math.sqrt(self._rows) * clip
    norm = tf.norm(table)

    def fast():
      factor = tf.minimum(1.0, bound / tf.maximum(norm, 1e-30))
      return table * factor / bound, factor

    def slow():  # NaN/Inf counters (zeroed) or a float32 norm overflow.
      (bounded,), _, norm64 = finite_guard.bound_in_float64([table], bound)
      factor = tf.minimum(
        tf.constant(1.0, tf.float64), tf.cast(bound, tf.float64) / norm64
      )
      return bounded / bound, tf.cast(factor, tf.float32)

    return tf.cond(tf.math.is_finite(norm), fast, slow)

  def _impact_bit(self, g, top_k, factor):
    """DPSFL-AC's bit 1[clipping impact on the previous top-k <= gamma]."""
    adaptive = self._adaptive
    top_norm = tf.norm(tf.gather(g, top_k))
    impact = (1.0 - factor) * top_norm
    if adaptive.impact_rule == 'relative':
      impact = tf.where(
        top_norm > 0, impact / tf.maximum(top_norm, 1e-30), 1.0 - factor
      )
    return tf.cast(impact <= adaptive.impact_threshold, tf.float32)

  def _inner_sums(self):
    """`(table sum, bit sum)` processes: secure (private) or plain."""
    table_type = tff.TensorType(np.float32, [self._rows, self._columns])
    if self._private:
      table_sum = tff.aggregators.SecureSumFactory(1.0, -1.0).create(table_type)
      bit_sum = tff.aggregators.SecureSumFactory(1.0, 0.0).create(
        tff.TensorType(np.float32)
      )
    else:
      table_sum = tff.aggregators.SumFactory().create(table_type)
      bit_sum = tff.aggregators.SumFactory().create(tff.TensorType(np.float32))
    return table_sum, bit_sum


def _aggregation_process(
  value_type,
  initial_server,
  make_hashes,
  encode,
  server_update,
  table_sum,
  bit_sum,
) -> tff.templates.AggregationProcess:
  """Places the steps: broadcast, client encode, sums, server update."""

  @tff.tensorflow.computation
  def one():
    return tf.constant(1.0)

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(
      collections.OrderedDict(
        server=tff.federated_eval(initial_server, tff.SERVER),
        table_sum=table_sum.initialize(),
        bit_sum=bit_sum.initialize(),
      )
    )

  @tff.federated_computation(
    init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS)
  )
  def next_fn(state, value):
    server = state.server
    hashes = tff.federated_eval(make_hashes, tff.SERVER)
    payload = tff.federated_map(
      encode,
      (
        value,
        tff.federated_broadcast(hashes),
        tff.federated_broadcast(server.clip),
        tff.federated_broadcast(server.top_k),
      ),
    )
    tables = table_sum.next(state.table_sum, payload.table)
    bits = bit_sum.next(state.bit_sum, payload.bit)
    num_clients = tff.federated_sum(tff.federated_eval(one, tff.CLIENTS))
    total = tff.federated_zip(
      collections.OrderedDict(table=tables.result, bit=bits.result)
    )
    new_server, result, measurements = tff.federated_map(
      server_update, (server, total, hashes, num_clients)
    )
    new_state = tff.federated_zip(
      collections.OrderedDict(
        server=new_server, table_sum=tables.state, bit_sum=bits.state
      )
    )
    return tff.templates.MeasuredProcessOutput(new_state, result, measurements)

  return tff.templates.AggregationProcess(init_fn, next_fn)


def fetchsgd(
  rows: int, columns: int, k: int, **options
) -> SketchAggregatorFactory:
  """FetchSGD: sketched updates, momentum and error feedback, no DP.

  Args:
    rows: Sketch rows, an integer >= 1.
    columns: Sketch columns, an integer >= 1.
    k: Coordinates released a round, an integer in [1, d].
    **options: `momentum`, `learning_rate`, `seed`, `noise_seed`, `hashing`
      (see `SketchAggregatorFactory`).

  Returns:
    A non-private `SketchAggregatorFactory` (it releases no DP event).

  Raises:
    ValueError: On a bad argument (see `SketchAggregatorFactory`).
  """
  return SketchAggregatorFactory(rows=rows, columns=columns, k=k, **options)


def dpsfl(
  rows: int,
  columns: int,
  k: int,
  *,
  noise_multiplier: float,
  clients_per_round: float,
  clip: float,
  **options,
) -> SketchAggregatorFactory:
  """DPSFL: clipped sketches, Gaussian noise on their sum, FetchSGD server.

  Args:
    rows: Sketch rows, an integer >= 1.
    columns: Sketch columns, an integer >= 1.
    k: Coordinates released a round, an integer in [1, d].
    noise_multiplier: z >= 0: the sum's noise stddev over its sensitivity
      sqrt(rows) * clip.
    clients_per_round: Expected clients a round (the mean's denominator),
      > 0.
    clip: The clip C > 0 of a client's sketch, ||S||_F <= sqrt(rows) C.
    **options: As for `fetchsgd`, and `adaptive` (see `dpsfl_ac`).

  Returns:
    A `SketchAggregatorFactory` whose round releases
    `GaussianDpEvent(noise_multiplier)` (add/remove-one client).

  Raises:
    ValueError: On a bad argument (see `SketchAggregatorFactory`).
  """
  return SketchAggregatorFactory(
    rows=rows,
    columns=columns,
    k=k,
    noise_multiplier=noise_multiplier,
    clients_per_round=clients_per_round,
    clip=clip,
    **options,
  )


def dpsfl_ac(
  rows: int,
  columns: int,
  k: int,
  *,
  noise_multiplier: float,
  clients_per_round: float,
  initial_clip: float,
  adaptive: Optional[dpsfl_adaptive_clip.AdaptiveClip] = None,
  **options,
) -> SketchAggregatorFactory:
  """DPSFL-AC: DPSFL with the clip adapted from noisy clipping-impact bits.

  Args:
    rows: Sketch rows, an integer >= 1.
    columns: Sketch columns, an integer >= 1.
    k: Coordinates released a round, an integer in [1, d].
    noise_multiplier: z >= 0 of the sketch sum (as for `dpsfl`).
    clients_per_round: Expected clients a round, > 0.
    initial_clip: The first round's clip C > 0.
    adaptive: The clip rule (`dpsfl_adaptive_clip.AdaptiveClip`, its
      ranges there); None: `AdaptiveClip()`. Its bit noise defaults to
      clients_per_round / 20.
    **options: As for `fetchsgd`.

  Returns:
    A `SketchAggregatorFactory` whose round releases
    `ComposedDpEvent([GaussianDpEvent(z), GaussianDpEvent(sigma_b)])`
    (add/remove-one client).

  Raises:
    ValueError: On a bad argument (see `SketchAggregatorFactory` and
      `dpsfl_adaptive_clip.AdaptiveClip`).
  """
  return dpsfl(
    rows,
    columns,
    k,
    noise_multiplier=noise_multiplier,
    clients_per_round=clients_per_round,
    clip=initial_clip,
    adaptive=adaptive
    if adaptive is not None
    else dpsfl_adaptive_clip.AdaptiveClip(),
    **options,
  )


def upload_bytes(rows: int, columns: int, adaptive: bool = False) -> int:
  """The float32 sketch (and DPSFL-AC's bit, as a float32)."""
  return 4 * rows * columns + (4 if adaptive else 0)


def download_bytes(k: int, adaptive: bool = False) -> int:
  """The top-k values and int32 indices (and DPSFL-AC's clip)."""
  return 8 * k + (4 if adaptive else 0)
