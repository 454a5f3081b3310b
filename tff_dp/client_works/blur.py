"""BLUR: bounded local update regularization (Cheng et al. 2022, eq. 5).

Local training with a proximal hinge towards the round's initial weights
w_t, added to every step's loss:

    lambda / 2 * max(0, ||w - w_t||^2 - S^2),  gradient lambda (w - w_t)
    outside the ball ||w - w_t|| <= S and 0 inside,

with S the DP aggregator's clip and ||.|| the L2 norm over all trainable
weights together. See docs/papers/blur_lus.md for the paper's reading and
derivations.
"""

import math
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.client_works import _local_training


def check_blur_args(lam: float, clip_norm: float) -> None:
  """Checks BLUR's lambda (finite, >= 0) and S (> 0).

  Raises:
    ValueError: Naming the bad argument, its allowed range and its value.
  """
  _local_training.check_number(
    'lam (lambda)',
    lam,
    'a finite number >= 0',
    lambda value: math.isfinite(value) and value >= 0,
  )
  _local_training.check_number(
    'clip_norm (S)', clip_norm, 'a number > 0', lambda value: value > 0
  )


def blur_penalty(lam: float, clip_norm: float):
  """`(trainable, initial) -> lambda/2 * max(0, ||w - w_t||^2 - S^2)`.

  The returned function also has `add_gradient(grads, trainable, initial)`,
  which adds the penalty's gradient to the loss gradients without tracing
  the penalty on the tape: the same float ops autodiff would run (so the
  same bits), and none of them while the update is inside the ball, where
  the gradient is zero. Local training uses it.

  Args:
    lam: lambda, a finite number >= 0.
    clip_norm: S, > 0.

  Returns:
    The penalty function, with its `add_gradient` attribute.

  Raises:
    ValueError: If lam is negative or not finite, or clip_norm <= 0.
  """
  check_blur_args(lam, clip_norm)
  half_lam = 0.5 * lam

  def squared_distance(diffs):
    return tf.add_n([tf.reduce_sum(tf.square(d)) for d in diffs])

  def penalty(trainable, initial):
    diffs = [w - w0 for w, w0 in zip(trainable, initial)]
    return half_lam * tf.maximum(0.0, squared_distance(diffs) - clip_norm**2)

  def add_gradient(grads, trainable, initial):
    diffs = [w - w0 for w, w0 in zip(trainable, initial)]
    # max(0, y)'s gradient reaches y only where 0 >= y is false (TF's rule).
    active = squared_distance(diffs) - clip_norm**2 > 0.0

    def with_penalty():
      # Autodiff computes half_lam * (2 d): upstream half_lam times
      # d(d^2) = 2 d. Doubling is exact in float32 and rounding commutes
      # with it, so (2 half_lam) * d has the same bits in one pass less.
      scale = 2.0 * tf.constant(half_lam, tf.float32)
      return [
        scale * d if g is None else g + scale * d for g, d in zip(grads, diffs)
      ]

    def without():
      return [
        tf.zeros_like(d) if g is None else g for g, d in zip(grads, diffs)
      ]

    summed = tf.cond(active, with_penalty, without)
    return tuple(summed) if isinstance(grads, tuple) else list(summed)

  penalty.add_gradient = add_gradient
  return penalty


def build_blur_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  optimizer: tff.learning.optimizers.Optimizer,
  *,
  lam: float,
  clip_norm: float,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.UNIFORM
  ),
  extra_metrics_fn=None,
) -> tff.learning.templates.ClientWorkProcess:
  """Model-delta training with BLUR's hinge-squared proximal term.

  Each client trains from the broadcast weights w_t with
  lambda / 2 * max(0, ||w - w_t||^2 - S^2) added to every step's loss and
  sends `ClientResult(update, update_weight)`: update = w_t - w (all
  trainable weights, unclipped: the aggregator clips and noises it),
  weight 1 (`UNIFORM`) or the client's example count (`NUM_EXAMPLES`); a
  non-finite update is sent as zeros with weight 0. The state is the local
  optimizer's hparams.

  Measurements: `train`, the model's metrics summed over the clients and
  finalized (the model's `metric_finalizers()` keys, e.g. `loss`,
  `num_examples`); with `extra_metrics_fn`, `extra`, its per-client values
  summed (`diagnostics.update_norm_metrics`: `clients`, `update_norm`,
  `update_norm_sq`, `clipped`, `norm_hist`).

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local `tff.learning.optimizers.Optimizer`.
    lam: lambda, a finite number >= 0 (0: no pull; the paper's default 0.4,
      its grid 0.05-0.8).
    clip_norm: S, the DP aggregator's clip, > 0.
    client_weighting: Uniform by default, as DP aggregation requires.
    extra_metrics_fn: Per-client scalars of the update, summed under
      `extra` (e.g. `diagnostics.update_norm_metrics`); None: no `extra`.

  Returns:
    A `tff.learning.templates.ClientWorkProcess`.

  Raises:
    ValueError: If lam is negative or not finite, or clip_norm <= 0.
    TypeError: If `model_fn` or `extra_metrics_fn` is not callable, or
      `optimizer` or `client_weighting` has the wrong type.
  """
  check_blur_args(lam, clip_norm)
  return _local_training.build_client_work(
    model_fn,
    optimizer,
    client_weighting=client_weighting,
    penalty_fn=blur_penalty(lam, clip_norm),
    extra_metrics_fn=extra_metrics_fn,
  )
