"""LUS: local update sparsification (Cheng et al. 2022, eq. 9-13).

After local training, each layer j keeps the s_j entries of its update dw
with the largest Taylor score |df_i/dw(w) * dw| (f_i: the client's loss on
its data at the final local weights w) and zeroes the rest, with

    s_j = max(1, round((1 - c) d_j))    (c: the sparsity, in [0, 1)),

optionally with BLUR's penalty during training. DP comes from the
aggregator, which clips and noises the sparsified update. See
docs/papers/blur_lus.md for the paper's reading and derivations.
"""

from typing import Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import selection
from tff_dp.client_works import _local_training
from tff_dp.client_works import blur


def check_sparsity(sparsity: float) -> None:
  """Checks LUS's sparsity c, in [0, 1).

  Raises:
    ValueError: If it is not a number in [0, 1).
  """
  _local_training.check_number(
    'sparsity', sparsity, 'in [0, 1)', lambda value: 0 <= value < 1
  )


def kept_count(size: int, sparsity: float) -> int:
  """s_j = max(1, round((1 - sparsity) size)) for a layer of `size` entries."""
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

  Each client trains from the broadcast weights (with BLUR's penalty when
  `blur_lam` is set), takes its update delta = initial - trained weights,
  scores every entry by |g * delta| with g the mean gradient of its loss
  over its dataset at the trained weights, keeps the `kept_count(d_j,
  sparsity)` top-scored entries of each tensor and zeroes the rest. It
  sends `ClientResult(update, update_weight)`: the sparsified update
  (unclipped: the aggregator clips and noises it) and weight 1 (`UNIFORM`)
  or its example count (`NUM_EXAMPLES`); a non-finite update is sent as
  zeros with weight 0. The state is the local optimizer's hparams.

  Measurements: `train`, the model's metrics summed over the clients and
  finalized (the model's `metric_finalizers()` keys, e.g. `loss`,
  `num_examples`); with `extra_metrics_fn`, `extra`, its per-client values
  of the sparsified update summed (`diagnostics.update_norm_metrics`:
  `clients`, `update_norm`, `update_norm_sq`, `clipped`, `norm_hist`).

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local `tff.learning.optimizers.Optimizer`.
    sparsity: c, in [0, 1) (the paper's default 0.7).
    blur_lam: If set, BLUR's lambda, a finite number >= 0, used with
      `clip_norm`; None: no BLUR (`clip_norm` is then unused).
    clip_norm: BLUR's S, > 0 (required with `blur_lam`).
    client_weighting: Uniform by default, as DP aggregation requires.
    extra_metrics_fn: Per-client scalars of the sparsified update (what is
      clipped), summed under `extra` (e.g. `diagnostics.update_norm_metrics`);
      None: no `extra`.

  Returns:
    A `tff.learning.templates.ClientWorkProcess`.

  Raises:
    ValueError: If sparsity is not in [0, 1), or with `blur_lam`, if it is
      negative or not finite or clip_norm is not a number > 0.
    TypeError: If `model_fn` or `extra_metrics_fn` is not callable, or
      `optimizer` or `client_weighting` has the wrong type.
  """
  check_sparsity(sparsity)
  if blur_lam is not None:
    blur.check_blur_args(blur_lam, clip_norm)
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
