"""FL-TOP and FL-BASIC: train a K-subset of the weights (Kerkouche et al.).

FL-TOP(-DP): the server picks the K = ratio * d weights with the largest
accumulated |gradient| over `init_steps` SGD steps from w0 on public data
(`select_top_k`); clients train only those, the others reset to w0 after
every step (`build_masked_client_work`). FL-BASIC(-DP): a random K-subset,
re-drawn every round from a seed the aggregator shares, the others reset to
their value at the start of the round (`build_random_subset_client_work`).
`tff_dp.aggregators.dp_randagg.DPRandAggFactory` takes the clients' K
values, clips them and (for -DP) noises them. See docs/papers/fl_top.md for
the paper's reading.
"""

from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import dp_randagg
from tff_dp.client_works import _local_training

_INTEGERS = (int, np.integer)


def check_ratio(ratio: float) -> None:
  """Checks the Top-K ratio K / d, in (0, 1].

  Raises:
    ValueError: If it is not a number in (0, 1].
  """
  _local_training.check_number(
    'top_k_ratio', ratio, 'in (0, 1]', lambda value: 0 < value <= 1
  )


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
    Sorted flat indices into the concatenation of the trainable weights
    (ties broken by index).

  Raises:
    ValueError: If ratio is not in (0, 1], init_steps not an integer >= 1
      or learning_rate not > 0.
  """
  check_ratio(ratio)
  _local_training.check_number(
    'init_steps', init_steps, 'an integer >= 1', lambda v: v >= 1, types=int
  )
  _local_training.check_number(
    'learning_rate', learning_rate, '> 0', lambda v: v > 0, types=object
  )
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

  FL-TOP-DP's clip rule (Kerkouche et al., experimental setup): S is the
  L2 norm of the Top-K update of one round of T_gd SGD steps from w0 on the
  public batch.

  `norm(batches, masks)` trains the model from w0 (its weights when this
  object was built) over `batches` of `(x, y)` with the client's
  optimizer, resets the weights outside `masks` to w0 after every step as a
  client does (`build_masked_client_work`), and returns the update's L2
  norm. The step is traced once and reused across calls.

  Args:
    model: The model at w0 (trained in place by `norm`: pass a copy).
    loss: The task loss.
    optimizer: The client's `tff.learning.optimizers.Optimizer`.
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
    """The update norm of one round over `batches` (None: all weights).

    Raises:
      ValueError: If `batches` holds no batch.
    """
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

  Raises:
    ValueError: If `batches` holds no batch.
  """
  return PublicRound(model, loss, optimizer).norm(batches, masks)


def random_masks(
  shapes: Sequence[Sequence[int]], k: int, seed: int
) -> list[np.ndarray]:
  """0/1 masks of k flat coordinates drawn uniformly without replacement.

  Raises:
    ValueError: If k is not in [1, d] (d: the shapes' total size).
  """
  dim = int(sum(np.prod(s) for s in shapes))
  _local_training.check_number(
    'k', k, f'in [1, {dim}]', lambda v: 1 <= v <= dim, types=object
  )
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


def _check_masks(masks: Sequence[np.ndarray]) -> list[np.ndarray]:
  """The masks as float32 arrays, each holding only 0 and 1."""
  masks = [np.asarray(m, np.float32) for m in masks]
  for i, m in enumerate(masks):
    if not np.all((m == 0) | (m == 1)):
      raise ValueError(
        f'masks[{i}] must hold only 0 and 1. Found values '
        f'{np.unique(m)[:5]!r}.'
      )
  return masks


def _check_mask_shapes(masks: Sequence[np.ndarray], trainable) -> None:
  """Raises unless there is one mask per trainable tensor, of its shape."""
  mask_shapes = [tuple(m.shape) for m in masks]
  shapes = [tuple(w.shape.as_list()) for w in trainable]
  if mask_shapes != shapes:
    raise ValueError(
      "masks must have the model's trainable tensors' shapes "
      f'{shapes!r}. Found {mask_shapes!r}.'
    )


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
  """Local training of the masked weights only (FL-TOP); the rest reset to w0.

  Each client trains from the broadcast weights w0 and, after every local
  step, resets the weights outside `masks` to w0; it sends
  `ClientResult(update, update_weight)`: update = w0 - trained weights,
  zero outside the masks, weight 1 (`UNIFORM`) or its example count
  (`NUM_EXAMPLES`); a non-finite update is sent as zeros with weight 0.
  The aggregator (`DPRandAggFactory(fixed_indices=...)`) takes the masked
  values, clips and noises them. The state is the local optimizer's
  hparams.

  Measurements: `train`, the model's metrics summed over the clients and
  finalized (the model's `metric_finalizers()` keys, e.g. `loss`,
  `num_examples`); with `extra_metrics_fn`, `extra`, its per-client values
  of the update summed (`diagnostics.update_norm_metrics`: `clients`,
  `update_norm`, `update_norm_sq`, `clipped`, `norm_hist`).

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local `tff.learning.optimizers.Optimizer`.
    masks: One 0/1 array per trainable tensor, of its shape (1 = trained),
      e.g. `masks_from_indices(select_top_k(...), shapes)`.
    client_weighting: Uniform by default, as DP aggregation requires.
    extra_metrics_fn: Per-client scalars of the update, summed under
      `extra`; None: no `extra`.

  Returns:
    A `tff.learning.templates.ClientWorkProcess`.

  Raises:
    ValueError: If a mask holds a value other than 0 and 1, or (when the
      computation is built) the masks' number or shapes are not the
      model's trainable tensors'.
    TypeError: If `model_fn` or `extra_metrics_fn` is not callable, or
      `optimizer` or `client_weighting` has the wrong type.
  """
  masks = _check_masks(masks)

  def reset_untrained(trainable, initial):
    _check_mask_shapes(masks, trainable)
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


def _random_subset_round_input(
  model_fn, num_coordinates: int, seed: int
) -> _local_training.RoundInput:
  """FL-BASIC's round input: the sampler's seed, the round's K as masks.

  Checks `seed` (an integer) and `num_coordinates` (K, in [1, d]).
  """
  _local_training.check_number('seed', seed, 'an integer', types=_INTEGERS)
  with tf.Graph().as_default():
    shapes = [tuple(v.shape.as_list()) for v in model_fn().trainable_variables]
  sizes = [int(np.prod(s)) for s in shapes]
  dim = sum(sizes)
  _local_training.check_number(
    'num_coordinates',
    num_coordinates,
    f"an integer in [1, {dim}] (the model's trainable scalars)",
    lambda value: 1 <= value <= dim,
    types=_INTEGERS,
  )
  k = int(num_coordinates)

  def advance(round_seed):
    return dp_randagg.draw_random_coordinates(round_seed, dim, k)

  def to_masks(indices):
    flat = tf.scatter_nd(indices[:, None], tf.ones([k], tf.bool), [dim])
    return [tf.reshape(m, s) for m, s in zip(tf.split(flat, sizes), shapes)]

  return _local_training.RoundInput(
    initial=dp_randagg.initial_coordinate_seed(seed),
    advance=advance,
    on_client=to_masks,
  )


def _reset_unselected(trainable, initial, masks):
  """Weights outside the round's masks back to their start-of-round value."""
  return [tf.where(m, w, w0) for w, w0, m in zip(trainable, initial, masks)]


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

  The server state holds the coordinate sampler's seed; each round the
  server draws K of the model's d trainable scalars with
  `dp_randagg.draw_random_coordinates` (advancing the seed) and broadcasts
  them. Each client trains from the broadcast weights and, after every
  local step, resets the weights outside the round's K coordinates to
  their value at the start of the round; it sends
  `ClientResult(update, update_weight)`: update = initial - trained
  weights, zero outside the K coordinates, weight 1 (`UNIFORM`) or its
  example count (`NUM_EXAMPLES`); a non-finite update is sent as zeros with
  weight 0. The aggregator, built with the same seed, draws the same K.
  The state is `OrderedDict(hparams, round_input)`: the local optimizer's
  hparams and the sampler's int64[2] seed.

  Measurements: `train`, the model's metrics summed over the clients and
  finalized (the model's `metric_finalizers()` keys, e.g. `loss`,
  `num_examples`); with `extra_metrics_fn`, `extra`, its per-client values
  of the update summed (`diagnostics.update_norm_metrics`: `clients`,
  `update_norm`, `update_norm_sq`, `clipped`, `norm_hist`).

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local `tff.learning.optimizers.Optimizer`.
    num_coordinates: K, an integer in [1, d] (d: the model's trainable
      scalars).
    seed: The coordinate sampler's seed, an integer (public: it chooses
      coordinates, not noise); give the aggregator
      (`DPRandAggFactory(num_coordinates=K, seed=seed)`) the same one.
    client_weighting: Uniform by default, as DP aggregation requires.
    extra_metrics_fn: Per-client scalars of the update, summed under
      `extra`; None: no `extra`.

  Returns:
    A `tff.learning.templates.ClientWorkProcess`.

  Raises:
    ValueError: If K is not an integer in [1, d] or seed not an integer.
    TypeError: If `model_fn` or `extra_metrics_fn` is not callable, or
      `optimizer` or `client_weighting` has the wrong type.
  """
  round_input = _random_subset_round_input(model_fn, num_coordinates, seed)
  return _local_training.build_client_work(
    model_fn,
    optimizer,
    client_weighting=client_weighting,
    after_step_fn=_reset_unselected,
    extra_metrics_fn=extra_metrics_fn,
    round_input=round_input,
  )
