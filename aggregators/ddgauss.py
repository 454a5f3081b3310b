"""DDGauss: the distributed discrete Gaussian mean (Kairouz et al. 2021).

Each client rotates its update (randomized DFT), clips it to L2 norm C,
scales it by s, rounds it to integers and adds a discrete Gaussian share of
integer scale sigma = ceil(s z C / sqrt(h)), h = min_clients - 1; the
integers are secure-summed modulo 2^bits when at least `min_clients` take
part (else every client sends zeros), and the server unscales, unrotates and
divides by the expected cohort. Each round records
`ddgauss_accounting.DiscreteGaussianSumDpEvent`: RDP alpha c^2 / 2,
c = Delta_2 / (sqrt(h) sigma) + sqrt(d) tau_h. The contract is
`_DDGaussMeanFactory`'s docstring.

This module holds the factory (`ddgauss_mean`) and the protobuf probe it
needs (`protobuf_supports_ddgauss`); the accounting is in
`ddgauss_accounting`, the discrete Gaussian sampler and its DP query in
`ddgauss_query`, and the gated secure sum in `ddgauss_secure_sum`.
See docs/papers/ddgauss.md for the paper's reading and derivations.
"""

import collections
import math
from typing import Any, NamedTuple, Optional

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import _tff_private
from tff_dp.aggregators import ddgauss_accounting
from tff_dp.aggregators import ddgauss_query
from tff_dp.aggregators import ddgauss_secure_sum
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import weighting


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
  min_clients = ddgauss_accounting.check_min_clients(
    min_clients, expected_clients
  )
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


def _round_measurements(
  p: ddgauss_accounting.Parameters, clip: float, min_clients: int
):
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
    count = ddgauss_secure_sum.participant_count()
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
  entropy (`ddgauss_query._client_nonce`; the server, which holds the
  seed, cannot regenerate it), and sends the result modulo 2^bits to a
  secure sum. The participant count n is secure-summed first: if n <
  `min_clients`, every client sends zeros instead (no update, no noise).
  Clipped-update counts are not aggregated.

  Server: sees only n and the modular sum; releases the sum unwrapped,
  unscaled, unrotated and divided by `expected_clients` (public), or zeros
  for a withheld round. A round of n participants carries n / h times the
  noise variance z asks for.

  DP event: every round, released or withheld,
  `ddgauss_accounting.DiscreteGaussianSumDpEvent(l2_sensitivity=Delta_2,
  local_stddev=sigma, num_shares=h, dim=d)` (`NonPrivateDpEvent` at
  z = 0), under
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
    that ran: `ddgauss_accounting.round_event_from_measurements(
    measurements)`."""
    del state
    return ddgauss_accounting.round_event_from_measurements(measurements)

  def _parameters(self, dim: int) -> ddgauss_accounting.Parameters:
    a = self._args
    return ddgauss_accounting.parameters(
      a.noise_multiplier,
      a.clip,
      a.expected_clients,
      dim,
      a.bits,
      a.min_clients,
      a.beta,
      a.modclip_prob,
    )

  def _sum_factory(self, p: ddgauss_accounting.Parameters):
    """TFF's DDGauss nesting (`DistributedDpSumFactory`), gated and seeded."""
    clip, bits, beta = self._args.clip, self._args.bits, self._args.beta
    # Secure sum in [0, 2^b) inside modular clips to [0, 2^b) and to
    # [-2^(b-1), 2^(b-1)), as TFF's pipeline does.
    nested = ddgauss_secure_sum.ThresholdSecureSumFactory(
      self._args.min_clients, 2**bits - 1, 0
    )
    nested = _tff_private.modular_clipping_sum_factory(0, 2**bits, nested)
    nested = _tff_private.modular_clipping_sum_factory(
      -(2 ** (bits - 1)), 2 ** (bits - 1), nested
    )
    nested = tff.aggregators.DifferentiallyPrivateFactory(
      ddgauss_query.SeededDiscreteGaussianSumQuery(
        p.l2_sensitivity, p.local_stddev, self._seed
      ),
      nested,
    )
    nested = _tff_private.discretization_factory(
      nested, scale_factor=p.scale, beta=beta, prior_norm_bound=clip
    )
    nested = tff.aggregators.clipping_factory(
      clip,
      nested,
      clipped_count_sum_factory=ddgauss_secure_sum.NothingSumFactory(),
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
  beta: float = ddgauss_accounting.DEFAULT_BETA,
  modclip_prob: float = ddgauss_accounting.DEFAULT_MODCLIP_PROB,
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
  measurements)` (it calls
  `ddgauss_accounting.round_event_from_measurements`). See
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
      sampling (`ddgauss_accounting.binomial_min_clients`).
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
