"""Model-delta local training with hooks, as a `ClientWorkProcess`.

Mirrors TFF's `build_model_delta_client_work` (same state, hparams,
metrics and non-finite handling), with the hooks the techniques need: a
loss penalty (BLUR's proximal hinge), a weight rewrite after every step
(FL-TOP's reset to w0), an update transform with the trained model at hand
(LUS's sparsification, model clipping), per-client extra metrics (the
update-norm diagnostics) and a per-round server value broadcast to the
clients (FL-BASIC's random coordinates). `check_number` is the argument
check the client works share.
"""

import collections
import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional

import numpy as np

import tensorflow as tf
import tensorflow_federated as tff

PenaltyFn = Callable[[Any, Any], tf.Tensor]
UpdateFn = Callable[[Any, Any, tf.data.Dataset], Any]
AfterStepFn = Callable[..., Any]
ExtraMetricsFn = Callable[..., Mapping[str, Any]]


def check_number(
  name: str,
  value: Any,
  requirement: str,
  test: Callable[[Any], bool] = lambda value: True,
  *,
  types: Any = (int, float),
) -> None:
  """Raises unless `value` is an instance of `types` and passes `test`.

  Args:
    name: The argument's name, as the message shows it.
    value: The argument.
    requirement: What it must be, completing "`name` must be ..." (e.g.
      'in [0, 1)', 'an integer >= 1').
    test: The condition on a value of the right type.
    types: The accepted Python types (`object`: any).

  Raises:
    ValueError: `'{name} must be {requirement}. Found {value!r}.'`.
  """
  if not (isinstance(value, types) and test(value)):
    raise ValueError(f'{name} must be {requirement}. Found {value!r}.')


def _check_callable(name: str, value: Any, optional: bool = True) -> None:
  if not (callable(value) or (optional and value is None)):
    raise TypeError(
      f'{name} must be callable{" or None" if optional else ""}. '
      f'Found {value!r}.'
    )


@dataclasses.dataclass(frozen=True)
class RoundInput:
  """A value kept in the client work's server state, new every round.

  Attributes:
    initial: The state's initial value (a numpy array).
    advance: A TF function `state -> (client_value, next_state)`, run on the
      server each round; `client_value` is broadcast to the clients.
    on_client: A TF function applied to `client_value` once per client,
      before local training (e.g. indices to masks); its result is what
      `after_step_fn` receives.
  """

  initial: np.ndarray
  advance: Callable[[tf.Tensor], tuple[Any, tf.Tensor]]
  on_client: Callable[[Any], Any] = lambda value: value


@dataclasses.dataclass(frozen=True)
class _Hooks:
  """`build_client_work`'s options, as its client and server steps read them."""

  client_weighting: tff.learning.ClientWeighting
  penalty_fn: Optional[PenaltyFn]
  after_step_fn: Optional[AfterStepFn]
  update_fn: Optional[UpdateFn]
  extra_metrics_fn: Optional[ExtraMetricsFn]
  round_input: Optional[RoundInput]
  track_global_update: bool

  @property
  def extended(self) -> bool:
    """Whether the state holds more than the optimizer's hparams."""
    return self.round_input is not None or self.track_global_update


def _check_args(model_fn, optimizer, hooks: _Hooks) -> None:
  """The argument checks of `build_client_work`."""
  _check_callable('model_fn', model_fn, optional=False)
  if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError(
      'optimizer must be a tff.learning.optimizers.Optimizer. '
      f'Found {optimizer!r}.'
    )
  if not isinstance(hooks.client_weighting, tff.learning.ClientWeighting):
    raise TypeError(
      'client_weighting must be a tff.learning.ClientWeighting. '
      f'Found {hooks.client_weighting!r}.'
    )
  for name in ('penalty_fn', 'after_step_fn', 'update_fn', 'extra_metrics_fn'):
    _check_callable(name, getattr(hooks, name))
  if not (
    hooks.round_input is None or isinstance(hooks.round_input, RoundInput)
  ):
    raise TypeError(
      f'round_input must be a RoundInput or None. Found {hooks.round_input!r}.'
    )
  if not isinstance(hooks.track_global_update, (bool, np.bool_)):
    raise TypeError(
      'track_global_update must be a bool. '
      f'Found {hooks.track_global_update!r}.'
    )


def _zero_if_non_finite(structure):
  flat = tf.nest.flatten(structure)
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in flat])
  zeroed = [tf.where(finite, t, tf.zeros_like(t)) for t in flat]
  return tf.nest.pack_sequence_as(structure, zeroed), tf.logical_not(finite)


# The client: local training, the update, its weight and extra metrics.


def _train_locally(
  model,
  optimizer,
  hooks: _Hooks,
  hparams,
  initial_weights,
  dataset,
  round_value,
):
  """Trains `model` from `initial_weights` over `dataset`, in place.

  Returns:
    `(weights, num_examples)`: the model's `ModelWeights` (its variables,
    now trained) and the number of examples trained on.
  """
  weights = tff.learning.models.ModelWeights.from_model(model)
  tf.nest.map_structure(lambda v, t: v.assign(t), weights, initial_weights)
  trainable = tuple(tf.nest.flatten(weights.trainable))
  initial_trainable = tuple(tf.nest.flatten(initial_weights.trainable))
  specs = tf.nest.map_structure(
    lambda v: tf.TensorSpec(v.shape, v.dtype), trainable
  )
  opt_state = optimizer.set_hparams(optimizer.initialize(specs), hparams)
  num_examples = tf.constant(0, tf.int64)
  if round_value is not None:
    round_value = hooks.round_input.on_client(round_value)
  penalty_fn, after_step_fn = hooks.penalty_fn, hooks.after_step_fn
  add_penalty_gradient = getattr(penalty_fn, 'add_gradient', None)
  for batch in iter(dataset):
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
      loss = output.loss
      if penalty_fn is not None and add_penalty_gradient is None:
        loss += penalty_fn(trainable, initial_trainable)
    grads = tape.gradient(loss, trainable)
    if add_penalty_gradient is not None:
      grads = add_penalty_gradient(grads, trainable, initial_trainable)
    opt_state, updated = optimizer.next(opt_state, trainable, grads)
    for v, u in zip(trainable, updated):
      v.assign(u)
    if after_step_fn is not None:
      extra_args = () if round_value is None else (round_value,)
      for v, u in zip(
        trainable, after_step_fn(trainable, initial_trainable, *extra_args)
      ):
        v.assign(u)
    num_examples += tf.shape(output.predictions, out_type=tf.int64)[0]
  return weights, num_examples


def _update_and_weight(
  model, hooks: _Hooks, initial_weights, weights, dataset, num_examples
):
  """`(delta, weight)`: initial - trained weights (after `update_fn`).

  A non-finite delta is zeroed and weighted 0, as TFF's model-delta work.
  """
  delta = tf.nest.map_structure(
    tf.subtract, initial_weights.trainable, weights.trainable
  )
  if hooks.update_fn is not None:
    delta = hooks.update_fn(delta, model, dataset)
  delta, non_finite = _zero_if_non_finite(delta)
  if hooks.client_weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
    weight = tf.cast(num_examples, tf.float32)
  else:
    weight = tf.constant(1.0, tf.float32)
  weight = tf.where(non_finite, 0.0, weight)
  return delta, weight


def _extra_metrics(hooks: _Hooks, delta, initial_weights, reference):
  """`extra_metrics_fn`'s per-client values (empty without it)."""
  if hooks.extra_metrics_fn is None:
    return collections.OrderedDict()
  if not hooks.track_global_update:
    return collections.OrderedDict(hooks.extra_metrics_fn(delta))
  previous, has_previous = reference
  # The last global step in the delta's sign (initial - final):
  # w_{t-1} - w_t, zero (undefined) in the first round.
  step = tf.nest.map_structure(
    lambda p, w: tf.where(has_previous, p - w, tf.zeros_like(w)),
    tuple(tf.nest.flatten(previous)),
    tuple(tf.nest.flatten(initial_weights.trainable)),
  )
  return collections.OrderedDict(hooks.extra_metrics_fn(delta, step))


def _train(
  model,
  optimizer,
  hooks: _Hooks,
  hparams,
  initial_weights,
  dataset,
  round_value=None,
  reference=None,
):
  """One client's work: `(ClientResult, unfinalized metrics, extra)`."""
  weights, num_examples = _train_locally(
    model, optimizer, hooks, hparams, initial_weights, dataset, round_value
  )
  delta, weight = _update_and_weight(
    model, hooks, initial_weights, weights, dataset, num_examples
  )
  extra = _extra_metrics(hooks, delta, initial_weights, reference)
  return (
    tff.learning.templates.ClientResult(update=delta, update_weight=weight),
    model.report_local_unfinalized_metrics(),
    extra,
  )


# The TFF computations: state, client update, next.


def _plain_state_fns(initial_hparams):
  """`(init_fn, get_hparams_fn, set_hparams_fn)`; the state is the hparams."""

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(initial_hparams, tff.SERVER)

  state_type = init_fn.type_signature.result.member
  hparams_type = state_type

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return state

  @tff.tensorflow.computation(state_type, hparams_type)
  def set_hparams_fn(state, hparams):
    del state
    return hparams

  return init_fn, get_hparams_fn, set_hparams_fn


def _extended_state_fns(initial_hparams, weights_type, hooks: _Hooks):
  """`(init_fn, get_hparams_fn, set_hparams_fn)` of the dict state.

  The state is `OrderedDict(hparams[, round_input][, previous,
  has_previous])`: the round input's state, and the last global trainable
  weights with whether there were any (`track_global_update`).
  """
  trainable_specs = tff.types.type_to_tf_tensor_specs(weights_type.trainable)

  @tff.tensorflow.computation
  def initial_state():
    state = collections.OrderedDict(
      hparams=tf.nest.map_structure(tf.constant, initial_hparams)
    )
    if hooks.round_input is not None:
      state['round_input'] = tf.constant(np.asarray(hooks.round_input.initial))
    if hooks.track_global_update:
      state['previous'] = tf.nest.map_structure(
        lambda s: tf.zeros(s.shape, s.dtype), trainable_specs
      )
      state['has_previous'] = tf.constant(False)
    return state

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(initial_state, tff.SERVER)

  state_type = init_fn.type_signature.result.member
  hparams_type = state_type.hparams

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return state['hparams']

  @tff.tensorflow.computation(state_type, hparams_type)
  def set_hparams_fn(state, hparams):
    new = collections.OrderedDict(state)
    new['hparams'] = hparams
    return new

  return init_fn, get_hparams_fn, set_hparams_fn


def _advance_fn(round_input: RoundInput, init_fn):
  """The server's round-input step: `state -> (client_value, next_state)`."""

  @tff.tensorflow.computation(init_fn.type_signature.result.member.round_input)
  def advance_fn(value):
    return round_input.advance(value)

  return advance_fn


def _client_arg_types(hooks: _Hooks, init_fn, weights_type, data_type, advance):
  """The client update's argument types, in its arguments' order."""
  if hooks.extended:
    hparams_type = init_fn.type_signature.result.member.hparams
  else:
    hparams_type = init_fn.type_signature.result.member
  client_args = [hparams_type, weights_type, data_type]
  if hooks.round_input is not None:
    client_args.append(advance.type_signature.result[0])
  if hooks.track_global_update:
    reference_type = tff.StructWithPythonType(
      [weights_type.trainable, tff.TensorType(np.bool_)], tuple
    )
    client_args.append(reference_type)
  return client_args


def _client_update_fn(model_fn, optimizer, hooks: _Hooks, client_args):
  """The TFF computation of one client's `_train`."""

  def _call(hparams, initial_weights, dataset, **kwargs):
    train = tf.function(functools.partial(_train, model_fn(), optimizer, hooks))
    return train(hparams, initial_weights, dataset, **kwargs)

  # TFF computations take no varargs: one signature per combination.
  with_round_value = hooks.round_input is not None
  if not with_round_value and not hooks.track_global_update:

    @tff.tensorflow.computation(*client_args)
    def client_update(hparams, initial_weights, dataset):
      return _call(hparams, initial_weights, dataset)

  elif not hooks.track_global_update:

    @tff.tensorflow.computation(*client_args)
    def client_update(hparams, initial_weights, dataset, round_value):
      return _call(hparams, initial_weights, dataset, round_value=round_value)

  elif not with_round_value:

    @tff.tensorflow.computation(*client_args)
    def client_update(hparams, initial_weights, dataset, reference):
      return _call(hparams, initial_weights, dataset, reference=reference)

  else:

    @tff.tensorflow.computation(*client_args)
    def client_update(
      hparams, initial_weights, dataset, round_value, reference
    ):
      return _call(
        hparams,
        initial_weights,
        dataset,
        round_value=round_value,
        reference=reference,
      )

  return client_update


def _next_fn(
  hooks: _Hooks,
  init_fn,
  weights_type,
  data_type,
  client_update,
  advance_fn,
  metrics_aggregation_fn,
):
  """The process's `next`: broadcast, client updates, new state, metrics."""

  @tff.federated_computation(
    init_fn.type_signature.result,
    tff.FederatedType(weights_type, tff.CLIENTS),
    tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    if not hooks.extended:
      args = [tff.federated_broadcast(state), weights, client_data]
    else:
      args = [tff.federated_broadcast(state.hparams), weights, client_data]
      new_state = collections.OrderedDict(hparams=state.hparams)
      if hooks.round_input is not None:
        value, next_input = tff.federated_map(advance_fn, state.round_input)
        args.append(tff.federated_broadcast(value))
        new_state['round_input'] = next_input
      if hooks.track_global_update:
        reference = tff.federated_zip((state.previous, state.has_previous))
        args.append(tff.federated_broadcast(reference))
        # Every client holds the same global weights: their mean is them.
        new_state['previous'] = tff.federated_mean(weights.trainable)
        new_state['has_previous'] = tff.federated_value(True, tff.SERVER)
      state = tff.federated_zip(new_state)
    result, model_outputs, extra = tff.federated_map(client_update, tuple(args))
    train = metrics_aggregation_fn(model_outputs)
    measurements = collections.OrderedDict(train=train)
    if hooks.extra_metrics_fn is not None:
      measurements['extra'] = tff.federated_sum(extra)
    return tff.templates.MeasuredProcessOutput(
      state, result, tff.federated_zip(measurements)
    )

  return next_fn


def _build_process(
  model_fn, optimizer, hooks: _Hooks
) -> tff.learning.templates.ClientWorkProcess:
  """`build_client_work`'s process, from its checked arguments."""
  with tf.Graph().as_default():
    model = model_fn()
    metrics_aggregation_fn = tff.learning.metrics.sum_then_finalize(
      model.metric_finalizers()
    )
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
  weights_type = tff.learning.models.weights_type_from_model(model)
  initial_hparams = optimizer.get_hparams(
    optimizer.initialize(tf.TensorSpec([], tf.float32))
  )
  if hooks.extended:
    init_fn, get_hparams_fn, set_hparams_fn = _extended_state_fns(
      initial_hparams, weights_type, hooks
    )
  else:
    init_fn, get_hparams_fn, set_hparams_fn = _plain_state_fns(initial_hparams)
  advance_fn = None
  if hooks.round_input is not None:
    advance_fn = _advance_fn(hooks.round_input, init_fn)
  client_args = _client_arg_types(
    hooks, init_fn, weights_type, data_type, advance_fn
  )
  client_update = _client_update_fn(model_fn, optimizer, hooks, client_args)
  next_fn = _next_fn(
    hooks,
    init_fn,
    weights_type,
    data_type,
    client_update,
    advance_fn,
    metrics_aggregation_fn,
  )
  return tff.learning.templates.ClientWorkProcess(
    init_fn,
    next_fn,
    get_hparams_fn=get_hparams_fn,
    set_hparams_fn=set_hparams_fn,
  )


def build_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  optimizer: tff.learning.optimizers.Optimizer,
  *,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
  penalty_fn: Optional[PenaltyFn] = None,
  after_step_fn: Optional[AfterStepFn] = None,
  update_fn: Optional[UpdateFn] = None,
  extra_metrics_fn: Optional[ExtraMetricsFn] = None,
  round_input: Optional[RoundInput] = None,
  track_global_update: bool = False,
) -> tff.learning.templates.ClientWorkProcess:
  """A model-delta client work with a loss penalty and an update transform.

  Each client trains from the broadcast weights over its dataset, one
  `optimizer` step a batch, and sends `ClientResult(update,
  update_weight)`: update = initial - trained trainable weights, mapped by
  `update_fn`; weight = its example count (`NUM_EXAMPLES`) or 1
  (`UNIFORM`). A non-finite update is sent as zeros with weight 0. The
  state is the optimizer's hparams or, with `round_input` or
  `track_global_update`, `OrderedDict(hparams[, round_input][, previous,
  has_previous])`; `get_hparams`/`set_hparams` reach the hparams.

  Measurements: `train`, the model's metrics summed over the clients and
  finalized (`tff.learning.metrics.sum_then_finalize`: the model's
  `metric_finalizers()` keys, e.g. `loss`, `num_examples`); with
  `extra_metrics_fn`, `extra`, its values summed over the clients (the
  keys it returns).

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local `tff.learning.optimizers.Optimizer`.
    client_weighting: A `tff.learning.ClientWeighting`.
    penalty_fn: `(trainable, initial) -> scalar`, added to each step's loss
      (or its gradient added by its `add_gradient(grads, trainable,
      initial)` attribute, where it has one); None: no penalty.
    after_step_fn: `(trainable, initial[, round_value]) -> new trainable
      values`, applied after every step; None: none.
    update_fn: `(delta, model, dataset) -> delta`, maps the final delta
      with the trained model at hand; None: the delta as is.
    extra_metrics_fn: `delta -> {key: value}`, per-client values summed
      under `extra`; None: no `extra`.
    round_input: A `RoundInput`: a per-round server value broadcast to the
      clients and passed to `after_step_fn` as its third argument.
    track_global_update: Keep the last global weights in the state and
      call `extra_metrics_fn(delta, last_global_step)` (w_{t-1} - w_t, zero
      in the first round: the angle of Zhang et al. 2022's diagnostics).

  Returns:
    A `tff.learning.templates.ClientWorkProcess`.

  Raises:
    TypeError: If `model_fn` or a given hook is not callable, or
      `optimizer`, `client_weighting`, `round_input` or
      `track_global_update` has the wrong type.
  """
  hooks = _Hooks(
    client_weighting=client_weighting,
    penalty_fn=penalty_fn,
    after_step_fn=after_step_fn,
    update_fn=update_fn,
    extra_metrics_fn=extra_metrics_fn,
    round_input=round_input,
    track_global_update=track_global_update,
  )
  _check_args(model_fn, optimizer, hooks)
  return _build_process(model_fn, optimizer, hooks)
