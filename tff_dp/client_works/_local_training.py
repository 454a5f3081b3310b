"""Model-delta local training with hooks, as a `ClientWorkProcess`.

Mirrors TFF's `build_model_delta_client_work` (same state, hparams,
metrics and non-finite handling), with two hooks the techniques need:

* `penalty_fn(trainable, initial_trainable) -> scalar` is added to the loss
  of every local step (BLUR's proximal hinge); if it has an
  `add_gradient(grads, trainable, initial)` attribute, that adds its
  gradient instead of the tape (BLUR's: the same values, cheaper);
* `update_fn(update, model, dataset) -> update` transforms the model delta
  after training (LUS's sparsification), with the trained model at hand;
* `after_step_fn(trainable, initial[, round_value]) -> values` rewrites the
  weights after every step (FL-TOP's reset of untrained weights to w0);
* `round_input`: a server-side value advanced every round and broadcast to
  the clients, where `after_step_fn` receives it (FL-BASIC's per-round
  random coordinates). The process state is then `(hparams, round_input)`.
"""

import collections
import dataclasses
import functools
from typing import Any, Callable, Optional

import numpy as np

import tensorflow as tf
import tensorflow_federated as tff

PenaltyFn = Callable[[Any, Any], tf.Tensor]
UpdateFn = Callable[[Any, Any, tf.data.Dataset], Any]


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


def _zero_if_non_finite(structure):
  flat = tf.nest.flatten(structure)
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in flat])
  zeroed = [tf.where(finite, t, tf.zeros_like(t)) for t in flat]
  return tf.nest.pack_sequence_as(structure, zeroed), tf.logical_not(finite)


def build_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  optimizer: tff.learning.optimizers.Optimizer,
  *,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
  penalty_fn: Optional[PenaltyFn] = None,
  after_step_fn: Optional[Callable[[Any, Any], Any]] = None,
  update_fn: Optional[UpdateFn] = None,
  extra_metrics_fn: Optional[Callable[[Any], dict]] = None,
  round_input: Optional[RoundInput] = None,
  track_global_update: bool = False,
) -> tff.learning.templates.ClientWorkProcess:
  """A model-delta client work with a loss penalty and an update transform.

  Args:
    model_fn: No-arg callable returning a fresh `tff.learning` model.
    optimizer: The local `tff.learning.optimizers.Optimizer`.
    client_weighting: Example-count or uniform update weights.
    penalty_fn: Added to each step's loss (differentiated with it).
    after_step_fn: `(trainable, initial) -> new trainable values` applied
      after every step (FL-TOP resets untrained weights to w0).
    update_fn: Maps the final model delta (initial - final weights).
    extra_metrics_fn: Maps the final delta to extra per-client scalars that
      are summed over clients under `extra/`.
    round_input: A per-round server value broadcast to the clients and
      passed to `after_step_fn` as its third argument.
    track_global_update: Keep the last global weights in the state and
      call `extra_metrics_fn(delta, last_global_step)` (seed 003's angle
      between a client's update and the previous global update; the step
      is zero in the first round).
  """
  with tf.Graph().as_default():
    model = model_fn()
    metrics_aggregation_fn = tff.learning.metrics.sum_then_finalize(
      model.metric_finalizers()
    )
  element_type = tff.types.tensorflow_to_type(model.input_spec)
  data_type = tff.SequenceType(element_type)
  weights_type = tff.learning.models.weights_type_from_model(model)
  initial_hparams = optimizer.get_hparams(
    optimizer.initialize(tf.TensorSpec([], tf.float32))
  )

  extended = round_input is not None or track_global_update
  if not extended:

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

  else:
    trainable_specs = tff.types.type_to_tf_tensor_specs(weights_type.trainable)

    @tff.tensorflow.computation
    def initial_state():
      state = collections.OrderedDict(
        hparams=tf.nest.map_structure(tf.constant, initial_hparams)
      )
      if round_input is not None:
        state['round_input'] = tf.constant(np.asarray(round_input.initial))
      if track_global_update:
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

    if round_input is not None:

      @tff.tensorflow.computation(state_type.round_input)
      def advance_fn(value):
        return round_input.advance(value)

      round_value_type = advance_fn.type_signature.result[0]

  def _build_train(model):
    return tf.function(functools.partial(_train, model))

  def _train(
    model, hparams, initial_weights, dataset, round_value=None, reference=None
  ):
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
      round_value = round_input.on_client(round_value)
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
    delta = tf.nest.map_structure(
      tf.subtract, initial_weights.trainable, weights.trainable
    )
    if update_fn is not None:
      delta = update_fn(delta, model, dataset)
    delta, non_finite = _zero_if_non_finite(delta)
    if client_weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
      weight = tf.cast(num_examples, tf.float32)
    else:
      weight = tf.constant(1.0, tf.float32)
    weight = tf.where(non_finite, 0.0, weight)
    if extra_metrics_fn is None:
      extra = collections.OrderedDict()
    elif track_global_update:
      previous, has_previous = reference
      # The last global step in the delta's sign (initial - final):
      # w_{t-1} - w_t, zero (undefined) in the first round.
      step = tf.nest.map_structure(
        lambda p, w: tf.where(has_previous, p - w, tf.zeros_like(w)),
        tuple(tf.nest.flatten(previous)),
        tuple(tf.nest.flatten(initial_weights.trainable)),
      )
      extra = collections.OrderedDict(extra_metrics_fn(delta, step))
    else:
      extra = collections.OrderedDict(extra_metrics_fn(delta))
    return (
      tff.learning.templates.ClientResult(update=delta, update_weight=weight),
      model.report_local_unfinalized_metrics(),
      extra,
    )

  client_args = [hparams_type, weights_type, data_type]
  if round_input is not None:
    client_args.append(round_value_type)
  if track_global_update:
    reference_type = tff.StructWithPythonType(
      [weights_type.trainable, tff.TensorType(np.bool_)], tuple
    )
    client_args.append(reference_type)

  train_args = ('round_value',) * (round_input is not None) + (
    'reference',
  ) * track_global_update

  def _call(hparams, initial_weights, dataset, **kwargs):
    return _build_train(model_fn())(hparams, initial_weights, dataset, **kwargs)

  # TFF computations take no varargs: one signature per combination.
  if train_args == ():

    @tff.tensorflow.computation(*client_args)
    def client_update(hparams, initial_weights, dataset):
      return _call(hparams, initial_weights, dataset)

  elif train_args == ('round_value',):

    @tff.tensorflow.computation(*client_args)
    def client_update(hparams, initial_weights, dataset, round_value):
      return _call(hparams, initial_weights, dataset, round_value=round_value)

  elif train_args == ('reference',):

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

  @tff.federated_computation(
    init_fn.type_signature.result,
    tff.FederatedType(weights_type, tff.CLIENTS),
    tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    if not extended:
      args = [tff.federated_broadcast(state), weights, client_data]
    else:
      args = [tff.federated_broadcast(state.hparams), weights, client_data]
      new_state = collections.OrderedDict(hparams=state.hparams)
      if round_input is not None:
        value, next_input = tff.federated_map(advance_fn, state.round_input)
        args.append(tff.federated_broadcast(value))
        new_state['round_input'] = next_input
      if track_global_update:
        reference = tff.federated_zip((state.previous, state.has_previous))
        args.append(tff.federated_broadcast(reference))
        # Every client holds the same global weights: their mean is them.
        new_state['previous'] = tff.federated_mean(weights.trainable)
        new_state['has_previous'] = tff.federated_value(True, tff.SERVER)
      state = tff.federated_zip(new_state)
    result, model_outputs, extra = tff.federated_map(client_update, tuple(args))
    train = metrics_aggregation_fn(model_outputs)
    measurements = collections.OrderedDict(train=train)
    if extra_metrics_fn is not None:
      measurements['extra'] = tff.federated_sum(extra)
    return tff.templates.MeasuredProcessOutput(
      state, result, tff.federated_zip(measurements)
    )

  return tff.learning.templates.ClientWorkProcess(
    init_fn,
    next_fn,
    get_hparams_fn=get_hparams_fn,
    set_hparams_fn=set_hparams_fn,
  )
