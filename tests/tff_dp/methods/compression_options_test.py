"""The --compression options of DP-FedAvg and DDGauss
(tff_dp/methods/linear_compression.py). Named apart from the aggregator's
tests, tests/aggregators/linear_compression_test.py: pytest needs distinct
basenames."""

import dataclasses

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
import pytest

from tff_dp import methods
from tff_dp import privacy
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import linear_compression as lc
from tff_dp.job import training
from tff_dp.methods import communication
from tff_dp.methods import linear_compression
from tff_dp.reporting import audit
from tff_dp.runtime import contexts

D = 1663370  # The CNN's parameters.


def _params(method, *, num_model_params=D, **options):
  method = methods.METHODS[method]
  return methods.MethodParams(
    num_model_params=num_model_params,
    expected_clients_per_round=100.0,
    noise_multiplier=1.185,
    clip=0.5,
    options=method.options(**options),
  )


def test_bytes_are_the_inner_methods_at_b_plus_the_seed():
  dp_fedavg = methods.METHODS['dp_fedavg']
  p = _params('dp_fedavg', compression='100')
  b = 16634
  assert linear_compression.rows(p) == b
  assert dp_fedavg.upload_bytes(p) == 4 * b + 8
  assert dp_fedavg.download_bytes(p) == 4 * D + 8
  assert dp_fedavg.upload_bytes(_params('dp_fedavg')) == 4 * D
  ddgauss = methods.METHODS['ddgauss']
  p = _params('ddgauss', compression='1000', ddgauss_bits=16)
  b = 1664
  assert ddgauss.upload_bytes(p) == communication.packed_bits_bytes(b, 16) + 8
  assert ddgauss.upload_bytes(p) == 16 * b // 8 + 8
  adaptive = methods.METHODS['dp_fedavg_adaptive']
  assert adaptive.upload_bytes(
    _params('dp_fedavg_adaptive', compression='10')
  ) == (4 * 166337 + 8)


@pytest.mark.parametrize(
  'sampling',
  [
    privacy.Sampling('poisson', 6000, rate=1 / 60),
    privacy.Sampling('fixed', 6000, clients_per_round=100),
    privacy.Sampling('cyclic_poisson', 6000, rate=0.5, groups=30),
    privacy.Sampling('cyclic', 6000, rate=1.0, groups=30),
  ],
  ids=lambda s: s.mode,
)
def test_every_sampling_accounts_compression_as_the_uncompressed_run(
  sampling,
):
  # The round event with compression is the method's own, for fixed and
  # adaptive clipping: every sampling's run event, so its epsilon and its
  # calibrated multiplier, are the uncompressed run's. Fixed-size
  # sampling, accounted by dp_accounting directly: replacing one clipped
  # client moves the sum by 2C, so its multiplier is z / 2.
  rounds, delta, z = 60, 1e-5, 1.185
  for name in ('dp_fedavg', 'dp_fedavg_adaptive'):
    method = methods.METHODS[name]
    plain = method.round_event(z, _params(name))
    compressed = method.round_event(z, _params(name, compression='1000'))
    assert compressed == plain
    eps = (
      sampling.rdp_accountant()
      .compose(sampling.run_event(compressed, rounds))
      .get_epsilon(delta)
    )
    assert eps == pytest.approx(
      sampling.rdp_accountant()
      .compose(sampling.run_event(plain, rounds))
      .get_epsilon(delta),
      rel=1e-12,
    )
  compressed = methods.METHODS['dp_fedavg'].round_event(
    z, _params('dp_fedavg', compression='1000')
  )
  ledger = (
    sampling.rdp_accountant()
    .compose(sampling.run_event(compressed, rounds))
    .get_epsilon(delta)
  )
  # The cyclic modes, accounted by dp_accounting directly: a client is in
  # rounds / groups = 2 of its group's rounds, Poisson-sampled at the rate
  # ('cyclic_poisson') or at most that often, unamplified ('cyclic').
  gaussian = dp_accounting.GaussianDpEvent(z)
  if sampling.mode == 'cyclic_poisson':
    assert ledger == pytest.approx(
      rdp.RdpAccountant()
      .compose(dp_accounting.PoissonSampledDpEvent(0.5, gaussian), 2)
      .get_epsilon(delta),
      rel=1e-12,
    )
  if sampling.mode == 'cyclic':
    assert ledger == pytest.approx(
      rdp.RdpAccountant().compose(gaussian, 2).get_epsilon(delta), rel=1e-12
    )
  if sampling.mode == 'fixed':
    direct = dp_accounting.SampledWithoutReplacementDpEvent(
      6000, 100, dp_accounting.GaussianDpEvent(z / 2)
    )
    compressed = methods.METHODS['dp_fedavg'].round_event(
      z, _params('dp_fedavg', compression='1000')
    )
    assert sampling.rdp_accountant().compose(
      sampling.run_event(compressed, rounds)
    ).get_epsilon(delta) == pytest.approx(
      rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
      )
      .compose(direct, rounds)
      .get_epsilon(delta),
      rel=1e-12,
    )


def test_ddgauss_event_is_planned_at_b():
  # DDGauss's event depends on the dimension: with compression it is the
  # event of a b-dim sum.
  ddgauss = methods.METHODS['ddgauss']
  p = _params('ddgauss', compression='1000', ddgauss_min_clients=80)
  plain = dataclasses.replace(
    p, options=dataclasses.replace(p.options, compression='none')
  )
  assert ddgauss.round_event(1.0, p) == ddgauss.round_event(
    1.0, dataclasses.replace(plain, num_model_params=1664)
  )
  assert ddgauss.round_event(1.0, p) != ddgauss.round_event(1.0, plain)
  auto = _params(
    'ddgauss',
    compression='auto',
    compression_norm_ratio=0.5,
    ddgauss_min_clients=80,
  )
  with pytest.raises(ValueError, match='does not depend on the dimension'):
    ddgauss.round_event(1.0, auto)


def test_plan_picks_the_largest_compression_under_the_tolerance():
  for sketch in lc.SKETCHES:
    p = _params(
      'dp_fedavg',
      compression='auto',
      compression_sketch=sketch,
      compression_norm_ratio=0.5,
      compression_tolerance=0.05,
    )
    plan = linear_compression.plan(p)
    b = plan['rows']

    def share(rows):
      return lc.added_error_share(
        sketch,
        D,
        rows,
        noise_multiplier=1.185,
        clients_per_round=100.0,
        norm_ratio=0.5,
      )

    assert share(b) <= 0.05 < share(b - 1)
    assert plan['predicted_added_error_share'] == pytest.approx(share(b))
    assert plan['compression'] == pytest.approx(D / b)
    assert plan['chosen_by'] == 'auto' and plan['norm_source'] == 'assumed'
  # tolerance x d z^2 / (n^2 rho^2) = 46.6: 47.7x for the SRHT here.
  assert 35 < linear_compression.plan(p)['compression'] < 50


def test_plan_refuses_when_no_compression_meets_the_tolerance():
  p = _params(
    'dp_fedavg',
    num_model_params=1000,
    compression='auto',
    compression_norm_ratio=1.0,
  )
  with pytest.raises(ValueError, match='no b < d = 1000 keeps the srht'):
    linear_compression.plan(p)


def test_correlated_noise_keeps_one_s_and_a_pilot_is_named_as_tuning():
  p = dataclasses.replace(
    _params('dp_fedavg', compression='10'), noise_strategy=object()
  )
  built = linear_compression.compressible(
    build_aggregator=lambda q: dp_fedavg.gaussian_fixed(1.0, 100, 0.5),
    upload_bytes=lambda q: 0,
    round_event=lambda z, q: None,
  )['build_aggregator'](p)
  assert built._resample is False
  assert (
    methods.METHODS['dp_fedavg']
    .build_aggregator(_params('dp_fedavg', compression='10'))
    ._resample
  )
  options = methods.METHODS['dp_fedavg'].options
  pilot = options(
    compression='auto',
    compression_norm_ratio=0.6,
    compression_norm_source='pilot',
  )
  assert 'non-private pilot' in pilot.tuning_outside_ledger()[0]
  assert (
    options(
      compression='auto', compression_norm_ratio=0.6
    ).tuning_outside_ledger()
    == []
  )


@pytest.mark.usefixtures('shared_data_dir')
def test_ddgauss_refuses_auto():
  with pytest.raises(ValueError, match='auto is for Gaussian noise'):
    training.ExperimentConfig.create(
      task='heart_disease',
      method='ddgauss',
      rounds=1,
      delta=1e-3,
      noise_multiplier=1.0,
      compression='auto',
      compression_norm_ratio=0.5,
    ).validate()


def test_options_refuse_bad_values():
  options = methods.METHODS['dp_fedavg'].options
  assert options(compression=100).compression == '100'
  assert options(compression=1234567).compression == '1234567'
  assert options(compression=2.5).compression == '2.5'
  for bad in ('0.5', 'fast', '', 'nan', True, 0.9):
    with pytest.raises(ValueError, match="compression must be 'none', 'auto'"):
      options(compression=bad)
  with pytest.raises(ValueError, match='compression_sketch must be one of'):
    options(compression='10', compression_sketch='dct')
  with pytest.raises(ValueError, match='compression_tolerance must be in'):
    options(compression_tolerance=0.0)


@pytest.mark.usefixtures('shared_data_dir')
def test_auto_needs_a_norm_ratio(tmp_path):
  with pytest.raises(ValueError, match='needs --compression_norm_ratio'):
    training.ExperimentConfig.create(
      task='heart_disease',
      method='dp_fedavg',
      rounds=1,
      delta=1e-3,
      noise_multiplier=1.0,
      compression='auto',
    ).validate()


def _config(tmp_path, name, **kwargs):
  base = dict(
    task='heart_disease',
    method='dp_fedavg',
    rounds=3,
    client_sampling_rate=0.75,
    target_epsilon=2.0,
    delta=1e-3,
    clip=1.0,
    batch_size=32,
    client_lr=0.1,
    checkpoint_every=1,
    output_dir=str(tmp_path / name),
    noise_seed=0,
    release_non_private_metrics=True,
    allow_noise_seed_reuse=True,
    background_evaluation=False,
  )
  base.update(kwargs)
  return training.ExperimentConfig.create(**base)


def _read(path):
  return path.read_text()


class _Interrupt(Exception):
  pass


@pytest.fixture(scope='module')
def compressed_run(tmp_path_factory):
  base = tmp_path_factory.mktemp('lc')
  summary = training.run_experiment(
    _config(base, 'run', compression='auto', compression_norm_ratio=0.5)
  )
  return base, summary


@pytest.mark.usefixtures('shared_data_dir')
def test_epsilon_is_the_uncompressed_runs_and_dp_accountings(compressed_run):
  base, summary = compressed_run
  # The uncompressed method's calibration (as its run calibrates): the
  # same multiplier, so the same events and epsilon.
  sampling = privacy.Sampling.from_dict(summary['sampling'])
  plain = methods.METHODS['dp_fedavg']
  uncompressed = _params(
    'dp_fedavg', num_model_params=summary['num_model_params']
  )
  assert summary['noise_multiplier'] == privacy.calibrate_noise_multiplier(
    2.0,
    1e-3,
    3,
    sampling,
    round_event_fn=lambda z: plain.round_event(z, uncompressed),
  )
  # The multiplier the aggregator recorded (float32 in its state), accounted
  # by dp_accounting directly.
  recorded = privacy.event_from_dict(summary['dp_events'][-1])
  z = recorded.event.noise_multiplier
  assert recorded == dp_accounting.PoissonSampledDpEvent(
    0.75, dp_accounting.GaussianDpEvent(z)
  )
  assert z == pytest.approx(summary['noise_multiplier'], rel=1e-6)
  event = dp_accounting.PoissonSampledDpEvent(
    0.75, dp_accounting.GaussianDpEvent(z)
  )
  want = rdp.RdpAccountant().compose(event, 3).get_epsilon(1e-3)
  assert summary['epsilon_rdp'] == pytest.approx(want, rel=1e-12)
  assert summary['epsilon_pld'] == pytest.approx(
    pld.PLDAccountant().compose(event, 3).get_epsilon(1e-3), rel=1e-9
  )
  plan = summary['compression_plan']
  d = summary['num_model_params']
  assert plan['dim'] == d
  assert plan['noise_multiplier'] == summary['noise_multiplier']
  assert summary['bytes_per_client_per_round'] == {
    'down': 4 * d + 8,
    'up': 4 * plan['rows'] + 8,
  }
  # The decode's error was measured (a research row) beside the plan.
  metrics = (base / 'run' / 'non_private' / 'metrics.csv').read_text()
  assert 'tff/aggregator/compression_error_sq' in metrics


@pytest.mark.usefixtures('shared_data_dir')
def test_resume_is_bit_identical(tmp_path, compressed_run):
  base, _ = compressed_run

  def crash(round_num):
    if round_num == 2:
      raise _Interrupt()

  config = _config(
    tmp_path, 'run', compression='auto', compression_norm_ratio=0.5
  )
  with pytest.raises(_Interrupt):
    training.run_experiment(config, round_callback=crash)
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == 3
  assert _read(base / 'run/metrics.csv') == _read(tmp_path / 'run/metrics.csv')
  with (
    np.load(base / 'run/final_model_weights.npz') as a,
    np.load(tmp_path / 'run/final_model_weights.npz') as b,
  ):
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
      np.testing.assert_array_equal(a[k], b[k])


def test_the_audits_canaries_pass_through_the_wrapper():
  # Canaries at 3 x the clip, every round: the wrapper's release is
  # consistent with the ledger's epsilon (the inner event), and the
  # estimated mu is that of the uncompressed mechanism, sqrt(T) / z = 1.
  contexts.set_simulation_context()
  z, clip, rounds, delta, dim, canaries = 2.0, 1.0, 4, 1e-5, 20000, 300
  method = methods.METHODS['dp_fedavg']
  params = methods.MethodParams(
    num_model_params=dim,
    expected_clients_per_round=float(canaries),
    noise_multiplier=z,
    clip=clip,
    noise_seed=2,
    options=method.options(compression='10'),
  )
  assert isinstance(
    method.build_aggregator(params), lc.LinearCompressionFactory
  )
  result = audit.audit_method(
    method,
    params,
    shape=[dim],
    num_canaries=canaries,
    rounds=rounds,
    delta=delta,
    seed=1,
  )
  want = (
    pld.PLDAccountant()
    .compose(
      dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(z), rounds
      )
    )
    .get_epsilon(delta)
  )
  assert result.ledger_epsilon == pytest.approx(want)
  # No more than the ledger's mu, and the canaries get through at about
  # it (the audit has the power to see a leak).
  assert result.mu_lower <= 1.0
  assert result.mu_upper > 0.9
  assert not result.flagged
