import json
import math
import os
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp import contexts
from tff_dp import methods
from tff_dp.aggregators import ddgauss


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


def test_event_from_measurements():
  m = dict(
    actual_num_clients=4,
    scaled_local_stddev=49.2,
    scaled_inflated_l2=100.0,
    padded_dim=1000,
  )
  event = ddgauss.round_event_from_measurements(m)
  # The sampler rounds the stddev up: sigma = 50.
  assert event.noise_multiplier == pytest.approx(1.0)
  m['actual_num_clients'] = 0
  assert isinstance(
    ddgauss.round_event_from_measurements(m), dp_accounting.NoOpDpEvent
  )


@pytest.fixture(scope='module')
def context():
  contexts.set_simulation_context()


def test_noise_std_and_planned_event_match_what_ran(context):
  z, clip, n, dim = 1.0, 1.0, 3, 2000
  factory = ddgauss.ddgauss_mean(z, n, clip, bits=20)
  process = factory.create(tff.TensorType(np.float32, [dim]))
  zeros = [np.zeros(dim, np.float32)] * n
  out = process.next(process.initialize(), zeros)
  # Mean over the expected 3 clients of noise N(0, (z clip)^2) in total:
  # stddev z clip / n per coordinate; 2,000 draws, 5% tolerance (~4 s.e.).
  assert np.std(out.result) == pytest.approx(z * clip / n, rel=0.07)
  assert abs(np.mean(out.result)) < 4 * (z * clip / n) / math.sqrt(dim)
  measured = ddgauss.round_event_from_measurements(out.measurements)
  planned = ddgauss.planned_round_event(z, clip, n, dim, 20)
  assert planned.noise_multiplier == pytest.approx(
    measured.noise_multiplier, rel=1e-6
  )
  # Inflation of the sensitivity by rounding makes z_eff slightly < z.
  assert 0.95 * z < measured.noise_multiplier < z


def test_zero_noise_mean(context):
  factory = ddgauss.ddgauss_mean(0.0, 2, 10.0, bits=20)
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
      dict(expected_clients_per_round=0.5),
      'expected_clients_per_round must be >= 1',
    ),
    (dict(clip=0.0), 'clip must be a finite number > 0'),
    (dict(bits=23), r'bits must be an integer in \[2, 22\]'),
    (dict(beta=1.0), r'beta must be in \[0, 1\)'),
  ],
)
def test_bad_args(kwargs, match):
  args = dict(noise_multiplier=1.0, expected_clients_per_round=10, clip=1.0)
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
    timeout=540,
    env=env,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((out / 'summary.json').read_text())
  event = summary['dp_events'][-1]
  assert event['type'] == 'SampledWithoutReplacementDpEvent'
  z_eff = event['event']['noise_multiplier']
  assert 0.95 < z_eff < 1.0  # Inflated sensitivity: slightly below 1.
  # 1,281 params padded to 1,282 coordinates of 20 bits each.
  assert summary['bytes_per_client_per_round']['up'] == math.ceil(1282 * 20 / 8)
