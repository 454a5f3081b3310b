"""Model-delta local training with hooks, as a `ClientWorkProcess`.

Mirrors TFF's `build_model_delta_client_work` (same state, hparams,
metrics and non-finite handling), with two hooks the techniques need:

* `penalty_fn(trainable, initial_trainable) -> scalar` is added to the loss
  of every local step (BLUR's proximal hinge);
* `update_fn(update, model, dataset) -> update` transforms the model delta
  after training (LUS's sparsification), with the trained model at hand;
* `after_step_fn(trainable, initial) -> values` rewrites the weights after
  every step (FL-TOP's reset of untrained weights to w0).
"""

import collections
import functools
from typing import Any, Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

PenaltyFn = Callable[[Any, Any], tf.Tensor]
UpdateFn = Callable[[Any, Any, tf.data.Dataset], Any]


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
      are summed over clients under `train/`.
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

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(initial_hparams, tff.SERVER)

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return state

  @tff.tensorflow.computation(state_type, state_type)
  def set_hparams_fn(state, hparams):
    del state
    return hparams

  def _build_train(model):
    return tf.function(functools.partial(_train, model))

  def _train(model, hparams, initial_weights, dataset):
    weights = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(lambda v, t: v.assign(t), weights, initial_weights)
    trainable = tuple(tf.nest.flatten(weights.trainable))
    initial_trainable = tuple(tf.nest.flatten(initial_weights.trainable))
    specs = tf.nest.map_structure(
      lambda v: tf.TensorSpec(v.shape, v.dtype), trainable
    )
    opt_state = optimizer.set_hparams(optimizer.initialize(specs), hparams)
    num_examples = tf.constant(0, tf.int64)
    for batch in iter(dataset):
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
        loss = output.loss
        if penalty_fn is not None:
          loss += penalty_fn(trainable, initial_trainable)
      grads = tape.gradient(loss, trainable)
      opt_state, updated = optimizer.next(opt_state, trainable, grads)
      for v, u in zip(trainable, updated):
        v.assign(u)
      if after_step_fn is not None:
        for v, u in zip(trainable, after_step_fn(trainable, initial_trainable)):
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
    extra = (
      collections.OrderedDict()
      if extra_metrics_fn is None
      else collections.OrderedDict(extra_metrics_fn(delta))
    )
    return (
      tff.learning.templates.ClientResult(update=delta, update_weight=weight),
      model.report_local_unfinalized_metrics(),
      extra,
    )

  @tff.tensorflow.computation(state_type, weights_type, data_type)
  def client_update(hparams, initial_weights, dataset):
    return _build_train(model_fn())(hparams, initial_weights, dataset)

  @tff.federated_computation(
    init_fn.type_signature.result,
    tff.FederatedType(weights_type, tff.CLIENTS),
    tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    hparams = tff.federated_broadcast(state)
    result, model_outputs, extra = tff.federated_map(
      client_update, (hparams, weights, client_data)
    )
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
