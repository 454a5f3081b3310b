"""Keras metrics and losses for the binary medical tasks (single logit)."""

import tensorflow as tf


class BalancedAccuracy(tf.keras.metrics.Metric):
  """(TPR + TNR) / 2 at logit threshold 0, for a single-logit binary model."""

  def __init__(self, name: str = 'balanced_accuracy', dtype=tf.float32):
    super().__init__(name=name, dtype=dtype)
    self._counts = self.add_weight(
      name='counts', shape=(4,), initializer='zeros', dtype=tf.float32
    )

  def update_state(self, y_true, y_pred, sample_weight=None):
    y_true = tf.reshape(tf.cast(y_true, tf.bool), [-1])
    pred = tf.reshape(y_pred, [-1]) > 0.0
    w = (
      tf.ones_like(pred, tf.float32)
      if sample_weight is None
      else tf.reshape(tf.cast(sample_weight, tf.float32), [-1])
    )
    f = lambda m: tf.reduce_sum(tf.where(m, w, 0.0))
    self._counts.assign_add(
      tf.stack(
        [
          f(y_true & pred),
          f(y_true & ~pred),  # TP, FN
          f(~y_true & ~pred),
          f(~y_true & pred),
        ]
      )
    )  # TN, FP

  def result(self):
    tp, fn, tn, fp = tf.unstack(self._counts)
    tpr = tf.math.divide_no_nan(tp, tp + fn)
    tnr = tf.math.divide_no_nan(tn, tn + fp)
    return (tpr + tnr) / 2.0

  def reset_state(self):
    self._counts.assign(tf.zeros_like(self._counts))


class WeightedBinaryCrossentropy(tf.keras.losses.Loss):
  """Binary cross-entropy on logits with positives weighted by `pos_weight`.

  With `pos_weight = negatives / positives` of the training data, both
  classes weigh equally, the usual choice when balanced accuracy is reported.
  """

  def __init__(
    self, pos_weight: float = 1.0, name: str = 'weighted_binary_crossentropy'
  ):
    super().__init__(name=name)
    if not pos_weight > 0:
      raise ValueError(f'pos_weight must be > 0. Found {pos_weight!r}.')
    self.pos_weight = float(pos_weight)

  def call(self, y_true, y_pred):
    y_true = tf.cast(tf.reshape(y_true, [-1]), y_pred.dtype)
    logits = tf.reshape(y_pred, [-1])
    return tf.nn.weighted_cross_entropy_with_logits(
      labels=y_true, logits=logits, pos_weight=self.pos_weight
    )

  def get_config(self):
    return {'pos_weight': self.pos_weight, 'name': self.name}


def binary_metrics() -> list[tf.keras.metrics.Metric]:
  return [
    BalancedAccuracy(),
    tf.keras.metrics.AUC(name='auroc', from_logits=True),
  ]


def classification_metrics() -> list[tf.keras.metrics.Metric]:
  return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]
