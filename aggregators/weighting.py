"""The weighted form of every factory here: `factory.weighted()`.

Every aggregation factory in `tff_dp.aggregators` is unweighted, as TFF's
DP aggregators are: it drops into
`tff.learning.algorithms.build_unweighted_fed_avg` as it is. Most TFF
pipelines build with `build_weighted_fed_avg`, which refuses an unweighted
factory; `factory.weighted()` gives the same aggregation as a
`tff.aggregators.WeightedAggregationFactory` that takes the client weights
and ignores them, so every client counts the same.

Why uniform: a DP aggregator's noise is calibrated to the most one client
can move the sum, its clip C. With client weights w_i (e.g. example counts)
the sum of w_i * u_i moves by up to max(w) * C, which the weights, being
private and unbounded, do not bound; the released mean would not be DP at
the noise the factory was given. The non-private UV-Fed and FetchSGD could
honour weights, but their weighted forms weight uniformly too, so that
swapping a private method for its non-private baseline never changes the
weighting under a comparison (the method registry runs them that way).

With `build_weighted_fed_avg`, pass `client_weighting=
tff.learning.ClientWeighting.UNIFORM` as well, so that the training metrics
are weighted as the update is (the aggregation is uniform either way).
"""

import tensorflow_federated as tff

from tff_dp.aggregators import _tff_private


class UniformlyWeighted(tff.aggregators.WeightedAggregationFactory):
  """An unweighted factory as a weighted one that ignores the weights.

  Its state, measurements and result are those of the unweighted factory's
  process, so `dp_events.round_event` and the factories' own event readers
  work on it unchanged.
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

    Every client counts the same, as DP requires (see the module doc).
    """
    return UniformlyWeighted(self)
