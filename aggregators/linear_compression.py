"""Linear compression around a DP sum: clip and noise in the compressed space.

Chen, Choquette-Choo, Kairouz, Suresh, "The Fundamental Price of Secure
Aggregation in Differentially Private Federated Learning" (ICML 2022): each
round the server draws a b x d matrix S from a public seed in its state
(E[S^T S] = I); every client sends S x_i (b floats); the inner DP
aggregator (any of ours: fixed or adaptive Gaussian, DDGauss over secure
sum, correlated noise) clips those b-dim records to C, sums and noises them
as it would the full update; the server decodes the released b-dim mean
linearly, S^T y. The DP event is the inner aggregator's, unchanged: the
compressed record of a client is clipped to C whatever it holds.

Three sketches (`SKETCHES`):
  * 'srht_interleaved' (the default): a subsampled randomized Hadamard
    transform, S = sqrt(D/b) P H D_s: the value padded to D (a multiple of
    1,024), random signs D_s, the orthonormal Hadamard transform H of
    blocks of 1,024 (`BLOCK`) that interleave the coordinates (block k
    holds the coordinates k, k + D/1,024, k + 2 D/1,024, ...), and b of the
    D rows kept by systematic sampling through a seeded permutation (each
    row with probability b/D, never twice).
  * 'srht': the same with blocks of 1,024 consecutive coordinates. Its
    decode error stays in the blocks it comes from, so it lands on the
    layers that carry the update: in the Fashion-MNIST CNN the second
    convolution holds 3% of the parameters and 38% of ||mu||^2 after 500
    SGD steps, and there the error at 1,000x is 16x its uniform share of
    the total (benchmarks/results/compression_error_by_layer.md).
    Interleaving spreads each layer over every block, and the error over
    the coordinates like the noise. Its rows are systematic
    sampling's lattice, unpermuted.
  * 'count_sketch': one hash row, S[h(i), i] = s(i), h uniform on [0, b),
    s uniform on {-1, +1}. Encoding is a segment sum, decoding a gather.

All three are unbiased (E[S^T S] = I) and put each decoded coordinate's noise at
the inner noise's variance (diag(S^T S) = 1 exactly for the count sketch,
in expectation for the SRHT), so the decoded noise energy on the mean is
d z^2 C^2 / n^2, as uncompressed. What compression adds is the error of the
linear decode on the cohort's mean update mu: E ||S^T S mu - mu||^2 =
(d - 1)/b ||mu||^2 (count sketch) and (D/b - 1) ||mu||^2 (SRHTs), the
`added_error_share` of the noise that the compression plan bounds.

See docs/papers/linear_compression.md.
"""

import collections
import math
import numbers
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import _tff_private
from tff_dp.aggregators import dp_events
from tff_dp.aggregators import weighting

SKETCHES = ('count_sketch', 'srht', 'srht_interleaved')
_SRHTS = ('srht', 'srht_interleaved')
# The SRHT's Hadamard block: 1,024 = 32 x 32, applied as two 32 x 32
# matrix products per block (H_32 kron H_32 = H_1024).
BLOCK = 1024
_SIDE = 32
# The round's 8-byte seed: sent down to every client, and counted in its
# upload too, beside its b values: a record decodes only with its round's
# S, so a client reporting asynchronously sends the seed with it (the
# simulation hands it to the server directly).
SEED_BYTES = 8

# The non-private measurements (`measure_error_clip`).
ERROR_SQ = 'compression_error_sq'
MEAN_SQ = 'compression_mean_sq'


def check_sketch(sketch: str) -> None:
  """Raises ValueError unless `sketch` is one of `SKETCHES`."""
  if sketch not in SKETCHES:
    raise ValueError(f'sketch must be one of {SKETCHES}. Found {sketch!r}.')


def check_compression(compression) -> None:
  """Raises ValueError unless `compression` is a finite number >= 1."""
  if (
    isinstance(compression, bool)
    or not isinstance(compression, (int, float, np.integer, np.floating))
    or not math.isfinite(compression)
    or compression < 1
  ):
    raise ValueError(
      f'compression must be a finite number >= 1 (d / b). Found '
      f'{compression!r}.'
    )


def padded_dim(sketch: str, dim: int) -> int:
  """D: the dimension S acts on (an SRHT pads to a multiple of `BLOCK`)."""
  if sketch in _SRHTS:
    return -(-dim // BLOCK) * BLOCK
  return dim


def num_rows(dim: int, compression: float) -> int:
  """b = ceil(d / compression), at least 1."""
  check_compression(compression)
  return max(1, math.ceil(dim / compression))


def error_factor(sketch: str, dim: int, rows: int) -> float:
  """E ||S^T S mu - mu||^2 / ||mu||^2 for this sketch's S (b x d)."""
  if sketch == 'count_sketch':
    return (dim - 1) / rows
  return padded_dim(sketch, dim) / rows - 1


def added_error_share(
  sketch: str,
  dim: int,
  rows: int,
  *,
  noise_multiplier: float,
  clients_per_round: float,
  norm_ratio: float,
) -> float:
  """The decode's expected squared error on the mean, over the DP noise's.

  The mean of the cohort's clipped updates, mu, has ||mu|| <= norm_ratio x
  C; the noise on the released mean has energy d z^2 C^2 / n^2. C cancels:
  error_factor x norm_ratio^2 n^2 / (d z^2).
  """
  if noise_multiplier <= 0:
    return math.inf
  return (
    error_factor(sketch, dim, rows)
    * norm_ratio**2
    * clients_per_round**2
    / (dim * noise_multiplier**2)
  )


def initial_seed(seed: int) -> np.ndarray:
  """The sketch seed's first state (public)."""
  return np.array([int(seed), 2], np.int64)


def _hadamard(side: int) -> np.ndarray:
  h = np.ones([1, 1])
  while h.shape[0] < side:
    h = np.block([[h, h], [h, -h]])
  return (h / np.sqrt(side)).astype(np.float32)


class _Sketch:
  """S for one (sketch, d, b): `encode(flat, seed)`, `decode(y, seed)`."""

  def __init__(self, sketch: str, dim: int, rows: int):
    self.sketch, self.dim, self.rows = sketch, dim, rows
    self.padded = padded_dim(sketch, dim)
    if rows > self.padded:
      raise ValueError(
        f'The sketch has b = {rows} rows but acts on {self.padded} '
        f'coordinates: b must be at most {self.padded}.'
      )

  def _hash(self, seed):
    """Count sketch: bucket in [0, b) and sign in {-1, +1} per coordinate."""
    r = tf.random.stateless_uniform(
      [self.dim], seed=seed, minval=0, maxval=2 * self.rows, dtype=tf.int32
    )
    return r // 2, tf.cast(r % 2, tf.float32) * 2.0 - 1.0

  def _srht_parts(self, seed):
    """SRHT: the signs (D) and the b sampled rows."""
    interleaved = self.sketch == 'srht_interleaved'
    seeds = tf.random.experimental.stateless_split(
      seed, num=3 if interleaved else 2
    )
    if interleaved:
      # The 32 bits of D / 32 random words (a quarter of the time of one
      # draw per sign).
      words = tf.random.stateless_uniform(
        [self.padded // 32],
        seed=seeds[0],
        minval=None,
        maxval=None,
        dtype=tf.int32,
      )
      bits = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(words[:, None], tf.range(32)), 1
      )
      signs = tf.reshape(tf.cast(bits, tf.float32), [-1]) * 2.0 - 1.0
    else:
      signs = (
        tf.cast(
          tf.random.stateless_uniform(
            [self.padded], seed=seeds[0], minval=0, maxval=2, dtype=tf.int32
          ),
          tf.float32,
        )
        * 2.0
        - 1.0
      )
    # Systematic sampling: one offset u for every stratum, so the rows
    # floor((t + u) D / b) are distinct (D / b >= 1 apart) and each of the
    # D rows is kept with probability exactly b / D.
    u = tf.random.stateless_uniform([], seed=seeds[1], dtype=tf.float64)
    t = tf.range(self.rows, dtype=tf.float64)
    rows = tf.cast(tf.floor((t + u) * (self.padded / self.rows)), tf.int32)
    rows = tf.minimum(rows, self.padded - 1)
    if interleaved:
      # Through a seeded permutation of the D rows: still distinct and
      # each kept with probability b / D, but no longer a lattice that
      # can line up with the blocks (a stride of D / b that is a multiple
      # of D / 1,024 would put every row in one block).
      rows = tf.cast(
        tf.random.experimental.index_shuffle(
          tf.cast(rows, tf.int64), seeds[2], self.padded - 1
        ),
        tf.int32,
      )
    return signs, rows

  def _blocks(self, v):
    """The orthonormal Hadamard transform of every block (its own inverse)."""
    h = tf.constant(_hadamard(_SIDE))
    if self.sketch == 'srht_interleaved':
      # Index (i * 32 + j) * (D / 1,024) + k: block k, position (i, j).
      x = tf.matmul(h, tf.reshape(v, [_SIDE, -1]))
      x = tf.matmul(h, tf.reshape(x, [_SIDE, _SIDE, -1]))
      return tf.reshape(x, [-1])
    x = tf.reshape(v, [-1, _SIDE, _SIDE])
    x = tf.einsum('ij,njk->nik', h, x)
    x = tf.einsum('nik,kl->nil', x, h)
    return tf.reshape(x, [-1])

  def encode(self, flat, seed):
    if self.sketch == 'count_sketch':
      buckets, signs = self._hash(seed)
      return tf.math.unsorted_segment_sum(flat * signs, buckets, self.rows)
    signs, rows = self._srht_parts(seed)
    v = tf.pad(flat, [[0, self.padded - self.dim]]) * signs
    scale = math.sqrt(self.padded / self.rows)
    return tf.gather(self._blocks(v), rows) * scale

  def decode(self, y, seed):
    if self.sketch == 'count_sketch':
      buckets, signs = self._hash(seed)
      return tf.gather(y, buckets) * signs
    signs, rows = self._srht_parts(seed)
    scale = math.sqrt(self.padded / self.rows)
    w = tf.scatter_nd(rows[:, None], y * scale, [self.padded])
    return (self._blocks(w) * signs)[: self.dim]


def _flatten(value):
  return tf.concat(
    [tf.reshape(tf.cast(v, tf.float32), [-1]) for v in tf.nest.flatten(value)],
    axis=0,
  )


def _unflatten(flat, specs, flat_specs, sizes):
  parts = tf.split(flat, sizes)
  return tf.nest.pack_sequence_as(
    specs,
    [
      tf.cast(tf.reshape(p, s.shape), s.dtype)
      for p, s in zip(parts, flat_specs)
    ],
  )


class LinearCompressionFactory(
  tff.aggregators.UnweightedAggregationFactory, weighting.Weightable
):
  """A DP sum of b-dim linear sketches, decoded by S^T: unweighted.

  The value is a structure of float tensors with d scalars in all,
  flattened. Each round the server derives the round's seed from the
  public `seed` in its state (a fresh one every round, or the same one
  every round with `resample=False`, as correlated noise needs: its noise
  streams over rounds in one fixed b-dim space) and broadcasts it; every
  client sends S x (b float32 values, `LinearCompressionFactory.rows`);
  `inner` aggregates those b-dim records (it clips them to its C and
  noises the sum); the server decodes the inner result y into S^T y, in
  the value's own structure.

  Released: what `inner` releases, on b-dim records. The decoded result is
  post-processing of it and the public seed.

  DP event: the inner factory's (`released_event` delegates to
  `dp_events.released_event(inner, ...)`), for its neighbouring relation and
  sensitivity: a client's record is whatever it sends, and the inner
  factory clips it.

  State: `OrderedDict(seed=..., inner=...)`: the seed (int64 pair) and the
  inner process's state.

  Measurements: the inner process's (its keys at the top level, so its
  clip and fraction clipped read as they do bare), plus `sketch_rows` (b)
  and, with `measure_error_clip`, the non-private `compression_error_sq`
  (||S^T S mu - mu||^2) and `compression_mean_sq` (||mu||^2) of mu, the
  sum of the cohort's updates clipped whole to that clip over
  `clients_per_round`: a research measurement (it aggregates the
  uncompressed updates once more, unprotected): only for runs that
  release non-private metrics.

  Args:
    inner: The DP (or plain) sum on b-dim records: an
      `UnweightedAggregationFactory` (e.g. `dp_fedavg.gaussian_fixed`,
      `ddgauss.ddgauss_mean`).
    sketch: One of `SKETCHES` (default 'srht_interleaved').
    compression: d / b, a finite number >= 1 (b = ceil(d / compression));
      or give `rows`. Exactly one of the two.
    rows: b, an integer >= 1, at most D (checked at `create`).
    seed: Seeds S (public randomness; never the noise's).
    resample: Draw a new S every round (default); False keeps one S for the
      whole run (correlated noise).
    measure_error_clip: With a clip (finite > 0), the non-private
      measurements above, of the updates clipped to it; None (default):
      none. Under adaptive clipping the runner passes the initial clip,
      not the clip in force.
    clients_per_round: The denominator of the measured mean (the expected
      cohort); needed with `measure_error_clip`.

  Raises:
    ValueError: At construction, on a bad argument, naming it and its
      allowed range; at `create`, if b exceeds D.
    TypeError: At `create`, if the value has a non-float tensor.
  """

  def __init__(
    self,
    inner: tff.aggregators.UnweightedAggregationFactory,
    *,
    sketch: str = 'srht_interleaved',
    compression: Optional[float] = None,
    rows: Optional[int] = None,
    seed: int = 0,
    resample: bool = True,
    measure_error_clip: Optional[float] = None,
    clients_per_round: Optional[float] = None,
  ):
    if not isinstance(inner, tff.aggregators.UnweightedAggregationFactory):
      raise TypeError(
        'inner must be a tff.aggregators.UnweightedAggregationFactory. '
        f'Found {type(inner).__name__}.'
      )
    check_sketch(sketch)
    if (compression is None) == (rows is None):
      raise ValueError('Set exactly one of compression and rows.')
    if compression is not None:
      check_compression(compression)
    if rows is not None and (
      isinstance(rows, bool)
      or not isinstance(rows, (int, np.integer))
      or rows < 1
    ):
      raise ValueError(f'rows must be an integer >= 1. Found {rows!r}.')
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
      raise ValueError(f'seed must be an integer. Found {seed!r}.')
    if measure_error_clip is not None:
      for name, v in (
        ('measure_error_clip', measure_error_clip),
        ('clients_per_round', clients_per_round),
      ):
        if not (
          isinstance(v, numbers.Real) and math.isfinite(v) and v > 0
        ) or isinstance(v, bool):
          raise ValueError(
            f'{name} must be a finite number > 0 with measure_error_clip. '
            f'Found {v!r}.'
          )
    self._inner = inner
    self._sketch = sketch
    self._compression = compression
    self._rows = None if rows is None else int(rows)
    self._seed = int(seed)
    self._resample = bool(resample)
    self._error_clip = measure_error_clip
    self._clients_per_round = clients_per_round

  @property
  def inner(self) -> tff.aggregators.UnweightedAggregationFactory:
    return self._inner

  def rows(self, dim: int) -> int:
    """b for a value of `dim` scalars."""
    if self._rows is not None:
      return self._rows
    return num_rows(dim, self._compression)

  def released_event(self, state, measurements):
    """The inner factory's event for the round (`dp_events`)."""
    return dp_events.released_event(self._inner, state['inner'], measurements)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, flat_specs, sizes = _tff_private.flat_float_specs(
      value_type, 'LinearCompressionFactory'
    )
    dim = sum(sizes)
    s = _Sketch(self._sketch, dim, self.rows(dim))
    record_type = tff.TensorType(np.float32, [s.rows])
    inner = self._inner.create(record_type)
    seed0 = initial_seed(self._seed)
    resample = self._resample

    @tff.tensorflow.computation
    def init_seed():
      return tf.constant(seed0)

    seed_type = init_seed.type_signature.result

    @tff.tensorflow.computation(seed_type)
    def split(seed):
      seeds = tf.random.experimental.stateless_split(seed, num=2)
      return seeds[0], (seeds[1] if resample else seed)

    @tff.tensorflow.computation(value_type, seed_type)
    def encode(value, seed):
      return s.encode(_flatten(value), seed)

    @tff.tensorflow.computation(record_type, seed_type)
    def decode(y, seed):
      return _unflatten(s.decode(y, seed), specs, flat_specs, sizes)

    error_fns = None
    if self._error_clip is not None:
      error_fns = _error_computations(
        s, value_type, seed_type, self._error_clip, self._clients_per_round
      )
    return _process(
      value_type, inner, init_seed, split, encode, decode, s.rows, error_fns
    )


def _error_computations(s, value_type, seed_type, clip, n):
  """(client clip to `clip`, server error of the sum / n) computations."""
  flat_type = tff.TensorType(np.float32, [s.dim])

  @tff.tensorflow.computation(value_type)
  def clipped(value):
    flat = _flatten(value)
    return flat * tf.minimum(1.0, clip / tf.maximum(tf.norm(flat), 1e-30))

  @tff.tensorflow.computation(flat_type, seed_type)
  def error(total, seed):
    mu = total / n
    decoded = s.decode(s.encode(mu, seed), seed)
    return collections.OrderedDict(
      [
        (ERROR_SQ, tf.reduce_sum(tf.square(decoded - mu))),
        (MEAN_SQ, tf.reduce_sum(tf.square(mu))),
      ]
    )

  return clipped, error


def _process(
  value_type, inner, init_seed, split, encode, decode, rows, error_fns
):
  """The round: the seed, the sketches, the inner sum, the decode."""

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(
      collections.OrderedDict(
        seed=tff.federated_eval(init_seed, tff.SERVER),
        inner=inner.initialize(),
      )
    )

  inner_names = [
    name
    for name, _ in tff.structure.iter_elements(
      inner.next.type_signature.result.measurements.member
    )
  ]

  @tff.federated_computation(
    init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS)
  )
  def next_fn(state, value):
    round_seed, next_seed = tff.federated_map(split, state.seed)
    client_seed = tff.federated_broadcast(round_seed)
    records = tff.federated_map(encode, (value, client_seed))
    out = inner.next(state.inner, records)
    result = tff.federated_map(decode, (out.result, round_seed))
    measured = collections.OrderedDict(
      (name, out.measurements[name]) for name in inner_names
    )
    measured['sketch_rows'] = tff.federated_value(rows, tff.SERVER)
    if error_fns is not None:
      clipped, error = error_fns
      total = tff.federated_sum(tff.federated_map(clipped, value))
      errors = tff.federated_map(error, (total, round_seed))
      measured[ERROR_SQ] = errors[ERROR_SQ]
      measured[MEAN_SQ] = errors[MEAN_SQ]
    new_state = tff.federated_zip(
      collections.OrderedDict(seed=next_seed, inner=out.state)
    )
    return tff.templates.MeasuredProcessOutput(
      new_state, result, tff.federated_zip(measured)
    )

  return tff.templates.AggregationProcess(init_fn, next_fn)


def upload_bytes(inner_bytes: int) -> int:
  """A client's upload: the inner payload of its b-dim record and the
  round's seed."""
  return int(inner_bytes) + SEED_BYTES
