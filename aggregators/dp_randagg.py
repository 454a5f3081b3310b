"""DP-RandAgg: shared random-k coordinates, clipped and noised (seed 001).

Guo, Hu, Gong, "Agent-Level Differentially Private Federated Learning via
Compressed Model Perturbation" (seed 001), Sec. V baseline, adapting
random-k sparsification (their ref. [29]) to secure aggregation: each round
the server draws k of the d coordinates from a seed kept in its state and
broadcasts them; every client sends only those k values of its update,
clipped to L2 norm `clip`; they are summed with secure sum, and Gaussian
noise N(0, (noise_multiplier * clip)^2) is added to the k-dim sum
(DP-FedAvg's query on the k-vector: clip what you noise). The aggregator
decodes inside: the noisy k-dim mean is scattered back into a zero vector of
the value's structure, so the result has the value's own type and the factory
drops into `tff.learning` algorithms like any unweighted aggregator.

What is clipped (`clip_scope`, one of `CLIP_SCOPES`):
- 'update' (default): the client's whole d-dim update is clipped to `clip`
  and then its k coordinates are sent. Seed 001 describes its baseline as
  "the local model update is perturbed by adding Gaussian noise drawn from
  the distribution N(0, sigma^2 I_d) and then sparsified using the random-k
  sparsification" (Sec. V), and picks every clip by "the median of the l2-norm
  of the subspace/embedding/model to be clipped" with "C = 1.0 for DP-FedAvg
  and DP-RandAgg": the clipped object is the model update. Its median norm
  in our seed-001 runs is 1.16-1.29, so the seed's C = 1 sits a little
  below it (0.93-0.99 of those updates were above 1). The k-vector of a clipped
  update has norm <= clip, so the k-vector clip after it (kept as the
  guard of what is noised) changes nothing and the DP event is the same.
- 'payload': only the k-vector is clipped to `clip` (runs before issue #24).
  At the same C this clips far less (a k-vector's norm is about
  sqrt(k/d) of the update's), so it is a stronger baseline at C = 1 only if
  C is re-tuned to the k-vector's median.
Seed 004's FL-TOP-DP and FL-BASIC-DP "clip and then noise the compressed
updates": they use 'payload' (their updates are zero outside the K
coordinates, so both scopes give the same clip there).

Reading chosen where the paper is silent: unselected coordinates are 0 and
kept coordinates are not rescaled by d/k (`rescale=True` gives the unbiased
d/k version). The k coordinates are drawn without replacement as the top-k
of a stateless uniform draw over the d coordinates.

Non-private use (`noise_multiplier=None, clip=None`): the k-vectors are
averaged over the round's participants with TFF's `UnweightedMeanFactory`,
with no clip and no noise. Seed 004's non-private FL-TOP and FL-BASIC run
this way: the client of seed 004's Alg. 1 outputs the compressed update
with no clip (line 24, "Output: Model update C(w_t^k - w_{t-1}^k, T)"), and
the paper clips only in the private versions (Alg. 3 line 25; "private
extensions (i.e., FL-STD-DP, FL-BASIC-DP and FL-CS-DP) also clip and then
noise the compressed updates").

Randomness: the coordinates are public (broadcast to every client) and
come from `seed`; the noise comes from `noise_seed`, a separate stream that
is secret by default (see `dp_fedavg.gaussian_fixed`).

State: `seed` (the coordinate sampler's stateless seed, advanced every
round) and `dp` (TFF's DPAggregatorState of the k-dim DP sum, whose
`dp_event` the privacy ledger reads). Measurements: `dp` (the inner DP
aggregator's) and `num_coordinates`.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import _tff_private
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import weighting


CLIP_SCOPES = ('update', 'payload')


def check_clip_scope(clip_scope: str) -> None:
  """Raises ValueError unless `clip_scope` is one of `CLIP_SCOPES`."""
  if clip_scope not in CLIP_SCOPES:
    raise ValueError(
      f'clip_scope must be one of {CLIP_SCOPES}. Found {clip_scope!r}.'
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


class DPRandAggFactory(
  tff.aggregators.UnweightedAggregationFactory, weighting.Weightable
):
  """DP-RandAgg aggregation factory (see module docstring)."""

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
  ):
    """Checks the arguments.

    Args:
      noise_multiplier: Noise stddev over clip, >= 0; None (with clip None)
        for the non-private mean over participants (no clip, no noise).
      clients_per_round: Expected clients per round (the DP mean's
        denominator), > 0.
      clip: L2 clip, > 0, of each client's whole update ('update' scope)
        or of its k-dim vector ('payload'); the k-vector is clipped to it
        before the noise either way. None with noise_multiplier None.
      num_coordinates: k, in [1, d] (checked against d at `create`).
      fraction: k/d in (0, 1], if `num_coordinates` is not given.
      seed: Seed of the coordinate sampler (public randomness).
      noise_seed: Seed of the noise: None (default) draws a secret one; an
        int gives reproducible noise (keep it secret).
      rescale: Multiply decoded coordinates by d/k (unbiased estimate).
      secure_sum: Sum the k-vectors with `tff.aggregators.SecureSumFactory`
        (bounds +-clip, which a clipped vector's coordinates already meet).
      fixed_indices: If given, these flat coordinates every round instead of
        a fresh random draw (FL-TOP's server-chosen Top-K); then
        `num_coordinates` must equal their number.
      clip_scope: 'update' clips the whole update to `clip` before its k
        coordinates are taken (seed 001's baseline); 'payload' clips only
        the k-vector (see the module docstring). Unused without a clip.

    Raises:
      ValueError: On a bad argument, naming it and its allowed range.
    """
    if (num_coordinates is None) == (fraction is None):
      raise ValueError('Set exactly one of num_coordinates and fraction.')
    if num_coordinates is not None and (
      not isinstance(num_coordinates, (int, np.integer)) or num_coordinates < 1
    ):
      raise ValueError(
        'num_coordinates must be an integer >= 1. Found '
        f'{num_coordinates!r}.'
      )
    if fraction is not None and not (
      isinstance(fraction, (int, float)) and 0 < fraction <= 1
    ):
      raise ValueError(f'fraction must be in (0, 1]. Found {fraction!r}.')
    if fixed_indices is not None:
      fixed_indices = np.unique(np.asarray(fixed_indices, np.int64))
      if num_coordinates != len(fixed_indices):
        raise ValueError(
          'num_coordinates must equal the number of distinct '
          f'fixed_indices ({len(fixed_indices)}). Found '
          f'{num_coordinates!r}.'
        )
    self._fixed_indices = fixed_indices
    check_clip_scope(clip_scope)
    self._clip_scope = clip_scope
    if (noise_multiplier is None) != (clip is None):
      raise ValueError(
        'noise_multiplier and clip must both be None (non-private mean, no '
        'clip) or both be numbers. Found noise_multiplier='
        f'{noise_multiplier!r}, clip={clip!r}.'
      )
    self._private = noise_multiplier is not None
    if self._private:
      # Validates noise_multiplier, clients_per_round and clip.
      dp_fedavg.gaussian_fixed(noise_multiplier, clients_per_round, clip)
    else:
      dp_fedavg.gaussian_fixed(0.0, clients_per_round, 1.0)
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

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, flat_specs, sizes = _flat_spec(value_type)
    dim = sum(sizes)
    k = self.num_coordinates(dim)
    k_type = tff.TensorType(np.float32, [k])
    if self._private:
      inner_factory = dp_fedavg.gaussian_fixed(
        self._noise_multiplier,
        self._clients_per_round,
        self._clip,
        noise_seed=self._noise_seed,
        record_aggregation_factory=(
          tff.aggregators.SecureSumFactory(self._clip, -self._clip)
          if self._secure_sum
          else None
        ),
      )
    else:
      inner_factory = tff.aggregators.UnweightedMeanFactory()
    inner = inner_factory.create(k_type)
    scale = dim / k if self._rescale else 1.0
    seed = self._seed
    # The whole update's clip ('update' scope); the k-vector's own clip
    # stays in the DP sum's query.
    update_clip = (
      self._clip if self._private and self._clip_scope == 'update' else None
    )

    @tff.tensorflow.computation
    def initial_seed():
      return tf.constant(initial_coordinate_seed(seed))

    seed_type = initial_seed.type_signature.result

    fixed = self._fixed_indices
    if fixed is not None and (fixed.min() < 0 or fixed.max() >= dim):
      raise ValueError(
        f'fixed_indices must be in [0, {dim - 1}]. Found '
        f'[{fixed.min()}, {fixed.max()}].'
      )

    @tff.tensorflow.computation(seed_type)
    def draw_coordinates(round_seed):
      if fixed is not None:
        seeds = tf.random.experimental.stateless_split(round_seed, num=2)
        return tf.constant(fixed, tf.int32), seeds[1]
      return draw_random_coordinates(round_seed, dim, k)

    indices_type = draw_coordinates.type_signature.result[0]

    @tff.tensorflow.computation(value_type, indices_type)
    def encode(value, indices):
      flat = tf.concat(
        [
          tf.reshape(tf.cast(v, tf.float32), [-1])
          for v in tf.nest.flatten(value)
        ],
        axis=0,
      )
      if update_clip is not None:
        flat = flat * tf.minimum(
          1.0, update_clip / tf.maximum(tf.norm(flat), 1e-30)
        )
      return tf.gather(flat, indices)

    @tff.tensorflow.computation(k_type, indices_type)
    def decode(values, indices):
      dense = tf.scatter_nd(indices[:, None], values * scale, [dim])
      parts = tf.split(dense, sizes)
      tensors = [
        tf.cast(tf.reshape(p, s.shape), s.dtype)
        for p, s in zip(parts, flat_specs)
      ]
      return tf.nest.pack_sequence_as(specs, tensors)

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
      indices, next_seed = tff.federated_map(draw_coordinates, state.seed)
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
      return tff.templates.MeasuredProcessOutput(
        new_state, result, measurements
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


def upload_bytes(num_coordinates: int) -> int:
  """Each client uploads the k float32 values."""
  return 4 * int(num_coordinates)


def fraction_for_rank(rank: int, layer_shapes) -> float:
  """k/d matching CMP-Fed's rank-r payload r(m+n) summed over layers.

  Seed 001 gives DP-RandAgg the compression ratio r(m+n)/(mn) of CMP-Fed;
  `layer_shapes` are the (m, n) matrix shapes of the weight tensors.
  """
  k = sum(rank * (m + n) for m, n in layer_shapes)
  d = sum(m * n for m, n in layer_shapes)
  return min(1.0, k / d) if d else 1.0
