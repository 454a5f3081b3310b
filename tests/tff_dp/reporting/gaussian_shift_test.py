"""The audit's statistics: the shift interval covers at its level and
narrows like 1/sqrt(n), and the Gaussian-DP curve's epsilon."""

import numpy as np
import pytest

import audit_testing
from audit_testing import Z

from tff_dp.reporting import gaussian_shift


def test_gdp_epsilon_known_values():
  # mu = 1 at delta 1e-5 (Dong et al.'s curve), and monotone in mu.
  e1 = gaussian_shift.gdp_epsilon(1.0, 1e-5)
  assert 4.2 < e1 < 4.6
  assert (
    gaussian_shift.gdp_epsilon(2.0, 1e-5)
    > e1
    > gaussian_shift.gdp_epsilon(0.5, 1e-5)
  )
  assert gaussian_shift.gdp_epsilon(0.0, 1e-5) == 0.0
  assert gaussian_shift.gdp_epsilon(float('inf'), 1e-5) == float('inf')
  # The PLD ledger of 4 Gaussians at z = 2 is mu = 1 GDP, a bit above.
  assert e1 <= audit_testing.ledger_epsilon(Z) < e1 + 0.05


def test_interval_covers_a_known_shift_at_its_level():
  # Samples with a known shift of 3 null standard deviations: each
  # one-sided bound covers it in ~95% of 400 draws (binomial sd 0.011), so
  # an interval that ignored the uncertainty of the null std (coverage
  # ~0.82 here) or was needlessly wide (~1.0) fails.
  rng = np.random.default_rng(0)
  mu, k, draws = 3.0, 50, 400
  lower_ok = upper_ok = 0
  for _ in range(draws):
    null = rng.normal(5.0, 2.0, k)
    observed = rng.normal(5.0 + mu * 2.0, 2.0, k)
    est = gaussian_shift.gaussian_shift_interval(
      observed, null, confidence=0.95
    )
    assert est.mu_lower <= est.mu <= est.mu_upper
    lower_ok += est.mu_lower <= mu
    upper_ok += mu <= est.mu_upper
  assert 0.925 <= lower_ok / draws <= 0.975
  assert 0.925 <= upper_ok / draws <= 0.975


def test_interval_width_shrinks_like_one_over_sqrt_n():
  rng = np.random.default_rng(1)
  widths = {}
  for k in (100, 400, 1600):
    w = []
    for _ in range(20):
      null = rng.normal(0.0, 1.0, k)
      observed = rng.normal(1.0, 1.0, k)
      est = gaussian_shift.gaussian_shift_interval(observed, null)
      w.append(est.mu_upper - est.mu_lower)
    widths[k] = np.mean(w)
  assert widths[100] / widths[400] == pytest.approx(2.0, rel=0.05)
  assert widths[400] / widths[1600] == pytest.approx(2.0, rel=0.05)
  # The 90% interval's width for mu = 1: 2 * 1.645 * sqrt(2/k + 1/(2k)).
  assert widths[400] == pytest.approx(
    2 * 1.6449 * np.sqrt(2 / 400 + 1 / 800), rel=0.05
  )


def test_interval_edge_cases():
  zero_std = gaussian_shift.gaussian_shift_interval([2.0, 3.0], [1.0, 1.0, 1.0])
  assert zero_std.mu == zero_std.mu_lower == float('inf')
  huge = gaussian_shift.gaussian_shift_interval([1e9, 1e9 + 1], [0.0, 1.0, 2.0])
  assert 0 < huge.mu_lower < huge.mu < huge.mu_upper
  with pytest.raises(ValueError, match=r'confidence must be in \[0.5, 1\)'):
    gaussian_shift.gaussian_shift_interval([1.0], [0.0, 1.0], confidence=1.0)
  with pytest.raises(ValueError, match='>= 2 null values'):
    gaussian_shift.gaussian_shift_interval([1.0], [0.0])


def test_unequal_variance_interval_covers_at_its_level():
  # Observed samples with twice the null's variance: the equal-variance
  # interval would undercover; the unequal one keeps ~95% per side.
  rng = np.random.default_rng(2)
  mu, k, draws = 1.0, 100, 400
  lower_ok = upper_ok = 0
  for _ in range(draws):
    null = rng.normal(0.0, 1.0, k)
    observed = rng.normal(mu, np.sqrt(2.0), k)
    est = gaussian_shift.gaussian_shift_interval(
      observed, null, confidence=0.95, equal_variance=False
    )
    assert est.variance_ratio >= 1.0
    lower_ok += est.mu_lower <= mu
    upper_ok += mu <= est.mu_upper
  assert 0.925 <= lower_ok / draws <= 0.985
  assert 0.925 <= upper_ok / draws <= 0.985


def test_bad_args():
  with pytest.raises(ValueError, match=r'delta must be in \(0, 1\)'):
    gaussian_shift.gdp_epsilon(1.0, 0.0)
  assert np.isfinite(gaussian_shift.gdp_epsilon(5.0, 1e-5))
