"""Count sketch: linearity, estimates, heavy-hitter recovery, errors."""

import numpy as np
import pytest
import tensorflow as tf

from tff_dp.aggregators import count_sketch


HASHINGS = pytest.mark.parametrize('hashing', ['murmur', 'block'])


@HASHINGS
def test_linear(hashing):
  sk = count_sketch.CountSketch(3, 50, 1000, seed=1, hashing=hashing)
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(2, 1000)).astype(np.float32)
  np.testing.assert_allclose(
    sk.sketch(a + b), sk.sketch(a) + sk.sketch(b), atol=1e-4
  )
  np.testing.assert_allclose(sk.sketch(3 * a), 3 * sk.sketch(a), atol=1e-4)


def test_hashes_seeded_in_range_and_balanced():
  sk = count_sketch.CountSketch(4, 100, 20000, seed=3)
  index, sign = (t.numpy() for t in sk.hashes())
  same, _ = count_sketch.CountSketch(4, 100, 20000, seed=3).hashes()
  other, _ = count_sketch.CountSketch(4, 100, 20000, seed=4).hashes()
  np.testing.assert_array_equal(index, same.numpy())
  assert np.mean(index != other.numpy()) > 0.9
  for j in range(4):
    buckets = index[j] - 100 * j
    assert buckets.min() >= 0 and buckets.max() < 100
    counts = np.bincount(buckets, minlength=100)
    assert counts.min() > 120 and counts.max() < 280  # ~200 each.
  assert set(np.unique(sign)) == {-1.0, 1.0}
  assert abs(sign.mean()) < 0.02


@HASHINGS
def test_single_coordinate_is_exact_and_sketch_norm(hashing):
  sk = count_sketch.CountSketch(5, 64, 300, seed=0, hashing=hashing)
  x = np.zeros(300, np.float32)
  x[17] = -2.5
  table = sk.sketch(x)
  # One coordinate lands in one counter per row, with its sign.
  assert np.count_nonzero(table.numpy()) == 5
  np.testing.assert_allclose(np.linalg.norm(table), np.sqrt(5) * 2.5)
  np.testing.assert_allclose(sk.estimate(table), x, atol=1e-6)


@HASHINGS
@pytest.mark.parametrize('rows', [4, 5])
def test_recovers_a_planted_sparse_vector(rows, hashing):
  d = 20000
  rng = np.random.default_rng(rows)
  heavy = np.sort(rng.choice(d, 20, replace=False))
  x = rng.normal(scale=0.01, size=d).astype(np.float32)
  x[heavy] = rng.choice([-1, 1], 20) * rng.uniform(2, 5, 20)
  sk = count_sketch.CountSketch(rows, 2000, d, seed=7, hashing=hashing)
  idx, values = sk.top_k(sk.sketch(x), 20)
  np.testing.assert_array_equal(idx, heavy)
  np.testing.assert_allclose(values, x[heavy], atol=0.1)


def test_block_hashes_match_their_definition():
  rows, cols, dim = 3, 10, 47  # 5 blocks, the last one partial.
  sk = count_sketch.CountSketch(rows, cols, dim, seed=2, hashing='block')
  shift, sign = (t.numpy() for t in sk.hashes())
  assert shift.shape == sign.shape == (rows, 5)
  assert shift.min() >= 0 and shift.max() < cols
  assert set(np.unique(sign)) <= {-1.0, 1.0}
  x = np.random.default_rng(0).normal(size=dim).astype(np.float32)
  expected = np.zeros((rows, cols), np.float32)
  for j in range(rows):
    for i in range(dim):
      b = i // cols
      expected[j, (i % cols + shift[j, b]) % cols] += sign[j, b] * x[i]
  np.testing.assert_allclose(sk.sketch(x), expected, atol=1e-5)
  # Per-row estimates invert the hashing: s_j(i) * table[j, h_j(i)].
  per_row = np.stack([t.numpy() for t in sk._per_row(expected, None)])
  for j in range(rows):
    for i in range(dim):
      b = i // cols
      np.testing.assert_allclose(
        per_row[j, i],
        sign[j, b] * expected[j, (i % cols + shift[j, b]) % cols],
        atol=1e-6,
      )


def test_block_collisions_are_uniform_across_blocks():
  # Coordinate 0 and each coordinate of block 1: over many seeds, each
  # collides with probability 1/columns; within a block never.
  cols, seeds = 8, 4000
  hits = np.zeros(cols)
  for seed in range(seeds):
    sk = count_sketch.CountSketch(1, cols, 2 * cols, seed=seed, hashing='block')
    s0, s1 = sk._shifts[0]
    bucket0 = s0 % cols
    hits[(bucket0 - s1) % cols] += 1  # the block-1 offset that collides
  np.testing.assert_allclose(hits / seeds, 1 / cols, atol=0.025)


def test_median_network_matches_sort():
  rng = np.random.default_rng(1)
  for n in range(1, 8):
    rows = rng.integers(-3, 3, size=(n, 200)).astype(np.float32)
    got = count_sketch._median([tf.constant(r) for r in rows]).numpy()
    ordered = np.sort(rows, axis=0)
    want = (
      ordered[n // 2]
      if n % 2
      else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
    )
    np.testing.assert_array_equal(got, want)


def test_even_rows_median_is_the_middle_mean():
  sk = count_sketch.CountSketch(2, 8, 3, seed=0)
  table = tf.reshape(tf.range(16, dtype=tf.float32), [2, 8])
  index, sign = sk.hashes()
  per_row = tf.gather(tf.reshape(table, [-1]), index) * sign
  np.testing.assert_allclose(
    sk.estimate(table), tf.reduce_mean(per_row, 0), atol=1e-6
  )


@pytest.mark.parametrize(
  'args, match',
  [
    ((0, 10, 100), 'rows must be an integer >= 1'),
    ((3, 0, 100), 'columns must be an integer >= 1'),
    ((3, 10, 0), 'dim must be an integer >= 1'),
  ],
)
def test_bad_sizes(args, match):
  with pytest.raises(ValueError, match=match):
    count_sketch.CountSketch(*args)


def test_bad_hashing():
  with pytest.raises(ValueError, match=r"hashing must be one of \('murmur'"):
    count_sketch.CountSketch(3, 10, 100, hashing='md5')
  with pytest.raises(ValueError, match=r'dim <= 1024 x columns \(= 10240\)'):
    count_sketch.CountSketch(3, 10, 10241, hashing='block')


def test_k_larger_than_dim():
  sk = count_sketch.CountSketch(3, 10, 100)
  with pytest.raises(ValueError, match=r'k must be an integer in \[1, 100\]'):
    sk.top_k(tf.zeros([3, 10]), 101)
