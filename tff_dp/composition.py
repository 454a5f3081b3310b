"""Builds a learning process from client work, aggregator and optimizers.

`build_learning_process` is `tff.learning.algorithms.build_weighted_fed_avg`
with the client work exchangeable (BLUR, model clipping, FL-TOP's masked
training are client works) and with unweighted (DP) aggregators accepted as
they are: they are wrapped to ignore weights, and clients are then weighted
uniformly, as DP requires.
"""

import collections
from typing import Any, Callable, Mapping, Optional, Union

import numpy as np
import tensorflow_federated as tff

from tff_dp.aggregators import weighting
from tff_dp.client_works import _local_training

AggregationFactory = Union[
  tff.aggregators.WeightedAggregationFactory,
  tff.aggregators.UnweightedAggregationFactory,
]


def initial_model_weights_computation(model_fn: Callable[[], object]):
  @tff.tensorflow.computation
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return initial_model_weights_fn


def build_learning_process(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  *,
  client_optimizer: tff.learning.optimizers.Optimizer,
  server_optimizer: tff.learning.optimizers.Optimizer,
  model_aggregator: Optional[AggregationFactory] = None,
  client_model_fn: Optional[
    Callable[[], tff.learning.models.VariableModel]
  ] = None,
  client_work: Optional[tff.learning.templates.ClientWorkProcess] = None,
  client_metrics_fn: Optional[Callable[..., Any]] = None,
  track_global_update: bool = False,
  loop_implementation: tff.learning.LoopImplementation = (
    tff.learning.LoopImplementation.DATASET_ITERATOR
  ),
) -> tff.learning.templates.LearningProcess:
  """Composes (distributor, client work, aggregator, finalizer).

  Args:
    model_fn: A no-arg callable returning a `tff.learning` model.
    client_optimizer: Local optimizer (used by the default client work).
    client_model_fn: The model function of the default client work
      (default `model_fn`); same architecture, e.g. with cheap initializers
      (`FederatedTask.client_model_fn`). The initial global model always
      comes from `model_fn`.
    server_optimizer: Server optimizer applied to the aggregated update.
    model_aggregator: Weighted or unweighted aggregation factory; default
      `tff.aggregators.MeanFactory()` (example-weighted mean).
    client_work: A `ClientWorkProcess`; default: model-delta training with
      `client_optimizer` (weighted by examples, or uniformly when the
      aggregator is unweighted).
    client_metrics_fn: With the default client work, per-client scalars of
      the update summed into the measurements (update-norm diagnostics);
      then the loop is `tff_dp`'s mirror of TFF's model-delta training.
    track_global_update: With `client_metrics_fn`, call it as
      `fn(delta, last_global_step)` (norm and angle diagnostics).
    loop_implementation: The local training loop.

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  if model_aggregator is None:
    model_aggregator = tff.aggregators.MeanFactory()
  unweighted = isinstance(
    model_aggregator, tff.aggregators.UnweightedAggregationFactory
  )
  if unweighted:
    weighted_factory = weighting.UniformlyWeighted(model_aggregator)
    client_weighting = tff.learning.ClientWeighting.UNIFORM
  elif isinstance(model_aggregator, tff.aggregators.WeightedAggregationFactory):
    weighted_factory = model_aggregator
    client_weighting = tff.learning.ClientWeighting.NUM_EXAMPLES
  else:
    raise TypeError(
      'model_aggregator must be a tff.aggregators weighted or '
      f'unweighted factory. Found {type(model_aggregator)!r}.'
    )
  initial_fn = initial_model_weights_computation(model_fn)
  weights_type = initial_fn.type_signature.result
  distributor = tff.learning.templates.build_broadcast_process(weights_type)
  if client_work is None and client_metrics_fn is not None:
    client_work = _local_training.build_client_work(
      client_model_fn or model_fn,
      client_optimizer,
      client_weighting=client_weighting,
      extra_metrics_fn=client_metrics_fn,
      track_global_update=track_global_update,
    )
  if client_work is None:
    client_work = tff.learning.templates.build_model_delta_client_work(
      model_fn=client_model_fn or model_fn,
      optimizer=client_optimizer,
      client_weighting=client_weighting,
      loop_implementation=loop_implementation,
    )
  aggregator = weighted_factory.create(
    weights_type.trainable, tff.TensorType(np.float32)
  )
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
    server_optimizer, weights_type
  )
  return tff.learning.templates.compose_learning_process(
    initial_fn, distributor, client_work, aggregator, finalizer
  )


def with_client_learning_rate(
  process: tff.learning.templates.LearningProcess, state, learning_rate: float
):
  """`state` with the client optimizer's learning rate set (TFF hparams).

  Works for TFF's model-delta client work and `tff_dp`'s (both keep the
  client optimizer's hparams, `learning_rate` among them, as the client
  work's hparams). Raises if the process has no such hparam.
  """
  hparams = process.get_hparams(state)
  client = hparams.get('client_work')
  if not isinstance(client, Mapping) or 'learning_rate' not in client:
    raise ValueError(
      "This process's client work has no 'learning_rate' hparam to decay "
      f'(its hparams: {hparams!r}).'
    )
  client = collections.OrderedDict(client)
  client['learning_rate'] = np.asarray(
    learning_rate, np.asarray(client['learning_rate']).dtype
  )
  hparams = collections.OrderedDict(hparams)
  hparams['client_work'] = client
  return process.set_hparams(state, hparams)
