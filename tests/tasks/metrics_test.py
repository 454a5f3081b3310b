import numpy as np
import pytest
import tensorflow as tf

from tff_dp.tasks import metrics


def test_balanced_accuracy_by_hand():
  m = metrics.BalancedAccuracy()
  # Positives: logits 2, -1 -> TP 1, FN 1 -> TPR 0.5.
  # Negatives: logits -3, -2, 1 -> TN 2, FP 1 -> TNR 2/3.
  m.update_state(
    np.array([1, 1, 0, 0, 0]), np.array([[2.0], [-1.0], [-3.0], [-2.0], [1.0]])
  )
  assert float(m.result()) == pytest.approx((0.5 + 2 / 3) / 2)
  m.reset_state()
  assert float(m.result()) == 0.0


def test_weighted_bce_matches_formula():
  loss = metrics.WeightedBinaryCrossentropy(pos_weight=3.0)
  y = np.array([1.0, 0.0])
  z = np.array([[0.5], [0.2]], np.float32)
  sig = 1 / (1 + np.exp(-z.ravel()))
  want = np.mean([-3.0 * np.log(sig[0]), -np.log(1 - sig[1])])
  assert float(loss(y, z)) == pytest.approx(want, rel=1e-5)


def test_weighted_bce_rejects_nonpositive_weight():
  with pytest.raises(ValueError, match='pos_weight must be > 0'):
    metrics.WeightedBinaryCrossentropy(0.0)


def test_auroc_metric_from_logits():
  m = [x for x in metrics.binary_metrics() if x.name == 'auroc'][0]
  m.update_state(
    tf.constant([0, 0, 1, 1]), tf.constant([[-2.0], [0.5], [0.1], [3.0]])
  )
  assert float(m.result()) == pytest.approx(0.75, abs=0.01)
