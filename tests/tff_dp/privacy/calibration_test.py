"""Noise calibration meets its epsilon target and names bad arguments."""

import math

import dp_accounting
import pytest

from tff_dp import privacy

G = dp_accounting.GaussianDpEvent


@pytest.mark.parametrize('accountant', ['rdp', 'pld'])
def test_calibration_hits_target(accountant):
  sampling = privacy.Sampling('poisson', 6000, rate=1 / 60)
  z = privacy.calibrate_noise_multiplier(
    1.0, 1e-4, 180, sampling, accountant=accountant
  )
  ledger = privacy.PrivacyLedger(sampling, 1e-4)
  for _ in range(180):
    ledger.record(G(z))
  eps = ledger.epsilon()[0 if accountant == 'rdp' else 1]
  assert eps == pytest.approx(1.0, abs=2e-3)
  assert eps <= 1.0 + 1e-3
  if accountant == 'rdp':
    assert z == pytest.approx(1.185, abs=2e-3)


def test_calibration_two_phase_event():
  sampling = privacy.Sampling('poisson', 1000, rate=0.05)
  z = privacy.calibrate_noise_multiplier(
    2.0,
    1e-5,
    50,
    sampling,
    round_event_fn=lambda z: dp_accounting.ComposedDpEvent([G(z), G(z)]),
  )
  single = privacy.calibrate_noise_multiplier(2.0, 1e-5, 50, sampling)
  assert z == pytest.approx(single * math.sqrt(2), rel=1e-3)


@pytest.mark.parametrize(
  'args, match',
  [
    ((0.0, 1e-5, 10), 'target_epsilon must be a finite number > 0'),
    ((1.0, 0.0, 10), r'delta must be in \(0, 1\)'),
    ((1.0, 1e-5, 0), 'rounds must be an integer >= 1'),
  ],
)
def test_bad_calibration_args(args, match):
  sampling = privacy.Sampling('poisson', 100, rate=0.1)
  with pytest.raises(ValueError, match=match):
    privacy.calibrate_noise_multiplier(*args, sampling)
