"""Update-norm diagnostics: per-client sums and the round summary."""

import numpy as np
import pytest
import tensorflow as tf

from tff_dp.client_works import diagnostics

P = diagnostics.PREFIX


def _sums(norms, clip, steps=None):
  fn = diagnostics.update_norm_metrics(clip, with_angle=steps is not None)
  total = {}
  for i, n in enumerate(norms):
    delta = [tf.constant([n * 0.6, n * 0.8]), tf.zeros([2, 2])]
    out = fn(delta) if steps is None else fn(delta, steps[i])
    for k, v in out.items():
      total[P + k] = total.get(P + k, 0.0) + np.asarray(v)
  return total


def test_per_client_values():
  out = diagnostics.update_norm_metrics(1.0)(
    [tf.constant([3.0, 4.0]), tf.zeros([3])]
  )
  assert float(out['update_norm']) == pytest.approx(5.0)
  assert float(out['update_norm_sq']) == pytest.approx(25.0)
  assert float(out['clipped']) == 1.0
  hist = out['norm_hist'].numpy()
  assert hist.sum() == 1.0
  i = int(np.argmax(hist))
  assert diagnostics.EDGES[i - 1] <= 5.0 < diagnostics.EDGES[i]


def test_summary_mean_std_fraction_clipped_and_quantiles():
  norms = [0.5, 2.0, 8.0, 8.0]
  s = diagnostics.summarize(_sums(norms, clip=1.0))
  assert s['update_norm_mean'] == pytest.approx(np.mean(norms), rel=1e-5)
  assert s['update_norm_std'] == pytest.approx(np.std(norms), rel=1e-4)
  assert s['fraction_clipped'] == pytest.approx(0.75)
  # Histogram quantiles fall in the right bucket (8 buckets a decade).
  width = 10 ** (1 / 8)
  assert 0.5 / width <= s['update_norm_q10'] <= 0.5 * width
  assert 2.0 / width <= s['update_norm_q50'] <= 8.0 * width
  assert 8.0 / width <= s['update_norm_q90'] <= 8.0 * width


def test_angles_match_hand_computed_cosines():
  # Updates along (0.6, 0.8); steps at 0, 90 and 180 degrees from it, and
  # an undefined (zero) step.
  steps = [
    [tf.constant([0.6, 0.8]), tf.zeros([2, 2])],
    [tf.constant([-0.8, 0.6]), tf.zeros([2, 2])],
    [tf.constant([-3.0, -4.0]), tf.zeros([2, 2])],
    [tf.zeros([2]), tf.zeros([2, 2])],
  ]
  sums = _sums([1.0, 2.0, 3.0, 4.0], clip=10.0, steps=steps)
  assert sums[P + 'cosine_defined'] == 3
  assert sums[P + 'cosine'] == pytest.approx(0.0, abs=1e-6)  # 1 + 0 - 1.
  joint = sums[P + 'joint_hist']
  assert joint.sum() == 3
  cols = np.nonzero(joint.sum(0))[0]
  # Cosines 1, 0, -1 land in the last, middle and first of 20 buckets.
  np.testing.assert_array_equal(cols, [0, 10, 19])
  s = diagnostics.summarize(sums)
  assert s['update_cosine_mean'] == pytest.approx(0.0, abs=1e-6)
  h = diagnostics.histograms(sums)
  assert sum(h['joint_hist'].values()) == 3
  assert sum(h['norm_hist'].values()) == 4


def test_summary_absent_and_bad_clip():
  assert diagnostics.summarize({'train/loss': 1.0}) == {}
  with pytest.raises(ValueError, match='clip must be > 0'):
    diagnostics.update_norm_metrics(0.0)
