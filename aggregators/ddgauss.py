"""DDGauss: the distributed discrete Gaussian mean (Kairouz et al. 2021).

Each client rotates its update (randomized DFT), clips it to L2 norm C,
scales it by s, rounds it to integers and adds a discrete Gaussian share of
integer scale sigma = ceil(s z C / sqrt(h)), h = min_clients - 1; the
integers are secure-summed modulo 2^bits when at least `min_clients` take
part (else every client sends zeros), and the server unscales, unrotates and
divides by the expected cohort. Each round records
`DiscreteGaussianSumDpEvent`: RDP alpha c^2 / 2, c = Delta_2 / (sqrt(h)
sigma) + sqrt(d) tau_h. The contract is `_DDGaussMeanFactory`'s docstring.
See docs/papers/ddgauss.md for the paper's reading and derivations.
"""

import collections
import math
import numbers
from typing import Any, Mapping, NamedTuple, Optional

from absl import logging
import attr
import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp.aggregators import _tff_private
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import weighting

DEFAULT_BETA = math.exp(-0.5)
DEFAULT_MODCLIP_PROB = 1e-4


def tau(local_stddev: float, num_clients: int) -> float:
  """Kairouz et al.'s tau for n discrete Gaussians of stddev sigma."""
  k = np.arange(1, max(int(num_clients), 1))
  return float(
    10.0
    * np.sum(np.exp(-2.0 * np.pi**2 * float(local_stddev) ** 2 * k / (k + 1.0)))
  )


def effective_noise_multiplier(
  l2_sensitivity: float, local_stddev: float, num_clients: int, dim: int
) -> float:
  """1 / c, c = Delta_2 / (sqrt(n) sigma) + sqrt(d) tau_n (the event's c).

  The RDP curve of the sum of `num_clients` discrete Gaussians is
  alpha c^2 / 2, a Gaussian mechanism's curve at this multiplier; its
  amplification by subsampling is not the Gaussian's (see
  `DiscreteGaussianSumDpEvent`).

  Args:
    l2_sensitivity: Scaled, inflated L2 norm bound of one client's integer
      vector (Delta_2).
    local_stddev: Each client's discrete Gaussian stddev (integer domain).
    num_clients: Noise shares counted in the sum, >= 1.
    dim: Dimension of the (padded) vector.

  Returns:
    The noise multiplier whose Gaussian RDP curve equals the sum's.

  Raises:
    ValueError: If `num_clients` < 1 or a scale is not positive.
  """
  if num_clients < 1:
    raise ValueError(f'num_clients must be >= 1. Found {num_clients!r}.')
  if not (l2_sensitivity > 0 and local_stddev > 0):
    raise ValueError(
      'l2_sensitivity and local_stddev must be > 0. Found '
      f'{l2_sensitivity!r}, {local_stddev!r}.'
    )
  l2_scale = l2_sensitivity / (math.sqrt(num_clients) * local_stddev)
  return 1.0 / (l2_scale + math.sqrt(dim) * tau(local_stddev, num_clients))


def _positive_finite(name):
  def check(unused_instance, unused_attribute, value):
    if isinstance(value, bool) or not (
      isinstance(value, numbers.Real) and math.isfinite(value) and value > 0
    ):
      raise ValueError(f'{name} must be a finite number > 0. Found {value!r}.')

  return check


def _finite_at_least(name, lower):
  def check(unused_instance, unused_attribute, value):
    if isinstance(value, bool) or not (
      isinstance(value, numbers.Real)
      and math.isfinite(value)
      and value >= lower
    ):
      raise ValueError(
        f'{name} must be a finite number >= {lower}. Found {value!r}.'
      )

  return check


def _positive_int(name):
  def check(unused_instance, unused_attribute, value):
    if (
      isinstance(value, bool)
      or not isinstance(value, numbers.Integral)
      or value < 1
    ):
      raise ValueError(f'{name} must be an integer >= 1. Found {value!r}.')

  return check


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DiscreteGaussianSumDpEvent(dp_accounting.DpEvent):
  """A sum of discrete Gaussian noise shares added to integer vectors.

  The release is sum_i v_i + sum_{k=1}^{num_shares} N_Z(0, sigma^2 I_dim)
  (further data-independent noise may be added: post-processing), where one
  individual moves sum_i v_i by at most `l2_sensitivity` in L2 norm under
  the neighbouring relation the event is accounted under. Kairouz et al.
  2021 (Prop. 14 / Eq. 17) bound its Renyi divergence at every order
  alpha >= 1 by
      eps(alpha) = alpha / 2 * c^2,
      c = l2_sensitivity / (sqrt(num_shares) sigma) + sqrt(dim) tau,
      tau = 10 sum_{k=1}^{num_shares - 1} exp(-2 pi^2 sigma^2 k / (k + 1))
  (the third of the proposition's three bounds; the other two differ only
  in how tau enters, and tau < 1e-100 for every sigma >= 5, while
  DDGauss's integer scales are in the thousands). The theorem assumes
  sigma >= 1/2. This curve is all the theorem gives: it is an upper bound,
  not the divergence itself, so accountants may only use generic
  (curve-based) amplification and conversion results, and there is no PLD.

  Attributes:
    l2_sensitivity: Delta_2, in the integer domain.
    local_stddev: sigma, the integer scale of each share, >= 1/2.
    num_shares: h, the shares counted (>= 1).
    dim: d, the vector's dimension.
  """

  l2_sensitivity: float = attr.ib(validator=_positive_finite('l2_sensitivity'))
  local_stddev: float = attr.ib(validator=_finite_at_least('local_stddev', 0.5))
  num_shares: int = attr.ib(validator=_positive_int('num_shares'))
  dim: int = attr.ib(validator=_positive_int('dim'))

  def rdp_coefficient(self) -> float:
    """c^2: the curve is eps(alpha) = alpha c^2 / 2."""
    return (
      1.0
      / effective_noise_multiplier(
        self.l2_sensitivity, self.local_stddev, self.num_shares, self.dim
      )
      ** 2
    )

  def rdp(self, orders) -> np.ndarray:
    """eps(alpha) of the unsampled release at each order (>= 1)."""
    return np.asarray(orders, np.float64) * self.rdp_coefficient() / 2.0

  def with_sensitivity_scaled(self, factor: float):
    """The event with Delta_2 times `factor` (e.g. 2 for replace-one)."""
    return attr.evolve(self, l2_sensitivity=self.l2_sensitivity * factor)


def _check_min_clients(min_clients: Any, expected_clients: float) -> int:
  """`min_clients` as an int, or ValueError naming its allowed range."""
  upper = math.floor(expected_clients)
  if (
    isinstance(min_clients, bool)
    or not isinstance(min_clients, numbers.Integral)
    or not 2 <= min_clients <= upper
  ):
    raise ValueError(
      f'min_clients must be an integer in [2, {upper}] (at least one noise '
      'share besides the target client, at most the expected cohort '
      f'{expected_clients!r}). Found {min_clients!r}.'
    )
  return int(min_clients)


def honest_shares(min_clients: int) -> int:
  """Noise shares the accounting counts: h = min_clients - 1.

  Only the shares of participants other than the target are counted; the
  rest are data-independent noise (`_DDGaussMeanFactory`'s DP event).
  """
  return int(min_clients) - 1


def binomial_min_clients(
  num_clients: int, rate: float, withhold_prob: float = 0.01
) -> int:
  """A `min_clients` for Poisson sampling: a low quantile of the cohort.

  The largest k such that a Binomial(num_clients, rate) cohort has fewer
  than k clients with probability at most `withhold_prob`, i.e. the
  fraction of rounds the gate withholds is at most `withhold_prob`.

  Args:
    num_clients: Population size N, an integer >= 1.
    rate: Poisson sampling probability q, in (0, 1].
    withhold_prob: Largest acceptable probability of withholding a round,
      in (0, 1).

  Returns:
    k, an integer >= 2.

  Raises:
    ValueError: On a bad argument, or if k < 2 (the cohort is too small
      for DDGauss at this `withhold_prob`).
  """
  if (
    isinstance(num_clients, bool)
    or not isinstance(num_clients, numbers.Integral)
    or num_clients < 1
  ):
    raise ValueError(
      f'num_clients must be an integer >= 1. Found {num_clients!r}.'
    )
  if not 0 < rate <= 1:
    raise ValueError(f'rate must be in (0, 1]. Found {rate!r}.')
  if not 0 < withhold_prob < 1:
    raise ValueError(
      f'withhold_prob must be in (0, 1). Found {withhold_prob!r}.'
    )
  n = int(num_clients)
  if rate == 1:
    k = n
  else:
    log_q, log_p = math.log(rate), math.log1p(-rate)
    below, k = 0.0, 0  # below = P(cohort < k).
    while k < n:
      log_pmf = (
        math.lgamma(n + 1)
        - math.lgamma(k + 1)
        - math.lgamma(n - k + 1)
        + k * log_q
        + (n - k) * log_p
      )
      if below + math.exp(log_pmf) > withhold_prob:
        break
      below += math.exp(log_pmf)
      k += 1
  if k < 2:
    raise ValueError(
      f'A Binomial({n}, {rate!r}) cohort is below 2 clients with '
      f'probability > withhold_prob = {withhold_prob!r}: DDGauss needs '
      'min_clients >= 2. Raise the sampling rate or withhold_prob.'
    )
  return k


def _round_event(
  l2_sensitivity: float, local_stddev: float, min_clients: int, dim: int
) -> dp_accounting.DpEvent:
  if local_stddev == 0:
    return dp_accounting.NonPrivateDpEvent()
  return DiscreteGaussianSumDpEvent(
    l2_sensitivity=float(l2_sensitivity),
    local_stddev=float(local_stddev),
    num_shares=honest_shares(min_clients),
    dim=int(dim),
  )


def round_event_from_measurements(
  measurements: Mapping[str, Any],
) -> dp_accounting.DpEvent:
  """The round's DpEvent from the measurements of `ddgauss_mean`.

  `DiscreteGaussianSumDpEvent` of h = min_clients - 1 shares with the
  noise scale, sensitivity and dimension that ran; the same for every
  round, released or withheld, whatever the realised participant count
  (`actual_num_clients` is not read).

  Args:
    measurements: The aggregator's measurements (`min_clients`,
      `scaled_local_stddev`, `scaled_inflated_l2`, `padded_dim`).

  Returns:
    The round's (unsampled, add/remove-one) event; `NonPrivateDpEvent`
    without noise.

  Raises:
    ValueError: If `measurements` lacks `min_clients` (not from
      `ddgauss_mean`) or it is below 2.
  """
  if 'min_clients' not in measurements:
    raise ValueError(
      'DDGauss measurements must hold min_clients (the public cohort lower '
      'bound of ddgauss_mean). Found keys '
      f'{sorted(measurements)!r}.'
    )
  min_clients = int(measurements['min_clients'])
  if min_clients < 2:
    raise ValueError(f'min_clients must be >= 2. Found {min_clients!r}.')
  # The sampler draws with an integer scale (ceil: a no-op on what
  # `ddgauss_mean` reports, which is already the integer it used).
  return _round_event(
    float(measurements['scaled_inflated_l2']),
    math.ceil(float(measurements['scaled_local_stddev'])),
    min_clients,
    int(measurements['padded_dim']),
  )


class _Parameters(NamedTuple):
  """What one round of `ddgauss_mean` runs with (integer domain)."""

  padded_dim: int
  scale: float
  local_stddev: int  # sigma, the sampler's integer scale.
  l2_sensitivity: float  # Delta_2, TFF's scaled inflated bound + leeway.


def _heuristic_clients(expected_clients: float) -> int:
  """The cohort TFF's scale heuristic (modular headroom) is sized for."""
  return max(int(round(expected_clients)), 1)


def _parameters(
  noise_multiplier: float,
  clip: float,
  expected_clients: float,
  dim: int,
  bits: int,
  min_clients: int,
  beta: float,
  modclip_prob: float,
) -> _Parameters:
  """TFF's parameter choice for a local stddev of z clip / sqrt(h)."""
  ddp = _tff_private.distributed_dp_module()
  padded_dim = math.ceil(max(int(dim), 1) / 2.0) * 2  # DFT pads to even.
  local_stddev = noise_multiplier * clip / math.sqrt(honest_shares(min_clients))
  k_stddevs = ddp._clip_prob_to_num_stddevs(modclip_prob)  # pylint: disable=protected-access
  scale = float(
    ddp._heuristic_scale_factor(  # pylint: disable=protected-access
      local_stddev,
      clip,
      bits,
      _heuristic_clients(expected_clients),
      padded_dim,
      k_stddevs,
    ).numpy()
  )
  scale = min(scale, ddp.MAX_SCALE_FACTOR)
  if scale <= 1:
    logging.warning(
      'DDGauss scale factor %s <= 1: large quantization error. Raise bits '
      '(%d) or lower the expected cohort (%s).',
      scale,
      bits,
      expected_clients,
    )
  inflated = _tff_private.inflated_l2_norm_bound(
    clip, 1.0 / scale, beta, padded_dim
  )
  # TFF's leeway for float32 error in the norm check before noising.
  sensitivity = (inflated + 1e-5) * scale
  return _Parameters(
    padded_dim, scale, math.ceil(local_stddev * scale), sensitivity
  )


def planned_round_event(
  noise_multiplier: float,
  clip: float,
  expected_clients: float,
  dim: int,
  bits: int,
  *,
  min_clients: int,
  beta: float = DEFAULT_BETA,
  modclip_prob: float = DEFAULT_MODCLIP_PROB,
) -> dp_accounting.DpEvent:
  """The event every round of `ddgauss_mean` with these arguments records.

  Computes the parameters `ddgauss_mean` runs with (scale factor, inflated
  norm bound, padded dimension), so that noise can be calibrated to a
  target epsilon before training; equals `round_event_from_measurements`
  of what runs.

  Args:
    noise_multiplier: Target noise multiplier z, >= 0.
    clip: L2 clip of each update, > 0.
    expected_clients: Expected cohort (sizes the modular headroom).
    dim: Number of model parameters (before DFT padding).
    bits: Bit width of the modular secure sum.
    min_clients: Public cohort lower bound, an integer in [2, floor(
      expected_clients)]; h = min_clients - 1 shares are counted.
    beta: Conditional rounding parameter.
    modclip_prob: Target probability of modular wrap-around.

  Returns:
    `DiscreteGaussianSumDpEvent`, or `NonPrivateDpEvent` if
    `noise_multiplier` is 0.

  Raises:
    ValueError: If `min_clients` or `noise_multiplier` is out of range.
  """
  min_clients = _check_min_clients(min_clients, expected_clients)
  if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
    raise ValueError(
      'noise_multiplier must be a finite number >= 0. Found '
      f'{noise_multiplier!r}.'
    )
  if noise_multiplier == 0:
    return dp_accounting.NonPrivateDpEvent()
  p = _parameters(
    noise_multiplier,
    clip,
    expected_clients,
    dim,
    bits,
    min_clients,
    beta,
    modclip_prob,
  )
  return _round_event(
    p.l2_sensitivity, p.local_stddev, min_clients, p.padded_dim
  )


PROTOBUF_ENV = 'PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION'


def protobuf_supports_ddgauss() -> bool:
  """Whether this process's protobuf can hold a DDGauss learning process.

  TFF 0.87 nests the DDGauss pipeline (rotation, clipping, rounding, DP,
  modular clipping, secure sum) so deeply that, inside a learning process
  and after the test context lowers secure sum, its computation proto is
  deeper than protobuf's upb backend parses (100 levels): execution fails
  with `DecodeError: Error parsing message`. TFF's own
  `tff.learning.ddp_secure_aggregator` fails the same way (with
  protobuf 4.25). The pure-Python backend has no such limit: set
  `PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python` before TensorFlow is
  imported (`python -m tff_dp.run --method=ddgauss` does so itself). It
  makes computation building slower (about 1.5 min more per run here).
  """
  from google.protobuf.internal import api_implementation  # pylint: disable=g-import-not-at-top

  return api_implementation.Type() == 'python'


def sample_discrete_gaussian(scale, shape, seed) -> tf.Tensor:
  """Stateless draws from the discrete Gaussian N_Z(0, scale^2), int64.

  Canonne, Kamath, Steinke 2020 (https://arxiv.org/abs/2004.00010), as
  tensorflow-privacy vectorizes it (discrete Laplace proposals of scale
  `scale`, accepted with probability exp(-(|y| - scale)^2 / (2 scale^2)))
  but with every uniform drawn statelessly from `seed` (one fold per
  rejection pass), so the draws are a function of the seed alone.

  Args:
    scale: Integer scale >= 1 (int64 scalar tensor).
    shape: Output shape.
    seed: int64 `[2]` stateless seed.

  Returns:
    An int64 tensor of `shape`.
  """
  scale = tf.cast(scale, tf.int64)
  t = tf.cast(scale, tf.float64)
  n = tf.cast(tf.reduce_prod(shape), tf.int64)

  def geometric(uniform):
    # Failures before the first success at p = 1 - exp(-1 / t): inverse
    # CDF floor(log(U) / log(1 - p)), U in (0, 1].
    return tf.cast(tf.floor(-t * tf.math.log1p(-uniform)), tf.int64)

  def body(i, result):
    draws = tf.maximum(
      tf.cast(
        1.5 * tf.cast(n - tf.size(result, tf.int64), tf.float64), tf.int64
      ),
      1000,
    )
    seeds = tf.random.experimental.stateless_split(
      tf.random.experimental.stateless_fold_in(seed, i), num=3
    )
    u = [
      tf.random.stateless_uniform([draws], seed=s, dtype=tf.float64)
      for s in tf.unstack(seeds)
    ]
    y = geometric(u[0]) - geometric(u[1])
    d = tf.cast(tf.abs(y) - scale, tf.float64)
    accept = u[2] < tf.exp(-(d * d) / (2.0 * t * t))
    return i + 1, tf.concat([result, tf.boolean_mask(y, accept)], 0)

  _, result = tf.while_loop(
    lambda i, result: tf.size(result, tf.int64) < n,
    body,
    (tf.constant(0, tf.int64), tf.zeros([0], tf.int64)),
    shape_invariants=(tf.TensorShape([]), tf.TensorShape([None])),
  )
  return tf.reshape(result[:n], shape)


# The client's OS entropy source, read inside its computation.
OS_ENTROPY_FILE = '/dev/urandom'
_NONCE_LINES = 16  # About 4 KB of OS entropy (lines average 256 bytes).


def _client_nonce() -> tf.Tensor:
  """About 126 bits of the client's own randomness (distinct per client).

  Read from the OS (`OS_ENTROPY_FILE`) each time the client computation
  runs: 16 newline-separated chunks of /dev/urandom, joined and hashed by
  two keyed SipHashes (`tf.strings.to_hash_bucket_strong`) into two int64s
  of 63 bits each. TF's own random ops do not serve: an unseeded kernel
  draws its seed from one process-wide `std::mt19937_64` that TF seeds
  with 32 bits of `std::random_device`, so every nonce of a process would
  be a function of those 32 bits, and whoever holds the round seed could
  regenerate each client's noise in about 2^32 guesses.
  """
  lines = tf.data.TextLineDataset(OS_ENTROPY_FILE, buffer_size=4096)
  chunk = lines.take(_NONCE_LINES).reduce(
    tf.constant(''), lambda joined, line: joined + line
  )
  buckets = tf.int64.max
  return tf.stack(
    [
      tf.strings.to_hash_bucket_strong(chunk, buckets, [1, 2]),
      tf.strings.to_hash_bucket_strong(chunk, buckets, [3, 4]),
    ]
  )


class _SeededDiscreteGaussianSumQuery(tfp.SumAggregationDPQuery):
  """tensorflow-privacy's DDGauss query with stateless, per-client noise.

  As `tfp.DistributedDiscreteGaussianSumQuery`, except for the noise's
  randomness. Record: a client's int32 vector (structure), whose L2 norm
  must be at most `l2_norm_bound` (an assertion fails otherwise). Each
  client adds one discrete Gaussian share N_Z(0, local_stddev^2) to it
  (none at `local_stddev` 0), drawn statelessly from the round's seed
  folded with the client's own nonce (`_client_nonce`); the sum of the
  noised records is the release, and `get_noised_result` advances the
  seed. The DpEvent it returns is `UnsupportedDpEvent`: the factory
  accounts the round (`_DDGaussMeanFactory`).

  Args:
    l2_norm_bound: Delta_2, the bound on a record's L2 norm, > 0.
    local_stddev: The sampler's integer scale sigma, >= 0.
    seed: The initial int64 seed pair.
  """

  class _GlobalState(NamedTuple):
    """Broadcast to the clients as the sample params."""

    l2_norm_bound: tf.Tensor  # float32.
    local_stddev: tf.Tensor  # float32.
    seed: tf.Tensor  # int64 [2]: this round's seed.

  def __init__(
    self, l2_norm_bound: float, local_stddev: int, seed: tuple[int, int]
  ):
    self._l2_norm_bound = l2_norm_bound
    self._local_stddev = local_stddev
    self._seed = seed

  def initial_global_state(self):
    return self._GlobalState(
      tf.constant(self._l2_norm_bound, tf.float32),
      tf.constant(self._local_stddev, tf.float32),
      tf.constant(self._seed, tf.int64),
    )

  def derive_sample_params(self, global_state):
    return global_state

  def preprocess_record(self, params, record):
    flat = tf.nest.flatten(record)
    for v in flat:
      tf.debugging.assert_type(v, tf.int32)
    norm_check = tf.debugging.assert_less_equal(
      tf.linalg.global_norm([tf.cast(v, tf.float32) for v in flat]),
      params.l2_norm_bound,
      message='DDGauss: a client vector exceeds the L2 norm bound.',
    )
    nonce = _client_nonce()
    seed = tf.random.experimental.stateless_fold_in(params.seed, nonce[0])
    seed = tf.random.experimental.stateless_fold_in(seed, nonce[1])
    seeds = tf.random.experimental.stateless_split(seed, num=len(flat))
    scale = tf.cast(params.local_stddev, tf.int64)

    def noised():
      return [
        v + tf.cast(sample_discrete_gaussian(scale, tf.shape(v), s), v.dtype)
        for v, s in zip(flat, tf.unstack(seeds))
      ]

    with tf.control_dependencies([norm_check]):
      out = tf.cond(
        tf.equal(scale, 0), lambda: [tf.identity(v) for v in flat], noised
      )
    return tf.nest.pack_sequence_as(record, out)

  def get_noised_result(self, sample_state, global_state):
    next_seed = tf.random.experimental.stateless_split(global_state.seed, 1)[0]
    return (
      sample_state,
      global_state._replace(seed=next_seed),
      dp_accounting.UnsupportedDpEvent(),
    )


class _ThresholdSecureSumFactory(tff.aggregators.UnweightedAggregationFactory):
  """Secure sum with a threshold abort below `min_clients` participants.

  Secure-sums the participant count first, broadcasts whether it reaches
  `min_clients`, and below it has every client contribute zeros to TFF's
  `SecureSumFactory(upper, lower)`: the server then sees the count and a
  zero sum, nothing derived from the clients' values.
  """

  def __init__(self, min_clients: int, upper: int, lower: int):
    self._min_clients = int(min_clients)
    self._inner = tff.aggregators.SecureSumFactory(upper, lower)

  def create(self, value_type):
    inner = self._inner.create(value_type)
    min_clients = self._min_clients

    @tff.tensorflow.computation(np.int32)
    def decide(count):
      return count >= min_clients

    @tff.tensorflow.computation(value_type, np.bool_)
    def gate(value, released):
      return tf.nest.map_structure(
        lambda v: tf.where(released, v, tf.zeros_like(v)), value
      )

    @tff.federated_computation(
      inner.initialize.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      released = tff.federated_broadcast(
        tff.federated_map(decide, participant_count())
      )
      return inner.next(state, tff.federated_map(gate, (value, released)))

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


class _NothingSumFactory(tff.aggregators.UnweightedAggregationFactory):
  """Reads nothing from the clients; its result is zero at the server."""

  def create(self, value_type):
    @tff.tensorflow.computation
    def zeros():
      return tf.nest.map_structure(
        lambda s: tf.zeros(s.shape, s.dtype),
        tff.types.type_to_tf_tensor_specs(value_type),
      )

    @tff.federated_computation
    def init_fn():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
      init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS)
    )
    def next_fn(state, value):
      del value
      return tff.templates.MeasuredProcessOutput(
        state,
        tff.federated_eval(zeros, tff.SERVER),
        tff.federated_value((), tff.SERVER),
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


def participant_count():
  """The round's participant count at the server (secure sum of ones)."""
  return tff.federated_secure_sum_bitwidth(
    tff.federated_value(1, tff.CLIENTS), bitwidth=1
  )


class _Args(NamedTuple):
  """`ddgauss_mean`'s arguments, as `_check_mean_args` accepted them."""

  noise_multiplier: float
  clip: float
  expected_clients: float
  bits: int
  min_clients: int
  beta: float
  modclip_prob: float


def _check_mean_args(
  noise_multiplier: Any,
  expected_clients: Any,
  clip: Any,
  min_clients: Any,
  bits: Any,
  beta: Any,
  modclip_prob: Any,
) -> int:
  """`min_clients` as an int, or ValueError naming the bad argument."""
  if not math.isfinite(noise_multiplier) or noise_multiplier < 0:
    raise ValueError(
      'noise_multiplier must be a finite number >= 0. Found '
      f'{noise_multiplier!r}.'
    )
  if not expected_clients >= 2:
    raise ValueError(
      f'expected_clients_per_round must be >= 2. Found {expected_clients!r}.'
    )
  min_clients = _check_min_clients(min_clients, expected_clients)
  if not (math.isfinite(clip) and clip > 0):
    raise ValueError(f'clip must be a finite number > 0. Found {clip!r}.')
  if not isinstance(bits, int) or not 2 <= bits <= 22:
    raise ValueError(f'bits must be an integer in [2, 22]. Found {bits!r}.')
  if not 0 <= beta < 1:
    raise ValueError(f'beta must be in [0, 1). Found {beta!r}.')
  if not 0 < modclip_prob < 1:
    raise ValueError(f'modclip_prob must be in (0, 1). Found {modclip_prob!r}.')
  return min_clients


def _float_dim(value_type) -> int:
  """The number of entries of `value_type`, a structure of float tensors."""
  specs = tff.types.type_to_tf_tensor_specs(value_type)
  flat = tf.nest.flatten(specs)
  if not flat or not all(s.dtype.is_floating for s in flat):
    raise TypeError(
      f'ddgauss_mean needs a structure of float tensors. Found {value_type}.'
    )
  return sum(int(np.prod(s.shape.as_list())) for s in flat)


def _gated_mean(result_type, min_clients: int, denominator: float):
  """Server: the sum over the expected cohort, or zeros if withheld."""

  @tff.tensorflow.computation(result_type, np.int32)
  def mean(value, count):
    released = count >= min_clients
    return tf.nest.map_structure(
      lambda v: tf.where(released, v / denominator, tf.zeros_like(v)),
      value,
    )

  return mean


def _round_measurements(p: _Parameters, clip: float, min_clients: int):
  """Server: the round's measurements, from its participant count."""

  @tff.tensorflow.computation(np.int32)
  def measurements(count):
    return collections.OrderedDict(
      l2_clip=tf.constant(clip, tf.float32),
      scale_factor=tf.constant(p.scale, tf.float64),
      scaled_inflated_l2=tf.constant(p.l2_sensitivity, tf.float64),
      scaled_local_stddev=tf.constant(float(p.local_stddev), tf.float64),
      actual_num_clients=count,
      padded_dim=tf.constant(p.padded_dim, tf.int32),
      min_clients=tf.constant(min_clients, tf.int32),
      released=tf.cast(count >= min_clients, tf.int32),
    )

  return measurements


def _release(inner, value_type, mean, measurements):
  """The round: the gated noised sum, then its mean and measurements."""

  @tff.federated_computation(
    inner.initialize.type_signature.result,
    tff.FederatedType(value_type, tff.CLIENTS),
  )
  def next_fn(state, value):
    out = inner.next(state, value)
    count = participant_count()
    return tff.templates.MeasuredProcessOutput(
      state=out.state,
      result=tff.federated_map(mean, tff.federated_zip((out.result, count))),
      measurements=tff.federated_map(measurements, count),
    )

  return next_fn


class _DDGaussMeanFactory(
  tff.aggregators.UnweightedAggregationFactory, weighting.Weightable
):
  """The gated DDGauss mean of float client updates (build: `ddgauss_mean`).

  Client: flattens its update, pads it to the even length d, rotates it
  (TFF's randomized DFT, which keeps the L2 norm), clips it to L2 norm
  `clip`, scales it by the scale factor s, rounds it to int32 (conditional
  randomized rounding with `beta`), checks that the integer vector's L2
  norm is at most Delta_2, adds one discrete Gaussian share
  N_Z(0, sigma^2 I_d), sigma = ceil(s z clip / sqrt(h)), h = min_clients -
  1, drawn from the round's seed folded with a nonce of its own from OS
  entropy (`_client_nonce`; the server, which holds the seed, cannot
  regenerate it), and sends the result modulo 2^bits to a secure sum. The
  participant count n is secure-summed first: if n < `min_clients`, every
  client sends zeros instead (no update, no noise). Clipped-update counts
  are not aggregated.

  Server: sees only n and the modular sum; releases the sum unwrapped,
  unscaled, unrotated and divided by `expected_clients` (public), or zeros
  for a withheld round. A round of n participants carries n / h times the
  noise variance z asks for.

  DP event: every round, released or withheld,
  `DiscreteGaussianSumDpEvent(l2_sensitivity=Delta_2, local_stddev=sigma,
  num_shares=h, dim=d)` (`NonPrivateDpEvent` at z = 0), under
  add/remove-one: one client moves the integer sum by at most Delta_2, the
  scaled norm bound of a clipped, rounded update (TFF's inflated bound plus
  its float32 leeway, times s); only the h shares of participants other
  than the target are counted. Under replace-one (fixed-size sampling) the
  sensitivity is 2 Delta_2 (`tff_dp.privacy.replace_one_event`). The
  state's DP state holds an `UnsupportedDpEvent`, so the event is read
  from the measurements: `released_event(state, measurements)`, which
  `tff_dp.aggregators.dp_events.released_event(factory, state,
  measurements)`, the one documented reader of a round's event, calls. The
  guarantee assumes the h counted shares come from clients that follow the
  protocol, an honest-but-curious server, and, under Poisson sampling, a
  hidden n (`PrivacyLedger.assumptions`).

  State: TFF's nested distributed-DP states (the rotation seed, the
  discretization's scale and norm bound, and the `DPAggregatorState` whose
  query state holds `l2_norm_bound`, `local_stddev` and the noise `seed`,
  advanced every round).

  Measurements (`OrderedDict`, the inner pipeline's are not emitted):
    l2_clip: `clip` (float32).
    scale_factor: s (float64).
    scaled_inflated_l2: Delta_2, in the integer domain (float64).
    scaled_local_stddev: sigma, the sampler's integer scale (float64).
    actual_num_clients: n, the round's participant count (int32).
    padded_dim: d (int32).
    min_clients: The public cohort lower bound (int32).
    released: 1 if the round's sum was released, 0 if withheld (int32).

  Constructor arguments, as `ddgauss_mean` checks them: `noise_multiplier`
  z finite >= 0; `expected_clients` >= 2; `clip` finite > 0; `min_clients`
  an integer in [2, floor(expected_clients)]; `bits` an integer in [2, 22];
  `beta` in [0, 1); `modclip_prob` in (0, 1); `seed` an int64 pair.

  Raises (`create`):
    TypeError: If `value_type` is not a structure of float tensors.
  """

  def __init__(
    self,
    noise_multiplier: float,
    expected_clients: float,
    clip: float,
    min_clients: int,
    bits: int,
    beta: float,
    modclip_prob: float,
    seed: tuple[int, int],
  ):
    self._args = _Args(
      noise_multiplier=noise_multiplier,
      clip=clip,
      expected_clients=expected_clients,
      bits=bits,
      min_clients=min_clients,
      beta=beta,
      modclip_prob=modclip_prob,
    )
    self._seed = seed

  def released_event(self, state, measurements) -> dp_accounting.DpEvent:
    """The round's event (`dp_events.released_event`), from the noise
    that ran: `round_event_from_measurements(measurements)`."""
    del state
    return round_event_from_measurements(measurements)

  def _parameters(self, dim: int) -> _Parameters:
    a = self._args
    return _parameters(
      a.noise_multiplier,
      a.clip,
      a.expected_clients,
      dim,
      a.bits,
      a.min_clients,
      a.beta,
      a.modclip_prob,
    )

  def _sum_factory(self, p: _Parameters):
    """TFF's DDGauss nesting (`DistributedDpSumFactory`), gated and seeded."""
    clip, bits, beta = self._args.clip, self._args.bits, self._args.beta
    # Secure sum in [0, 2^b) inside modular clips to [0, 2^b) and to
    # [-2^(b-1), 2^(b-1)), as TFF's pipeline does.
    nested = _ThresholdSecureSumFactory(self._args.min_clients, 2**bits - 1, 0)
    nested = _tff_private.modular_clipping_sum_factory(0, 2**bits, nested)
    nested = _tff_private.modular_clipping_sum_factory(
      -(2 ** (bits - 1)), 2 ** (bits - 1), nested
    )
    nested = tff.aggregators.DifferentiallyPrivateFactory(
      _SeededDiscreteGaussianSumQuery(
        p.l2_sensitivity, p.local_stddev, self._seed
      ),
      nested,
    )
    nested = _tff_private.discretization_factory(
      nested, scale_factor=p.scale, beta=beta, prior_norm_bound=clip
    )
    nested = tff.aggregators.clipping_factory(
      clip, nested, clipped_count_sum_factory=_NothingSumFactory()
    )
    nested = tff.aggregators.DiscreteFourierTransformFactory(nested)
    return tff.aggregators.concat_factory(nested)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    p = self._parameters(_float_dim(value_type))
    inner = self._sum_factory(p).create(value_type)
    a = self._args
    result_type = inner.next.type_signature.result.result.member
    mean = _gated_mean(result_type, a.min_clients, a.expected_clients)
    measurements = _round_measurements(p, a.clip, a.min_clients)
    next_fn = _release(inner, value_type, mean, measurements)
    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def ddgauss_mean(
  noise_multiplier: float,
  expected_clients_per_round: float,
  clip: float,
  *,
  min_clients: int,
  bits: int = 20,
  beta: float = DEFAULT_BETA,
  modclip_prob: float = DEFAULT_MODCLIP_PROB,
  noise_seed: Optional[dp_queries.SeedLike] = None,
) -> tff.aggregators.UnweightedAggregationFactory:
  """DDGauss mean of client updates over the expected cohort.

  Each client's noise has integer scale ceil(scale * noise_multiplier *
  clip / sqrt(min_clients - 1)); the secure sum is divided by
  `expected_clients_per_round` (public), as DP-FedAvg does. A round with
  fewer than `min_clients` participants reveals only its count and releases
  a zero update. What a client sends, what is released, the DP event and
  the measurement keys are `_DDGaussMeanFactory`'s contract; read a round's
  event with `tff_dp.aggregators.dp_events.released_event(factory, state,
  measurements)` (it calls `round_event_from_measurements`). See
  `protobuf_supports_ddgauss` for the protobuf backend this needs inside a
  learning process.

  Args:
    noise_multiplier: Target noise multiplier z (central noise of
      `min_clients - 1` shares over clip), finite >= 0.
    expected_clients_per_round: Expected cohort (the mean's denominator and
      the cohort the modular headroom is sized for), >= 2.
    clip: L2 clip of each update, finite > 0.
    min_clients: Public lower bound on the cohort of a released round, an
      integer in [2, floor(expected_clients_per_round)]: the cohort size m
      under fixed-size sampling, a low quantile of the cohort under Poisson
      sampling (`binomial_min_clients`).
    bits: Bit width of the modular secure sum, an integer in [2, 22].
    beta: Conditional rounding parameter in [0, 1).
    modclip_prob: Target probability of modular wrap-around, in (0, 1).
    noise_seed: None (a secret 128-bit seed from the OS), or an int or a
      pair of ints in int64: the state's initial seed. Each client folds in
      a nonce of its own from OS entropy, which is what keeps its noise
      secret from the server, so a seed does not reproduce the noise.

  Returns:
    The aggregation factory (a `_DDGaussMeanFactory`; `.weighted()` for
    `build_weighted_fed_avg`).

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  min_clients = _check_mean_args(
    noise_multiplier,
    expected_clients_per_round,
    clip,
    min_clients,
    bits,
    beta,
    modclip_prob,
  )
  return _DDGaussMeanFactory(
    noise_multiplier,
    expected_clients_per_round,
    clip,
    min_clients,
    bits,
    beta,
    modclip_prob,
    dp_queries.resolve_seed(noise_seed),
  )
