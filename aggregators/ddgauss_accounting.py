"""DDGauss's accounting: the discrete Gaussian sum's DP event and parameters.

`DiscreteGaussianSumDpEvent` is the RDP curve that Kairouz et al. 2021
(Prop. 14) give for a sum of h discrete Gaussian shares, alpha c^2 / 2 with
c = Delta_2 / (sqrt(h) sigma) + sqrt(d) tau_h (`tau`,
`effective_noise_multiplier`), h = min_clients - 1 (`honest_shares`). A
round's event of `ddgauss.ddgauss_mean` is read from its measurements
(`round_event_from_measurements`) or planned before training from its
arguments (`planned_round_event`, through TFF's choice of the scale factor
and the inflated norm bound, `parameters`). `binomial_min_clients` picks
the public cohort lower bound under Poisson sampling.
"""

import math
import numbers
from typing import Any, Mapping, NamedTuple

from absl import logging
import attr
import dp_accounting
import numpy as np

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


def check_min_clients(min_clients: Any, expected_clients: float) -> int:
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
  rest are data-independent noise (`ddgauss._DDGaussMeanFactory`'s DP event).
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
  """The round's DpEvent from the measurements of `ddgauss.ddgauss_mean`.

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


class Parameters(NamedTuple):
  """What one round of `ddgauss.ddgauss_mean` runs with (integer domain)."""

  padded_dim: int
  scale: float
  local_stddev: int  # sigma, the sampler's integer scale.
  l2_sensitivity: float  # Delta_2, TFF's scaled inflated bound + leeway.


def _heuristic_clients(expected_clients: float) -> int:
  """The cohort TFF's scale heuristic (modular headroom) is sized for."""
  return max(int(round(expected_clients)), 1)


def parameters(
  noise_multiplier: float,
  clip: float,
  expected_clients: float,
  dim: int,
  bits: int,
  min_clients: int,
  beta: float,
  modclip_prob: float,
) -> Parameters:
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
  return Parameters(
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
  min_clients = check_min_clients(min_clients, expected_clients)
  if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
    raise ValueError(
      'noise_multiplier must be a finite number >= 0. Found '
      f'{noise_multiplier!r}.'
    )
  if noise_multiplier == 0:
    return dp_accounting.NonPrivateDpEvent()
  p = parameters(
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
