"""BLUR: bounded local update regularisation (Cheng et al., CVPR 2022, eq. 5).

"Differentially Private Federated Learning with Local Regularization and
Sparsification" (seed 000). The local objective adds

    lambda / 2 * max(0, ||w - w_t||^2 - S^2)

towards the round's initial weights w_t, where S is the clipping threshold of
the DP aggregator: updates are pulled inside the clip ball during training,
so clipping later removes less signal. ||.|| is the L2 norm over all
trainable weights together. Its gradient is lambda (w - w_t) outside the
ball and 0 inside.

BLUR acts only where the clip binds and lambda eta Q is not small: an update
outside the ball for all Q local steps is scaled by about (1 - (1 - lambda
eta)^Q) / (Q lambda eta) (the seed's Lemma 2). The seed's own regime is "the
number of local iterations Q = 30", "the mini-batch size to 64", "the local
LR eta_l to 0.03", "S = 0.03 ... perform best on EMNIST" and lambda from its
grid up to 0.8 (Sec. 6); `benchmarks.studies`' `seed000_regime` runs it.
"""

import math
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.client_works import _local_training


def check_blur_args(lam: float, clip_norm: float) -> None:
  if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
    raise ValueError(
      f'lam (lambda) must be a finite number >= 0. Found ' f'{lam!r}.'
    )
  if not (isinstance(clip_norm, (int, float)) and clip_norm > 0):
    raise ValueError(
      f'clip_norm (S) must be a number > 0. Found ' f'{clip_norm!r}.'
    )


def blur_penalty(lam: float, clip_norm: float):
  """`(trainable, initial) -> lambda/2 * max(0, ||w - w_t||^2 - S^2)`.

  The returned function also has `add_gradient(grads, trainable, initial)`,
  which adds the penalty's gradient to the loss gradients without tracing
  the penalty on the tape: the same float ops autodiff would run (so the
  same bits), and none of them while the update is inside the ball, where
  the gradient is zero. Local training uses it (it was the larger part of
  BLUR's cost over a DP-FedAvg round).
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

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local optimizer.
    lam: lambda, >= 0 (seed 000's default 0.4; grid 0.05-0.8).
    clip_norm: S, the DP clip, > 0.
    client_weighting: Uniform by default, as DP aggregation requires.
    extra_metrics_fn: Per-client scalars of the update, summed (e.g.
      `diagnostics.update_norm_metrics`).

  Raises:
    ValueError: If lam < 0 or clip_norm <= 0.
  """
  return _local_training.build_client_work(
    model_fn,
    optimizer,
    client_weighting=client_weighting,
    penalty_fn=blur_penalty(lam, clip_norm),
    extra_metrics_fn=extra_metrics_fn,
  )
