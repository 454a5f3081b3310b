"""Radix top-k selection: the same set as tf.math.top_k, and bad input."""

import numpy as np
import pytest
import tensorflow as tf

from tff_dp.aggregators import selection


def _top_k_set(values, k):
  _, idx = tf.math.top_k(values, k=k, sorted=False)
  mask = np.zeros(values.shape[0], bool)
  mask[idx.numpy()] = True
  return mask


@pytest.mark.parametrize('k', [1, 7, 500, 3000, 9999, 10000])
def test_same_set_as_top_k_on_distinct_values(k):
  values = tf.abs(tf.random.stateless_normal([10000], seed=[k, 1]))
  mask = selection.top_k_mask(values, k).numpy()
  assert mask.sum() == k
  np.testing.assert_array_equal(mask, _top_k_set(values, k))


@pytest.mark.parametrize('k', [1, 5, 333, 5000, 9990])
def test_ties_broken_towards_lower_indices_like_top_k(k):
  rng = np.random.default_rng(k)
  # Few distinct values, zeros among them: many ties at every threshold.
  values = tf.constant(rng.integers(0, 4, size=10000).astype(np.float32))
  mask = selection.top_k_mask(values, k).numpy()
  assert mask.sum() == k
  np.testing.assert_array_equal(mask, _top_k_set(values, k))


def test_all_equal_keeps_the_first_k():
  mask = selection.top_k_mask(tf.fill([50], 0.5), 20).numpy()
  np.testing.assert_array_equal(mask, np.arange(50) < 20)


def test_wide_dynamic_range_and_exact_threshold():
  # Values sharing their high 16 bits force the second (low-bit) pass.
  base = np.float32(1.0)
  values = base + np.arange(1000, dtype=np.float32) * np.float32(2**-23)
  values = np.concatenate([values, [np.float32(1e30), np.float32(1e-30)]])
  values = tf.constant(np.random.default_rng(0).permutation(values))
  for k in (1, 2, 10, 500, 1001):
    np.testing.assert_array_equal(
      selection.top_k_mask(values, k).numpy(), _top_k_set(values, k)
    )


def test_indices_are_sorted_top_k():
  values = tf.constant([0.1, 3.0, 0.0, 2.0, 5.0, 2.0], tf.float32)
  np.testing.assert_array_equal(
    selection.top_k_indices(values, 3).numpy(), [1, 3, 4]
  )
  np.testing.assert_array_equal(
    selection.top_k_indices(values, 4).numpy(), [1, 3, 4, 5]
  )


def test_inside_tf_function():
  f = tf.function(lambda v: selection.top_k_indices(v, 2))
  np.testing.assert_array_equal(
    f(tf.constant([1.0, 4.0, 2.0, 8.0])).numpy(), [1, 3]
  )


@pytest.mark.parametrize(
  'values, k, match',
  [
    (tf.ones([5]), 0, r'k must be an integer in \[1, 5\]'),
    (tf.ones([5]), 6, r'k must be an integer in \[1, 5\]'),
    (tf.ones([5]), 2.0, r'k must be an integer in \[1, 5\]'),
    (tf.ones([2, 3]), 1, 'values must be a 1-D float32'),
    (tf.ones([5], tf.float64), 1, 'values must be a 1-D float32'),
  ],
)
def test_bad_input(values, k, match):
  with pytest.raises(ValueError, match=match):
    selection.top_k_mask(values, k)
