"""Tensorflow-privacy's Gaussian DP queries with a secret, resumable seed.

Each query clips in `preprocess_record` (guarded: `finite_guard.clip_flat`),
adds N(0, stddev^2) noise drawn by `tf.random.stateless_normal` from a seed
kept in its global state and advanced every round
(`tf.random.experimental.stateless_split`), and returns tensorflow-privacy's
DpEvent: `GaussianDpEvent(stddev / l2_norm_clip)`, composed where a round
makes two releases. `noise_seed=None` draws a secret 128-bit seed from the
OS. See docs/papers/dp_fedavg.md for the paper's reading and derivations.
"""

import collections
import secrets
from typing import NamedTuple, Optional, Sequence, Union

import dp_accounting
import tensorflow as tf
import tensorflow_privacy as tfp

from tff_dp.aggregators import finite_guard

SeedLike = Union[int, Sequence[int]]
# None: a secret seed from OS entropy; an int or pair: reproducible noise.
NoiseSeed = Optional[SeedLike]


def secret_seed() -> tuple[int, int]:
  """A fresh stateless seed pair (128 bits) from the OS's CSPRNG."""
  return tuple(secrets.randbits(64) - 2**63 for _ in range(2))


def resolve_seed(seed: NoiseSeed) -> tuple[int, int]:
  """The int64 seed pair of `seed`: `(s, 0)` for an int, a secret for None.

  Raises:
    ValueError: If `seed` is not None, an int or a pair of ints in int64.
  """
  if seed is None:
    return secret_seed()
  if isinstance(seed, bool):
    raise ValueError(f'seed must be an int or a pair of ints. Found {seed!r}.')
  if isinstance(seed, int):
    seed = (seed, 0)
  try:
    pair = tuple(int(s) for s in seed)
  except (TypeError, ValueError):
    pair = ()
  if len(pair) != 2 or not all(-(2**63) <= s < 2**63 for s in pair):
    raise ValueError(
      f'seed must be an int or a pair of ints in int64. Found {seed!r}.'
    )
  return pair


def offset_seed(seed: NoiseSeed, offset: int) -> NoiseSeed:
  """An independent stream: `seed + offset` for an int, a new secret for None.

  Aggregators with several noised releases give each its own stream this
  way: an int seed s gives the streams of the int seeds s + offset, a pair
  (a, b) the pair (a, b + offset).
  """
  if seed is None:
    return None
  if isinstance(seed, int) and not isinstance(seed, bool):
    return seed + offset
  a, b = resolve_seed(seed)
  return (a, b + offset)


def seed_tensor(seed: SeedLike) -> tf.Tensor:
  """The int64 `[2]` tensor of `resolve_seed(seed)`."""
  return tf.constant(resolve_seed(seed), tf.int64)


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
  """`tfp.GaussianSumQuery` with noise from a stateless seed in its state.

  Record: a structure of float tensors, clipped to global L2 norm
  `l2_norm_clip` (`preprocess_record_impl`: tensorflow-privacy's clip,
  guarded against non-finite and overflowing records). Release: the sum of
  the clipped records plus N(0, stddev^2) noise on every entry, drawn from
  the state's seed, which `get_noised_result` then advances. DpEvent:
  `GaussianDpEvent(stddev / l2_norm_clip)`, add/remove-one with L2
  sensitivity `l2_norm_clip` (replace-one: twice that, which
  `tff_dp.privacy` accounts). Metrics: none (`derive_metrics` is
  tensorflow-privacy's empty one).

  Args:
    l2_norm_clip: The clip, > 0.
    stddev: The noise's standard deviation, >= 0.
    seed: None (a secret seed from OS entropy), or an int or a pair of ints
      in int64 (reproducible noise; whoever knows it can subtract the
      noise). Resolved once, at construction.

  Raises:
    ValueError: If `seed` is not None, an int or a pair of ints in int64.
  """

  class _GlobalState(NamedTuple):
    l2_norm_clip: tf.Tensor  # float32; also the sample params.
    stddev: tf.Tensor  # float32.
    seed: tf.Tensor  # int64 [2]: this round's noise seed.

  def __init__(self, l2_norm_clip: float, stddev: float, seed: NoiseSeed):
    super().__init__(l2_norm_clip, stddev)
    # Resolved once: the initial state (and so a rebuilt computation) of
    # this query always starts the same stream.
    self._seed = resolve_seed(seed)

  def preprocess_record_impl(self, params, record):
    """`(record clipped to L2 norm params, its norm)`, guarded.

    The fast path is tensorflow-privacy's `tf.clip_by_global_norm` (same
    bits); a record whose float32 norm is not finite is clipped in float64,
    or zeroed if it holds a NaN or an infinity (`finite_guard.clip_flat`).
    The adaptive-clip query reads the norm from here too.
    """
    clipped, norm = finite_guard.clip_flat(tf.nest.flatten(record), params)
    return tf.nest.pack_sequence_as(record, clipped), norm

  def make_global_state(self, l2_norm_clip, stddev, seed=None):
    return self._GlobalState(
      tf.cast(l2_norm_clip, tf.float32),
      tf.cast(stddev, tf.float32),
      seed_tensor(self._seed) if seed is None else seed,
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
  """`tfp.QuantileEstimatorQuery` whose below-estimate count is seeded.

  Record: a scalar (a client's update norm); each client adds
  [record <= estimate] - 0.5 to a sum (sensitivity 0.5) that gets
  N(0, below_estimate_stddev^2) noise from `seed`
  (`SeededGaussianSumQuery`) and is divided by `expected_num_records`.
  Release: the new estimate, estimate * exp(-learning_rate * (b -
  target_quantile)) with b the noised fraction below the estimate clipped
  to [0, 1] (or minus that step without `geometric_update`). DpEvent:
  `GaussianDpEvent(below_estimate_stddev / 0.5)`. Arguments as
  tensorflow-privacy's, and `seed` as `SeededGaussianSumQuery`'s.
  """

  def __init__(
    self,
    initial_estimate,
    target_quantile,
    learning_rate,
    below_estimate_stddev,
    expected_num_records,
    geometric_update=True,
    *,
    seed: NoiseSeed,
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

  Record: a structure of float tensors, clipped to the current clip C
  (`SeededGaussianSumQuery`); its norm feeds the unclipped-quantile
  estimator (`SeededQuantileEstimatorQuery`). Release: the sum plus
  N(0, (noise_multiplier C)^2) noise, and the next clip, the estimator's
  geometric step towards `target_unclipped_quantile` (floored at 0); the
  sum's state keeps its advanced seed when the clip moves (tensorflow-
  privacy's rebuilds it, which would restart the seed). DpEvent:
  `ComposedDpEvent([GaussianDpEvent(noise_multiplier),
  GaussianDpEvent(clipped_count_stddev / 0.5)])`, both on the same cohort.
  Metrics: `clip`, the current clip (tensorflow-privacy's).

  Args: as tensorflow-privacy's, and `seed`: None (two independent secrets
  from OS entropy) or an int s: the sum query and the clipped-count query
  draw from the independent seeds `(s, 0)` and `(s, 1)`.
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
    seed: Optional[int],
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
      seed=None if seed is None else (seed, 1),
    )
    self._sum_query = SeededGaussianSumQuery(
      initial_l2_norm_clip,
      noise_multiplier * initial_l2_norm_clip,
      seed=None if seed is None else (seed, 0),
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


class ClippedFractionSumQuery(tfp.SumAggregationDPQuery):
  """A fixed-clip Gaussian sum that also releases a DP fraction clipped.

  Record: a structure of float tensors. Each client clips it to
  `l2_norm_clip` (as `SeededGaussianSumQuery`) and adds the indicator
  [norm > clip] - 0.5 to a second sum (sensitivity 0.5, as
  tensorflow-privacy's quantile estimator centres it), which gets
  N(0, fraction_stddev^2) noise. Release: the sum plus N(0, stddev^2)
  noise, and the estimate clip01(noised indicator sum /
  expected_num_records + 0.5) of the fraction of the cohort whose update
  was clipped; the estimate is kept in the global state
  (`dp_fraction_clipped`) and the clip never moves. DpEvent:
  `ComposedDpEvent([GaussianDpEvent(stddev / l2_norm_clip),
  GaussianDpEvent(fraction_stddev / 0.5)])`, both on the same cohort,
  add/remove-one (one client moves the sum by at most `l2_norm_clip` and
  the indicator sum by at most 0.5). Metrics: `clip` (`l2_norm_clip`) and
  `dp_fraction_clipped` (the last round's estimate; 0 before the first).

  Args:
    l2_norm_clip: The clip, > 0.
    stddev: The sum's noise standard deviation, >= 0.
    fraction_stddev: The indicator sum's noise standard deviation, > 0.
    expected_num_records: The public expected cohort (the estimate's
      denominator), > 0.
    seed: As `SeededGaussianSumQuery`'s; the sum and the indicator sum draw
      from the independent streams `offset_seed(seed, 0)` and
      `offset_seed(seed, 1)`.
  """

  class _GlobalState(NamedTuple):
    sum_state: SeededGaussianSumQuery._GlobalState
    count_state: SeededGaussianSumQuery._GlobalState
    dp_fraction_clipped: tf.Tensor  # float32, the last round's estimate.

  class _SampleParams(NamedTuple):
    sum_params: tf.Tensor  # The clip.
    count_params: tf.Tensor  # 0.5.

  class _SampleState(NamedTuple):
    sum_state: object  # The clipped records' sum (the record's structure).
    count_state: tf.Tensor  # The indicators' sum.

  def __init__(
    self,
    l2_norm_clip: float,
    stddev: float,
    fraction_stddev: float,
    expected_num_records: float,
    seed: NoiseSeed,
  ):
    self._sum_query = SeededGaussianSumQuery(
      l2_norm_clip, stddev, offset_seed(seed, 0)
    )
    # Indicators shifted by -0.5 (sensitivity 0.5), as in tfp.
    self._count_query = SeededGaussianSumQuery(
      0.5, fraction_stddev, offset_seed(seed, 1)
    )
    self._expected = float(expected_num_records)

  def initial_global_state(self):
    return self._GlobalState(
      self._sum_query.initial_global_state(),
      self._count_query.initial_global_state(),
      tf.constant(0.0, tf.float32),
    )

  def derive_sample_params(self, global_state):
    return self._SampleParams(
      self._sum_query.derive_sample_params(global_state.sum_state),
      self._count_query.derive_sample_params(global_state.count_state),
    )

  def initial_sample_state(self, template=None):
    return self._SampleState(
      self._sum_query.initial_sample_state(template),
      self._count_query.initial_sample_state(tf.constant(0.0)),
    )

  def preprocess_record(self, params, record):
    clipped, norm = self._sum_query.preprocess_record_impl(
      params.sum_params, record
    )
    indicator = tf.cast(norm > params.sum_params, tf.float32) - 0.5
    return self._SampleState(
      clipped,
      self._count_query.preprocess_record(params.count_params, indicator),
    )

  def get_noised_result(self, sample_state, global_state):
    result, sum_state, sum_event = self._sum_query.get_noised_result(
      sample_state.sum_state, global_state.sum_state
    )
    count, count_state, count_event = self._count_query.get_noised_result(
      sample_state.count_state, global_state.count_state
    )
    fraction = tf.clip_by_value(count / self._expected + 0.5, 0.0, 1.0)
    event = dp_accounting.ComposedDpEvent([sum_event, count_event])
    return result, self._GlobalState(sum_state, count_state, fraction), event

  def derive_metrics(self, global_state):
    return collections.OrderedDict(
      clip=global_state.sum_state.l2_norm_clip,
      dp_fraction_clipped=global_state.dp_fraction_clipped,
    )
