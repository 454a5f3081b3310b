"""The one place that reaches into TFF 0.87's private modules.

Each wrapper names the private symbol it uses so that a TFF upgrade breaks
here, loudly, and nowhere else.
"""

from tensorflow_federated.python.aggregators import differential_privacy
from tensorflow_federated.python.aggregators import factory_utils

# TFF's DPAggregatorState(query_state, agg_state, dp_event, is_init_state).
DPAggregatorState = differential_privacy.DPAggregatorState


def extract_dp_event_from_state(state):
  """TFF's `differential_privacy.extract_dp_event_from_state` (not exported
  by `tff.aggregators` in 0.87): the event of a `DPAggregatorState` after
  `next`; raises `ExtractingDpEventFromInitialStateError` on the state from
  `initialize`."""
  return differential_privacy.extract_dp_event_from_state(state)


ExtractingDpEventFromInitialStateError = (
  differential_privacy.ExtractingDpEventFromInitialStateError
)


def adaptive_clip_noise_params(
  noise_multiplier: float,
  expected_clients_per_round: float,
  clipped_count_stddev=None,
):
  """TFF's split of an effective noise multiplier for adaptive clipping.

  Returns `(value_noise_multiplier, clipped_count_stddev)` such that the sum
  and the clipped-count releases together are a Gaussian mechanism with the
  effective `noise_multiplier` (1/z^2 = 1/z_v^2 + (2 sigma_b)^-2).
  """
  return differential_privacy.adaptive_clip_noise_params(
    noise_multiplier, expected_clients_per_round, clipped_count_stddev
  )


def as_weighted_aggregator(unweighted_factory):
  """TFF's weighted wrapper of an unweighted factory (weights ignored)."""
  return factory_utils.as_weighted_aggregator(unweighted_factory)


def distributed_dp_module():
  """TFF's `aggregators.distributed_dp` (DistributedDpSumFactory and its
  parameter heuristics), not exported by `tff.aggregators` in 0.87."""
  from tensorflow_federated.python.aggregators import distributed_dp  # pylint: disable=g-import-not-at-top

  return distributed_dp


def inflated_l2_norm_bound(l2_norm_bound, gamma, beta, dim) -> float:
  """TFF's norm bound after scaling by 1/gamma and conditional rounding."""
  from tensorflow_federated.python.aggregators import discretization  # pylint: disable=g-import-not-at-top

  return float(
    discretization.inflated_l2_norm_bound(
      l2_norm_bound=l2_norm_bound, gamma=gamma, beta=beta, dim=dim
    ).numpy()
  )


def flat_float_specs(value_type, who: str):
  """`(specs, flat specs, sizes)` of a value type of float tensors.

  Raises:
    TypeError: If a tensor is not floating point (`who` needs floats).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  specs = tff.types.type_to_tf_tensor_specs(value_type)
  flat = tf.nest.flatten(specs)
  for s in flat:
    if not s.dtype.is_floating:
      raise TypeError(f'{who} needs float tensors. Found {s!r}.')
  sizes = [int(np.prod(s.shape.as_list())) for s in flat]
  return specs, flat, sizes


def with_type_signature(comp, type_signature):
  """`comp` (a ConcreteComputation) re-typed to an assignable signature.

  TFF's `ConcreteComputation.with_type`: the proto is unchanged; only the
  Python-side signature (e.g. its Python container types) is replaced.
  """
  from tensorflow_federated.python.core.impl.computation import computation_impl  # pylint: disable=g-import-not-at-top

  return computation_impl.ConcreteComputation.with_type(comp, type_signature)


def modular_clipping_sum_factory(lower: int, upper: int, inner):
  """TFF's `modular_clipping.ModularClippingSumFactory` (not exported in
  0.87): clips integers modulo [lower, upper) before and after `inner`."""
  from tensorflow_federated.python.aggregators import modular_clipping  # pylint: disable=g-import-not-at-top

  return modular_clipping.ModularClippingSumFactory(lower, upper, inner)


def discretization_factory(inner, *, scale_factor, beta, prior_norm_bound):
  """TFF's `discretization.DiscretizationFactory` (not exported in 0.87),
  stochastic: scales by `scale_factor` and rounds conditionally (beta)."""
  from tensorflow_federated.python.aggregators import discretization  # pylint: disable=g-import-not-at-top

  return discretization.DiscretizationFactory(
    inner,
    scale_factor=scale_factor,
    stochastic=True,
    beta=beta,
    prior_norm_bound=prior_norm_bound,
  )
