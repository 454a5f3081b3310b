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
  """A no-arg TFF computation returning `model_fn()`'s initial weights.

  Args:
    model_fn: A no-arg callable returning a `tff.learning` model.

  Returns:
    A `tff.tensorflow.computation` whose result is the model's
    `tff.learning.models.ModelWeights`.
  """

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
    server_optimizer: Server optimizer applied to the aggregated update.
    model_aggregator: Weighted or unweighted aggregation factory; default
      `tff.aggregators.MeanFactory()` (example-weighted mean).
    client_model_fn: The model function of the default client work
      (default `model_fn`); same architecture, e.g. with cheap initializers
      (`FederatedTask.client_model_fn`). The initial global model always
      comes from `model_fn`.
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

  Raises:
    TypeError: If `model_aggregator` is neither a weighted nor an
      unweighted `tff.aggregators` factory.
  """
  if model_aggregator is None:
    model_aggregator = tff.aggregators.MeanFactory()
  weighted_factory, client_weighting = _weighted(model_aggregator)
  initial_fn = initial_model_weights_computation(model_fn)
  weights_type = initial_fn.type_signature.result
  distributor = tff.learning.templates.build_broadcast_process(weights_type)
  if client_work is None:
    client_work = _default_client_work(
      client_model_fn or model_fn,
      client_optimizer,
      client_weighting,
      client_metrics_fn=client_metrics_fn,
      track_global_update=track_global_update,
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


def _weighted(
  model_aggregator: AggregationFactory,
) -> tuple[
  tff.aggregators.WeightedAggregationFactory, tff.learning.ClientWeighting
]:
  """The weighted factory to create, and how clients are weighted.

  An unweighted (DP) factory is wrapped to ignore weights, and clients
  are weighted uniformly; a weighted one is used as is, by examples.

  Raises:
    TypeError: If `model_aggregator` is neither kind of factory.
  """
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    return (
      weighting.UniformlyWeighted(model_aggregator),
      tff.learning.ClientWeighting.UNIFORM,
    )
  if isinstance(model_aggregator, tff.aggregators.WeightedAggregationFactory):
    return model_aggregator, tff.learning.ClientWeighting.NUM_EXAMPLES
  raise TypeError(
    'model_aggregator must be a tff.aggregators weighted or '
    f'unweighted factory. Found {type(model_aggregator)!r}.'
  )


def _default_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  client_optimizer: tff.learning.optimizers.Optimizer,
  client_weighting: tff.learning.ClientWeighting,
  *,
  client_metrics_fn: Optional[Callable[..., Any]],
  track_global_update: bool,
  loop_implementation: tff.learning.LoopImplementation,
) -> tff.learning.templates.ClientWorkProcess:
  """Model-delta training: `tff_dp`'s mirror of TFF's with per-client
  metrics (`client_metrics_fn`), else TFF's own."""
  if client_metrics_fn is not None:
    return _local_training.build_client_work(
      model_fn,
      client_optimizer,
      client_weighting=client_weighting,
      extra_metrics_fn=client_metrics_fn,
      track_global_update=track_global_update,
    )
  return tff.learning.templates.build_model_delta_client_work(
    model_fn=model_fn,
    optimizer=client_optimizer,
    client_weighting=client_weighting,
    loop_implementation=loop_implementation,
  )


def with_client_learning_rate(
  process: tff.learning.templates.LearningProcess, state, learning_rate: float
):
  """`state` with the client optimizer's learning rate set (TFF hparams).

  Works for TFF's model-delta client work and `tff_dp`'s (both keep the
  client optimizer's hparams, `learning_rate` among them, as the client
  work's hparams).

  Args:
    process: The learning process `state` belongs to.
    state: Its state.
    learning_rate: The new client learning rate (cast to the hparam's
      dtype).

  Returns:
    `state` with the client work's `learning_rate` hparam replaced.

  Raises:
    ValueError: If the process's client work has no 'learning_rate'
      hparam.
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
