"""LUS: local update sparsification (Cheng et al., CVPR 2022, eq. 9-13).

After local training, each layer j keeps the s_j entries of its update with
the largest Taylor score T(dw) = |df_i/dw(w) * dw| (eq. 11: the first-order
loss change of resetting that weight to w_0), with f_i the client's loss
on its local data at the final local model w, and zeroes the rest (eq.
12-13). Sparsity c = 1 - s/d; our reading of the garbled per-layer count is
s_j = max(1, round((1 - c) d_j)), the same sparsity in every layer. LUS
composes with BLUR (`build_lus_client_work(..., blur_lam=...)`); DP comes
from the aggregator (clip and noise after sparsification, Alg. 2 lines 9-10).
The seed's regime ("lambda = 0.4 and c = 0.7" by default, Q = 30, S = 0.03,
Sec. 6) is `benchmarks.studies`' `seed000_regime`.
"""

from typing import Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import selection
from tff_dp.client_works import _local_training
from tff_dp.client_works import blur


def check_sparsity(sparsity: float) -> None:
  if not (isinstance(sparsity, (int, float)) and 0 <= sparsity < 1):
    raise ValueError(f'sparsity must be in [0, 1). Found {sparsity!r}.')


def kept_count(size: int, sparsity: float) -> int:
  """s_j for a layer of `size` entries."""
  return max(1, int(round((1.0 - sparsity) * size)))


def sparsify(update, scores, sparsity: float):
  """Keeps, per tensor, the `kept_count` entries with the largest score.

  Args:
    update: Structure of tensors (the model delta).
    scores: Same structure, the Taylor scores |g * delta|.
    sparsity: c in [0, 1).

  Returns:
    The update with all but the top-s_j entries of each tensor zeroed (the
    entries `tf.math.top_k` picks, found by `selection.top_k_mask`).
  """
  check_sparsity(sparsity)

  def one(u, s):
    flat_u, flat_s = tf.reshape(u, [-1]), tf.reshape(s, [-1])
    size = int(flat_u.shape[0])
    k = kept_count(size, sparsity)
    if k >= size:
      return u
    keep = selection.top_k_mask(tf.cast(flat_s, tf.float32), k)
    mask = tf.cast(keep, u.dtype)
    return tf.reshape(flat_u * mask, tf.shape(u))

  return tf.nest.map_structure(one, update, scores)


def _local_gradient(model, dataset):
  """Mean gradient of the local loss at the model's current weights."""
  trainable = tuple(model.trainable_variables)
  total = [tf.zeros_like(v) for v in trainable]
  count = tf.constant(0.0)
  for batch in iter(dataset):
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=False)
    grads = tape.gradient(output.loss, trainable)
    n = tf.cast(tf.shape(output.predictions)[0], tf.float32)
    total = [t + n * g for t, g in zip(total, grads)]
    count += n
  return [t / tf.maximum(count, 1.0) for t in total]


def build_lus_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  optimizer: tff.learning.optimizers.Optimizer,
  *,
  sparsity: float,
  blur_lam: Optional[float] = None,
  clip_norm: Optional[float] = None,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.UNIFORM
  ),
  extra_metrics_fn=None,
) -> tff.learning.templates.ClientWorkProcess:
  """Model-delta training, then LUS; optionally with BLUR (`blur_lus`).

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local optimizer.
    sparsity: c in [0, 1) (seed 000's default 0.7).
    blur_lam: If set, BLUR's lambda (>= 0) and `clip_norm` (S > 0) are used.
    clip_norm: BLUR's S (with `blur_lam`).
    client_weighting: Uniform by default, as DP aggregation requires.
    extra_metrics_fn: Per-client scalars of the sparsified update (what is
      clipped), summed (e.g. `diagnostics.update_norm_metrics`).

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  check_sparsity(sparsity)
  penalty = None
  if blur_lam is not None:
    penalty = blur.blur_penalty(blur_lam, clip_norm)

  def update_fn(delta, model, dataset):
    grads = _local_gradient(model, dataset)
    flat = tf.nest.flatten(delta)
    scores = [tf.abs(g * d) for g, d in zip(grads, flat)]
    return tf.nest.pack_sequence_as(delta, sparsify(flat, scores, sparsity))

  return _local_training.build_client_work(
    model_fn,
    optimizer,
    client_weighting=client_weighting,
    penalty_fn=penalty,
    update_fn=update_fn,
    extra_metrics_fn=extra_metrics_fn,
  )
