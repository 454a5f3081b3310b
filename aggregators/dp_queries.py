"""Seeded versions of tensorflow-privacy's Gaussian DP queries.

tensorflow-privacy 0.9.0 draws its noise from TF's stateful RNG
(`tf.random_normal_initializer()` with no seed), so two runs with the same
flags add different noise, and a run resumed from a checkpoint cannot repeat
the noise it would have drawn. These queries keep a stateless seed in their
global state, draw noise with `tf.random.stateless_normal`, and advance the
seed every round (`tf.random.experimental.stateless_split`); the seed is saved
with the aggregator state, so noise is reproducible and resumable.

Privacy meaning is unchanged: clipping in `preprocess_record`, Gaussian noise
of standard deviation `stddev` in `get_noised_result`, and the same DpEvent
(`GaussianDpEvent(stddev / l2_norm_clip)`; adaptive clipping composes the sum
and the clipped-count events).
"""

import collections
from typing import Sequence, Union

import dp_accounting
import tensorflow as tf
import tensorflow_privacy as tfp

SeedLike = Union[int, Sequence[int]]


def _seed_tensor(seed: SeedLike) -> tf.Tensor:
  if isinstance(seed, int):
    seed = (seed, 0)
  seed = tuple(int(s) for s in seed)
  if len(seed) != 2:
    raise ValueError(f'seed must be an int or a pair of ints. Found {seed!r}.')
  return tf.constant(seed, tf.int64)


def add_stateless_gaussian_noise(structure, stddev, seed):
  """Adds N(0, stddev^2) noise to every tensor of `structure`.

  Args:
    structure: Nested structure of float tensors.
    stddev: Scalar standard deviation.
    seed: int64 `[2]` stateless seed; one sub-seed per tensor is split off.

  Returns:
    The noised structure.
  """
  flat = tf.nest.flatten(structure)
  seeds = tf.random.experimental.stateless_split(seed, num=max(len(flat), 1))
  noised = []
  for i, v in enumerate(flat):
    noise = tf.random.stateless_normal(
      tf.shape(v),
      seed=seeds[i],
      stddev=tf.cast(stddev, tf.float32),
      dtype=tf.float32,
    )
    noised.append(v + tf.cast(noise, v.dtype))
  return tf.nest.pack_sequence_as(structure, noised)


class SeededGaussianSumQuery(tfp.GaussianSumQuery):
  """`tfp.GaussianSumQuery` with noise from a stateless seed in its state."""

  _GlobalState = collections.namedtuple(  # pylint: disable=invalid-name
    '_GlobalState', ['l2_norm_clip', 'stddev', 'seed']
  )

  def __init__(self, l2_norm_clip: float, stddev: float, seed: SeedLike):
    super().__init__(l2_norm_clip, stddev)
    self._seed = seed
    _seed_tensor(seed)  # Validates.

  def make_global_state(self, l2_norm_clip, stddev, seed=None):
    return self._GlobalState(
      tf.cast(l2_norm_clip, tf.float32),
      tf.cast(stddev, tf.float32),
      _seed_tensor(self._seed) if seed is None else seed,
    )

  def initial_global_state(self):
    return self.make_global_state(self._l2_norm_clip, self._stddev)

  def get_noised_result(self, sample_state, global_state):
    seeds = tf.random.experimental.stateless_split(global_state.seed, num=2)
    result = add_stateless_gaussian_noise(
      sample_state, global_state.stddev, seeds[0]
    )
    event = dp_accounting.GaussianDpEvent(
      global_state.stddev / global_state.l2_norm_clip
    )
    return result, global_state._replace(seed=seeds[1]), event


class SeededQuantileEstimatorQuery(tfp.QuantileEstimatorQuery):
  """`tfp.QuantileEstimatorQuery` whose below-estimate count is seeded."""

  def __init__(
    self,
    initial_estimate,
    target_quantile,
    learning_rate,
    below_estimate_stddev,
    expected_num_records,
    geometric_update=True,
    *,
    seed: SeedLike,
  ):
    self._seed = seed  # Read by _construct_below_estimate_query.
    super().__init__(
      initial_estimate,
      target_quantile,
      learning_rate,
      below_estimate_stddev,
      expected_num_records,
      geometric_update,
    )

  def _construct_below_estimate_query(
    self, below_estimate_stddev, expected_num_records
  ):
    # As in tfp: indicators shifted by -0.5, so the sensitivity is 0.5.
    return tfp.NormalizedQuery(
      SeededGaussianSumQuery(
        l2_norm_clip=0.5, stddev=below_estimate_stddev, seed=self._seed
      ),
      denominator=expected_num_records,
    )


class SeededQuantileAdaptiveClipSumQuery(tfp.QuantileAdaptiveClipSumQuery):
  """`tfp.QuantileAdaptiveClipSumQuery` (Andrew et al. 2021) with seeds.

  The sum query and the clipped-count query draw from independent seeds
  `(seed, 0)` and `(seed, 1)`.
  """

  def __init__(
    self,
    initial_l2_norm_clip,
    noise_multiplier,
    target_unclipped_quantile,
    learning_rate,
    clipped_count_stddev,
    expected_num_records,
    geometric_update=True,
    *,
    seed: int,
  ):
    super().__init__(
      initial_l2_norm_clip,
      noise_multiplier,
      target_unclipped_quantile,
      learning_rate,
      clipped_count_stddev,
      expected_num_records,
      geometric_update,
    )
    self._quantile_estimator_query = SeededQuantileEstimatorQuery(
      initial_l2_norm_clip,
      target_unclipped_quantile,
      learning_rate,
      clipped_count_stddev,
      expected_num_records,
      geometric_update,
      seed=(seed, 1),
    )
    self._sum_query = SeededGaussianSumQuery(
      initial_l2_norm_clip,
      noise_multiplier * initial_l2_norm_clip,
      seed=(seed, 0),
    )

  def get_noised_result(self, sample_state, global_state):
    noised, sum_state, sum_event = self._sum_query.get_noised_result(
      sample_state.sum_state, global_state.sum_state
    )
    new_clip, new_estimator_state, quantile_event = (
      self._quantile_estimator_query.get_noised_result(
        sample_state.quantile_estimator_state,
        global_state.quantile_estimator_state,
      )
    )
    new_clip = tf.maximum(new_clip, 0.0)
    new_sum_state = sum_state._replace(
      l2_norm_clip=new_clip, stddev=new_clip * global_state.noise_multiplier
    )
    new_global_state = self._GlobalState(
      global_state.noise_multiplier, new_sum_state, new_estimator_state
    )
    event = dp_accounting.ComposedDpEvent([sum_event, quantile_event])
    return noised, new_global_state, event
