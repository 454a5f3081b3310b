"""Model clipping: the client clips its local model (seed 003, Sec. 2.1).

Zhang et al., "Understanding Clipping for Federated Learning: Convergence
and Client-Level Differential Privacy" (seed 003) compare two clipping
strategies for FedAvg. **Model clipping** (their ref. [23]): after local
training the client clips its model itself, x_i <- x_i min(1, c / ||x_i||)
(L2 over all trainable weights), and the server averages the clipped
models. In TFF's delta form the client reports initial - clip(x_i), so
with server SGD at learning rate 1 (no momentum) and a uniform mean the new
global model is exactly the mean of the clipped models. (Difference
clipping, CE-FedAvg, clips initial - x_i instead: `tff_dp.methods`'
`ce_fedavg`, TFF's clipping factory over a uniform mean.)
"""

from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.client_works import _local_training


def check_clip(clip: float) -> None:
  if not (isinstance(clip, (int, float)) and clip > 0):
    raise ValueError(f'clip must be > 0. Found {clip!r}.')


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

  Raises:
    ValueError: If clip <= 0.
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
