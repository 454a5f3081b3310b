"""DDGauss: the distributed discrete Gaussian mechanism (Kairouz et al. 2021).

"The Distributed Discrete Gaussian Mechanism for Federated Learning with
Secure Aggregation", ICML 2021, https://arxiv.org/abs/2102.06387; seed 000's
secure-aggregation baseline. Each client clips its update to L2 norm `clip`,
rotates it (DFT), scales it by `scale`, rounds it to integers (conditional
randomized rounding, beta = exp(-0.5)), adds discrete Gaussian noise of
stddev `ceil(scale * noise_multiplier * clip / sqrt(min_clients - 1))`, and
the integers are summed modulo 2^bits with secure sum
(`tff.federated_secure_sum_bitwidth`). The server unscales, unrotates and
divides by the expected cohort. The mechanism is TFF's
`DistributedDpSumFactory(mechanism='distributed_dgauss')`; `ddgauss_mean`
adds the release gate below.

Accounting (TFF reports an `UnsupportedDpEvent` for it). For a sum of m
discrete Gaussian noise shares of integer stddev sigma, with scaled and
inflated L2 sensitivity Delta_2 (the norm bound of one client's integer
vector) and padded dimension d, Kairouz et al. (Prop. 14 / Eq. 17) bound
the Renyi divergence between the sum with and without one client's vector,
at every order alpha, by
    alpha / 2 * (Delta_2 / (sqrt(m) sigma) + sqrt(d) tau_m)^2,
    tau_m = 10 * sum_{k=1}^{m-1} exp(-2 pi^2 sigma^2 k / (k + 1)),
which is the RDP curve of a Gaussian mechanism with noise multiplier
    z_eff(m) = 1 / (Delta_2 / (sqrt(m) sigma) + sqrt(d) tau_m).

The per-round event does not depend on the realised cohort. With a public
lower bound `min_clients` on the cohort of every released round, each round
is recorded as `GaussianDpEvent(z_eff(h))`, h = min_clients - 1, whatever
the realised participant count n is, and local noise is calibrated so that
h shares give the requested multiplier (z_eff(h) is then slightly below it,
by the rounding's inflation of Delta_2). Exactly what this assumes:

1. What one event bounds. Fix a round's cohort of n participants, one of
   them the target client. The event bounds the divergence between the
   round's release when the target's vector is its clipped value and when
   it is zero (L2 distance <= Delta_2: the add/remove-one sensitivity of a
   single client's clipped vector; the ledger's sampling wrapper applies
   the sampler's neighbouring relation and amplification to it). Only h
   noise shares of participants other than the target are counted. The
   target's own share, and the shares of the n - 1 - h further
   participants, are independent of the target's vector and are added to
   the sum whatever it is: the round is the h-share mechanism followed by
   adding independent, data-independent noise, a post-processing of it.
   So `GaussianDpEvent(z_eff(h))` dominates every round with n >= h + 1 =
   min_clients (this uses post-processing, not monotonicity of z_eff in m,
   which does not hold in general). The target's own share is not counted,
   so the bound never relies on noise the target adds itself (under
   add/remove-one neighbouring that share leaves with the target); what
   the resulting change of the count reveals is item 3.
2. Every released round has n >= min_clients. The aggregator checks the
   participant count that secure sum reports and, for a round with fewer
   participants, releases a zero update instead of the sum (measurement
   `released` = 0). Fixed-size sampling of m clients: min_clients = m (a
   round is then withheld only if a sampled client does not take part).
   Poisson sampling with rate q over N clients: the user chooses
   min_clients, e.g. `binomial_min_clients(N, q, withhold_prob)`, the
   largest count that Binomial(N, q) falls below with probability at most
   `withhold_prob`; the expected cohort rounded down is not a safe choice
   (about half the rounds would be withheld).
3. The participant count n is treated as known to the adversary (the
   standard distributed-DP threat model): secure aggregation reveals it to
   the server, and the released sum's noise variance, n sigma^2 per
   coordinate, reveals it to anyone who sees the output. The decision to
   withhold depends only on n. The recorded event is the same for every n,
   so the ledger's epsilon after T rounds is the same function of T
   whatever cohorts were drawn. What is not accounted for: under Poisson
   sampling the count itself depends on whether the target was sampled
   (n = others + [target sampled]), while dp_accounting's Poisson-sampled
   event, which the ledger applies, assumes the sampled set stays hidden.
   The reported epsilon does not charge for what the count reveals about
   the target's participation. Under fixed-size sampling the count is m in
   every round and reveals nothing.
4. The h counted shares come from clients that follow the protocol (they
   add their noise and do not reveal it); the server is honest-but-curious
   and learns only the modular sum and the count.
5. A withheld round records the same event as a released one
   (conservative: it releases nothing about any client's vector, but
   charging it keeps the ledger independent of the realised counts).
6. Amplification by sampling is computed as for the dominating Gaussian
   (dp_accounting's subsampled-Gaussian RDP); the paper's own accountant
   instead takes the minimum of a generic subsampled-RDP bound and the
   unsampled bound.
7. Noise multiplier 0 adds no noise: the event is `NonPrivateDpEvent`.

Cost of the bound: a round with n participants carries n / h times the
noise variance that the multiplier asks for (n / h = m / (m - 1) under
fixed-size sampling; more under Poisson sampling, where min_clients is
well below the expected cohort).

Length: the module runs past ~500 lines because its docstrings (about 230
lines) hold the accounting derivation and its assumptions above, next to
the code they justify; the code itself is under 300 lines.
"""

import collections
import math
import numbers
from typing import Any, Mapping
import warnings

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import _tff_private
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
  """z_eff of the sum of `num_clients` discrete Gaussians (see module doc).

  Args:
    l2_sensitivity: Scaled, inflated L2 norm bound of one client's integer
      vector (Delta_2).
    local_stddev: Each client's discrete Gaussian stddev (integer domain).
    num_clients: Noise shares counted in the sum, >= 1.
    dim: Dimension of the (padded) vector.

  Returns:
    The noise multiplier of the dominating Gaussian mechanism.

  Raises:
    ValueError: If `num_clients` < 1 or a scale is not positive.
  """
  if num_clients < 1:
    raise ValueError(f'num_clients must be >= 1. Found {num_clients!r}.')
  if l2_sensitivity <= 0 or local_stddev <= 0:
    raise ValueError(
      'l2_sensitivity and local_stddev must be > 0. Found '
      f'{l2_sensitivity!r}, {local_stddev!r}.'
    )
  l2_scale = l2_sensitivity / (math.sqrt(num_clients) * local_stddev)
  return 1.0 / (l2_scale + math.sqrt(dim) * tau(local_stddev, num_clients))


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
  """Noise shares the accounting counts: h = min_clients - 1 (module doc)."""
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


def round_event_from_measurements(
  measurements: Mapping[str, Any],
) -> dp_accounting.DpEvent:
  """The round's DpEvent from the measurements of `ddgauss_mean`.

  `GaussianDpEvent(z_eff(min_clients - 1))` with the noise scale,
  sensitivity and dimension that ran; the same for every round, released or
  withheld, whatever the realised participant count (`actual_num_clients`
  is not read; see the module doc).

  Args:
    measurements: The aggregator's measurements (`min_clients`,
      `scaled_local_stddev`, `scaled_inflated_l2`, `padded_dim`).

  Returns:
    The round's (unsampled) event; `NonPrivateDpEvent` without noise.

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
  # The sampler draws with stddev rounded up to an integer.
  sigma = math.ceil(float(measurements['scaled_local_stddev']))
  if sigma == 0:
    return dp_accounting.NonPrivateDpEvent()
  return dp_accounting.GaussianDpEvent(
    effective_noise_multiplier(
      float(measurements['scaled_inflated_l2']),
      sigma,
      honest_shares(min_clients),
      int(measurements['padded_dim']),
    )
  )


def _heuristic_clients(expected_clients: float) -> int:
  """The cohort TFF's scale heuristic (modular headroom) is sized for."""
  return max(int(round(expected_clients)), 1)


def _tff_noise_multiplier(
  noise_multiplier: float, expected_clients: float, min_clients: int
) -> float:
  """What TFF must be given for local stddev z clip / sqrt(h).

  TFF splits its noise multiplier over the cohort it is given (local
  stddev = multiplier * clip / sqrt(cohort)); the cohort it is given sizes
  the modular headroom, so it stays the expected one, and the multiplier
  is scaled instead.
  """
  return noise_multiplier * math.sqrt(
    _heuristic_clients(expected_clients) / honest_shares(min_clients)
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

  Recomputes TFF's parameter choice (scale factor, inflated norm bound,
  padded dimension of the DFT rotation) so that noise can be calibrated to a
  target epsilon before training; equals `round_event_from_measurements`
  of what runs (up to float32 rounding of the measurements).

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
    `GaussianDpEvent(z_eff(min_clients - 1))`, or `NonPrivateDpEvent` if
    `noise_multiplier` is 0.

  Raises:
    ValueError: If `min_clients` is out of range.
  """
  min_clients = _check_min_clients(min_clients, expected_clients)
  if noise_multiplier == 0:
    return dp_accounting.NonPrivateDpEvent()
  ddp = _tff_private.distributed_dp_module()
  n = _heuristic_clients(expected_clients)
  padded_dim = math.ceil(dim / 2.0) * 2
  # As TFF computes it: central stddev, then split over its cohort n.
  central_stddev = (
    _tff_noise_multiplier(noise_multiplier, expected_clients, min_clients)
    * clip
  )
  local_stddev = central_stddev / math.sqrt(n)
  k_stddevs = ddp._clip_prob_to_num_stddevs(modclip_prob)  # pylint: disable=protected-access
  scale = float(
    ddp._heuristic_scale_factor(  # pylint: disable=protected-access
      local_stddev, clip, bits, n, padded_dim, k_stddevs
    ).numpy()
  )
  scale = min(scale, ddp.MAX_SCALE_FACTOR)
  inflated = _tff_private.inflated_l2_norm_bound(
    clip, 1.0 / scale, beta, padded_dim
  )
  sensitivity = (inflated + 1e-5) * scale
  sigma = math.ceil(local_stddev * scale)
  return dp_accounting.GaussianDpEvent(
    effective_noise_multiplier(
      sensitivity, sigma, honest_shares(min_clients), padded_dim
    )
  )


PROTOBUF_ENV = 'PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION'


def protobuf_supports_ddgauss() -> bool:
  """Whether this process's protobuf can hold a DDGauss learning process.

  TFF 0.87 nests the DDGauss pipeline (rotation, clipping, rounding, DP,
  modular clipping, secure sum) so deeply that, inside a learning process
  and after the test context lowers secure sum, its computation proto is
  deeper than protobuf's upb backend parses (100 levels): execution fails
  with `DecodeError: Error parsing message`. TFF's own
  `tff.learning.ddp_secure_aggregator` fails the same way (measured here,
  protobuf 4.25). The pure-Python backend has no such limit: set
  `PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python` before TensorFlow is
  imported (`python -m tff_dp.run --method=ddgauss` does so itself). It
  makes computation building slower (about 1.5 min more per run here).
  """
  from google.protobuf.internal import api_implementation  # pylint: disable=g-import-not-at-top

  return api_implementation.Type() == 'python'


class _GatedMeanFactory(
  tff.aggregators.UnweightedAggregationFactory, weighting.Weightable
):
  """Sums with TFF's DDGauss sum; releases sum / denominator, or withholds.

  A round whose participant count (TFF's `actual_num_clients`, from secure
  sum) is below `min_clients` releases a zero update. Measurements are
  TFF's plus `min_clients` and `released` (1, or 0 if withheld).
  """

  def __init__(
    self,
    inner: tff.aggregators.UnweightedAggregationFactory,
    denominator: float,
    min_clients: int,
  ):
    self._inner = inner
    self._denominator = float(denominator)
    self._min_clients = int(min_clients)

  def create(self, value_type):
    inner = self._inner.create(value_type)
    denominator = self._denominator
    min_clients = self._min_clients
    result_type = inner.next.type_signature.result.result.member
    measurements_type = inner.next.type_signature.result.measurements.member
    count_type = measurements_type.actual_num_clients

    @tff.tensorflow.computation(result_type, count_type)
    def gate(value, count):
      released = count >= min_clients
      return tf.nest.map_structure(
        lambda v: tf.where(released, v / denominator, tf.zeros_like(v)),
        value,
      )

    @tff.tensorflow.computation(measurements_type)
    def with_gate_measurements(measurements):
      out = collections.OrderedDict(measurements)
      out['min_clients'] = tf.constant(min_clients, tf.int32)
      out['released'] = tf.cast(
        measurements['actual_num_clients'] >= min_clients, tf.int32
      )
      return out

    @tff.federated_computation(
      inner.initialize.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      out = inner.next(state, value)
      count = out.measurements.actual_num_clients
      return tff.templates.MeasuredProcessOutput(
        state=out.state,
        result=tff.federated_map(gate, tff.federated_zip((out.result, count))),
        measurements=tff.federated_map(
          with_gate_measurements, out.measurements
        ),
      )

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
) -> tff.aggregators.UnweightedAggregationFactory:
  """DDGauss mean of client updates over the expected cohort.

  TFF's `DistributedDpSumFactory(mechanism='distributed_dgauss')` sums, with
  each client's noise stddev `noise_multiplier * clip / sqrt(min_clients -
  1)` (before scaling); the sum is divided by `expected_clients_per_round`
  (public), as DP-FedAvg does. A round with fewer than `min_clients`
  participants releases a zero update (see the module doc for what the
  accounting assumes). See `protobuf_supports_ddgauss` for the protobuf
  backend this needs inside a learning process.

  Measurements: TFF's `l2_clip`, `scale_factor`, `scaled_inflated_l2`,
  `scaled_local_stddev`, `actual_num_clients`, `padded_dim`,
  `dp_query_metrics`, and `min_clients` and `released` (1 if the round's
  sum was released, 0 if withheld); `round_event_from_measurements` turns
  them into the round's DpEvent.

  Args:
    noise_multiplier: Target noise multiplier z (central noise of
      `min_clients - 1` shares over clip), >= 0.
    expected_clients_per_round: Expected cohort (the mean's denominator and
      the cohort TFF sizes the modular headroom for), >= 2.
    clip: L2 clip of each update, > 0.
    min_clients: Public lower bound on the cohort of a released round, an
      integer in [2, floor(expected_clients_per_round)]: the cohort size m
      under fixed-size sampling, a low quantile of the cohort under Poisson
      sampling (`binomial_min_clients`).
    bits: Bit width of the modular secure sum, in [2, 22] (TFF's limit).
    beta: Conditional rounding parameter in [0, 1).
    modclip_prob: Target probability of modular wrap-around, in (0, 1).

  Returns:
    The aggregation factory.

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  if not math.isfinite(noise_multiplier) or noise_multiplier < 0:
    raise ValueError(
      'noise_multiplier must be a finite number >= 0. Found '
      f'{noise_multiplier!r}.'
    )
  if not expected_clients_per_round >= 2:
    raise ValueError(
      'expected_clients_per_round must be >= 2. Found '
      f'{expected_clients_per_round!r}.'
    )
  min_clients = _check_min_clients(min_clients, expected_clients_per_round)
  if not (math.isfinite(clip) and clip > 0):
    raise ValueError(f'clip must be a finite number > 0. Found {clip!r}.')
  if not isinstance(bits, int) or not 2 <= bits <= 22:
    raise ValueError(f'bits must be an integer in [2, 22]. Found {bits!r}.')
  if not 0 <= beta < 1:
    raise ValueError(f'beta must be in [0, 1). Found {beta!r}.')
  if not 0 < modclip_prob < 1:
    raise ValueError(f'modclip_prob must be in (0, 1). Found {modclip_prob!r}.')
  ddp = _tff_private.distributed_dp_module()
  with warnings.catch_warnings():
    # TFF warns on any beta > 0; Kairouz et al. recommend exp(-0.5).
    warnings.filterwarnings('ignore', message='The selected beta')
    inner = ddp.DistributedDpSumFactory(
      noise_multiplier=_tff_noise_multiplier(
        noise_multiplier, expected_clients_per_round, min_clients
      ),
      expected_clients_per_round=_heuristic_clients(expected_clients_per_round),
      bits=bits,
      l2_clip=clip,
      modclip_prob=modclip_prob,
      beta=beta,
      mechanism='distributed_dgauss',
      rotation_type='dft',
    )
  return _GatedMeanFactory(inner, expected_clients_per_round, min_clients)
