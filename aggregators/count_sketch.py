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

`hashing='block'` is a cheaper family: the vector is cut into blocks of
`columns` consecutive coordinates and, in row j, block b is cyclically
shifted by s_j(b), uniform in [0, columns), and multiplied by a sign
sigma_j(b), both drawn once from `seed`: h_j(i) = (i mod columns + s_j(b))
mod columns. It needs dim <= 1024 x columns (one graph op per block and
row). 'murmur' is the default. See docs/papers/dpsfl.md for why 'block'
keeps the guarantees the count sketch's analysis uses, and its cost.

Estimation takes the median over rows with a min/max sorting network and
the heavy hitters by radix select (`selection`; exact: the same values as a
sort and the same set as `tf.math.top_k`).
"""

import numpy as np
import tensorflow as tf

from tff_dp.aggregators import selection

_MAX_DIM = 2**31 - 1
HASHINGS = ('murmur', 'block')
MAX_BLOCKS = 1024


def check_int(name: str, value, low: int) -> None:
  """Raises ValueError unless `value` is an integer >= `low`."""
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


def check_hashing(hashing: str) -> None:
  """Raises ValueError unless `hashing` is one of `HASHINGS`."""
  if hashing not in HASHINGS:
    raise ValueError(f'hashing must be one of {HASHINGS}. Found {hashing!r}.')


def check_table(rows, columns, hashing: str = 'murmur') -> None:
  """Checks a table's shape and hash family as `CountSketch` does.

  Raises:
    ValueError: If rows or columns is not an integer >= 1, or the hashing
      is unknown (the dimension's checks are `CountSketch`'s).
  """
  check_int('rows', rows, 1)
  check_int('columns', columns, 1)
  check_hashing(hashing)


def _median(rows: list[tf.Tensor]) -> tf.Tensor:
  """Elementwise median of equal-shape tensors (middle mean if even).

  Odd-even transposition sort with min/max: the same values as `tf.sort`
  over a stacked axis, as elementwise passes.
  """
  rows = list(rows)
  n = len(rows)
  for sweep in range(n):
    for i in range(sweep % 2, n - 1, 2):
      lo = tf.minimum(rows[i], rows[i + 1])
      rows[i + 1] = tf.maximum(rows[i], rows[i + 1])
      rows[i] = lo
  mid = n // 2
  if n % 2:
    return rows[mid]
  return 0.5 * (rows[mid - 1] + rows[mid])


class CountSketch:
  """Count sketch of `dim`-vectors with `rows x columns` counters."""

  def __init__(
    self,
    rows: int,
    columns: int,
    dim: int,
    seed: int = 0,
    hashing: str = 'murmur',
  ):
    """Checks the arguments and draws the hash constants.

    Args:
      rows: Rows of the table, >= 1.
      columns: Columns (buckets per row), >= 1.
      dim: Length of the sketched vectors, >= 1.
      seed: Seeds the hashes.
      hashing: 'murmur' (per-coordinate hashes) or 'block' (per-block shifts
        and signs; see the module docstring).

    Raises:
      ValueError: If rows, columns or dim is < 1 (or dim >= 2^31 - 1), the
        hashing is unknown, or 'block' would need more than 1024 blocks.
    """
    check_int('rows', rows, 1)
    check_int('columns', columns, 1)
    check_int('dim', dim, 1)
    if dim >= _MAX_DIM:
      raise ValueError(f'dim must be < {_MAX_DIM}. Found {dim!r}.')
    check_hashing(hashing)
    self.rows, self.columns, self.dim = int(rows), int(columns), int(dim)
    self.hashing = hashing
    self.blocks = -(-self.dim // self.columns)
    if hashing == 'block' and self.blocks > MAX_BLOCKS:
      raise ValueError(
        f"hashing='block' needs dim <= {MAX_BLOCKS} x columns "
        f'(= {MAX_BLOCKS * self.columns}); found dim {self.dim}. Use more '
        "columns or hashing='murmur'."
      )
    rng = np.random.default_rng(int(seed))
    self._keys = rng.integers(0, 2**32, size=(self.rows, 1), dtype=np.uint64)
    if hashing == 'block':
      self._shifts = rng.integers(
        0, self.columns, size=(self.rows, self.blocks)
      ).astype(np.int32)
      self._signs = rng.choice([-1.0, 1.0], size=(self.rows, self.blocks))
      self._signs = self._signs.astype(np.float32)

  @property
  def num_counters(self) -> int:
    return self.rows * self.columns

  def hashes(self) -> tuple[tf.Tensor, tf.Tensor]:
    """The hash values the other methods take (computed if not given).

    'murmur': `(flat bucket index in [0, rows*columns), sign)`, each
    `[rows, dim]`. 'block': `(shift in [0, columns), sign)`, each
    `[rows, blocks]`.
    """
    if self.hashing == 'block':
      return tf.constant(self._shifts), tf.constant(self._signs)
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

  def _blocks(self, x: tf.Tensor) -> list[tf.Tensor]:
    """`x` zero-padded and cut into `blocks` tensors of `columns`."""
    padded = tf.pad(
      tf.cast(x, tf.float32), [[0, self.blocks * self.columns - self.dim]]
    )
    return tf.unstack(tf.reshape(padded, [self.blocks, self.columns]))

  def sketch(self, x: tf.Tensor, hashes=None) -> tf.Tensor:
    """The `[rows, columns]` sketch of a `[dim]` float vector."""
    if self.hashing == 'block':
      shift, sign = hashes if hashes is not None else self.hashes()
      blocks = self._blocks(x)
      return tf.stack(
        [
          tf.add_n(
            [
              tf.roll(block, shift[j, b], 0) * sign[j, b]
              for b, block in enumerate(blocks)
            ]
          )
          for j in range(self.rows)
        ]
      )
    index, sign = hashes if hashes is not None else self.hashes()
    values = sign * tf.cast(x, tf.float32)[None, :]
    table = tf.math.unsorted_segment_sum(
      tf.reshape(values, [-1]), tf.reshape(index, [-1]), self.num_counters
    )
    return tf.reshape(table, [self.rows, self.columns])

  def _per_row(self, table: tf.Tensor, hashes) -> list[tf.Tensor]:
    """Row j's estimate s_j(i) table[j, h_j(i)] of every coordinate."""
    if self.hashing == 'block':
      shift, sign = hashes if hashes is not None else self.hashes()
      return [
        tf.concat(
          [
            tf.roll(table[j], -shift[j, b], 0) * sign[j, b]
            for b in range(self.blocks)
          ],
          axis=0,
        )[: self.dim]
        for j in range(self.rows)
      ]
    index, sign = hashes if hashes is not None else self.hashes()
    per_row = tf.gather(tf.reshape(table, [-1]), index) * sign
    return tf.unstack(per_row)

  def estimate(self, table: tf.Tensor, hashes=None) -> tf.Tensor:
    """The `[dim]` median-over-rows estimate of the sketched vector."""
    return _median(self._per_row(table, hashes))

  def top_k(self, table: tf.Tensor, k: int, hashes=None):
    """`(sorted indices, estimated values)` of the k largest |estimates|.

    Ties in magnitude go to the lower index (as `tf.math.top_k`).
    """
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= self.dim:
      raise ValueError(f'k must be an integer in [1, {self.dim}]. Found {k!r}.')
    est = self.estimate(table, hashes)
    idx = selection.top_k_indices(tf.abs(est), int(k))
    return idx, tf.gather(est, idx)
