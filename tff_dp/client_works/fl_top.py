"""FL-TOP(-DP): train a fixed Top-K weight subset (Kerkouche et al., seed 004).

"Constrained Differentially Private Federated Learning for Low-bandwidth
Devices" (UAI 2021), Alg. 1-3. Before training, the server starts from w0,
runs `init_steps` SGD steps on a small public batch, accumulating each
parameter's |gradient|, and keeps the K = ratio * d parameters with the
largest sum (`select_top_k`). Clients then train only those weights: after
every local step the others are reset to w0 (`build_masked_client_work`), so
their update is zero outside the K coordinates. The aggregator
(`tff_dp.aggregators.dp_randagg.DPRandAggFactory(fixed_indices=...)`) takes
only the K values from each client, clips them, adds Gaussian noise for
FL-TOP-DP (none for FL-TOP), sums them with secure sum, and scatters the mean
back. Since every weight outside K stays w0 forever, only the K values need
to travel down as well (declared bytes: 4K down and up).

FL-BASIC(-DP) (the paper's baseline) re-draws a random K-subset every round
(`build_random_subset_client_work`): the client work keeps the coordinate
sampler's seed in its state, draws the round's K coordinates with
`dp_randagg.draw_random_coordinates` and broadcasts them; the aggregator
(`DPRandAggFactory` with the same seed) runs the same chain, so both use the
same K. Weights outside the subset are reset after every step to their value
at the start of the round (the reading chosen where the paper says
"reinitialized": resetting them to w0 would erase what earlier rounds
learned there, and the paper's FL-BASIC downloads the whole model, which
only makes sense if those weights keep their trained values). The whole
model comes down; K values and the K indices' seed go up and down.
"""

from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import dp_randagg
from tff_dp.client_works import _local_training


def check_ratio(ratio: float) -> None:
  if not (isinstance(ratio, (int, float)) and 0 < ratio <= 1):
    raise ValueError(f'top_k_ratio must be in (0, 1]. Found {ratio!r}.')


def select_top_k(
  model: tf.keras.Model,
  loss: tf.keras.losses.Loss,
  x: np.ndarray,
  y: np.ndarray,
  *,
  ratio: float,
  init_steps: int = 10,
  learning_rate: float = 0.01,
) -> np.ndarray:
  """Flat indices of the K weights with the largest accumulated |gradient|.

  Args:
    model: The model at w0 (its weights are trained in place: pass a copy).
    loss: The task loss.
    x: Public inputs (one batch), never from a training client.
    y: Public labels.
    ratio: K / d in (0, 1].
    init_steps: T_init SGD steps on the batch, >= 1.
    learning_rate: Their learning rate, > 0.

  Returns:
    Sorted flat indices into the concatenation of the trainable weights.
  """
  check_ratio(ratio)
  if not isinstance(init_steps, int) or init_steps < 1:
    raise ValueError(
      f'init_steps must be an integer >= 1. Found ' f'{init_steps!r}.'
    )
  if not learning_rate > 0:
    raise ValueError(f'learning_rate must be > 0. Found {learning_rate!r}.')
  variables = model.trainable_variables
  total = [np.zeros(v.shape, np.float64) for v in variables]
  for _ in range(init_steps):
    with tf.GradientTape() as tape:
      value = loss(y, model(x, training=True))
    grads = tape.gradient(value, variables)
    for t, g, v in zip(total, grads, variables):
      t += np.abs(g.numpy())
      v.assign_sub(learning_rate * g)
  flat = np.concatenate([t.ravel() for t in total])
  k = max(1, int(round(ratio * flat.size)))
  # Stable: ties broken by index, so the choice is deterministic.
  order = np.argsort(-flat, kind='stable')[:k]
  return np.sort(order)


class PublicRound:
  """One local round on public batches, as a client runs it.

  Seed 004's DP clip rule (its experimental setup): "the server executes a
  single training round locally, which is composed of T_gd SGD iterations
  starting from the model parameters w_0, using the batch from the public
  data. The clipping threshold S is set to the L2-norm of the Top-K weight
  update obtained for this single training round."

  `norm(batches, masks)` trains the model from w0 (its weights when this
  object was built) over `batches` of `(x, y)` with the client's
  optimizer, resets the weights outside `masks` to w0 after every step as a
  client does (`build_masked_client_work`), and returns the update's L2
  norm. The step is traced once and reused across calls (FL-BASIC-DP's 100
  random subsets).
  """

  def __init__(
    self,
    model: tf.keras.Model,
    loss: tf.keras.losses.Loss,
    optimizer: tff.learning.optimizers.Optimizer,
  ):
    self._model = model
    self._loss = loss
    self._optimizer = optimizer
    self._variables = list(model.trainable_variables)
    self._w0 = [tf.constant(v.numpy()) for v in self._variables]
    self._specs = [tf.TensorSpec(v.shape, v.dtype) for v in self._variables]
    self._step = tf.function(self._step_fn)

  def _step_fn(self, x, y, state, keep):
    with tf.GradientTape() as tape:
      value = self._loss(y, self._model(x, training=True))
    grads = tape.gradient(value, self._variables)
    state, updated = self._optimizer.next(state, self._variables, grads)
    for v, u, k, w0 in zip(self._variables, updated, keep, self._w0):
      v.assign(tf.where(k, u, w0))
    return state

  def norm(
    self,
    batches: tf.data.Dataset,
    masks: Optional[Sequence[np.ndarray]] = None,
  ) -> float:
    """The update norm of one round over `batches` (None: all weights)."""
    for v, w0 in zip(self._variables, self._w0):
      v.assign(w0)
    keep = [
      tf.ones(v.shape, tf.bool) if masks is None else tf.constant(m > 0)
      for v, m in zip(self._variables, masks or self._variables)
    ]
    state = self._optimizer.initialize(self._specs)
    steps = 0
    for x, y in batches:
      state = self._step(x, y, state, keep)
      steps += 1
    if steps == 0:
      raise ValueError('The public batches hold no batch to train on.')
    return float(
      np.sqrt(
        sum(
          np.sum(np.square((v - w0).numpy().astype(np.float64)))
          for v, w0 in zip(self._variables, self._w0)
        )
      )
    )


def public_round_norm(
  model: tf.keras.Model,
  loss: tf.keras.losses.Loss,
  batches: tf.data.Dataset,
  optimizer: tff.learning.optimizers.Optimizer,
  *,
  masks: Optional[Sequence[np.ndarray]] = None,
) -> float:
  """`PublicRound(model, loss, optimizer).norm(batches, masks)`.

  `model` is at w0 and is trained in place (pass a copy).
  """
  return PublicRound(model, loss, optimizer).norm(batches, masks)


def random_masks(
  shapes: Sequence[Sequence[int]], k: int, seed: int
) -> list[np.ndarray]:
  """0/1 masks of k flat coordinates drawn uniformly without replacement."""
  dim = int(sum(np.prod(s) for s in shapes))
  if not 1 <= k <= dim:
    raise ValueError(f'k must be in [1, {dim}]. Found {k!r}.')
  rng = np.random.default_rng(seed)
  return masks_from_indices(rng.choice(dim, size=k, replace=False), shapes)


def masks_from_indices(
  indices: np.ndarray, shapes: Sequence[Sequence[int]]
) -> list[np.ndarray]:
  """Per-tensor 0/1 float32 masks of the flat `indices`."""
  sizes = [int(np.prod(s)) for s in shapes]
  flat = np.zeros(sum(sizes), np.float32)
  flat[indices] = 1.0
  parts = np.split(flat, np.cumsum(sizes)[:-1])
  return [p.reshape(s) for p, s in zip(parts, shapes)]


def build_masked_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  optimizer: tff.learning.optimizers.Optimizer,
  *,
  masks: Sequence[np.ndarray],
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.UNIFORM
  ),
  extra_metrics_fn=None,
) -> tff.learning.templates.ClientWorkProcess:
  """Local training of the masked weights only; the rest reset to w0.

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local optimizer.
    masks: One 0/1 array per trainable tensor (1 = trained).
    client_weighting: Uniform by default, as DP aggregation requires.
    extra_metrics_fn: Per-client scalars of the update, summed.
  """
  masks = [np.asarray(m, np.float32) for m in masks]

  def reset_untrained(trainable, initial):
    return [
      tf.where(tf.constant(m) > 0, w, w0)
      for w, w0, m in zip(trainable, initial, masks)
    ]

  return _local_training.build_client_work(
    model_fn,
    optimizer,
    client_weighting=client_weighting,
    after_step_fn=reset_untrained,
    extra_metrics_fn=extra_metrics_fn,
  )


def build_random_subset_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  optimizer: tff.learning.optimizers.Optimizer,
  *,
  num_coordinates: int,
  seed: int,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.UNIFORM
  ),
  extra_metrics_fn=None,
) -> tff.learning.templates.ClientWorkProcess:
  """FL-BASIC: train a random K-subset, re-drawn every round.

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local optimizer.
    num_coordinates: K, in [1, d] (d: the model's trainable scalars).
    seed: The coordinate sampler's seed; give the aggregator
      (`DPRandAggFactory(num_coordinates=K, seed=seed)`) the same one.
    client_weighting: Uniform by default, as DP aggregation requires.
    extra_metrics_fn: Per-client scalars of the update, summed.

  Raises:
    ValueError: If K is not in [1, d].
  """
  with tf.Graph().as_default():
    shapes = [tuple(v.shape.as_list()) for v in model_fn().trainable_variables]
  sizes = [int(np.prod(s)) for s in shapes]
  dim = sum(sizes)
  if not isinstance(num_coordinates, (int, np.integer)) or not (
    1 <= num_coordinates <= dim
  ):
    raise ValueError(
      f"num_coordinates must be an integer in [1, {dim}] (the model's "
      f'trainable scalars). Found {num_coordinates!r}.'
    )
  k = int(num_coordinates)

  def advance(round_seed):
    return dp_randagg.draw_random_coordinates(round_seed, dim, k)

  def to_masks(indices):
    flat = tf.scatter_nd(indices[:, None], tf.ones([k], tf.bool), [dim])
    return [tf.reshape(m, s) for m, s in zip(tf.split(flat, sizes), shapes)]

  def reset_unselected(trainable, initial, masks):
    return [tf.where(m, w, w0) for w, w0, m in zip(trainable, initial, masks)]

  return _local_training.build_client_work(
    model_fn,
    optimizer,
    client_weighting=client_weighting,
    after_step_fn=reset_unselected,
    extra_metrics_fn=extra_metrics_fn,
    round_input=_local_training.RoundInput(
      initial=dp_randagg.initial_coordinate_seed(seed),
      advance=advance,
      on_client=to_masks,
    ),
  )
