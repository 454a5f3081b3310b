"""The noise-reuse check: fresh noise passes, noise repeated every round
is caught (also through a correlated stream, once whitened), and
correlated noise passes once whitened."""

import pytest

import audit_testing
from audit_testing import CLIP, Z

from tff_dp.reporting import noise_reuse
from tff_dp.reporting import planted_bugs
from tff_dp.runtime import contexts
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import finite_guard
from tff_dp.aggregators import mf_strategy


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


def _reuse_check(factory, seed=1, rounds=3, strategy=None):
  return noise_reuse.noise_reuse_check(
    finite_guard.FiniteGuardFactory(factory),
    dim=5000,
    num_canaries=50,
    canary_norm=CLIP,
    rounds=rounds,
    seed=seed,
    strategy=strategy,
  )


_BANDED = mf_strategy.banded([0.8, 0.5, 0.33])


def test_correlated_noise_passes_once_whitened_and_not_before():
  factory = dp_fedavg.gaussian_fixed(Z, 50, CLIP, noise_seed=5, noise=_BANDED)
  # Correlated by design: the unwhitened residuals of adjacent rounds
  # correlate (y_t = (w_t - 0.5 y_{t-1} - 0.33 y_{t-2}) / 0.8).
  assert _reuse_check(factory, rounds=4).reused
  result = _reuse_check(factory, rounds=4, strategy=_BANDED)
  assert not result.reused
  assert result.max_abs_correlation < 0.06


def test_whitening_still_catches_a_correlated_stream_that_repeats():
  factory = planted_bugs.planted_correlated_reuse(
    _BANDED, Z, 50, CLIP, noise_seed=6
  )
  result = _reuse_check(factory, rounds=4, strategy=_BANDED)
  assert result.reused
  # Whitened, it is one draw w every round.
  assert result.max_abs_correlation > 0.999


def test_noise_reuse_check_passes_fresh_noise():
  result = _reuse_check(dp_fedavg.gaussian_fixed(Z, 50, CLIP, noise_seed=2))
  assert not result.reused
  assert result.max_abs_z < result.threshold
  # Independent noise in 4850 dimensions: cosines ~ N(0, 1/4850).
  assert result.max_abs_correlation < 0.06
  assert result.residual_dim == 5000 - 3 * 50


def test_noise_reuse_check_catches_a_seed_that_never_advances():
  factory = planted_bugs.planted_dp_fedavg(
    'reused_noise', Z, 50, CLIP, noise_seed=3
  )
  result = _reuse_check(factory)
  assert result.reused
  # The residuals are the same noise every round.
  assert result.max_abs_correlation > 0.999
  assert result.max_abs_z > 10 * result.threshold
  # Its final-model estimate stays under its ledger: only this check sees it.
  audited = audit_testing.audit_method(
    planted_bugs.planted_method('reused_noise')
  )
  assert not audited.flagged


def test_bad_args():
  with pytest.raises(ValueError, match='rounds must be an integer >= 2'):
    noise_reuse.noise_reuse_check(
      dp_fedavg.gaussian_fixed(1.0, 1, 1.0, noise_seed=0),
      dim=100,
      num_canaries=1,
      canary_norm=1.0,
      rounds=1,
    )
  with pytest.raises(ValueError, match=r'dim must be > rounds \* num_canaries'):
    noise_reuse.noise_reuse_check(
      dp_fedavg.gaussian_fixed(1.0, 1, 1.0, noise_seed=0),
      dim=100,
      num_canaries=50,
      canary_norm=1.0,
    )
