"""Model clipping: the client clips its trained model (Zhang et al. 2022).

After local training the client clips its model itself,

    x_i <- x_i min(1, c / ||x_i||)    (L2 over all trainable weights),

and reports the delta initial - clip(x_i): with server SGD at learning rate
1 (no momentum) and a uniform mean the new global model is the mean of the
clipped models. (Difference clipping, CE-FedAvg, is `tff_dp.methods`'
`ce_fedavg`.) See docs/papers/clipping.md for the paper's reading and
derivations.
"""

from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.client_works import _local_training


def check_clip(clip: float) -> None:
  """Checks the model clip c, > 0.

  Raises:
    ValueError: If it is not a number > 0.
  """
  _local_training.check_number('clip', clip, '> 0', lambda value: value > 0)


def clip_model(weights, clip: float):
  """`weights * min(1, clip / ||weights||)` over the whole structure."""
  flat = tf.nest.flatten(weights)
  norm = tf.linalg.global_norm(flat)
  scale = tf.minimum(1.0, clip / tf.maximum(norm, 1e-30))
  return tf.nest.pack_sequence_as(weights, [w * scale for w in flat])


def build_model_clip_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  optimizer: tff.learning.optimizers.Optimizer,
  *,
  clip: float,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.UNIFORM
  ),
  extra_metrics_fn=None,
) -> tff.learning.templates.ClientWorkProcess:
  """Local training, then the trained model clipped to L2 norm `clip`.

  Each client trains from the broadcast weights w to x, clips the trained
  model, x * min(1, clip / ||x||) (L2 over all trainable weights), and sends
  `ClientResult(update, update_weight)`: update = w - clip(x), weight 1
  (`UNIFORM`) or its example count (`NUM_EXAMPLES`); a non-finite update is
  sent as zeros with weight 0. No noise is added: the `model_clip` method
  averages these updates uniformly. The state is the local optimizer's
  hparams.

  Measurements: `train`, the model's metrics summed over the clients and
  finalized (the model's `metric_finalizers()` keys, e.g. `loss`,
  `num_examples`); with `extra_metrics_fn`, `extra`, its per-client values
  of the update summed (`diagnostics.update_norm_metrics`: `clients`,
  `update_norm`, `update_norm_sq`, `clipped`, `norm_hist`).

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local `tff.learning.optimizers.Optimizer`.
    clip: c, the L2 bound on the trained model, > 0.
    client_weighting: Uniform by default (the mean of the clipped models).
    extra_metrics_fn: Per-client scalars of the update, summed under
      `extra`; None: no `extra`.

  Returns:
    A `tff.learning.templates.ClientWorkProcess`.

  Raises:
    ValueError: If clip is not a number > 0.
    TypeError: If `model_fn` or `extra_metrics_fn` is not callable, or
      `optimizer` or `client_weighting` has the wrong type.
  """
  check_clip(clip)

  def update_fn(delta, model, dataset):
    del dataset
    final = [tf.identity(v) for v in model.trainable_variables]
    flat_delta = tf.nest.flatten(delta)
    initial = [d + w for d, w in zip(flat_delta, final)]
    clipped = clip_model(final, clip)
    return tf.nest.pack_sequence_as(
      delta, [w0 - w for w0, w in zip(initial, clipped)]
    )

  return _local_training.build_client_work(
    model_fn,
    optimizer,
    client_weighting=client_weighting,
    update_fn=update_fn,
    extra_metrics_fn=extra_metrics_fn,
  )
