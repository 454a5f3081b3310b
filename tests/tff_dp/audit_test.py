"""The canary audit: its interval, the ledger test, and the noise-reuse check.

A correct mechanism must pass `epsilon_lower <= ledger` whatever the seeds
(checked over several), broken ones (half the noise, no clip) must fail
it, and noise repeated every round must be caught by `noise_reuse_check`.
"""

import dp_accounting
from dp_accounting import pld
import numpy as np
import pytest
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp import audit
from tff_dp import contexts
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import finite_guard

Z, CLIP, ROUNDS, DELTA = 2.0, 1.0, 4, 1e-5
DIM, CANARIES = 20000, 300


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


def _ledger_epsilon(z):
  # Every canary takes part in every round: T Gaussians, no sampling. The
  # PLD ledger is the tight one (exact mu = sqrt(T) / z GDP, up to its
  # pessimistic discretization): the hardest ledger to stay under.
  event = dp_accounting.SelfComposedDpEvent(
    dp_accounting.GaussianDpEvent(z), ROUNDS
  )
  return pld.PLDAccountant().compose(event).get_epsilon(DELTA)


def test_gdp_epsilon_known_values():
  # mu = 1 at delta 1e-5 (Dong et al.'s curve), and monotone in mu.
  e1 = audit.gdp_epsilon(1.0, 1e-5)
  assert 4.2 < e1 < 4.6
  assert audit.gdp_epsilon(2.0, 1e-5) > e1 > audit.gdp_epsilon(0.5, 1e-5)
  assert audit.gdp_epsilon(0.0, 1e-5) == 0.0
  assert audit.gdp_epsilon(float('inf'), 1e-5) == float('inf')
  # The PLD ledger of 4 Gaussians at z = 2 is mu = 1 GDP, a bit above.
  assert e1 <= _ledger_epsilon(Z) < e1 + 0.05


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
    est = audit.gaussian_shift_interval(observed, null, confidence=0.95)
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
      est = audit.gaussian_shift_interval(observed, null)
      w.append(est.mu_upper - est.mu_lower)
    widths[k] = np.mean(w)
  assert widths[100] / widths[400] == pytest.approx(2.0, rel=0.05)
  assert widths[400] / widths[1600] == pytest.approx(2.0, rel=0.05)
  # The 90% interval's width for mu = 1: 2 * 1.645 * sqrt(2/k + 1/(2k)).
  assert widths[400] == pytest.approx(
    2 * 1.6449 * np.sqrt(2 / 400 + 1 / 800), rel=0.05
  )


def test_interval_edge_cases():
  zero_std = audit.gaussian_shift_interval([2.0, 3.0], [1.0, 1.0, 1.0])
  assert zero_std.mu == zero_std.mu_lower == float('inf')
  huge = audit.gaussian_shift_interval([1e9, 1e9 + 1], [0.0, 1.0, 2.0])
  assert 0 < huge.mu_lower < huge.mu < huge.mu_upper
  with pytest.raises(ValueError, match=r'confidence must be in \[0.5, 1\)'):
    audit.gaussian_shift_interval([1.0], [0.0, 1.0], confidence=1.0)
  with pytest.raises(ValueError, match='>= 2 null values'):
    audit.gaussian_shift_interval([1.0], [0.0])


def _unclipped():
  """A broken DP-FedAvg: noise for clip `CLIP`, but clips at 1e9.

  The noise is the correct one (stddev Z * CLIP on the sum, fresh every
  round); only the clip is missing.
  """
  return dp_fedavg.gaussian_fixed(Z * CLIP / 1e9, CANARIES, 1e9, noise_seed=3)


class _FrozenSeedQuery(dp_queries.SeededGaussianSumQuery):
  """A broken query: never advances its seed (identical noise each round)."""

  def get_noised_result(self, sample_state, global_state):
    result, _, event = super().get_noised_result(sample_state, global_state)
    return result, global_state, event


def _frozen_seed_fedavg(z, n, clip):
  query = tfp.NormalizedQuery(
    _FrozenSeedQuery(clip, clip * z, 3), denominator=float(n)
  )
  return tff.aggregators.DifferentiallyPrivateFactory(query)


def _audit(factory, canary_norm=CLIP, seed=1):
  return audit.audit_aggregator(
    finite_guard.FiniteGuardFactory(factory),
    dim=DIM,
    num_canaries=CANARIES,
    rounds=ROUNDS,
    canary_norm=canary_norm,
    delta=DELTA,
    seed=seed,
  )


@pytest.mark.parametrize(
  'seed',
  # Seed 0 in `make test`, all five in `make test-slow`.
  [0] + [pytest.param(s, marks=pytest.mark.slow) for s in range(1, 5)],
)
def test_correct_dp_fedavg_is_consistent_with_the_ledger(seed):
  # Fresh noise and directions per seed (the seeds of a 100-seed sweep in
  # which the point estimate exceeded this ledger for about half).
  factory = dp_fedavg.gaussian_fixed(Z, CANARIES, CLIP, noise_seed=1000 + seed)
  result = _audit(factory, seed=seed)
  # mu = sqrt(T) / z = 1 for this mechanism: above the lower bound.
  assert result.mu_lower <= 1.0
  assert result.epsilon_lower <= result.epsilon_estimate
  assert result.epsilon_estimate <= result.epsilon_upper
  assert result.consistent_with(_ledger_epsilon(Z))


def test_halved_noise_is_caught():
  # The mechanism adds noise z/2 (mu = 2) while the ledger claims z.
  result = _audit(dp_fedavg.gaussian_fixed(Z / 2, CANARIES, CLIP, noise_seed=2))
  assert result.epsilon_lower > _ledger_epsilon(Z)
  assert not result.consistent_with(_ledger_epsilon(Z))


def test_missing_clip_is_caught():
  # Canaries 3x the clip, and the clip is not applied (mu = 3).
  result = _audit(_unclipped(), canary_norm=3 * CLIP)
  assert result.epsilon_lower > _ledger_epsilon(Z)


def _reuse_check(factory, seed=1):
  return audit.noise_reuse_check(
    finite_guard.FiniteGuardFactory(factory),
    dim=5000,
    num_canaries=50,
    canary_norm=CLIP,
    rounds=3,
    seed=seed,
  )


def test_noise_reuse_check_passes_fresh_noise():
  result = _reuse_check(dp_fedavg.gaussian_fixed(Z, 50, CLIP, noise_seed=2))
  assert not result.reused
  assert result.max_abs_z < result.threshold
  # Independent noise in 4850 dimensions: cosines ~ N(0, 1/4850).
  assert result.max_abs_correlation < 0.06
  assert result.residual_dim == 5000 - 3 * 50


def test_noise_reuse_check_catches_a_seed_that_never_advances():
  result = _reuse_check(_frozen_seed_fedavg(Z, 50, CLIP))
  assert result.reused
  # The residuals are the same noise every round.
  assert result.max_abs_correlation > 0.999
  assert result.max_abs_z > 10 * result.threshold


def test_bad_args():
  with pytest.raises(ValueError, match='num_canaries must be an integer >= 2'):
    audit.audit_aggregator(
      dp_fedavg.gaussian_fixed(1.0, 1, 1.0, noise_seed=0),
      dim=10,
      num_canaries=1,
      rounds=1,
      canary_norm=1.0,
      delta=1e-5,
    )
  with pytest.raises(ValueError, match=r'delta must be in \(0, 1\)'):
    audit.gdp_epsilon(1.0, 0.0)
  assert np.isfinite(audit.gdp_epsilon(5.0, 1e-5))
  with pytest.raises(ValueError, match='rounds must be an integer >= 2'):
    audit.noise_reuse_check(
      dp_fedavg.gaussian_fixed(1.0, 1, 1.0, noise_seed=0),
      dim=100,
      num_canaries=1,
      canary_norm=1.0,
      rounds=1,
    )
  with pytest.raises(ValueError, match=r'dim must be > rounds \* num_canaries'):
    audit.noise_reuse_check(
      dp_fedavg.gaussian_fixed(1.0, 1, 1.0, noise_seed=0),
      dim=100,
      num_canaries=50,
      canary_norm=1.0,
    )
