"""DP-RandAgg: shared random-k coordinates, clipped and noised.

Guo et al. (CMP-Fed), Sec. V baseline: random-k sparsification under secure
aggregation. Each round the server draws k of the d coordinates, I, from a
public seed in its state; client i sends x_i = clip_C(Delta_i)[I] (scope
'update'; 'payload' clips Delta_i[I] instead), the k-vector clipped to C
again before the noise. The server releases the mean
(sum_i x_i + N(0, (z C)^2 I_k)) / S, scattered back into zeros in the
value's structure (times d/k with `rescale`).

See docs/papers/dp_randagg.md for the paper's reading and derivations.
"""

import collections
from typing import Optional

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp.aggregators import _tff_private
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import mf_strategy
from tff_dp.aggregators import weighting


CLIP_SCOPES = ('update', 'payload')


def check_clip_scope(clip_scope: str) -> None:
  """Raises ValueError unless `clip_scope` is one of `CLIP_SCOPES`."""
  if clip_scope not in CLIP_SCOPES:
    raise ValueError(
      f'clip_scope must be one of {CLIP_SCOPES}. Found {clip_scope!r}.'
    )


def _check_coordinates(num_coordinates, fraction, fixed_indices):
  """Checks how k is set; returns the distinct sorted `fixed_indices`."""
  if (num_coordinates is None) == (fraction is None):
    raise ValueError('Set exactly one of num_coordinates and fraction.')
  if num_coordinates is not None and (
    not isinstance(num_coordinates, (int, np.integer)) or num_coordinates < 1
  ):
    raise ValueError(
      'num_coordinates must be an integer >= 1. Found ' f'{num_coordinates!r}.'
    )
  if fraction is not None and not (
    isinstance(fraction, (int, float)) and 0 < fraction <= 1
  ):
    raise ValueError(f'fraction must be in (0, 1]. Found {fraction!r}.')
  if fixed_indices is None:
    return None
  fixed_indices = np.unique(np.asarray(fixed_indices, np.int64))
  if num_coordinates != len(fixed_indices):
    raise ValueError(
      'num_coordinates must equal the number of distinct '
      f'fixed_indices ({len(fixed_indices)}). Found '
      f'{num_coordinates!r}.'
    )
  return fixed_indices


def _check_dp_args(noise_multiplier, clients_per_round, clip) -> None:
  """Checks the DP arguments: z and C both numbers, or both None."""
  if (noise_multiplier is None) != (clip is None):
    raise ValueError(
      'noise_multiplier and clip must both be None (non-private mean, no '
      'clip) or both be numbers. Found noise_multiplier='
      f'{noise_multiplier!r}, clip={clip!r}.'
    )
  # The checks of the DP query (`dp_fedavg.gaussian_fixed`), in its order.
  if noise_multiplier is not None:
    dp_fedavg._check('noise_multiplier', noise_multiplier, positive=False)
  dp_fedavg._check('clients_per_round', clients_per_round, positive=True)
  if clip is not None:
    dp_fedavg._check('clip', clip, positive=True)


def _check_fixed_within(fixed: Optional[np.ndarray], dim: int) -> None:
  if fixed is not None and (fixed.min() < 0 or fixed.max() >= dim):
    raise ValueError(
      f'fixed_indices must be in [0, {dim - 1}]. Found '
      f'[{fixed.min()}, {fixed.max()}].'
    )


def _flat_spec(value_type):
  return _tff_private.flat_float_specs(value_type, 'DP-RandAgg')


def initial_coordinate_seed(seed: int) -> np.ndarray:
  """The coordinate sampler's first state (public)."""
  return np.array([int(seed), 1], np.int64)


def draw_random_coordinates(round_seed: tf.Tensor, dim: int, k: int):
  """`(sorted k of dim coordinates, next round's seed)`, stateless.

  The aggregator draws its coordinates with this; FL-BASIC's client work
  runs the same chain from the same seed, so both pick the same k.
  """
  seeds = tf.random.experimental.stateless_split(round_seed, num=2)
  scores = tf.random.stateless_uniform([dim], seed=seeds[0])
  _, indices = tf.math.top_k(scores, k=k, sorted=False)
  return tf.sort(indices), seeds[1]


def _coordinate_sampler(seed: int, fixed, dim: int, k: int):
  """Server: the sampler's first seed and each round's k coordinates."""

  @tff.tensorflow.computation
  def initial_seed():
    return tf.constant(initial_coordinate_seed(seed))

  seed_type = initial_seed.type_signature.result
  _check_fixed_within(fixed, dim)

  @tff.tensorflow.computation(seed_type)
  def draw_coordinates(round_seed):
    if fixed is not None:
      seeds = tf.random.experimental.stateless_split(round_seed, num=2)
      return tf.constant(fixed, tf.int32), seeds[1]
    return draw_random_coordinates(round_seed, dim, k)

  return initial_seed, draw_coordinates


def _encoder(value_type, indices_type, update_clip: Optional[float]):
  """Client: the update (clipped whole to `update_clip` if set) at the k
  coordinates."""

  @tff.tensorflow.computation(value_type, indices_type)
  def encode(value, indices):
    flat = tf.concat(
      [
        tf.reshape(tf.cast(v, tf.float32), [-1]) for v in tf.nest.flatten(value)
      ],
      axis=0,
    )
    if update_clip is not None:
      flat = flat * tf.minimum(
        1.0, update_clip / tf.maximum(tf.norm(flat), 1e-30)
      )
    return tf.gather(flat, indices)

  return encode


def _decoder(specs, flat_specs, sizes, k_type, indices_type, scale: float):
  """Server: the k-dim mean (times `scale`) scattered into the value."""
  dim = sum(sizes)

  @tff.tensorflow.computation(k_type, indices_type)
  def decode(values, indices):
    dense = tf.scatter_nd(indices[:, None], values * scale, [dim])
    parts = tf.split(dense, sizes)
    tensors = [
      tf.cast(tf.reshape(p, s.shape), s.dtype)
      for p, s in zip(parts, flat_specs)
    ]
    return tf.nest.pack_sequence_as(specs, tensors)

  return decode


def _process(value_type, inner, initial_seed, draw, encode, decode, k: int):
  """The round: coordinates, payloads, the DP sum, the result, the release."""

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(
      collections.OrderedDict(
        seed=tff.federated_eval(initial_seed, tff.SERVER),
        dp=inner.initialize(),
      )
    )

  @tff.federated_computation(
    init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS)
  )
  def next_fn(state, value):
    indices, next_seed = tff.federated_map(draw, state.seed)
    client_indices = tff.federated_broadcast(indices)
    payload = tff.federated_map(encode, (value, client_indices))
    out = inner.next(state.dp, payload)
    result = tff.federated_map(decode, (out.result, indices))
    new_state = tff.federated_zip(
      collections.OrderedDict(seed=next_seed, dp=out.state)
    )
    measurements = tff.federated_zip(
      collections.OrderedDict(
        dp=out.measurements,
        num_coordinates=tff.federated_value(k, tff.SERVER),
      )
    )
    return tff.templates.MeasuredProcessOutput(new_state, result, measurements)

  return tff.templates.AggregationProcess(init_fn, next_fn)


class DPRandAggFactory(
  tff.aggregators.UnweightedAggregationFactory, weighting.Weightable
):
  """DP-RandAgg (private) or the random-k mean (non-private), unweighted.

  The value is a structure of float tensors with d scalars in all,
  flattened. Each round the server draws k of the d coordinates, I (the
  top-k of a stateless uniform draw, from the public `seed` kept in the
  state and advanced every round; or the same `fixed_indices` every
  round), and broadcasts them. A client sends the k float32 values of its
  update at I:
    * private, `clip_scope='update'`: of its update clipped whole to L2
      norm C (`clip`);
    * private, `clip_scope='payload'`: of its update as is;
    * non-private: of its update as is (no clip).
  Private: the k-vector is clipped to C (the guarded clip of `dp_queries`;
  which the 'update' clip already meets), summed (with `secure_sum`,
  `tff.aggregators.SecureSumFactory` of bounds +-C), noised with
  N(0, (z C)^2) on every coordinate and divided by `clients_per_round`
  (`dp_fedavg.gaussian_fixed`, noise from `noise_seed`). Non-private: the
  mean over the participants (`tff.aggregators.UnweightedMeanFactory`).

  Released: the k-dim (noisy) mean. The result, that mean (times d/k with
  `rescale`) at I and 0 elsewhere, in the value's own type, is
  post-processing of it and the public I.

  DP event (private): the `DPAggregatorState` (state `dp`) records
  `GaussianDpEvent(z)` (with `noise`, `MatrixFactorizationDpEvent(z,
  strategy)`), the round's event before sampling
  (`dp_events.released_event`). Neighbouring relation: add/remove-one
  client (one client's clipped k-vector added or removed), L2 sensitivity
  C (replace-one, for fixed-size cohorts: 2 C, which `tff_dp.privacy`
  applies). The non-private mean releases no event.

  State: `OrderedDict(seed=..., dp=...)`: the coordinate sampler's
  stateless int64 seed and the inner process's state.

  Measurements (`OrderedDict`):
    * `dp`: the inner process's measurements (private: the DP
      aggregator's `dp_query_metrics` and `dp`, the inner sum's;
      non-private: the mean's `mean_value` and `mean_count`);
    * `num_coordinates`: k.

  Legacy switch: `clip_scope='payload'` is what the 30-round DP-RandAgg
  rows of benchmarks/results/seed001_iid.md and seed001_5labels.md (ranks
  1-16, no `_180` or `_smoke` suffix) and the `dp_randagg` row of
  benchmarks/results/method_cost.md were recorded with; FL-TOP-DP and
  FL-BASIC-DP (Kerkouche et al. 2021) use it, their updates being zero
  outside the K coordinates.

  Args:
    noise_multiplier: z, a finite number >= 0; None (with `clip` None) for
      the non-private mean over the participants.
    clients_per_round: The expected clients a round (the DP mean's
      denominator), a finite number > 0 (checked even when non-private).
    clip: C, a finite number > 0: the L2 clip of each client's whole
      update ('update') or of its k-vector ('payload'); the k-vector is
      clipped to it before the noise either way. None with
      `noise_multiplier` None.
    num_coordinates: k, an integer in [1, d] (d checked at `create`).
    fraction: k/d in (0, 1] (k = max(1, round(fraction d))), if
      `num_coordinates` is not given; exactly one of the two.
    seed: Seeds the coordinate sampler (public randomness).
    noise_seed: Seeds the noise: None (default) draws a secret; an int
      gives reproducible noise (keep it secret).
    rescale: Multiply the decoded coordinates by d/k (unbiased).
    secure_sum: Sum the k-vectors with `tff.aggregators.SecureSumFactory`
      (bounds +-C, which a clipped vector's coordinates already meet).
    fixed_indices: If given, these flat coordinates (duplicates dropped,
      each in [0, d - 1], checked at `create`) every round instead of a
      fresh random draw (FL-TOP's server-chosen Top-K); `num_coordinates`
      must equal their number.
    clip_scope: One of `CLIP_SCOPES`: 'update' (the default) clips the
      whole update before its k coordinates are taken, as Guo et al.
      describe the baseline; 'payload' clips only the k-vector (the legacy
      rows above). Unused without a clip.
    noise: None (default): noise independent across rounds. An
      `mf_strategy.Strategy`: noise correlated across rounds (DP-MF, as
      `dp_fedavg.gaussian_fixed(noise=...)`); private only. With
      `fixed_indices` it streams in the k-dim space (the same coordinates
      every round); with random coordinates it streams in the d-dim space
      and each round releases its projection on the round's k
      coordinates (`correlated_noise.ProjectedCorrelatedGaussianSumQuery`).
      A coordinate is then released in about k/d of the rounds, so most of
      the rounds whose noise would cancel its noise are not released on
      it, and it keeps each round's larger per-round noise: at small k/d
      this is worse than independent noise (a warning says so; seed 001's
      `dp_randagg_r16_banded_mf_180` row and the projected column of
      `benchmarks/results/correlated_noise_plan.md` measure it). The round's
      event is then `correlated_noise.MatrixFactorizationDpEvent(z,
      strategy)`, accounted over the run by `tff_dp.privacy.correlated`.

  Raises:
    ValueError: At construction, on a bad argument, naming it and its
      allowed range; at `create`, if k > d or a fixed index is outside
      [0, d - 1].
    TypeError: At `create`, if the value has a non-float tensor.
  """

  def __init__(
    self,
    noise_multiplier: Optional[float],
    clients_per_round: float,
    clip: Optional[float],
    *,
    num_coordinates: Optional[int] = None,
    fraction: Optional[float] = None,
    seed: int = 0,
    noise_seed: dp_queries.NoiseSeed = None,
    rescale: bool = False,
    secure_sum: bool = True,
    fixed_indices: Optional[np.ndarray] = None,
    clip_scope: str = 'update',
    noise: Optional[mf_strategy.Strategy] = None,
  ):
    """Checks the arguments (k against d at `create`); see the class doc."""
    correlated_noise.check_noise(
      noise,
      private=noise_multiplier is not None,
      needs='a private DPRandAggFactory: pass noise_multiplier and clip',
    )
    self._noise = noise
    self._fixed_indices = _check_coordinates(
      num_coordinates, fraction, fixed_indices
    )
    check_clip_scope(clip_scope)
    self._clip_scope = clip_scope
    _check_dp_args(noise_multiplier, clients_per_round, clip)
    self._private = noise_multiplier is not None
    self._noise_multiplier = noise_multiplier
    self._clients_per_round = float(clients_per_round)
    self._clip = clip
    self._num_coordinates = num_coordinates
    self._fraction = fraction
    self._seed = int(seed)
    self._noise_seed = dp_queries.resolve_seed(noise_seed)
    self._rescale = bool(rescale)
    self._secure_sum = bool(secure_sum)

  def num_coordinates(self, dim: int) -> int:
    """k for a value of `dim` scalars; raises if k > dim."""
    k = (
      self._num_coordinates
      if self._num_coordinates is not None
      else max(1, int(round(self._fraction * dim)))
    )
    if k > dim:
      raise ValueError(
        f'num_coordinates must be in [1, {dim}] (the number '
        f'of scalars in the value). Found {k!r}.'
      )
    return int(k)

  def _inner_factory(
    self, dim: int, k: int
  ) -> tff.aggregators.UnweightedAggregationFactory:
    """The k-dim sum: DP-FedAvg's fixed-clip query (its noise correlated
    in the k-dim space for fixed coordinates, in the d-dim space for
    random ones), or the plain mean."""
    if not self._private:
      return tff.aggregators.UnweightedMeanFactory()
    record_aggregation_factory = (
      tff.aggregators.SecureSumFactory(self._clip, -self._clip)
      if self._secure_sum
      else None
    )
    if self._noise is not None and self._fixed_indices is None:
      if k < dim:
        logging.warning(
          'DP-RandAgg with correlated noise over random coordinates: a '
          'coordinate is released in about %.3g of the rounds (k/d = %d/%d),'
          ' so most of the noise built to cancel its noise is never '
          'released on it; at small k/d this is worse than independent '
          'noise. Pass fixed_indices to stream the noise in the k-dim '
          'space.',
          k / dim,
          k,
          dim,
        )
      query = correlated_noise.ProjectedCorrelatedGaussianSumQuery(
        self._clip,
        self._clip * self._noise_multiplier,
        self._noise,
        dim=dim,
        coordinate_seed=initial_coordinate_seed(self._seed),
        draw_coordinates=lambda s: draw_random_coordinates(s, dim, k),
        seed=self._noise_seed,
      )
      return dp_fedavg.DPFactory(
        tfp.NormalizedQuery(query, denominator=self._clients_per_round),
        record_aggregation_factory,
      )
    return dp_fedavg.gaussian_fixed(
      self._noise_multiplier,
      self._clients_per_round,
      self._clip,
      noise_seed=self._noise_seed,
      noise=self._noise,
      record_aggregation_factory=record_aggregation_factory,
    )

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, flat_specs, sizes = _flat_spec(value_type)
    dim = sum(sizes)
    k = self.num_coordinates(dim)
    k_type = tff.TensorType(np.float32, [k])
    inner = self._inner_factory(dim, k).create(k_type)
    scale = dim / k if self._rescale else 1.0
    # The whole update's clip ('update' scope); the k-vector's own clip
    # stays in the DP sum's query.
    update_clip = (
      self._clip if self._private and self._clip_scope == 'update' else None
    )
    initial_seed, draw = _coordinate_sampler(
      self._seed, self._fixed_indices, dim, k
    )
    indices_type = draw.type_signature.result[0]
    encode = _encoder(value_type, indices_type, update_clip)
    decode = _decoder(specs, flat_specs, sizes, k_type, indices_type, scale)
    return _process(value_type, inner, initial_seed, draw, encode, decode, k)


def upload_bytes(num_coordinates: int) -> int:
  """Each client uploads the k float32 values."""
  return 4 * int(num_coordinates)


def fraction_for_rank(rank: int, layer_shapes) -> float:
  """k/d matching CMP-Fed's rank-r payload r(m+n) summed over layers.

  Guo et al. give DP-RandAgg the compression ratio r(m+n)/(mn) of CMP-Fed;
  `layer_shapes` are the (m, n) matrix shapes of the weight tensors.
  """
  k = sum(rank * (m + n) for m, n in layer_shapes)
  d = sum(m * n for m, n in layer_shapes)
  return min(1.0, k / d) if d else 1.0
