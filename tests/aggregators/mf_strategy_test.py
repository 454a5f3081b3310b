"""Matrix-factorisation strategies: inverses, streamed noise, sensitivity."""

import itertools

import numpy as np
import pytest

from tff_dp.aggregators import mf_strategy as mf

N = 10
# C = BLT with omega >= 0 summing to < 1: non-negative, non-increasing.
BLT = mf.blt([0.9, 0.5], [0.3, 0.2])
STRATEGIES = {
  'identity': mf.identity(),
  'banded3': mf.banded([1.0, 0.5, 0.25]),
  'sqrt_banded4': mf.banded(mf.sqrt_prefix_coefficients(4)),
  'signed_banded3': mf.banded([1.0, -0.7, 0.4]),
  'blt': BLT,
}


@pytest.mark.parametrize('name', sorted(STRATEGIES))
def test_inverse_column_inverts_the_strategy(name):
  s = STRATEGIES[name]
  inverse = mf._toeplitz(s.inverse_column(N))  # pylint: disable=protected-access
  np.testing.assert_allclose(s.matrix(N) @ inverse, np.eye(N), atol=1e-12)


def test_blt_column_is_its_formula():
  k = np.arange(1, N)
  expected = 0.3 * 0.9 ** (k - 1) + 0.2 * 0.5 ** (k - 1)
  np.testing.assert_allclose(BLT.column(N), np.r_[1.0, expected], rtol=1e-12)


@pytest.mark.parametrize('name', sorted(STRATEGIES))
def test_streamed_noise_is_the_inverse_times_the_draws(name):
  s = STRATEGIES[name]
  w = np.random.default_rng(0).normal(size=(N, 3))
  expected = np.linalg.solve(s.matrix(N), w)
  np.testing.assert_allclose(s.noise(w), expected, rtol=1e-10, atol=1e-12)


def test_one_band_passes_the_draws_through_bit_for_bit():
  w = np.random.default_rng(1).normal(size=(N, 4))
  assert np.array_equal(mf.identity().noise(w), w)


@pytest.mark.parametrize('name', ['banded3', 'blt'])
def test_noise_covariance_over_rounds_is_cinv_cinv_transposed(name):
  s = STRATEGIES[name]
  n, draws = 6, 40_000
  w = np.random.default_rng(2).normal(size=(n, draws))
  y = s.noise(w)
  cinv = np.linalg.inv(s.matrix(n))
  cov = cinv @ cinv.T
  empirical = y @ y.T / draws
  # Standard error of a product-moment estimate of cov[a, b] under a
  # Gaussian: sqrt((cov[a,a] cov[b,b] + cov[a,b]^2) / draws).
  se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / draws)
  assert np.all(np.abs(empirical - cov) <= 4 * se)
  # A wrong strategy (independent noise) is caught by the same test.
  assert np.any(np.abs(w @ w.T / draws - cov) > 4 * se)


def test_identity_sensitivity_is_the_root_of_the_participations():
  # k independent Gaussian rounds: sensitivity sqrt(k), as composition.
  for horizon, separation in [(10, 1), (10, 3), (7, 7)]:
    k = -(-horizon // separation)
    got = mf.sensitivity(mf.identity(), horizon, separation)
    assert got == pytest.approx(np.sqrt(k), rel=1e-12)
  assert mf.sensitivity(mf.identity(), 10, 1, 4) == pytest.approx(2.0)


def _cases():
  rng = np.random.default_rng(3)
  for _ in range(3):  # Random non-negative, non-increasing bands.
    c = np.sort(rng.uniform(0, 1, size=5))[::-1]
    yield mf.banded(np.r_[1.0, c * 0.9])
  yield STRATEGIES['sqrt_banded4']
  yield BLT
  yield mf.blt([0.95], [0.6])


@pytest.mark.parametrize('horizon', [6, 9, 12])
@pytest.mark.parametrize('separation', [1, 2, 3])
@pytest.mark.parametrize('k', [1, 2, None])
def test_greedy_sensitivity_equals_brute_force_over_every_pattern(
  horizon, separation, k
):
  for s in _cases():
    greedy = mf.sensitivity(s, horizon, separation, k)
    brute = mf.brute_force_sensitivity(s, horizon, separation, k)
    assert greedy == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize('separation', [3, 4])
def test_disjoint_bands_of_any_sign_need_no_monotone_column(separation):
  s = STRATEGIES['signed_banded3']
  greedy = mf.sensitivity(s, 11, separation)
  assert greedy == pytest.approx(
    mf.brute_force_sensitivity(s, 11, separation), rel=1e-12
  )


def test_brute_force_is_an_exhaustive_maximum():
  # On a tiny case, the greedy pattern's value is the largest of all.
  s = mf.banded([1.0, 0.8, 0.6])
  c = s.column(5)
  values = []
  for size in (1, 2):
    for p in itertools.combinations(range(5), size):
      if all(b - a >= 2 for a, b in zip(p, p[1:])):
        values.append(mf._pattern_norm(c, list(p)))  # pylint: disable=protected-access
  assert mf.brute_force_sensitivity(s, 5, 2, 2) == max(values)
  assert max(values) == mf._pattern_norm(c, [0, 2])  # pylint: disable=protected-access


def test_an_overlapping_non_monotone_strategy_is_refused():
  with pytest.raises(ValueError, match='not known to be the worst'):
    mf.sensitivity(STRATEGIES['signed_banded3'], 10, 2)
  with pytest.raises(ValueError, match='not known to be the worst'):
    mf.sensitivity(mf.blt([0.9], [1.5]), 10, 1)  # c_1 = 1.5 > c_0.


@pytest.mark.parametrize(
  'call, match',
  [
    (lambda: mf.banded([]), 'at least one'),
    (lambda: mf.banded([0.0, 1.0]), r'c_0 must be > 0. Found 0.0'),
    (lambda: mf.banded([1.0, float('nan')]), 'finite'),
    (lambda: mf.blt([1.0], [0.1]), r'\[0, 1\). Found \[1.0\]'),
    (lambda: mf.blt([0.5], [0.1, 0.2]), 'one length'),
    (lambda: mf.sensitivity(mf.identity(), 0, 1), 'horizon must be'),
    (lambda: mf.sensitivity(mf.identity(), 5, 0), 'separation must be'),
    (lambda: mf.sensitivity(mf.identity(), 5, 1, 0), 'max_participations'),
    (lambda: mf.workload_column(5, 1.0), r'momentum must be in \[0, 1\)'),
    (lambda: mf.optimize_banded(6, 5), 'bands must be <= the horizon'),
  ],
)
def test_bad_arguments_are_named(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_identity_error_is_the_mean_prefix_length():
  # A = prefix sums, C = I, one participation: ||A||_F^2 / n = (n + 1) / 2.
  for n in (1, 5, 40):
    got = mf.expected_error(mf.identity(), n, 0.0, 1, 1)
    assert got == pytest.approx((n + 1) / 2, rel=1e-12)


@pytest.mark.parametrize('momentum', [0.0, 0.9])
def test_optimized_bands_beat_the_square_root_and_independent_noise(momentum):
  n, b = 60, 6
  err = lambda s: mf.expected_error(s, n, momentum, b, 1)
  best = mf.optimize_banded(b, n, momentum)
  sqrt = mf.banded(mf.sqrt_prefix_coefficients(b))
  assert best.bands == b
  assert np.linalg.norm(best.coefficients) == pytest.approx(1.0, rel=1e-12)
  assert err(best) <= err(sqrt) < err(mf.identity())
  # Deterministic: the same strategy twice.
  assert mf.optimize_banded(b, n, momentum) == best
  assert mf.optimize_banded(1, n, momentum) == mf.identity()


def test_to_dict_names_the_strategy():
  assert mf.banded([1.0, 0.5]).to_dict() == {
    'kind': 'banded',
    'bands': 2,
    'coefficients': [1.0, 0.5],
  }
  assert BLT.to_dict()['buffers'] == 2


@pytest.mark.parametrize('buffers', [1, 2])
def test_optimized_blt_is_monotone_and_beats_iid_under_min_separation(buffers):
  n, sep = 60, 6
  k = -(-n // sep)
  s = mf.optimize_blt(buffers, n, 0.0, sep, k)
  c = s.column(n)
  # The region where the greedy sensitivity is proven.
  assert np.all(c >= 0) and np.all(np.diff(c) <= 1e-12)
  # Greedy equals every pattern's maximum (brute force at a small n).
  small = mf.optimize_blt(buffers, 12, 0.0, 3, 4)
  assert mf.sensitivity(small, 12, 3, 4) == pytest.approx(
    mf.brute_force_sensitivity(small, 12, 3, 4), rel=1e-12
  )
  assert mf.expected_error(s, n, 0.0, sep, k) < 0.5 * mf.expected_error(
    mf.identity(), n, 0.0, sep, k
  )
  assert mf.optimize_blt(buffers, n, 0.0, sep, k) == s  # Deterministic.


def test_optimize_blt_names_a_bad_buffer_count():
  with pytest.raises(ValueError, match='buffers must be an integer >= 1'):
    mf.optimize_blt(0, 10)
