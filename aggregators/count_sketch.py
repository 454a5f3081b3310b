"""A count sketch in TensorFlow (Charikar, Chen, Farach-Colton 2004).

A `rows x columns` table. Row j hashes coordinate i to the bucket h_j(i) in
[0, columns) with the sign s_j(i) in {-1, +1}; sketching adds s_j(i) x_i to
table[j, h_j(i)] for every row (linear: sketch(a + b) = sketch(a) +
sketch(b)). The estimate of x_i is the median over rows of
s_j(i) table[j, h_j(i)] (the mean of the two middle values for an even
number of rows); `top_k` recovers the k coordinates with the largest
estimated magnitude (heavy hitters).

Hashes are computed in-graph with uint32 arithmetic: m = fmix32(i XOR k_j)
(MurmurHash3's finalizer, a bijection on 32 bits with full avalanche) for a
per-row key k_j drawn once from `seed` with numpy; the sign is bit 0 of m
and the bucket (m >> 1) mod columns. Clients and server that build the
sketch with the same seed hash identically, and there is no global random
state. `hashes()` costs O(rows x dim); aggregators compute it once a round on
the server and broadcast it to the clients.
"""

import numpy as np
import tensorflow as tf

_MAX_DIM = 2**31 - 1


def _check_int(name: str, value, low: int) -> None:
  if not isinstance(value, (int, np.integer)) or value < low:
    raise ValueError(f'{name} must be an integer >= {low}. Found {value!r}.')


def _fmix32(h: tf.Tensor) -> tf.Tensor:
  """MurmurHash3's 32-bit finalizer (uint32 wraps modulo 2^32)."""

  def shift_xor(x, n):
    return tf.bitwise.bitwise_xor(
      x, tf.bitwise.right_shift(x, tf.constant(n, tf.uint32))
    )

  h = shift_xor(h, 16)
  h = h * tf.constant(0x85EBCA6B, tf.uint32)
  h = shift_xor(h, 13)
  h = h * tf.constant(0xC2B2AE35, tf.uint32)
  return shift_xor(h, 16)


class CountSketch:
  """Count sketch of `dim`-vectors with `rows x columns` counters."""

  def __init__(self, rows: int, columns: int, dim: int, seed: int = 0):
    """Checks the arguments and draws the hash constants.

    Raises:
      ValueError: If rows, columns or dim is < 1 (or dim >= 2^31 - 1).
    """
    _check_int('rows', rows, 1)
    _check_int('columns', columns, 1)
    _check_int('dim', dim, 1)
    if dim >= _MAX_DIM:
      raise ValueError(f'dim must be < {_MAX_DIM}. Found {dim!r}.')
    self.rows, self.columns, self.dim = int(rows), int(columns), int(dim)
    rng = np.random.default_rng(int(seed))
    self._keys = rng.integers(0, 2**32, size=(self.rows, 1), dtype=np.uint64)

  @property
  def num_counters(self) -> int:
    return self.rows * self.columns

  def hashes(self) -> tuple[tf.Tensor, tf.Tensor]:
    """`(flat bucket index in [0, rows*columns), sign)`, each `[rows, dim]`."""
    keys = tf.constant(self._keys.astype(np.uint32))
    i = tf.cast(tf.range(self.dim, dtype=tf.int64), tf.uint32)[None, :]
    m = _fmix32(tf.bitwise.bitwise_xor(i, keys))
    one = tf.constant(1, tf.uint32)
    sign = tf.cast(tf.bitwise.bitwise_and(m, one), tf.float32) * 2.0 - 1.0
    bucket = tf.math.floormod(
      tf.cast(tf.bitwise.right_shift(m, one), tf.int32), self.columns
    )
    offset = tf.range(self.rows, dtype=tf.int32)[:, None] * self.columns
    return bucket + offset, sign

  def sketch(self, x: tf.Tensor, hashes=None) -> tf.Tensor:
    """The `[rows, columns]` sketch of a `[dim]` float vector."""
    index, sign = hashes if hashes is not None else self.hashes()
    values = sign * tf.cast(x, tf.float32)[None, :]
    table = tf.math.unsorted_segment_sum(
      tf.reshape(values, [-1]), tf.reshape(index, [-1]), self.num_counters
    )
    return tf.reshape(table, [self.rows, self.columns])

  def estimate(self, table: tf.Tensor, hashes=None) -> tf.Tensor:
    """The `[dim]` median-over-rows estimate of the sketched vector."""
    index, sign = hashes if hashes is not None else self.hashes()
    per_row = tf.gather(tf.reshape(table, [-1]), index) * sign
    if self.rows == 1:
      return per_row[0]
    ordered = tf.sort(per_row, axis=0)
    mid = self.rows // 2
    if self.rows % 2:
      return ordered[mid]
    return 0.5 * (ordered[mid - 1] + ordered[mid])

  def top_k(self, table: tf.Tensor, k: int, hashes=None):
    """`(sorted indices, estimated values)` of the k largest |estimates|."""
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= self.dim:
      raise ValueError(f'k must be an integer in [1, {self.dim}]. Found {k!r}.')
    est = self.estimate(table, hashes)
    _, idx = tf.math.top_k(tf.abs(est), k=int(k), sorted=False)
    idx = tf.sort(idx)
    return idx, tf.gather(est, idx)
