"""The weighted form of every factory here: `factory.weighted()`.

Every aggregation factory in `tff_dp.aggregators` is unweighted, as TFF's
DP aggregators are: it drops into
`tff.learning.algorithms.build_unweighted_fed_avg` as it is.
`factory.weighted()` (`UniformlyWeighted`) gives the same aggregation as a
`tff.aggregators.WeightedAggregationFactory` that takes the client weights
and ignores them, for `build_weighted_fed_avg`: every client counts the same.
"""

import tensorflow_federated as tff

from tff_dp.aggregators import _tff_private


class UniformlyWeighted(tff.aggregators.WeightedAggregationFactory):
  """An unweighted factory as a weighted one that ignores the weights.

  Client: sends its value, as to the unweighted factory, and its weight,
  which is dropped (TFF's `as_weighted_aggregator`). Server: the unweighted
  factory's process, unchanged: its state, result and measurements (keys
  included), and so its DP event, under the same neighbouring relation and
  sensitivity; `tff_dp.aggregators.dp_events.released_event(factory,
  state, measurements)` unwraps it (`unweighted`).

  Why uniform: a DP aggregator's noise is calibrated to the most one client
  can move the sum, its clip C. With client weights w_i (e.g. example
  counts) the sum of w_i * u_i moves by up to max(w) * C, which the
  weights, being private and unbounded, do not bound; the released mean
  would not be DP at the noise the factory was given. The non-private
  UV-Fed and FetchSGD could honour weights, but their weighted forms weight
  uniformly too, so that swapping a private method for its non-private
  baseline never changes the weighting under a comparison (the method
  registry runs them that way). With `build_weighted_fed_avg`, pass
  `client_weighting=tff.learning.ClientWeighting.UNIFORM` as well, so that
  the training metrics are weighted as the update is (the aggregation is
  uniform either way).

  Args:
    factory: The unweighted factory.

  Raises:
    TypeError: If `factory` is not a
      `tff.aggregators.UnweightedAggregationFactory`.
  """

  def __init__(self, factory: tff.aggregators.UnweightedAggregationFactory):
    if not isinstance(factory, tff.aggregators.UnweightedAggregationFactory):
      raise TypeError(
        'UniformlyWeighted wraps a tff.aggregators.'
        f'UnweightedAggregationFactory. Found {type(factory).__name__}.'
      )
    self._unweighted = factory

  @property
  def unweighted(self) -> tff.aggregators.UnweightedAggregationFactory:
    """The wrapped factory (for `build_unweighted_fed_avg`)."""
    return self._unweighted

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    return _tff_private.as_weighted_aggregator(self._unweighted).create(
      value_type, weight_type
    )


class Weightable:
  """Mixin of the unweighted factories: adds `weighted()`."""

  def weighted(self) -> UniformlyWeighted:
    """This aggregation for `build_weighted_fed_avg`: weights ignored.

    Every client counts the same, as DP requires (`UniformlyWeighted`).
    """
    return UniformlyWeighted(self)
