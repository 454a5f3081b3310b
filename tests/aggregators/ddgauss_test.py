import json
import math
import os
import subprocess
import sys

import attr
import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp import methods
from tff_dp import privacy
from tff_dp.aggregators import ddgauss
from tff_dp.methods import ddgauss as ddgauss_method


def test_tau_and_effective_noise_by_hand():
  # n = 2 clients of stddev 0.5: tau = 10 exp(-2 pi^2 0.25 / 2).
  assert ddgauss.tau(0.5, 2) == pytest.approx(
    10 * math.exp(-(math.pi**2) / 4), rel=1e-12
  )
  # One client: no sum, tau = 0; z_eff = sigma / Delta_2.
  assert ddgauss.tau(3.0, 1) == 0.0
  assert ddgauss.effective_noise_multiplier(2.0, 3.0, 1, 10) == 1.5
  # Large sigma: tau underflows to 0 and z_eff = sqrt(n) sigma / Delta_2.
  z = ddgauss.effective_noise_multiplier(100.0, 50.0, 4, 1000)
  assert z == pytest.approx(1.0)
  # Small sigma: the tau term lowers z_eff below sqrt(n) sigma / Delta_2.
  sigma, n, d, l2 = 0.4, 3, 16, 1.0
  t = 10 * sum(
    math.exp(-2 * math.pi**2 * sigma**2 * k / (k + 1)) for k in (1, 2)
  )
  want = 1 / (l2 / (math.sqrt(n) * sigma) + math.sqrt(d) * t)
  assert ddgauss.effective_noise_multiplier(l2, sigma, n, d) == pytest.approx(
    want, rel=1e-12
  )
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
    ddgauss.round_event_from_measurements(_measurements(n))
    for n in (5, 6, 50, 4, 0)
  ]
  # The sampler rounds the stddev up: sigma = 50. The event is the
  # theorem's curve (Kairouz et al. Prop. 14), not a Gaussian.
  want = ddgauss.DiscreteGaussianSumDpEvent(
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
  event = ddgauss.round_event_from_measurements(m)
  assert event == ddgauss.DiscreteGaussianSumDpEvent(1.0, 1.0, 4, 1000)
  t = 10 * sum(math.exp(-2 * math.pi**2 * k / (k + 1)) for k in (1, 2, 3))
  c = 1 / 2 + math.sqrt(1000) * t
  assert event.rdp([3.0])[0] == pytest.approx(3 * c**2 / 2, rel=1e-12)


def test_curve_event_by_hand_and_checks():
  # Delta_2 = 2, sigma = 3, one share (tau = 0): c = 2 / 3, eps(alpha) =
  # alpha (2/3)^2 / 2.
  event = ddgauss.DiscreteGaussianSumDpEvent(2.0, 3.0, 1, 10)
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
    ddgauss.round_event_from_measurements(m), dp_accounting.NonPrivateDpEvent
  )
  assert isinstance(
    ddgauss.planned_round_event(0.0, 1.0, 10, 100, 20, min_clients=5),
    dp_accounting.NonPrivateDpEvent,
  )
  m = _measurements(7)
  del m['min_clients']
  with pytest.raises(ValueError, match='must hold min_clients'):
    ddgauss.round_event_from_measurements(m)


def test_binomial_min_clients_is_the_low_quantile():
  def below(n, q, k):  # P(Binomial(n, q) < k).
    return sum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(k))

  for n, q, p in ((100, 0.1, 0.01), (50, 0.3, 0.05), (1000, 0.02, 0.001)):
    k = ddgauss.binomial_min_clients(n, q, p)
    assert below(n, q, k) <= p < below(n, q, k + 1)
  assert ddgauss.binomial_min_clients(7, 1.0) == 7
  with pytest.raises(ValueError, match='needs min_clients >= 2'):
    ddgauss.binomial_min_clients(20, 0.05, 0.01)
  with pytest.raises(ValueError, match=r'rate must be in \(0, 1\]'):
    ddgauss.binomial_min_clients(20, 0.0)
  with pytest.raises(ValueError, match=r'withhold_prob must be in \(0, 1\)'):
    ddgauss.binomial_min_clients(20, 0.5, 1.0)
  with pytest.raises(ValueError, match='num_clients must be an integer >= 1'):
    ddgauss.binomial_min_clients(0, 0.5)


@pytest.fixture(scope='module')
def context():
  contexts.set_simulation_context()


def _kairouz_z_eff(scaled_sigma, z, clip, h, d, beta=ddgauss.DEFAULT_BETA):
  """z_eff by hand from the scale that ran (Kairouz et al. 2021).

  Each client's continuous stddev is z clip / sqrt(h); the integer domain
  multiplies it by the scale factor and the sampler rounds it up. The L2
  bound after conditional rounding at gamma = 1 / scale is their Theorem 1
  (the smaller of c + sqrt(d) gamma and sqrt(c^2 + d gamma^2 / 4 +
  sqrt(2 ln(1 / beta)) gamma (c + sqrt(d) gamma / 2))), plus TFF's 1e-5,
  in integer units; z_eff = 1 / (Delta / (sqrt(h) sigma) + sqrt(d) tau).
  """
  scale = scaled_sigma / (z * clip / math.sqrt(h))
  gamma = 1.0 / scale
  bound_1 = clip + math.sqrt(d) * gamma
  bound_2 = math.sqrt(
    clip**2
    + d * gamma**2 / 4
    + math.sqrt(2 * math.log(1 / beta))
    * gamma
    * (clip + math.sqrt(d) * gamma / 2)
  )
  delta = (min(bound_1, bound_2) + 1e-5) * scale
  sigma = math.ceil(scaled_sigma)
  z_eff = 1 / (
    delta / (math.sqrt(h) * sigma) + math.sqrt(d) * ddgauss.tau(sigma, h)
  )
  return scale, delta, sigma, z_eff


def test_noise_std_and_planned_event_match_what_ran(context):
  z, clip, n, dim = 1.0, 1.0, 3, 20_000
  h = n - 1
  factory = ddgauss.ddgauss_mean(z, n, clip, min_clients=n, bits=20)
  process = factory.create(tff.TensorType(np.float32, [dim]))
  zeros = [np.zeros(dim, np.float32)] * n
  out = process.next(process.initialize(), zeros)
  m = out.measurements
  assert out.measurements['released'] == 1
  assert out.measurements['min_clients'] == n
  assert int(m['padded_dim']) == dim  # Even: no padding.
  scale, delta, sigma, z_eff = _kairouz_z_eff(
    float(m['scaled_local_stddev']), z, clip, h, dim
  )
  assert float(m['scaled_inflated_l2']) == pytest.approx(delta, rel=1e-5)
  # Zero updates round to zero, so the release is the n clients' discrete
  # Gaussians (stddev sigma each, integer units) over the scale and over
  # the expected n: stddev sqrt(n) sigma / scale / n per coordinate, which
  # is z clip sqrt(n / h) / n up to the integer rounding of sigma. 20,000
  # draws: the sample std's standard error is 0.5%; 2% is 4 of them.
  want_std = math.sqrt(n) * sigma / scale / n
  assert want_std == pytest.approx(
    math.sqrt(n / h) * z * clip / n, rel=1 / sigma
  )
  # The n clients have identical (zero) inputs: identical noise would give
  # n sigma, sqrt(3) = 1.73 times this.
  assert np.std(out.result) == pytest.approx(want_std, rel=0.02)
  assert abs(np.mean(out.result)) < 4 * want_std / math.sqrt(dim)
  # The event that was recorded and the one planned before training are
  # equal, and their curve is the hand-computed one: alpha / (2 z_eff^2).
  measured = ddgauss.round_event_from_measurements(out.measurements)
  planned = ddgauss.planned_round_event(z, clip, n, dim, 20, min_clients=n)
  assert measured == planned
  assert measured == ddgauss.DiscreteGaussianSumDpEvent(
    measured.l2_sensitivity, float(sigma), h, dim
  )
  assert measured.l2_sensitivity == pytest.approx(delta, rel=1e-5)
  assert measured.rdp([8.0])[0] == pytest.approx(8 / (2 * z_eff**2), rel=1e-5)
  assert z_eff < z  # The rounding's inflated sensitivity costs noise.


def test_round_below_min_clients_releases_zero(context):
  factory = ddgauss.ddgauss_mean(0.0, 3, 10.0, min_clients=3, bits=20)
  process = factory.create(tff.TensorType(np.float32, [4]))
  values = [
    np.array([1.0, -2.0, 0.5, 0.0], np.float32),
    np.array([3.0, 0.0, 0.5, 1.0], np.float32),
    np.array([2.0, 2.0, 2.0, 2.0], np.float32),
  ]
  state = process.initialize()
  withheld = process.next(state, values[:2])
  np.testing.assert_array_equal(withheld.result, np.zeros(4, np.float32))
  assert withheld.measurements['released'] == 0
  assert withheld.measurements['actual_num_clients'] == 2
  released = process.next(withheld.state, values)
  assert released.measurements['released'] == 1
  # sum / 3, up to the rounding error of scale ~1e4.
  np.testing.assert_allclose(released.result, [2.0, 0.0, 1.0, 1.0], atol=1e-2)
  # Both rounds record the same event (NonPrivate here: no noise).
  assert ddgauss.round_event_from_measurements(
    withheld.measurements
  ) == ddgauss.round_event_from_measurements(released.measurements)


def test_withheld_round_secure_sum_sees_only_zeros(context):
  # The threshold-abort secure sum: below min_clients = 3 every client
  # contributes zeros, so what the server sees (the secure sum's result)
  # is exactly zero; at 3 it is the sum.
  values = [
    np.array([5, 0, 7, 1], np.int32),
    np.array([2, 9, 0, 4], np.int32),
    np.array([1, 1, 1, 1], np.int32),
  ]
  process = ddgauss._ThresholdSecureSumFactory(3, 2**20 - 1, 0).create(
    tff.TensorType(np.int32, [4])
  )
  state = process.initialize()
  withheld = process.next(state, values[:2])
  np.testing.assert_array_equal(withheld.result, [0, 0, 0, 0])
  released = process.next(withheld.state, values)
  np.testing.assert_array_equal(released.result, [8, 10, 8, 6])
  # The whole noised pipeline below the mean (clip, rotate, round, noise,
  # modular clips, gated secure sum): with noise z = 1 and 2 < 3
  # participants, the unscaled, unrotated secure sum is exactly zero.
  factory = ddgauss.ddgauss_mean(1.0, 3, 1.0, min_clients=3, bits=20)
  p = factory._parameters(4)
  assert p.local_stddev > 1000  # Noise that would show.
  inner = factory._sum_factory(p).create(tff.TensorType(np.float32, [4]))
  floats = [v.astype(np.float32) / 10 for v in values]
  out = inner.next(inner.initialize(), floats[:2])
  np.testing.assert_array_equal(out.result, np.zeros(4, np.float32))
  out = inner.next(out.state, floats)
  assert np.all(out.result != 0)
  # And the factory's mean of a withheld round is exactly zero.
  process = factory.create(tff.TensorType(np.float32, [4]))
  out = process.next(process.initialize(), floats[:2])
  np.testing.assert_array_equal(out.result, np.zeros(4, np.float32))
  assert out.measurements['released'] == 0


def _client_noise(query, clients):
  """Each client's noised record of zeros (int32[1000]), as returned."""
  spec = tff.TensorType(np.int32, [1000])

  @tff.tensorflow.computation(spec)
  def client(record):
    params = query.derive_sample_params(query.initial_global_state())
    return query.preprocess_record(params, record)

  @tff.federated_computation(tff.FederatedType(spec, tff.CLIENTS))
  def noised(records):
    return tff.federated_map(client, records)

  return noised([np.zeros(1000, np.int32)] * clients)


def test_identical_clients_get_distinct_noise(context):
  # Two clients of one round, identical records, one state seed: each
  # folds in its own nonce, so their noise differs.
  query = ddgauss._SeededDiscreteGaussianSumQuery(1e9, 100, (3, 4))
  first, second = _client_noise(query, 2)
  assert not np.array_equal(first, second)
  # Independent, not merely different: the two clients' noise is
  # uncorrelated (|r| < 4 / sqrt(1000) at 4 standard errors).
  assert abs(np.corrcoef(first, second)[0, 1]) < 4 / np.sqrt(1000)
  # Each is N_Z(0, 100^2) noise (1,000 draws: the std's standard error is
  # 2.2%; 10% is 4.5 of them).
  for noise in (first, second):
    assert np.std(noise) == pytest.approx(100, rel=0.1)


def test_noise_is_a_function_of_the_seed_and_the_client_nonce(
  context, monkeypatch
):
  # With the clients' nonce fixed, a client's noise is a function of the
  # state's seed: the same seed gives bit-identical noise, another seed
  # other noise. (A whole round also depends on TFF's rotation seed and
  # rounding draws, which are not privacy noise.)
  monkeypatch.setattr(
    ddgauss, '_client_nonce', lambda: tf.constant([11, 12], tf.int64)
  )

  def noise(seed):
    (out,) = _client_noise(
      ddgauss._SeededDiscreteGaussianSumQuery(1e9, 100, seed), 1
    )
    return out

  np.testing.assert_array_equal(noise((7, 0)), noise((7, 0)))
  assert not np.array_equal(noise((7, 0)), noise((8, 0)))
  # The factory's seed: noise_seed as given, else a fresh 128-bit secret
  # for every factory.
  seeds = [
    ddgauss.ddgauss_mean(1.0, 2, 1.0, min_clients=2, noise_seed=s)._seed
    for s in (7, 7, None, None)
  ]
  assert seeds[0] == seeds[1] == (7, 0)
  assert seeds[2] != seeds[3]


def test_sampler_is_the_discrete_gaussian_and_stateless():
  seed = tf.constant([21, 22], tf.int64)
  draws = ddgauss.sample_discrete_gaussian(3, [40_000], seed).numpy()
  again = ddgauss.sample_discrete_gaussian(3, [40_000], seed).numpy()
  np.testing.assert_array_equal(draws, again)
  other = ddgauss.sample_discrete_gaussian(
    3, [40_000], tf.constant([21, 23], tf.int64)
  ).numpy()
  assert not np.array_equal(draws, other)
  # N_Z(0, 9): P(x) = exp(-x^2 / 18) / sum_y exp(-y^2 / 18). Each of the
  # frequencies of -8..8 within 4 standard errors of its probability.
  ys = np.arange(-60, 61)
  pmf = np.exp(-(ys**2) / 18.0)
  pmf /= pmf.sum()
  for x in range(-8, 9):
    p = pmf[ys == x][0]
    freq = np.mean(draws == x)
    assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / draws.size), x
  var = float(np.sum(pmf * ys**2))  # Just under 9.
  assert np.var(draws) == pytest.approx(var, rel=0.03)


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
  event = ddgauss.round_event_from_measurements(measurements)
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
    ddgauss.planned_round_event(
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


def test_zero_noise_mean(context):
  factory = ddgauss.ddgauss_mean(0.0, 2, 10.0, min_clients=2, bits=20)
  process = factory.create(tff.TensorType(np.float32, [4]))
  values = [
    np.array([1.0, -2.0, 0.5, 0.0], np.float32),
    np.array([3.0, 0.0, 0.5, 1.0], np.float32),
  ]
  out = process.next(process.initialize(), values)
  # (v1 + v2) / 2 up to the rounding error of scale ~1e5.
  np.testing.assert_allclose(out.result, [2.0, -1.0, 0.5, 0.5], atol=1e-3)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(noise_multiplier=-0.1), 'noise_multiplier must be a finite'),
    (
      dict(expected_clients_per_round=1.5),
      'expected_clients_per_round must be >= 2',
    ),
    (dict(min_clients=1), r'min_clients must be an integer in \[2, 10\]'),
    (dict(min_clients=11), r'min_clients must be an integer in \[2, 10\]'),
    (dict(min_clients=4.0), r'min_clients must be an integer in \[2, 10\]'),
    (dict(min_clients=True), r'min_clients must be an integer in \[2, 10\]'),
    (dict(clip=0.0), 'clip must be a finite number > 0'),
    (dict(bits=23), r'bits must be an integer in \[2, 22\]'),
    (dict(beta=1.0), r'beta must be in \[0, 1\)'),
  ],
)
def test_bad_args(kwargs, match):
  args = dict(noise_multiplier=1.0, expected_clients_per_round=10.5, clip=1.0)
  args['min_clients'] = 5
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    ddgauss.ddgauss_mean(**args)


def test_planned_event_checks_min_clients():
  with pytest.raises(
    ValueError, match=r'min_clients must be an integer in \[2, 4\].*Found 1'
  ):
    ddgauss.planned_round_event(1.0, 1.0, 4, 100, 20, min_clients=1)


def test_preflight_names_the_protobuf_setting():
  if ddgauss.protobuf_supports_ddgauss():
    pytest.skip('this process already uses pure-Python protobuf')
  with pytest.raises(
    ValueError, match='PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION'
  ):
    methods.METHODS['ddgauss'].preflight()


# pytest-timeout's 600 s default would cut the subprocess's own guard.
# Slow (pure-Python protobuf, 4-10 min): `make test-slow`. Its fast smoke in
# `make test`: test_noise_std_and_planned_event_match_what_ran (the
# aggregator in process, the event it records against the planned one).
@pytest.mark.slow
@pytest.mark.timeout(1300)
@pytest.mark.usefixtures('shared_data_dir')
def test_ddgauss_run_end_to_end_with_honest_ledger(tmp_path):
  """The runner picks pure-Python protobuf itself and accounts each round."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  env.pop('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION', None)
  out = tmp_path / 'ddgauss'
  done = subprocess.run(
    [
      sys.executable,
      '-m',
      'tff_dp.run',
      '--task=heart_disease',
      '--method=ddgauss',
      '--rounds=2',
      '--clients_per_round=4',
      '--noise_multiplier=1.0',
      '--delta=1e-3',
      '--batch_size=32',
      f'--root_output_dir={out}',
    ],
    capture_output=True,
    text=True,
    # A hang guard, not a speed target: pure-Python protobuf makes this run
    # take 5-10 minutes on 2 busy cores.
    timeout=1200,
    env=env,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((out / 'summary.json').read_text())
  event = summary['dp_events'][-1]
  assert event['type'] == 'SampledWithoutReplacementDpEvent'
  # Fixed-size sampling of 4: min_clients defaults to 4, h = 3 shares, and
  # every round records the planned event (the ledger's sampling wrapper
  # applied; it rescales for replace-one neighbouring).
  planned = ddgauss.planned_round_event(
    1.0, 1.0, 4, summary['num_model_params'], 20, min_clients=4
  )
  # (Its value against Kairouz et al.'s formula is checked by hand in
  # test_noise_std_and_planned_event_match_what_ran.)
  want = privacy.Sampling(
    'fixed', summary['num_clients'], clients_per_round=4
  ).wrap(planned)
  got = privacy.event_from_dict(event)
  assert got.event.num_shares == want.event.num_shares == 3
  assert got.event.local_stddev == want.event.local_stddev
  assert got.event.dim == want.event.dim
  # Replace-one: twice the planned Delta_2 (float64 measurements).
  assert got.event.l2_sensitivity == pytest.approx(
    want.event.l2_sensitivity, rel=1e-9
  )
  assert math.isnan(summary['epsilon_pld'])
  # 1,281 params padded to 1,282 coordinates of 20 bits each.
  assert summary['bytes_per_client_per_round']['up'] == math.ceil(1282 * 20 / 8)


def test_client_nonces_come_from_the_os_not_tfs_process_rng(
  context, monkeypatch, tmp_path
):
  del context
  # Read from the entropy file inside the client's computation: a file of
  # fixed content gives a fixed nonce (so TF's RNG plays no part) ...
  fixed = tmp_path / 'entropy'
  fixed.write_bytes(b''.join(bytes([i]) * 50 + b'\n' for i in range(1, 20)))
  monkeypatch.setattr(ddgauss, 'OS_ENTROPY_FILE', str(fixed))
  nonce = tff.tensorflow.computation(ddgauss._client_nonce)  # pylint: disable=protected-access
  assert np.array_equal(nonce(), nonce())
  monkeypatch.undo()
  # ... and /dev/urandom gives a fresh one each call, filling both words'
  # 63 bits.
  nonce = tff.tensorflow.computation(ddgauss._client_nonce)  # pylint: disable=protected-access
  draws = np.array([nonce() for _ in range(200)])
  assert len({tuple(d) for d in draws}) == 200
  assert draws.min() >= 0 and draws.max() > 2**62
