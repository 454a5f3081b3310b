"""DDGauss's accounting: the discrete Gaussian sum's event and parameters."""

import math

import attr
import dp_accounting
import numpy as np
import pytest

from tff_dp import methods
from tff_dp import privacy
from tff_dp.aggregators import ddgauss_accounting
from tff_dp.methods import ddgauss as ddgauss_method


def test_tau_and_effective_noise_by_hand():
  # n = 2 clients of stddev 0.5: tau = 10 exp(-2 pi^2 0.25 / 2).
  assert ddgauss_accounting.tau(0.5, 2) == pytest.approx(
    10 * math.exp(-(math.pi**2) / 4), rel=1e-12
  )
  # One client: no sum, tau = 0; z_eff = sigma / Delta_2.
  assert ddgauss_accounting.tau(3.0, 1) == 0.0
  assert ddgauss_accounting.effective_noise_multiplier(2.0, 3.0, 1, 10) == 1.5
  # Large sigma: tau underflows to 0 and z_eff = sqrt(n) sigma / Delta_2.
  z = ddgauss_accounting.effective_noise_multiplier(100.0, 50.0, 4, 1000)
  assert z == pytest.approx(1.0)
  # Small sigma: the tau term lowers z_eff below sqrt(n) sigma / Delta_2.
  sigma, n, d, l2 = 0.4, 3, 16, 1.0
  t = 10 * sum(
    math.exp(-2 * math.pi**2 * sigma**2 * k / (k + 1)) for k in (1, 2)
  )
  want = 1 / (l2 / (math.sqrt(n) * sigma) + math.sqrt(d) * t)
  assert ddgauss_accounting.effective_noise_multiplier(
    l2, sigma, n, d
  ) == pytest.approx(want, rel=1e-12)
  assert want < math.sqrt(n) * sigma / l2


def _measurements(n, **overrides):
  m = dict(
    actual_num_clients=n,
    min_clients=5,
    scaled_local_stddev=49.2,
    scaled_inflated_l2=100.0,
    padded_dim=1000,
    released=int(n >= 5),
  )
  m.update(overrides)
  return m


def test_event_does_not_depend_on_the_realised_cohort():
  # min_clients = 5: h = 4 shares counted, never the realised n.
  events = [
    ddgauss_accounting.round_event_from_measurements(_measurements(n))
    for n in (5, 6, 50, 4, 0)
  ]
  # The sampler rounds the stddev up: sigma = 50. The event is the
  # theorem's curve (Kairouz et al. Prop. 14), not a Gaussian.
  want = ddgauss_accounting.DiscreteGaussianSumDpEvent(
    l2_sensitivity=100.0, local_stddev=50.0, num_shares=4, dim=1000
  )
  assert all(e == want for e in events)
  # c = 100 / (sqrt(4) 50) + sqrt(1000) tau = 1 (tau underflows): the
  # curve is alpha / 2.
  np.testing.assert_allclose(want.rdp([2.0, 8.0, 64.0]), [1.0, 4.0, 32.0])
  # The target's own share is not counted: 5 shares would give less.
  five = attr.evolve(want, num_shares=5)
  assert five.rdp_coefficient() < want.rdp_coefficient()
  # Small sigma: sigma 0.3 runs as the integer scale 1, and the tau term
  # of h = 4 shares (not n) enters: c = 1 / (sqrt(4) 1) + sqrt(1000) tau.
  m = _measurements(50, scaled_local_stddev=0.3, scaled_inflated_l2=1.0)
  event = ddgauss_accounting.round_event_from_measurements(m)
  assert event == ddgauss_accounting.DiscreteGaussianSumDpEvent(
    1.0, 1.0, 4, 1000
  )
  t = 10 * sum(math.exp(-2 * math.pi**2 * k / (k + 1)) for k in (1, 2, 3))
  c = 1 / 2 + math.sqrt(1000) * t
  assert event.rdp([3.0])[0] == pytest.approx(3 * c**2 / 2, rel=1e-12)


def test_curve_event_by_hand_and_checks():
  # Delta_2 = 2, sigma = 3, one share (tau = 0): c = 2 / 3, eps(alpha) =
  # alpha (2/3)^2 / 2.
  event = ddgauss_accounting.DiscreteGaussianSumDpEvent(2.0, 3.0, 1, 10)
  np.testing.assert_allclose(
    event.rdp([1.5, 2.0, 10.0]), [1.5 * 2 / 9, 2 * 2 / 9, 10 * 2 / 9]
  )
  # Replace-one doubles Delta_2: c = 4 / 3, four times the curve.
  np.testing.assert_allclose(
    event.with_sensitivity_scaled(2.0).rdp([2.0]), [2 * 8 / 9]
  )
  for kwargs, match in (
    (dict(local_stddev=0.4), 'local_stddev must be a finite number >= 0.5'),
    (dict(l2_sensitivity=math.nan), 'l2_sensitivity must be a finite'),
    (dict(num_shares=0), 'num_shares must be an integer >= 1'),
    (dict(dim=2.0), 'dim must be an integer >= 1'),
  ):
    with pytest.raises(ValueError, match=match):
      attr.evolve(event, **kwargs)


def test_event_without_noise_or_min_clients():
  m = _measurements(7, scaled_local_stddev=0.0)
  assert isinstance(
    ddgauss_accounting.round_event_from_measurements(m),
    dp_accounting.NonPrivateDpEvent,
  )
  assert isinstance(
    ddgauss_accounting.planned_round_event(
      0.0, 1.0, 10, 100, 20, min_clients=5
    ),
    dp_accounting.NonPrivateDpEvent,
  )
  m = _measurements(7)
  del m['min_clients']
  with pytest.raises(ValueError, match='must hold min_clients'):
    ddgauss_accounting.round_event_from_measurements(m)


def test_binomial_min_clients_is_the_low_quantile():
  def below(n, q, k):  # P(Binomial(n, q) < k).
    return sum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(k))

  for n, q, p in ((100, 0.1, 0.01), (50, 0.3, 0.05), (1000, 0.02, 0.001)):
    k = ddgauss_accounting.binomial_min_clients(n, q, p)
    assert below(n, q, k) <= p < below(n, q, k + 1)
  assert ddgauss_accounting.binomial_min_clients(7, 1.0) == 7
  with pytest.raises(ValueError, match='needs min_clients >= 2'):
    ddgauss_accounting.binomial_min_clients(20, 0.05, 0.01)
  with pytest.raises(ValueError, match=r'rate must be in \(0, 1\]'):
    ddgauss_accounting.binomial_min_clients(20, 0.0)
  with pytest.raises(ValueError, match=r'withhold_prob must be in \(0, 1\)'):
    ddgauss_accounting.binomial_min_clients(20, 0.5, 1.0)
  with pytest.raises(ValueError, match='num_clients must be an integer >= 1'):
    ddgauss_accounting.binomial_min_clients(0, 0.5)


def test_seed000_ddgauss_row_reaccounted():
  # `ddgauss_300` (benchmarks/results/seed000_regime.md): Poisson q = 0.1
  # over 300 writers, 300 rounds, delta 0.00333333, and what every round
  # measured (metrics.csv): min_clients 19, integer scale 8,989 (ceil of
  # 8,988.6), Delta_2 30,015.535, padded d = 1,206,590. Published: 5.999
  # RDP / 5.156 PLD as GaussianDpEvent(1.2706); the theorem's curve with
  # Zhu & Wang's generic Poisson bound gives 6.880, and no PLD.
  measurements = dict(
    min_clients=19.0,
    scaled_local_stddev=8988.6005859375,
    scaled_inflated_l2=30015.53515625,
    padded_dim=1206590.0,
  )
  event = ddgauss_accounting.round_event_from_measurements(measurements)
  ledger = privacy.PrivacyLedger(
    privacy.Sampling('poisson', 300, rate=0.1), 0.00333333
  )
  for _ in range(300):
    ledger.record(event)
  eps_rdp, eps_pld = ledger.epsilon()
  assert eps_rdp == pytest.approx(6.8802, abs=1e-4)
  assert math.isnan(eps_pld)
  assert 'RDP curve' in ledger.pld_unavailable_reason()
  assert ledger.assumptions() == [privacy.POISSON_COUNT_ASSUMPTION]
  # Noise calibrated for epsilon 6 through this accounting, as the runner
  # does it (the registry's round event of these parameters), is 14%
  # higher than the run's 1.2712; PLD calibration is refused.
  method = methods.METHODS['ddgauss']
  params = method.resolve(
    methods.MethodParams(
      num_model_params=1206590,
      expected_clients_per_round=30.0,
      clip=0.03,
      options=ddgauss_method.DDGaussOptions(ddgauss_bits=20),
    ),
    ledger.sampling,
  )
  assert params.options.ddgauss_min_clients == 19
  assert method.round_event(1.2711800616184437, params) == (
    ddgauss_accounting.planned_round_event(
      1.2711800616184437, 0.03, 30.0, 1206590, 20, min_clients=19
    )
  )
  z = privacy.calibrate_noise_multiplier(
    6.0,
    0.00333333,
    300,
    ledger.sampling,
    round_event_fn=lambda z: method.round_event(z, params),
  )
  assert z == pytest.approx(1.4547, abs=1e-3)
  with pytest.raises(ValueError, match="accountant='pld' cannot calibrate"):
    privacy.calibrate_noise_multiplier(
      6.0,
      0.00333333,
      300,
      ledger.sampling,
      round_event_fn=lambda z: method.round_event(z, params),
      accountant='pld',
    )


def test_planned_event_checks_min_clients():
  with pytest.raises(
    ValueError, match=r'min_clients must be an integer in \[2, 4\].*Found 1'
  ):
    ddgauss_accounting.planned_round_event(1.0, 1.0, 4, 100, 20, min_clients=1)
