"""The accountants: subsampled-RDP bounds for curve events against
dp_accounting's exact ones, and the cached PLD accountant to the bit."""

import math

import dp_accounting
from dp_accounting import pld
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np
import pytest

from tff_dp import privacy

# Curve events (DDGauss): generic subsampled-RDP bounds.

ORDERS = np.array(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
INTS = ORDERS[ORDERS == np.floor(ORDERS)]


def _gaussian_curve(z):
  return lambda a: np.asarray(a, np.float64) / (2 * z * z)


@pytest.mark.parametrize('scheme', ['poisson', 'without_replacement'])
def test_subsampled_curve_at_q_one_and_zero(scheme):
  curve = _gaussian_curve(1.3)
  np.testing.assert_array_equal(
    privacy.subsampled_rdp(curve, 1.0, ORDERS, scheme), curve(ORDERS)
  )
  np.testing.assert_array_equal(
    privacy.subsampled_rdp(curve, 0.0, ORDERS, scheme), np.zeros(len(ORDERS))
  )
  for q, orders, match in (
    (1.5, ORDERS, r'q must be in \[0, 1\]'),
    (0.1, [1.0, 2.0], 'orders must be finite and > 1'),
  ):
    with pytest.raises(ValueError, match=match):
      privacy.subsampled_rdp(curve, q, orders, scheme)
  with pytest.raises(ValueError, match='scheme must be one of'):
    privacy.subsampled_rdp(curve, 0.1, ORDERS, 'shuffle')


@pytest.mark.parametrize('q', [0.001, 0.029, 0.1, 0.3, 0.7])
@pytest.mark.parametrize('z', [0.5, 1.0, 2.0])
def test_poisson_bound_dominates_exact_subsampled_gaussian(q, z):
  """Zhu & Wang's Theorem 6 on the Gaussian's curve alpha / (2 z^2) is an
  upper bound on dp_accounting's exact subsampled-Gaussian RDP at every
  order (fractional ones through the CGF interpolation), equal at order 2
  (where the theorem is exact), within 3x at integer orders 2..64."""
  ours = privacy.subsampled_rdp(_gaussian_curve(z), q, ORDERS, 'poisson')
  exact = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(
    q, z, ORDERS
  )
  assert np.all(ours >= exact * (1 - 1e-12))
  assert ours[ORDERS == 2][0] == pytest.approx(exact[ORDERS == 2][0], rel=1e-12)
  middle = (ORDERS == np.floor(ORDERS)) & (ORDERS <= 64)
  assert np.max(ours[middle] / exact[middle]) < 3


@pytest.mark.parametrize('q', [0.01, 0.1, 0.5])
@pytest.mark.parametrize('z', [0.8, 1.0, 2.0])
def test_wor_bound_against_dp_accounting(q, z):
  """Wang-Balle-Kasiviswanathan's Theorem 9 on the Gaussian's curve against
  dp_accounting's SampledWithoutReplacement Gaussian RDP (replace-one; its
  Theorem 27, tighter for the Gaussian, and Theorem 9 itself above order
  256), both capped by the unsampled curve: equal at integer orders for
  z <= 1 and above 256, at most 1.5x otherwise."""
  curve = _gaussian_curve(z)
  ours = privacy.subsampled_rdp(curve, q, INTS, 'without_replacement')
  theirs = np.minimum(
    rdp_privacy_accountant._compute_rdp_sample_wor_gaussian(q, z, INTS),
    curve(INTS),
  )
  assert np.all(ours >= theirs * (1 - 1e-12))
  np.testing.assert_allclose(ours[INTS > 256], theirs[INTS > 256], rtol=1e-12)
  if z <= 1:
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)
  assert np.max(ours / theirs) < 1.5


@pytest.mark.parametrize('count', [1, 7, 1000])
def test_cached_pld_accountant_gives_dp_accountings_epsilon_to_the_bit(count):
  sampled = dp_accounting.PoissonSampledDpEvent(
    0.0166667, dp_accounting.GaussianDpEvent(1.1)
  )
  other = dp_accounting.PoissonSampledDpEvent(
    0.05, dp_accounting.GaussianDpEvent(0.8)
  )
  for event in (
    dp_accounting.SelfComposedDpEvent(sampled, count),
    dp_accounting.ComposedDpEvent(
      [dp_accounting.SelfComposedDpEvent(sampled, count), other]
    ),
  ):
    want = pld.PLDAccountant().compose(event).get_epsilon(1e-5)
    # Twice: the second time from the cached base distribution.
    for _ in range(2):
      got = privacy.PldAccountant().compose(event).get_epsilon(1e-5)
      assert got == want
  # Events it does not cache (no sampling, zero noise) go through
  # dp_accounting's own path.
  plain = dp_accounting.SelfComposedDpEvent(
    dp_accounting.GaussianDpEvent(2.0), 3
  )
  assert privacy.PldAccountant().compose(plain).get_epsilon(1e-5) == (
    pld.PLDAccountant().compose(plain).get_epsilon(1e-5)
  )
  zero = dp_accounting.PoissonSampledDpEvent(
    0.1, dp_accounting.GaussianDpEvent(0.0)
  )
  assert privacy.PldAccountant().compose(zero).get_epsilon(1e-5) == math.inf
