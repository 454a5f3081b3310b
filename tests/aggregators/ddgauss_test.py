import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp import methods
from tff_dp import privacy
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import ddgauss_accounting


@pytest.fixture(scope='module')
def context():
  contexts.set_simulation_context()


def _kairouz_z_eff(
  scaled_sigma, z, clip, h, d, beta=ddgauss_accounting.DEFAULT_BETA
):
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
    delta / (math.sqrt(h) * sigma)
    + math.sqrt(d) * ddgauss_accounting.tau(sigma, h)
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
  measured = ddgauss_accounting.round_event_from_measurements(out.measurements)
  planned = ddgauss_accounting.planned_round_event(
    z, clip, n, dim, 20, min_clients=n
  )
  assert measured == planned
  assert measured == ddgauss_accounting.DiscreteGaussianSumDpEvent(
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
  assert ddgauss_accounting.round_event_from_measurements(
    withheld.measurements
  ) == ddgauss_accounting.round_event_from_measurements(released.measurements)


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
      '--nobackground_evaluation',
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
  planned = ddgauss_accounting.planned_round_event(
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
