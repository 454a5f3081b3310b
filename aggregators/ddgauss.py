"""DDGauss: the distributed discrete Gaussian mechanism (Kairouz et al. 2021).

"The Distributed Discrete Gaussian Mechanism for Federated Learning with
Secure Aggregation", ICML 2021, https://arxiv.org/abs/2102.06387; seed 000's
secure-aggregation baseline. Each client clips its update to L2 norm `clip`,
rotates it (DFT), scales it by `scale`, rounds it to integers (conditional
randomized rounding, beta = exp(-0.5)), adds discrete Gaussian noise of
stddev `ceil(scale * noise_multiplier * clip / sqrt(n))` with n the expected
cohort, and the integers are summed modulo 2^bits with secure sum
(`tff.federated_secure_sum_bitwidth`). The server unscales, unrotates and
divides by the expected cohort. The mechanism is TFF's
`DistributedDpSumFactory(mechanism='distributed_dgauss')`.

Accounting (TFF reports an `UnsupportedDpEvent` for it). With n clients in
the round, local integer noise stddev sigma, scaled and inflated L2
sensitivity Delta_2 and padded dimension d, Kairouz et al. (Prop. 14 /
Eq. 17) bound the round's Renyi DP at every order alpha by
    alpha / 2 * (Delta_2 / (sqrt(n) sigma) + sqrt(d) tau)^2,
    tau = 10 * sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)),
which is the RDP curve of a Gaussian mechanism with noise multiplier
    z_eff = 1 / (Delta_2 / (sqrt(n) sigma) + sqrt(d) tau).
The ledger records `GaussianDpEvent(z_eff)` and applies client sampling to
it like any Gaussian. Documented assumption: amplification by sampling is
computed as for that dominating Gaussian (dp_accounting's subsampled-Gaussian
RDP); the paper's own accountant instead takes the minimum of a generic
subsampled-RDP bound and the unsampled bound. The number of participants n
is treated as public (secure aggregation reveals it); a round with no
participant releases nothing about any client (a `NoOpDpEvent`).
"""

import math
from typing import Any, Mapping
import warnings

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import _tff_private

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
    num_clients: Clients whose noise is in the sum, >= 1.
    dim: Dimension of the (padded) vector.
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


def round_event_from_measurements(
  measurements: Mapping[str, Any],
) -> dp_accounting.DpEvent:
  """The round's DpEvent from the aggregator's measurements (what ran)."""
  n = int(measurements['actual_num_clients'])
  if n == 0:
    return dp_accounting.NoOpDpEvent()
  # The sampler draws with stddev rounded up to an integer.
  sigma = math.ceil(float(measurements['scaled_local_stddev']))
  if sigma == 0:
    return dp_accounting.NonPrivateDpEvent()
  return dp_accounting.GaussianDpEvent(
    effective_noise_multiplier(
      float(measurements['scaled_inflated_l2']),
      sigma,
      n,
      int(measurements['padded_dim']),
    )
  )


def planned_round_event(
  noise_multiplier: float,
  clip: float,
  expected_clients: float,
  dim: int,
  bits: int,
  *,
  beta: float = DEFAULT_BETA,
  modclip_prob: float = DEFAULT_MODCLIP_PROB,
) -> dp_accounting.DpEvent:
  """The event a round with the expected cohort will release.

  Recomputes TFF's parameter choice (scale factor, inflated norm bound,
  padded dimension of the DFT rotation) so that noise can be calibrated to a
  target epsilon before training.
  """
  if noise_multiplier == 0:
    return dp_accounting.NonPrivateDpEvent()
  ddp = _tff_private.distributed_dp_module()
  n = max(int(round(expected_clients)), 1)
  padded_dim = math.ceil(dim / 2.0) * 2
  local_stddev = noise_multiplier * clip / math.sqrt(n)
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
    effective_noise_multiplier(sensitivity, sigma, n, padded_dim)
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


class _DivideByConstantFactory(tff.aggregators.UnweightedAggregationFactory):
  """Sums with an inner factory, then divides by a public constant."""

  def __init__(
    self,
    inner: tff.aggregators.UnweightedAggregationFactory,
    denominator: float,
  ):
    self._inner = inner
    self._denominator = float(denominator)

  def create(self, value_type):
    inner = self._inner.create(value_type)
    denominator = self._denominator

    @tff.tensorflow.computation(value_type)
    def divide(value):
      return tf.nest.map_structure(lambda v: v / denominator, value)

    @tff.federated_computation(
      inner.initialize.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      out = inner.next(state, value)
      return tff.templates.MeasuredProcessOutput(
        state=out.state,
        result=tff.federated_map(divide, out.result),
        measurements=out.measurements,
      )

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def ddgauss_mean(
  noise_multiplier: float,
  expected_clients_per_round: float,
  clip: float,
  *,
  bits: int = 20,
  beta: float = DEFAULT_BETA,
  modclip_prob: float = DEFAULT_MODCLIP_PROB,
) -> tff.aggregators.UnweightedAggregationFactory:
  """DDGauss mean of client updates over the expected cohort.

  TFF's `DistributedDpSumFactory(mechanism='distributed_dgauss')` sums; the
  sum is divided by `expected_clients_per_round` (public), as DP-FedAvg
  does. See `protobuf_supports_ddgauss` for the protobuf backend this needs
  inside a learning process.

  Measurements (TFF's): `l2_clip`, `scale_factor`, `scaled_inflated_l2`,
  `scaled_local_stddev`, `actual_num_clients`, `padded_dim`,
  `dp_query_metrics`; `round_event_from_measurements` turns them into the
  round's DpEvent.

  Args:
    noise_multiplier: Central noise stddev over clip, >= 0.
    expected_clients_per_round: Expected cohort n (splits the noise, and is
      the mean's denominator), >= 1.
    clip: L2 clip of each update, > 0.
    bits: Bit width of the modular secure sum, in [2, 22] (TFF's limit).
    beta: Conditional rounding parameter in [0, 1).
    modclip_prob: Target probability of modular wrap-around, in (0, 1).

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  if not math.isfinite(noise_multiplier) or noise_multiplier < 0:
    raise ValueError(
      'noise_multiplier must be a finite number >= 0. Found '
      f'{noise_multiplier!r}.'
    )
  if not expected_clients_per_round >= 1:
    raise ValueError(
      'expected_clients_per_round must be >= 1. Found '
      f'{expected_clients_per_round!r}.'
    )
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
      noise_multiplier=noise_multiplier,
      expected_clients_per_round=int(round(expected_clients_per_round)),
      bits=bits,
      l2_clip=clip,
      modclip_prob=modclip_prob,
      beta=beta,
      mechanism='distributed_dgauss',
      rotation_type='dft',
    )
  return _DivideByConstantFactory(inner, expected_clients_per_round)
