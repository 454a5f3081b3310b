"""--noise / --participation: the settings, the plan and runs end to end."""

import csv
import json

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
import pytest

from tff_dp import methods
from tff_dp import privacy
from tff_dp.job import noise_plan
from tff_dp.job import cohorts
from tff_dp import tasks
from tff_dp.job import training
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import mf_strategy

ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def _config(tmp_path=None, name='run', **kwargs):
  base = dict(
    task='heart_disease',
    method='dp_fedavg',
    # Its hashed groups split the four hospitals two and two (at --seed 0
    # all four hash into one group, and every other round is noise only).
    seed=2,
    rounds=4,
    client_sampling_rate=0.25,
    noise_multiplier=0.8,
    delta=1e-3,
    clip=1.0,
    batch_size=32,
    client_lr=0.1,
    checkpoint_every=1,
    participation='cyclic_poisson',
    noise='banded',
    bands='2',
    noise_seed=0,
    release_non_private_metrics=True,
    allow_noise_seed_reuse=True,
    background_evaluation=False,  # Inline: no evaluation child to start.
  )
  if tmp_path is not None:
    base['output_dir'] = str(tmp_path / name)
  base.update(kwargs)
  return training.ExperimentConfig.create(**base)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(participation='independent'), 'needs a cyclic --participation'),
    (
      dict(participation='independent', noise='iid', participation_groups=2),
      'for cyclic --participation',
    ),
    (
      dict(
        participation='independent',
        noise='iid',
        participation_partition='balanced',
      ),
      "--participation_partition is for cyclic --participation. Found 'bal",
    ),
    (dict(participation_partition='sorted'), 'by_client_id'),
    (dict(noise='blt', participation_groups=2), 'BLT noise has no amplified'),
    (dict(bands='auto', participation='cyclic'), 'needs --participation'),
    (
      dict(bands='auto', participation_groups=2, target_epsilon=1.0),
      'picks the groups too',
    ),
    (dict(bands='auto'), 'set --target_epsilon'),
    (dict(noise='iid'), 'needs --participation_groups'),
    (
      dict(client_sampling_rate=None, clients_per_round=2),
      'not a fixed cohort',
    ),
    (dict(method='dp_fedavg_adaptive'), 'methods with correlated noise: \\['),
  ],
)
def test_settings_that_do_not_go_together_are_named(kwargs, match):
  if kwargs.get('bands') == 'auto' and 'target_epsilon' in kwargs:
    kwargs = dict(kwargs, noise_multiplier=None)
  with pytest.raises(ValueError, match=match):
    _config(**kwargs).validate()


@pytest.mark.parametrize('bad', ['0', '-1', 'two', '1.5', 0, True, 2.0])
def test_bad_bands_are_named(bad):
  with pytest.raises(ValueError, match="'auto' or an integer >= 1"):
    _config(bands=bad)


def test_bands_as_an_int_plans_as_its_digits():
  # A Python config or a benchmark spec (`bands=4` read as JSON).
  a = noise_plan.resolve(_config(bands=3, rounds=12), 100, 1e-3)
  b = noise_plan.resolve(_config(bands='3', rounds=12), 100, 1e-3)
  assert a == b and a.strategy.bands == 3


def test_auto_bands_pick_the_least_expected_error_and_groups_follow():
  config = _config(
    task='fashion_mnist_iid',
    rounds=60,
    client_sampling_rate=0.05,
    noise_multiplier=None,
    target_epsilon=2.0,
    delta=1e-5,
    bands='auto',
  )
  plan = noise_plan.resolve(config, 1000, 1e-5)
  errors = [e for _, _, e in plan.choices]
  assert errors == sorted(errors)
  best_bands = plan.choices[0][0]
  assert plan.groups == best_bands == plan.strategy.bands
  # The same candidates straight from privacy.calibration.
  direct = privacy.calibration.choose_bands(
    noise_plan.AUTO_BANDS,
    rounds=60,
    rate=0.05,
    target_epsilon=2.0,
    delta=1e-5,
  )
  assert [(c.bands, c.noise_multiplier) for c in direct] == [
    (b, z) for b, z, _ in plan.choices
  ]


def test_blt_plan_is_optimised_for_min_separation():
  config = _config(
    rounds=30, participation='cyclic', participation_groups=3, noise='blt'
  )
  plan = noise_plan.resolve(config, 4, 1e-3)
  assert plan.groups == 3 and plan.strategy.kind == mf_strategy.BLT
  column = plan.strategy.column(30)
  assert np.all(column >= 0) and np.all(np.diff(column) <= 1e-12)
  k = 10
  assert mf_strategy.expected_error(
    plan.strategy, 30, 0.0, 3, k
  ) < mf_strategy.expected_error(mf_strategy.identity(), 30, 0.0, 3, k)


def _read(path):
  with open(path) as f:
    return list(csv.DictReader(f))


class _Interrupt(Exception):
  pass


def _weights(run_dir):
  with np.load(run_dir / 'final_model_weights.npz') as d:
    return {k: d[k] for k in d.files}


@pytest.fixture(scope='module')
def banded_run(tmp_path_factory, shared_data_root):
  del shared_data_root
  base = tmp_path_factory.mktemp('banded')
  summary = training.run_experiment(_config(base))
  return base / 'run', summary


def test_a_banded_run_accounts_amplified_banded_mf_each_round(banded_run):
  run_dir, summary = banded_run
  rows = _read(run_dir / 'metrics.csv')
  saved = json.loads((run_dir / 'summary.json').read_text())
  section = saved['privacy']['noise_across_rounds']
  strategy = mf_strategy.banded(section['strategy']['coefficients'])
  assert section['participation'] == {
    'schema': 'cyclic_poisson',
    'groups': 2,
    'rate': 0.5,
  }
  # Groups by client id (the default): the epsilon is stated for add/remove.
  assert section['partition'] == 'by_client_id'
  assert saved['privacy']['neighbouring_relation'].startswith(
    'add/remove one client (cyclic_poisson sampling, groups by a public hash'
  )
  assert section['sensitivity'] == pytest.approx(
    float(np.linalg.norm(strategy.coefficients)), rel=1e-12
  )
  # Every round's epsilon from dp_accounting directly: the theorem's event
  # (z over the column norm of the rounds so far, Poisson at the group
  # rate, once per visit).
  z = section['noise_multiplier']
  assert z == pytest.approx(0.8, rel=1e-6)
  for r in rows:
    n = int(r['round'])
    kappa = float(np.linalg.norm(strategy.coefficients[:n]))
    event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
        0.5, dp_accounting.GaussianDpEvent(z / kappa)
      ),
      -(-n // 2),
    )
    assert float(r['epsilon_rdp']) == pytest.approx(
      rdp.RdpAccountant(neighboring_relation=ADD_REMOVE)
      .compose(event)
      .get_epsilon(1e-3),
      rel=1e-9,
    )
    assert float(r['epsilon_pld']) == pytest.approx(
      pld.PLDAccountant(neighboring_relation=ADD_REMOVE)
      .compose(event)
      .get_epsilon(1e-3),
      rel=1e-9,
    )
  assert summary['epsilon_rdp'] == float(rows[-1]['epsilon_rdp'])
  # Round t's cohort came from group (t - 1) mod 2 of the hashed groups
  # (--seed 2: two hospitals in each).
  ids = tasks.load_task('heart_disease').train_data.client_ids
  np.testing.assert_array_equal(cohorts.partition(ids, 2, 2), [0, 1, 0, 1])
  rows = _read(run_dir / 'non_private' / 'metrics.csv')
  assert all(int(r['sampled_clients']) <= 2 for r in rows)


def test_a_resume_under_another_partition_is_refused(tmp_path):
  # The checkpointed ledger says how the groups were dealt; a config that
  # says otherwise (here edited by hand) must not continue its epsilon.
  config = _config(
    tmp_path, 'run', rounds=2, participation_partition='balanced'
  )

  def crash_after_one(round_num):
    if round_num == 1:
      raise _Interrupt()

  with pytest.raises(_Interrupt):
    training.run_experiment(config, round_callback=crash_after_one)
  saved = tmp_path / 'run' / 'config.json'
  edited = json.loads(saved.read_text())
  edited['participation_partition'] = 'by_client_id'
  saved.write_text(json.dumps(edited))
  with pytest.raises(ValueError, match="'partition': 'balanced'"):
    training.run_experiment(
      config.replace(participation_partition='by_client_id')
    )


@pytest.mark.parametrize('crash_after', [1, 2, 3])
def test_resume_from_every_rounds_checkpoint_is_bit_identical(
  tmp_path, banded_run, crash_after
):
  full_dir, _ = banded_run

  def crash(round_num):
    if round_num == crash_after:
      raise _Interrupt()

  config = _config(tmp_path)
  with pytest.raises(_Interrupt):
    training.run_experiment(config, round_callback=crash)
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == crash_after + 1
  a, b = _read(full_dir / 'metrics.csv'), _read(tmp_path / 'run/metrics.csv')
  assert a == b
  a, b = (
    [r['sampled_clients'] for r in _read(d / 'non_private' / 'metrics.csv')]
    for d in (full_dir, tmp_path / 'run')
  )
  assert a == b
  wa, wb = _weights(full_dir), _weights(tmp_path / 'run')
  assert sorted(wa) == sorted(wb)
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k])


def test_a_resume_streams_the_strategy_it_started_with(
  tmp_path, banded_run, monkeypatch
):
  # Another machine's optimiser can differ in the last bits (a BLT run
  # resumed on another machine did): the resumed run must read the plan
  # its folder kept, not optimise again, and end as the uninterrupted run.
  full_dir, _ = banded_run
  config = _config(tmp_path)

  def crash(round_num):
    if round_num == 2:
      raise _Interrupt()

  with pytest.raises(_Interrupt):
    training.run_experiment(config, round_callback=crash)
  kept = json.loads((tmp_path / 'run' / noise_plan.PLAN_FILE).read_text())
  assert kept == json.loads((full_dir / noise_plan.PLAN_FILE).read_text())
  started = mf_strategy.Strategy.from_dict(kept['strategy'])
  assert started.bands == 2

  def elsewhere(bands, horizon, momentum=0.0):
    del bands, horizon, momentum
    c = np.array(started.coefficients)
    return mf_strategy.banded(c * (1 + 1e-12 * np.arange(len(c))))

  monkeypatch.setattr(mf_strategy, 'optimize_banded', elsewhere)
  assert noise_plan.resolve(config, 4, 1e-3).strategy != started
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == 3
  a, b = _read(full_dir / 'metrics.csv'), _read(tmp_path / 'run/metrics.csv')
  assert a == b
  wa, wb = _weights(full_dir), _weights(tmp_path / 'run')
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k])


def test_a_folder_without_its_plan_names_the_file(tmp_path, monkeypatch):
  # A run folder from before the plan was kept, resumed where the
  # optimiser lands elsewhere: refused before its epsilon continues, and the
  # message says where the strategy is kept.
  config = _config(tmp_path, rounds=2)

  def crash(round_num):
    if round_num == 1:
      raise _Interrupt()

  with pytest.raises(_Interrupt):
    training.run_experiment(config, round_callback=crash)
  (tmp_path / 'run' / noise_plan.PLAN_FILE).unlink()
  monkeypatch.setattr(
    mf_strategy,
    'optimize_banded',
    lambda bands, horizon, momentum=0.0: mf_strategy.banded([1.0, 0.25]),
  )
  with pytest.raises(ValueError, match='noise_plan.json'):
    training.run_experiment(config)


@pytest.mark.parametrize(
  'text, match',
  [
    ('{not json', 'is not a readable noise plan'),
    ('{"strategy": {"kind": "dense"}}', "kind must be 'banded' or 'blt'"),
    (
      '{"strategy": {"kind": "banded", "bands": 3, "coefficients": [1, 0.5]}}',
      'size 3 has 2 values',
    ),
    (
      '{"strategy": {"kind": "blt", "buffers": 1, "theta": [0.5], '
      '"omega": [0.5]}, "groups": 2}',
      'holds a blt noise plan, not --noise=banded',
    ),
  ],
)
def test_a_bad_kept_plan_is_refused_naming_the_file(tmp_path, text, match):
  (tmp_path / noise_plan.PLAN_FILE).write_text(text)
  with pytest.raises(ValueError, match=match) as e:
    noise_plan.resolve_in(_config(), 4, 1e-3, tmp_path)
  assert noise_plan.PLAN_FILE in str(e.value)


def test_a_kept_plan_round_trips_exactly(tmp_path):
  for config in (
    _config(),
    _config(
      rounds=30, participation='cyclic', participation_groups=3, noise='blt'
    ),
  ):
    plan = noise_plan.resolve_in(config, 4, 1e-3, tmp_path / config.noise)
    again = noise_plan.resolve_in(config, 4, 1e-3, tmp_path / config.noise)
    assert again == plan
    assert (tmp_path / config.noise / noise_plan.PLAN_FILE).exists()
  assert noise_plan.resolve_in(_config(), 4, 1e-3, None) == (
    noise_plan.resolve(_config(), 4, 1e-3)
  )


def test_one_band_one_group_is_dp_fedavg_bit_for_bit(tmp_path, shared_data_dir):
  del shared_data_dir
  # --bands=1 under cyclic Poisson with one group: the same draws and
  # noise as plain Poisson DP-FedAvg, and the same epsilon.
  mf_dir, plain_dir = tmp_path / 'mf', tmp_path / 'plain'
  training.run_experiment(
    _config(tmp_path, 'mf', bands='1', participation_groups=1, rounds=3)
  )
  training.run_experiment(
    _config(
      tmp_path, 'plain', participation='independent', noise='iid', rounds=3
    )
  )
  a, b = _read(mf_dir / 'metrics.csv'), _read(plain_dir / 'metrics.csv')
  assert a == b
  wa, wb = _weights(mf_dir), _weights(plain_dir)
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k])


def test_the_round_event_the_noise_is_calibrated_with_is_the_ledgers():
  strategy = mf_strategy.optimize_banded(2, 10)
  params = methods.MethodParams(
    num_model_params=3, expected_clients_per_round=1.0, noise_strategy=strategy
  )
  event = methods.METHODS['dp_fedavg'].round_event(1.25, params)
  assert event == correlated_noise.MatrixFactorizationDpEvent(
    1.25, correlated_noise.strategy_json(strategy)
  )


# Every method with correlated noise but DP-FedAvg (tested above), from the
# registry: a method runs on the heart task with its defaults, and its round
# is one Gaussian stream at z = 0.8, unless listed here with what it needs
# and its round's streams' multipliers (merged by the ledger: 1/z^2 = sum
# 1/z_i^2, worked out by hand).
_Z = 0.8
_CORRELATED = sorted(
  n
  for n, m in methods.METHODS.items()
  if m.correlated_noise and n != 'dp_fedavg'
)
_NEEDS = {
  'fl_top_dp': (dict(task_kwargs=(('server_batch_size', 100),)), [_Z]),
  'cmp_fed': ({}, [_Z, _Z]),
  'dpsfl': (dict(sketch_columns=200, sketch_k=20), [_Z]),
  'dpsfl_ac': (
    dict(sketch_columns=200, sketch_k=20, dpsfl_bit_noise=2.0),
    [_Z, 2.0],
  ),
}


def test_the_correlated_noise_methods_are_private_and_the_table_is_theirs():
  assert set(_NEEDS) <= set(_CORRELATED)
  assert len(_CORRELATED) >= 9  # The registry was read.
  assert all(methods.METHODS[n].private for n in _CORRELATED)


# The methods whose rounds merge several streams (worked out by hand in
# _NEEDS) run in `make test`; the single-stream ones, whose accounting is
# DP-FedAvg's (tested above) and whose planned MF event the registry test
# checks, in `make test-slow`.
@pytest.mark.parametrize(
  'name',
  [
    n
    if len(_NEEDS.get(n, ({}, [_Z]))[1]) > 1
    else pytest.param(n, marks=pytest.mark.slow)
    for n in _CORRELATED
  ],
)
def test_each_correlated_noise_method_runs_and_is_accounted_as_merged_mf(
  tmp_path, shared_data_dir, name
):
  del shared_data_dir
  extra, streams = _NEEDS.get(name, ({}, [_Z]))
  summary = training.run_experiment(
    _config(tmp_path, method=name, rounds=2, noise_multiplier=_Z, **extra)
  )
  run_dir = tmp_path / 'run'
  section = json.loads((run_dir / 'summary.json').read_text())['privacy'][
    'noise_across_rounds'
  ]
  assert section['noise'] == 'correlated'
  strategy = mf_strategy.banded(section['strategy']['coefficients'])
  assert strategy.bands == 2
  z = sum(s**-2 for s in streams) ** -0.5
  assert section['noise_multiplier'] == pytest.approx(z, rel=1e-6)
  # The ledger's epsilon: the amplified banded MF event of the merged z
  # (2 groups at rate 0.5, 2 rounds: one visit), from dp_accounting.
  kappa = float(np.linalg.norm(strategy.coefficients))
  event = dp_accounting.PoissonSampledDpEvent(
    0.5, dp_accounting.GaussianDpEvent(z / kappa)
  )
  want = (
    rdp.RdpAccountant(neighboring_relation=ADD_REMOVE)
    .compose(event)
    .get_epsilon(1e-3)
  )
  assert summary['epsilon_rdp'] == pytest.approx(want, rel=1e-6)
  rows = _read(run_dir / 'metrics.csv')
  assert [r['round'] for r in rows] == ['1', '2']
  assert all(np.all(np.isfinite(w)) for w in _weights(run_dir).values())
