"""End-to-end tests of the training loop on the real (small) heart data."""

import csv
import dataclasses
import gc
import json
import os
import pathlib
import re
import subprocess
import sys

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
import pytest

from tff_dp import methods
from tff_dp.job import training
from tff_dp.job import outputs
from tff_dp import privacy

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def _config(tmp_path, name, **kwargs):
  base = dict(
    task='heart_disease',
    method='dp_fedavg',
    rounds=4,
    client_sampling_rate=0.75,
    noise_multiplier=0.5,
    delta=1e-3,
    clip=1.0,
    batch_size=32,
    client_lr=0.1,
    checkpoint_every=1,
    output_dir=str(tmp_path / name),
    # Runs compared bit for bit: reproducible noise and sampling.
    noise_seed=0,
    # Research runs: their tests read the non-private outputs too.
    release_non_private_metrics=True,
    allow_noise_seed_reuse=True,
  )
  base.update(kwargs)
  return training.ExperimentConfig.create(**base)


def _read_csv(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def _rows(path):
  """A metrics.csv's rows, with its run's non_private/metrics.csv merged in
  by round where the run released one."""
  rows = _read_csv(path)
  extra = path.parent / outputs.NON_PRIVATE_DIR / path.name
  if extra.exists():
    by_round = {r['round']: r for r in _read_csv(extra)}
    rows = [{**by_round[r['round']], **r} for r in rows]
  return rows


def _final_weights(output_dir):
  with np.load(output_dir / 'final_model_weights.npz') as d:
    return {k: d[k] for k in d.files}


def test_method_params_from_a_saved_config_equal_the_runs():
  config = training.ExperimentConfig.create(
    task='fashion_mnist_iid',
    method='cmp_fed',
    cmp_rank=2,
    cmp_clip_u=0.5,
    clip=0.8,
    seed=3,
  )
  saved = json.loads(json.dumps(config.flat()))
  saved['noise_multiplier'] = 99.0  # The run's calibrated value wins.
  kwargs = dict(
    num_model_params=10,
    expected_clients_per_round=5.0,
    noise_multiplier=1.5,
  )
  from_run = methods.MethodParams.from_config(config.flat(), **kwargs)
  assert methods.MethodParams.from_config(saved, **kwargs) == from_run
  o = from_run.options
  assert (o.cmp_rank, o.cmp_clip_u, o.cmp_clip_v) == (
    2,
    0.5,
    None,
  )
  assert (from_run.clip, from_run.seed, from_run.noise_multiplier) == (
    0.8,
    3,
    1.5,
  )


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """`(output dir, summary)` of one uninterrupted `_config` run (4 rounds,
  its checkpoints kept), shared by the tests that compare an interrupted
  run with it."""
  base = tmp_path_factory.mktemp('reference')
  summary = training.run_experiment(_config(base, 'run', keep_checkpoints=True))
  return base / 'run', summary


def test_dp_fedavg_end_to_end_and_ledger(reference):
  run_dir, summary = reference
  rows = _rows(run_dir / 'metrics.csv')
  assert [int(r['round']) for r in rows] == [1, 2, 3, 4]
  for key in (
    'train_loss',
    'test_auroc',
    'test_balanced_accuracy',
    'epsilon_rdp',
    'epsilon_pld',
    'clip',
    'bytes_up_per_client',
    'bytes_down_per_client',
    'round_seconds',
  ):
    assert key in rows[0], key
  # Epsilon from dp_accounting directly: 4 Poisson-sampled Gaussian rounds.
  event = dp_accounting.PoissonSampledDpEvent(
    0.75, dp_accounting.GaussianDpEvent(0.5)
  )
  want = rdp.RdpAccountant().compose(event, 4).get_epsilon(1e-3)
  assert float(rows[-1]['epsilon_rdp']) == pytest.approx(want, rel=1e-9)
  assert summary['epsilon_rdp'] == pytest.approx(want, rel=1e-9)
  eps = [float(r['epsilon_rdp']) for r in rows]
  assert eps == sorted(eps) and eps[0] > 0
  # Every round's row, RDP and PLD, from dp_accounting directly: rows are
  # finished on a background thread, their PLD from a reused distribution.
  for r in rows:
    n = int(r['round'])
    assert float(r['epsilon_rdp']) == pytest.approx(
      rdp.RdpAccountant().compose(event, n).get_epsilon(1e-3), rel=1e-9
    )
    assert float(r['epsilon_pld']) == pytest.approx(
      pld.PLDAccountant().compose(event, n).get_epsilon(1e-3), rel=1e-9
    )
  # 1,281 float32 parameters down and up per participating client.
  assert int(rows[0]['bytes_up_per_client']) == 4 * 1281
  total = sum(int(r['sampled_clients']) for r in rows) * 4 * 1281
  assert int(rows[-1]['bytes_up_total']) == total
  saved = json.loads((run_dir / 'summary.json').read_text())
  assert saved['config']['noise_multiplier'] == 0.5
  assert saved['config']['client_sampling_rate'] == 0.75
  # TensorBoard: each round's scalars at the run's start + its round,
  # whatever the round took.
  (events,) = (run_dir / 'tensorboard').glob('events.*')
  start = int(events.name.split('.')[3])
  assert events.name == f'events.out.tfevents.{start:010d}.tff_dp.000001'
  scalars = _tensorboard_scalars(run_dir, 'epsilon_rdp')
  assert [(e.step, e.wall_time) for e in scalars] == [
    (t, start + t) for t in (1, 2, 3, 4)
  ]
  assert [e.value for e in scalars] == pytest.approx(
    [float(r['epsilon_rdp']) for r in rows], rel=1e-6
  )
  # Kept (--keep_checkpoints): the secret state, owner-only.
  secret = run_dir / outputs.SECRET_DIR
  assert sorted(
    p.name for p in (run_dir / outputs.CHECKPOINT_DIR).iterdir()
  ) == [
    'round_3',
    'round_4',
  ]
  assert not (run_dir / outputs.LEGACY_CHECKPOINT_DIR).exists()
  for path in [secret, *secret.rglob('*')]:
    mode = path.stat().st_mode & 0o777
    assert mode == (0o700 if path.is_dir() else 0o600), path


class _Interrupt(Exception):
  pass


def test_client_lr_decay_per_round_and_exact_on_resume(tmp_path, reference):
  # Seed 001's 0.99 decay, here 0.5: round t trains at 0.1 x 0.5^(t-1);
  # the rate is a function of the round, so a resumed run is identical.
  full = _config(tmp_path, 'full', client_lr_decay=0.5)
  training.run_experiment(full)
  rows = _rows(tmp_path / 'full' / 'metrics.csv')
  lrs = [float(r['client_lr']) for r in rows]
  assert lrs == pytest.approx([0.1, 0.05, 0.025, 0.0125])

  def crash_after_one(round_num):
    if round_num == 1:
      raise _Interrupt()

  resumed = _config(tmp_path, 'resumed', client_lr_decay=0.5)
  with pytest.raises(_Interrupt):
    training.run_experiment(resumed, round_callback=crash_after_one)
  training.run_experiment(resumed)
  a = _final_weights(tmp_path / 'full')
  b = _final_weights(tmp_path / 'resumed')
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  # The reference run is the same command without the decay.
  constant_dir, _ = reference
  c = _final_weights(constant_dir)
  assert any(not np.array_equal(a[k], c[k]) for k in a)
  assert 'client_lr' not in _rows(constant_dir / 'metrics.csv')[0]


def test_kill_and_resume_equals_uninterrupted(tmp_path, reference):
  full_dir, _ = reference

  def crash_after_two(round_num):
    if round_num == 2:
      raise _Interrupt()

  resumed = _config(tmp_path, 'resumed')
  with pytest.raises(_Interrupt):
    training.run_experiment(resumed, round_callback=crash_after_two)
  assert len(_rows(tmp_path / 'resumed' / 'metrics.csv')) == 2
  summary = training.run_experiment(resumed)  # The same command again.
  assert summary['rounds_completed'] == 4
  assert summary['first_round_this_invocation'] == 3
  a = _rows(full_dir / 'metrics.csv')
  b = _rows(tmp_path / 'resumed' / 'metrics.csv')
  for ra, rb in zip(a, b):
    for key in (
      'sampled_clients',
      'train_loss',
      'test_loss',
      'epsilon_rdp',
      'epsilon_pld',
      'bytes_up_total',
    ):
      assert ra[key] == rb[key], (ra['round'], key)
  wa = _final_weights(full_dir)
  wb = _final_weights(tmp_path / 'resumed')
  assert sorted(wa) == sorted(wb) and len(wa) == 4
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k])


def test_worker_threads_do_not_change_results(tmp_path):
  # One client computation at a time on TF's default pools, against the
  # defaults (3 concurrent calls, 1 intra-op and 4 inter-op threads): every
  # client of every round, same numbers to the bit.
  serial = _config(
    tmp_path,
    'serial',
    rounds=2,
    client_sampling_rate=1.0,
    max_concurrent_computation_calls=1,
    intra_op_threads=0,
    inter_op_threads=0,
  )
  training.run_experiment(serial)
  default = _config(tmp_path, 'default', rounds=2, client_sampling_rate=1.0)
  assert default.max_concurrent_computation_calls == 3
  assert (default.intra_op_threads, default.inter_op_threads) == (1, 4)
  training.run_experiment(default)
  a = _rows(tmp_path / 'serial' / 'metrics.csv')
  b = _rows(tmp_path / 'default' / 'metrics.csv')
  assert [r['train_loss'] for r in a] == [r['train_loss'] for r in b]
  wa = _final_weights(tmp_path / 'serial')
  wb = _final_weights(tmp_path / 'default')
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k])


def test_fixed_size_sampling_and_nonprivate(
  tmp_path, shared_data_dir, monkeypatch
):
  # What the runner logs (TF's checkpoint save lowers absl's verbosity in
  # a process that did not parse absl's flags).
  logs = []
  monkeypatch.setattr(
    training.logging, 'info', lambda msg, *args: logs.append(msg % args)
  )
  summary = training.run_experiment(
    _config(
      tmp_path,
      'fixed',
      rounds=2,
      client_sampling_rate=None,
      clients_per_round=2,
    )
  )
  assert summary['sampling']['mode'] == 'fixed'
  # No PLD epsilon under fixed-size sampling: said once, with the reason,
  # and the progress lines show the RDP epsilon alone.
  monkeypatch.undo()
  (reason,) = (m for m in logs if m.startswith('No PLD epsilon'))
  assert 'SampledWithoutReplacementDpEvent' in reason
  lines = [m for m in logs if m.startswith('round ') and 'eps_rdp' in m]
  assert len(lines) == 2
  assert not [m for m in lines if 'eps_pld' in m]
  # Noise 0.5 x clip; replacing a client moves the sum by 2 x clip.
  event = dp_accounting.SampledWithoutReplacementDpEvent(
    4, 2, dp_accounting.GaussianDpEvent(0.25)
  )
  want = (
    rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    .compose(event, 2)
    .get_epsilon(1e-3)
  )
  assert summary['epsilon_rdp'] == pytest.approx(want, rel=1e-9)
  summary = training.run_experiment(
    _config(
      tmp_path,
      'fedavg',
      method='fedavg',
      rounds=2,
      noise_multiplier=None,
      client_sampling_rate=None,
      clients_per_round=4,
    )
  )
  assert summary['epsilon_rdp'] is None
  # The reported AUROC is the final model's on the test set: Keras' AUC
  # (200 thresholds) against the exact rank statistic of the saved
  # weights' logits.
  assert summary['final']['test_auroc'] == pytest.approx(
    _exact_test_auroc(tmp_path / 'fedavg', shared_data_dir), abs=2e-3
  )


def _exact_test_auroc(output_dir, data_dir):
  from sklearn import metrics as sk_metrics  # pylint: disable=g-import-not-at-top

  from tff_dp.tasks import medical  # pylint: disable=g-import-not-at-top

  task = medical.load_heart_disease(data_dir)
  model = task.model_builder()
  weights = _final_weights(output_dir)
  model.set_weights(
    [weights[f'trainable_{i}'] for i in range(len(model.trainable_weights))]
  )
  logits = model.predict(task.test_x, verbose=0).reshape(-1)
  return sk_metrics.roc_auc_score(task.test_y.reshape(-1), logits)


def test_target_epsilon_calibration(tmp_path):
  summary = training.run_experiment(
    _config(
      tmp_path,
      'calibrated',
      rounds=3,
      noise_multiplier=None,
      target_epsilon=5.0,
    )
  )
  assert summary['epsilon_rdp'] == pytest.approx(5.0, abs=0.01)


def test_other_flags_in_same_dir_fail(tmp_path):
  training.run_experiment(_config(tmp_path, 'run', rounds=1))
  with pytest.raises(training.ConfigError) as e:
    training.run_experiment(_config(tmp_path, 'run', rounds=1, clip=2.0))
  # The flag and its two values.
  assert (
    f'{tmp_path / "run"} holds a run with different flags (--clip: 1.0 '
    'there, 2.0 now); rerun the same command to resume, or choose a new '
    '--root_output_dir.'
  ) == str(e.value)


def _saved_before(config, setting: str) -> pathlib.Path:
  """The run folder of `config` holding a config.json written before
  `setting` existed (without its key)."""
  old = config.to_dict()
  del old[setting]
  out = pathlib.Path(config.output_dir)
  out.mkdir(parents=True)
  (out / 'config.json').write_text(json.dumps(old))
  return out


def test_flag_added_after_a_run_started_resumes_at_its_default(tmp_path):
  # A config.json written before `sketch_hashing` existed lacks it: the
  # run had the default's behaviour, so the same command resumes it, and
  # the other value is a different run.
  config = _config(tmp_path, 'old', rounds=1, method='fetchsgd')
  out = _saved_before(config, 'sketch_hashing')
  outputs.check_same_config(out, config)
  with pytest.raises(
    training.ConfigError,
    match=r"different flags \(--sketch_hashing: 'murmur' there, 'block' now\)",
  ):
    outputs.check_same_config(out, config.replace(sketch_hashing='block'))


def test_a_setting_whose_default_changed_resumes_at_its_legacy_value(
  tmp_path,
):
  # A config.json written before `top_k_nonprivate_clip` existed ran with
  # the clip (methods.LEGACY_DEFAULTS), not with today's default: today's
  # default is a different run, and a rebuilt aggregator gets the old value.
  assert methods.LEGACY_DEFAULTS['top_k_nonprivate_clip'] is True
  config = _config(tmp_path, 'old', rounds=1, method='fl_top')
  assert config.options.top_k_nonprivate_clip is False
  out = _saved_before(config, 'top_k_nonprivate_clip')
  old = json.loads((out / 'config.json').read_text())
  with pytest.raises(
    training.ConfigError,
    match=r'different flags \(--top_k_nonprivate_clip: True there, False now',
  ):
    outputs.check_same_config(out, config)
  outputs.check_same_config(out, config.replace(top_k_nonprivate_clip=True))
  kwargs = dict(num_model_params=10, expected_clients_per_round=2.0)
  assert methods.MethodParams.from_config(
    old, **kwargs
  ).options.top_k_nonprivate_clip
  assert not methods.MethodParams.from_config(
    config.to_dict(), **kwargs
  ).options.top_k_nonprivate_clip


def test_a_cyclic_run_from_before_partitions_resumes_balanced(tmp_path):
  # A config.json written before --participation_partition existed dealt
  # its groups from a permutation ('balanced', the legacy value): resuming
  # it needs that value. Under independent participation the setting does
  # nothing, so an old config resumes under today's default.
  cyclic = _config(
    tmp_path,
    'cyclic',
    rounds=1,
    participation='cyclic_poisson',
    noise='banded',
    bands='2',
    noise_multiplier=1.0,
  )
  assert cyclic.participation_partition == 'by_client_id'
  plain = _config(tmp_path, 'plain', rounds=1)
  cyclic_dir = _saved_before(cyclic, 'participation_partition')
  plain_dir = _saved_before(plain, 'participation_partition')
  with pytest.raises(
    training.ConfigError,
    match=r"different flags \(--participation_partition: 'balanced' there",
  ):
    outputs.check_same_config(cyclic_dir, cyclic)
  outputs.check_same_config(
    cyclic_dir, cyclic.replace(participation_partition='balanced')
  )
  outputs.check_same_config(plain_dir, plain)


def test_tuning_outside_ledger_names_cmp_feds_two_clips():
  config = training.ExperimentConfig.create(
    task='heart_disease',
    method='cmp_fed',
    clip=1.0,
    cmp_clip_u=0.05,
    clip_source='median rule on a probe run',
  )
  steps = outputs.tuning_outside_ledger(config, methods.METHODS['cmp_fed'])
  assert 'clips C1 0.05, C2 1: median rule on a probe run' in steps
  config = config.replace(method='dp_fedavg')
  steps = outputs.tuning_outside_ledger(config, methods.METHODS['dp_fedavg'])
  assert 'clip 1: median rule on a probe run' in steps


@pytest.mark.parametrize(
  'task, public_set',
  [
    ('physionet2012', 'patients held out of every client'),
    ('fashion_mnist_iid', 'EMNIST digits stand in'),
  ],
)
def test_tuning_outside_ledger_names_fl_tops_public_set(task, public_set):
  config = training.ExperimentConfig.create(task=task, method='fl_top_dp')
  steps = outputs.tuning_outside_ledger(config, methods.METHODS['fl_top_dp'])
  (mask,) = (s for s in steps if 'Top-K mask' in s)
  assert public_set in mask


@pytest.mark.parametrize('name', sorted(methods.LEGACY_DEFAULTS))
def test_every_legacy_default_differs_from_today_and_fills_old_configs(name):
  legacy = methods.LEGACY_DEFAULTS[name]
  # The first method that takes the setting (any method for a common one).
  method = min(methods.option_fields().get(name, (None, ['dp_fedavg']))[1])
  config = training.ExperimentConfig.create(method=method)
  assert config.flat()[name] != legacy
  if not hasattr(methods.MethodParams, name) and (
    name not in methods.option_fields()
  ):
    # Not a builder setting: a resume reads it (`outputs.check_same_config`;
    # test_a_cyclic_run_from_before_partitions_resumes_balanced).
    return
  kwargs = dict(num_model_params=10, expected_clients_per_round=2.0)
  today = methods.MethodParams.from_config(config.flat(), **kwargs)
  old = methods.MethodParams.from_config({'method': method}, **kwargs)
  if name in methods.option_fields():
    today, old = today.options, old.options
  assert getattr(today, name) != legacy
  assert getattr(old, name) == legacy


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (
      dict(noise_multiplier=-1.0),
      r'noise_multiplier must be a finite number >= 0. Found -1.0',
    ),
    (
      dict(client_sampling_rate=0.0),
      r'client_sampling_rate must be in \(0, 1\]. Found 0.0',
    ),
    (
      dict(client_sampling_rate=1.5),
      r'client_sampling_rate must be in \(0, 1\]. Found 1.5',
    ),
    (dict(task='mnist'), r"Unknown task 'mnist'; choose one of"),
    (dict(method='magic'), r"Unknown method 'magic'; choose one of"),
    (
      dict(noise_multiplier=None, target_epsilon=1.0, delta=None),
      r'target_epsilon needs delta',
    ),
    (dict(rounds=0), r'rounds must be an integer >= 1. Found 0'),
    (dict(delta=1.0), r'delta must be in \(0, 1\). Found 1.0'),
    (dict(noise_multiplier=None), r'is private: set --noise_multiplier'),
    (dict(clients_per_round=3), r'not both'),
    (
      dict(method='blur', blur_lambda=-1.0),
      r'blur_lambda must be a finite number >= 0',
    ),
    (dict(method='lus', lus_sparsity=1.0), r'lus_sparsity must be in \[0, 1\)'),
    (
      dict(method='dp_randagg', randagg_fraction=0.0),
      r'randagg_fraction must be in \(0, 1\]',
    ),
    (
      dict(inter_op_threads=-1),
      r'inter_op_threads must be an integer >= 0. Found -1',
    ),
  ],
)
def test_bad_config_fails_before_training(tmp_path, kwargs, match):
  with pytest.raises(ValueError, match=match):
    training.run_experiment(_config(tmp_path, 'bad', **kwargs))
  assert not (tmp_path / 'bad' / 'metrics.csv').exists()


def test_unwritable_output_dir(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('not a directory')
  with pytest.raises(ValueError, match='is not writable'):
    training.run_experiment(_config(tmp_path, 'file/sub'))


def test_binary_end_to_end_and_bad_flag(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  cmd = [
    sys.executable,
    '-m',
    'tff_dp.run',
    '--task=heart_disease',
    '--method=dp_fedavg',
    '--rounds=2',
    '--client_sampling_rate=1.0',
    '--noise_multiplier=0.8',
    '--delta=1e-3',
    '--batch_size=32',
    f'--root_output_dir={tmp_path / "bin"}',
  ]
  done = subprocess.run(
    cmd, capture_output=True, text=True, timeout=300, env=env
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'final:' in done.stdout and 'epsilon' in done.stdout
  assert 'round 2/2' in done.stderr
  bad = subprocess.run(
    cmd[:-1] + ['--client_sampling_rate=2'],
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
  )
  assert bad.returncode != 0
  assert 'client_sampling_rate must be in (0, 1]. Found 2.0' in bad.stderr


def _released_files(run_dir):
  """Every released file of a run folder (not its secret one), its bytes."""
  secret = run_dir / outputs.SECRET_DIR
  return {p: p.read_bytes() for p in _files(run_dir) if secret not in p.parents}


def test_released_rounds_that_no_checkpoint_covers_are_refused(
  tmp_path, reference
):
  import shutil  # pylint: disable=g-import-not-at-top

  # The reference run stopped after its round-4 checkpoint (its summary not
  # yet written), its rounds 1-4 released; the copy's config names it.
  run_dir, _ = reference
  shutil.copytree(run_dir, tmp_path / 'run')
  config = _config(tmp_path, 'run')
  (tmp_path / 'run' / 'config.json').write_text(json.dumps(config.to_dict()))
  (tmp_path / 'run' / 'summary.json').unlink()
  released = _released_files(tmp_path / 'run')
  ckpt = tmp_path / 'run' / outputs.CHECKPOINT_DIR
  pb = ckpt / 'round_4' / 'saved_model.pb'
  pb.write_bytes(pb.read_bytes()[:100])  # Truncated.
  # Round 3's checkpoint loads, but round 4 was released from the lost
  # one: training it again would release it twice.
  with pytest.raises(training.ConfigError) as e:
    training.run_experiment(config)
  message = str(e.value)
  assert 'released results of round 4 (' in message
  assert str(tmp_path / 'run' / 'metrics.csv') in message
  assert 'newest readable checkpoint is of round 3' in message
  assert 'new --root_output_dir' in message
  # The released round's checkpoint is kept as it is (a rerun once a
  # passing cause is gone loads it), and the run is refused again.
  assert sorted(p.name for p in ckpt.iterdir()) == ['round_3', 'round_4']
  with pytest.raises(training.ConfigError, match='results of round 4 '):
    training.run_experiment(config)
  # No checkpoint at all (deleted, or every one unreadable): rounds 1-4.
  shutil.rmtree(tmp_path / 'run' / outputs.SECRET_DIR)
  with pytest.raises(training.ConfigError, match='results of rounds 1-4 '):
    training.run_experiment(config)
  assert _released_files(tmp_path / 'run') == released


def test_a_checkpoint_torn_before_its_release_falls_back(
  tmp_path, reference, monkeypatch
):
  # A crash while round 3's checkpoint is written: it is unreadable, and
  # round 3 was not released, so the run resumes from round 2's.
  save = outputs.save_checkpoint

  def save_torn(manager, state, runner):
    seconds = save(manager, state, runner)
    if runner.round_num == 3:
      pb = tmp_path / 'run' / outputs.CHECKPOINT_DIR / 'round_3'
      pb = pb / 'saved_model.pb'
      pb.write_bytes(pb.read_bytes()[:100])
      raise _Interrupt()
    return seconds

  config = _config(tmp_path, 'run')
  monkeypatch.setattr(outputs, 'save_checkpoint', save_torn)
  with pytest.raises(_Interrupt):
    training.run_experiment(config)
  monkeypatch.setattr(outputs, 'save_checkpoint', save)
  rows = _rows(tmp_path / 'run' / 'metrics.csv')
  assert [r['round'] for r in rows] == ['1', '2']
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == 3
  run_dir, _ = reference
  before, after = _final_weights(run_dir), _final_weights(tmp_path / 'run')
  for k in before:
    np.testing.assert_array_equal(before[k], after[k])
  assert [r['train_loss'] for r in _rows(tmp_path / 'run' / 'metrics.csv')] == [
    r['train_loss'] for r in _rows(run_dir / 'metrics.csv')
  ]


def test_a_crash_between_checkpoints_releases_no_round_past_the_last(
  tmp_path, reference
):
  def crash_after_three(round_num):
    if round_num == 3:
      raise _Interrupt()

  config = _config(tmp_path, 'run', checkpoint_every=2)
  with pytest.raises(_Interrupt):
    training.run_experiment(config, round_callback=crash_after_three)
  run_dir = tmp_path / 'run'
  # Round 3 trained, but its checkpoint (round 4's) was never written: no
  # file the ledger covers shows it. (non_private/, which no epsilon
  # covers, is written every round.)
  assert [r['round'] for r in _read_csv(run_dir / 'metrics.csv')] == [
    '1',
    '2',
  ]
  assert {e.step for e in _tensorboard_events(run_dir)} == {1, 2}
  assert outputs.released_rounds(run_dir)[0] == 2
  extra = run_dir / outputs.NON_PRIVATE_DIR
  assert [r['round'] for r in _read_csv(extra / 'metrics.csv')] == [
    '1',
    '2',
    '3',
  ]
  # The same command again trains rounds 3 and 4 once, as the reference.
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == 3
  reference_dir, _ = reference
  a, b = _rows(reference_dir / 'metrics.csv'), _rows(run_dir / 'metrics.csv')
  assert [(r['round'], r['train_loss'], r['epsilon_rdp']) for r in a] == [
    (r['round'], r['train_loss'], r['epsilon_rdp']) for r in b
  ]
  assert sorted(e.step for e in _tensorboard_events(run_dir)) == [1, 2, 3, 4]


def test_a_stop_inside_the_last_release_is_completed_on_rerun(
  tmp_path, reference, monkeypatch
):
  # Stopped after round 4's events were written but before metrics.csv
  # was: the rerun writes the missing rows, no event twice, and trains
  # nothing again.
  write_csv = outputs.write_csv

  def stop_at_round_4(path, rows):
    if rows and rows[-1]['round'] == 4 and path.parent == tmp_path / 'run':
      raise _Interrupt()
    write_csv(path, rows)

  config = _config(tmp_path, 'run', checkpoint_every=2)
  monkeypatch.setattr(outputs, 'write_csv', stop_at_round_4)
  with pytest.raises(_Interrupt):
    training.run_experiment(config)
  run_dir = tmp_path / 'run'
  assert [r['round'] for r in _read_csv(run_dir / 'metrics.csv')] == [
    '1',
    '2',
  ]
  assert sorted(e.step for e in _tensorboard_events(run_dir)) == [1, 2, 3, 4]
  monkeypatch.setattr(outputs, 'write_csv', write_csv)
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == 5  # Nothing trained.
  reference_dir, _ = reference
  assert (run_dir / 'metrics.csv').read_text() == (
    reference_dir / 'metrics.csv'
  ).read_text()
  assert sorted(e.step for e in _tensorboard_events(run_dir)) == [1, 2, 3, 4]


def test_a_run_from_before_the_secret_folder_resumes_its_checkpoints(
  tmp_path,
):
  def crash_after_one(round_num):
    if round_num == 1:
      raise _Interrupt()

  config = _config(tmp_path, 'run', rounds=2)
  with pytest.raises(_Interrupt):
    training.run_experiment(config, round_callback=crash_after_one)
  # The layout of a run started before the secret folder existed.
  run_dir = tmp_path / 'run'
  os.replace(
    run_dir / outputs.CHECKPOINT_DIR, run_dir / outputs.LEGACY_CHECKPOINT_DIR
  )
  (run_dir / outputs.SECRET_DIR).rmdir()
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == 2
  assert summary['rounds_completed'] == 2
  # Moved to the secret folder, deleted with it once the run finished.
  assert not (run_dir / outputs.LEGACY_CHECKPOINT_DIR).exists()
  assert not (run_dir / outputs.SECRET_DIR).exists()


# `python -m tff_dp.run` whose job blocks once round 3's checkpoint is saved.
_BLOCK_AFTER_ROUND_3 = """
import pathlib, time
from absl import app
from tff_dp.job import outputs, run
save = outputs.save_checkpoint
def save_then_block(manager, state, runner):
  seconds = save(manager, state, runner)
  if runner.round_num == 3:
    pathlib.Path({marker!r}).touch()
    time.sleep(3600)
  return seconds
outputs.save_checkpoint = save_then_block
app.run(run.main)
"""


# Slow (two jobs through the binary): `make test-slow`. Its fast smoke:
# test_kill_and_resume_equals_uninterrupted (the same resume, in process).
@pytest.mark.slow
def test_kill_9_then_rerun_equals_uninterrupted(tmp_path):
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  args = [
    sys.executable,
    '-m',
    'tff_dp.run',
    '--task=heart_disease',
    '--method=dp_fedavg',
    '--rounds=6',
    '--client_sampling_rate=0.75',
    '--noise_multiplier=0.5',
    '--delta=1e-3',
    '--batch_size=32',
    '--checkpoint_every=1',
    '--noise_seed=0',  # Compared with an uninterrupted run, bit for bit.
  ]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  full = tmp_path / 'full'
  subprocess.run(
    args + [f'--root_output_dir={full}'], env=env, check=True, timeout=400
  )
  killed = tmp_path / 'killed'
  saved = tmp_path / 'round_3_saved'
  # The same job, made to stop after round 3's checkpoint is written, so
  # the kill lands there whatever the machine's speed (polling for the
  # checkpoint could race the run's end, or catch a save half written).
  proc = subprocess.Popen(
    [sys.executable, '-c', _BLOCK_AFTER_ROUND_3.format(marker=str(saved))]
    + args[3:]
    + [f'--root_output_dir={killed}'],
    env=env,
    start_new_session=True,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.time() + 300
  while not saved.exists():
    assert proc.poll() is None and time.time() < deadline
    time.sleep(0.2)
  assert (killed / outputs.CHECKPOINT_DIR / 'round_3').is_dir()
  os.killpg(proc.pid, signal.SIGKILL)  # The binary and its worker_binary.
  proc.wait(timeout=60)
  assert not (killed / 'summary.json').exists()
  subprocess.run(
    args + [f'--root_output_dir={killed}'], env=env, check=True, timeout=400
  )
  wa, wb = _final_weights(full), _final_weights(killed)
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k])
  a = json.loads((full / 'summary.json').read_text())
  b = json.loads((killed / 'summary.json').read_text())
  assert a['epsilon_rdp'] == b['epsilon_rdp']
  assert a['final'] == b['final']
  # Every released row (no timing is released): the same, each once.
  assert (full / 'metrics.csv').read_text() == (
    killed / 'metrics.csv'
  ).read_text()


def test_empty_clients_are_skipped_and_counted(tmp_path, monkeypatch):
  import dataclasses  # pylint: disable=g-import-not-at-top

  from tff_dp import tasks  # pylint: disable=g-import-not-at-top
  from tff_dp.tasks import client_data  # pylint: disable=g-import-not-at-top

  heart = tasks.load_task('heart_disease')
  cd = heart.train_data
  xs, ys = zip(*(cd.client_arrays(c) for c in cd.client_ids))
  x, y = np.concatenate(xs), np.concatenate(ys)
  parts, start = [], 0
  for a in xs:
    parts.append(np.arange(start, start + len(a)))
    start += len(a)
  parts.append(np.arange(0))  # A client without data.
  data = client_data.ArrayClientData(
    x,
    y,
    parts,
    client_ids=list(cd.client_ids) + ['empty'],
    element_fn=client_data.float_features,
  )
  monkeypatch.setitem(
    tasks.TASKS,
    'heart_with_empty',
    lambda data_dir=None, **kw: dataclasses.replace(
      heart, name='heart_with_empty', train_data=data
    ),
  )
  summary = training.run_experiment(
    _config(
      tmp_path,
      'run',
      task='heart_with_empty',
      rounds=2,
      client_sampling_rate=None,
      clients_per_round=5,
    )
  )
  rows = _rows(tmp_path / 'run' / 'metrics.csv')
  assert [int(r['empty_clients_skipped']) for r in rows] == [1, 1]
  assert [int(r['sampled_clients']) for r in rows] == [4, 4]
  assert np.isfinite(summary['final']['test_loss'])


def _texts(output_dir):
  return {
    name: (output_dir / name).read_text()
    for name in ('config.json', 'summary.json', 'metrics.csv')
  }


def test_noise_and_sampling_are_secret_by_default(tmp_path):
  # Two runs of the same command (same --seed) must not share their noise
  # or cohorts: with --seed public, shared noise could be regenerated.
  summaries = [
    training.run_experiment(_config(tmp_path, name, rounds=2, noise_seed=None))
    for name in ('a', 'b')
  ]
  wa, wb = _final_weights(tmp_path / 'a'), _final_weights(tmp_path / 'b')
  assert any(not np.array_equal(wa[k], wb[k]) for k in wa)
  for summary in summaries:
    section = summary['privacy']
    assert section['noise_seed_secret'] is True
    assert section['noise_seed'].startswith('secret')
    assert section['neighbouring_relation'].startswith('add/remove')
    assert section['epsilon_rdp'] == summary['epsilon_rdp']
    assert section['epsilon_pld'] == summary['epsilon_pld']
    assert section['event_accounted']['type'] == 'ComposedDpEvent'
    assert any('train_loss' in o for o in section['non_private_outputs'])
    assert any(
      'pos_weight' in t for t in section['tuning_outside_ledger']
    )  # heart_disease's preprocessing.
  saved = json.loads((tmp_path / 'a' / 'config.json').read_text())
  assert saved['noise_seed'].startswith('secret')


def test_given_noise_seed_reproduces_and_is_never_written(tmp_path):
  seed = 918273645
  for name in ('a', 'b'):
    summary = training.run_experiment(
      _config(tmp_path, name, rounds=2, noise_seed=seed)
    )
  wa, wb = _final_weights(tmp_path / 'a'), _final_weights(tmp_path / 'b')
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k])
  for name, text in _texts(tmp_path / 'a').items():
    assert str(seed) not in text, name
  section = summary['privacy']
  assert section['noise_seed_secret'] is False
  assert 'assumes this seed is kept secret' in section['noise_seed']
  # Whoever knows the seed regenerates the noise: the run cannot know it
  # secret, so its guarantee is not claimed (its epsilon itself is sound).
  assert section['guarantee_holds'] is False
  (caveat,) = section['guarantee_caveats']
  assert caveat.startswith('The noise seed was given with --noise_seed')
  assert section['guarantee_caveat'] is None


def test_resume_with_secret_noise_continues_the_checkpointed_stream(tmp_path):
  # The secret seed lives in the checkpointed state: two resumes of the same
  # checkpoint draw the same noise and cohorts (a fresh secret would not).
  def crash_after_one(round_num):
    if round_num == 1:
      raise _Interrupt()

  config = _config(tmp_path, 'a', rounds=2, noise_seed=None)
  with pytest.raises(_Interrupt):
    training.run_experiment(config, round_callback=crash_after_one)
  import shutil  # pylint: disable=g-import-not-at-top

  shutil.copytree(tmp_path / 'a', tmp_path / 'b')
  config_b = dataclasses.replace(config, output_dir=str(tmp_path / 'b'))
  # The copy's config names its own directory (the rest is the same run).
  (tmp_path / 'b' / 'config.json').write_text(json.dumps(config_b.to_dict()))
  training.run_experiment(config)
  training.run_experiment(config_b)
  wa, wb = _final_weights(tmp_path / 'a'), _final_weights(tmp_path / 'b')
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k])
  ra, rb = (
    _rows(tmp_path / 'a' / 'metrics.csv'),
    _rows(tmp_path / 'b' / 'metrics.csv'),
  )
  assert [r['sampled_clients'] for r in ra] == [
    r['sampled_clients'] for r in rb
  ]


def test_fixed_size_summary_names_replace_one(tmp_path):
  summary = training.run_experiment(
    _config(
      tmp_path,
      'fixed',
      rounds=1,
      client_sampling_rate=None,
      clients_per_round=3,
    )
  )
  section = summary['privacy']
  assert section['neighbouring_relation'].startswith('replace one')
  inner = section['event_accounted']['events'][0]['event']
  # Noise 0.5 x clip, replace-one sensitivity 2 x clip: multiplier 0.25.
  assert inner['noise_multiplier'] == pytest.approx(0.25)


def test_checkpoint_save_leaves_no_reference_cycles(tmp_path):
  # TFF's checkpoint save leaves its SavedModel's objects, and the tensors
  # they hold, in reference cycles that only a full collection frees (5-12
  # MB a save of the seed 001 CNN's state in a long job, where full
  # collections are rare); `save_checkpoint` collects them. Counted with
  # the collector off, as in a long job between its rare full collections.
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  manager = tff.program.FileProgramStateManager(
    str(tmp_path), prefix='ckpt_', keep_total=2, keep_first=False
  )
  rng = np.random.default_rng(0)
  state = [rng.standard_normal(s).astype(np.float32) for s in [(64, 32)] * 2]
  gc.disable()
  try:
    gc.collect()
    runner = outputs.RunnerState(1, {}, None, [])
    training.asyncio.run(manager.save((state, np.str_(runner.to_json())), 1))
    left_by_tff_save = gc.collect()
    runner = outputs.RunnerState(2, {}, None, [])
    assert outputs.save_checkpoint(manager, state, runner) >= 0
    left_by_ours = gc.collect()
  finally:
    gc.enable()
  # About 900 objects in cycles after each TFF save in TFF 0.87; none after
  # ours.
  assert left_by_tff_save > 100
  assert left_by_ours == 0
  restored = training.asyncio.run(manager.load(2, (state, np.str_(''))))
  np.testing.assert_array_equal(restored[0][1], state[1])
  assert outputs.RunnerState.from_json(restored[1]).round_num == 2


# Columns and summary keys that no epsilon covers (per-client statistics,
# cohort sizes, timings): none may appear in a default run's folder.
# A name ending in '_' or '/' is a prefix; the others are whole names
# ('fraction_clipped', not the DP 'dp_fraction_clipped').
_NON_PRIVATE_NAMES = (
  'sampled_clients',
  'empty_clients_skipped',
  'train_loss',
  'update_norm_',
  'fraction_clipped',
  'non_finite_clients',
  'round_seconds',
  'train_seconds',
  'data_wait_seconds',
  'eval_seconds',
  'bytes_up_total',
  'bytes_down_total',
  'wall_seconds_',
  'num_examples',
  'tff/',
)


def _holds_name(data: bytes, name: str) -> bool:
  pattern = b'(?<![A-Za-z0-9_])' + re.escape(name.encode())
  if not name.endswith(('_', '/')):
    pattern += b'(?![A-Za-z0-9_])'
  return re.search(pattern, data) is not None


def _tensorboard_events(run_dir):
  """The events of a run folder's TensorBoard files with scalars."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return [
    event
    for path in sorted((run_dir / 'tensorboard').glob('events.*'))
    for event in tf.compat.v1.train.summary_iterator(str(path))
    if event.summary.value
  ]


def _tensorboard_tags(run_dir):
  return {v.tag for e in _tensorboard_events(run_dir) for v in e.summary.value}


def _tensorboard_scalars(run_dir, tag):
  """TensorBoard's own reading of `tag` in a run folder's events."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top

  accumulator = event_accumulator.EventAccumulator(str(run_dir / 'tensorboard'))
  accumulator.Reload()
  return accumulator.Scalars(tag)


def _files(run_dir):
  return sorted(p for p in run_dir.rglob('*') if p.is_file())


def test_default_run_writes_only_what_the_ledger_covers(tmp_path):
  config = _config(
    tmp_path,
    'default',
    rounds=2,
    eval_every=1,
    # The defaults: a secret seed, nothing non-private released.
    noise_seed=None,
    release_non_private_metrics=False,
    allow_noise_seed_reuse=False,
    # Two clients a site: the held-out patients belong to no client, so
    # test metrics are post-processing of the model.
    task_kwargs=(('clients_per_unit', 2),),
  )
  summary = training.run_experiment(config)
  run_dir = tmp_path / 'default'
  # The secret state deleted once the run finished.
  assert sorted(p.name for p in run_dir.iterdir()) == [
    'config.json',
    'final_model_weights.npz',
    'metrics.csv',
    'summary.json',
    'tensorboard',
  ]
  allowed = set(outputs.PRIVATE_COLUMNS)
  columns = list(_rows(run_dir / 'metrics.csv')[0])
  assert 'test_auroc' in columns and 'epsilon_pld' in columns
  assert {c for c in columns if not c.startswith('test_')} <= allowed
  tags = _tensorboard_tags(run_dir)
  assert 'test_auroc' in tags and 'epsilon_rdp' in tags
  assert {t for t in tags if not t.startswith('test_')} <= allowed
  # No file holds any non-private name: not the checkpoints' runner state,
  # nor TensorBoard, nor the summary beyond its privacy section's list of
  # what is withheld.
  saved = json.loads((run_dir / 'summary.json').read_text())
  listed = dict(saved, privacy=dict(saved['privacy'], non_private_outputs=[]))
  for path in _files(run_dir):
    data = path.read_bytes()
    if path.name == 'summary.json':
      data = json.dumps(listed).encode()
    for name in _NON_PRIVATE_NAMES:
      assert not _holds_name(data, name), (path, name)
  # The task's description counts the patients: withheld too.
  assert 'task_description' not in saved
  assert saved == json.loads(json.dumps(summary))
  for key in outputs.NON_PRIVATE_SUMMARY_KEYS:
    assert key not in saved
  assert 'test_auroc' in saved['final']
  assert all(k.startswith('test_') for k in saved['final'])
  section = saved['privacy']
  assert section['non_private_metrics_released'] is False
  assert section['non_private_dir'] is None
  assert section['research_run'] is False and section['guarantee_holds']
  assert section['guarantee_caveats'] == []
  assert section['test_metrics'].startswith('covered')
  # The same command again: the run is finished and its secret state gone,
  # so nothing runs and nothing is written again.
  released = {
    p: (p.read_bytes(), p.stat().st_mtime_ns) for p in _files(run_dir)
  }
  assert training.run_experiment(config) == saved
  assert {
    p: (p.read_bytes(), p.stat().st_mtime_ns) for p in _files(run_dir)
  } == released


def test_test_metrics_on_a_sites_own_patients_are_withheld(tmp_path):
  # One client a site (the default): its held-out patients are its data.
  summary = training.run_experiment(
    _config(
      tmp_path,
      'sites',
      rounds=1,
      release_non_private_metrics=False,
      allow_noise_seed_reuse=False,
    )
  )
  columns = _rows(tmp_path / 'sites' / 'metrics.csv')[0]
  assert not [c for c in columns if c.startswith('test_')]
  assert summary['final'] == {}
  assert summary['privacy']['test_metrics'].startswith('not covered')


def test_released_non_private_metrics_go_to_their_own_folder(tmp_path):
  config = _config(
    tmp_path,
    'released',
    rounds=2,
    eval_every=1,
    release_non_private_metrics=True,
    allow_noise_seed_reuse=False,
    keep_checkpoints=True,
  )
  summary = training.run_experiment(config)
  run_dir = tmp_path / 'released'
  extra = run_dir / outputs.NON_PRIVATE_DIR
  assert sorted(p.name for p in extra.iterdir()) == [
    'diagnostics.jsonl',
    'metrics.csv',
    'summary.json',
    'tensorboard',
  ]
  private = _read_csv(run_dir / 'metrics.csv')
  non_private = _read_csv(extra / 'metrics.csv')
  assert [r['round'] for r in non_private] == ['1', '2']
  for key in ('sampled_clients', 'train_loss', 'round_seconds'):
    assert key in non_private[0] and key not in private[0]
  # Heart disease's held-out patients are its hospitals' own.
  assert 'test_auroc' in non_private[0] and 'test_auroc' not in private[0]
  extra_summary = json.loads((extra / 'summary.json').read_text())
  # With the final test metrics, the hospitals' own patients' (above).
  assert set(extra_summary) == {*outputs.NON_PRIVATE_SUMMARY_KEYS, 'final'}
  assert 'test_auroc' in extra_summary['final']
  assert extra_summary['bytes_up_total'] == summary['bytes_up_total'] > 0
  assert 'train_loss' in _tensorboard_tags(extra)
  assert 'train_loss' not in _tensorboard_tags(run_dir)
  # The checkpoint keeps the released columns, so the byte check of the
  # default run above has the power to see them.
  assert any(
    _holds_name(p.read_bytes(), 'sampled_clients')
    for p in _files(run_dir / outputs.CHECKPOINT_DIR)
  )
  assert not _holds_name(b'dp_fraction_clipped', 'fraction_clipped')
  assert _holds_name(b'"update_norm_mean"', 'update_norm_')
  assert summary['privacy']['non_private_metrics_released'] is True
  assert summary['privacy']['non_private_dir'] == outputs.NON_PRIVATE_DIR


def test_progress_line_omits_a_pld_epsilon_that_is_not_computed():
  row = {'round': 3, 'epsilon_rdp': 1.5, 'bytes_up_per_client': 2000}
  nan = dict(row, epsilon_pld=float('nan'))
  assert outputs.progress_line(nan, 10) == (
    'round 3/10 | eps_rdp 1.500 | up 2.0 KB/client'
  )
  assert outputs.progress_line(dict(row, epsilon_pld=1.25), 10) == (
    'round 3/10 | eps_rdp 1.500 eps_pld 1.250 | up 2.0 KB/client'
  )


def test_tensorboard_events_carry_the_round_not_the_clock(
  tmp_path, monkeypatch
):
  import socket  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  rows = [
    {'round': t, 'epsilon_rdp': 0.5 * t, 'round_seconds': 7.0 + t}
    for t in (1, 2, 3)
  ]
  files = outputs.RunFiles(tmp_path, True, test_private=True)
  for t in (1, 2):
    files.write_non_private(rows[:t], None)
  files.write_released(rows[:2], rows[:2])
  # A resumed invocation, hours later: its rounds keep the run's times.
  later = time.time() + 7200
  monkeypatch.setattr(time, 'time', lambda: later)
  resumed = outputs.RunFiles(tmp_path, True, test_private=True)
  monkeypatch.undo()
  resumed.write_non_private(rows, None)
  resumed.write_released(rows, rows[2:])
  names = sorted(p.name for p in (tmp_path / 'tensorboard').iterdir())
  start = int(names[0].split('.')[3])
  assert names == [
    f'events.out.tfevents.{start:010d}.tff_dp.000001',
    f'events.out.tfevents.{start:010d}.tff_dp.000003',
  ]
  assert not [n for n in names if socket.gethostname() in n]
  for run_dir, tag in (
    (tmp_path, 'epsilon_rdp'),
    (files.non_private_dir, 'round_seconds'),
  ):
    scalars = _tensorboard_scalars(run_dir, tag)
    assert [(e.step, e.wall_time) for e in scalars] == [
      (t, start + t) for t in (1, 2, 3)
    ]
    assert [e.value for e in scalars] == [r[tag] for r in rows]
  assert 'round_seconds' not in _tensorboard_tags(tmp_path)
  assert outputs.released_rounds(tmp_path) == (
    3,
    [str(tmp_path / 'metrics.csv'), str(tmp_path / 'tensorboard')],
  )


def test_test_metrics_of_client_held_test_data_are_non_private(tmp_path):
  files = outputs.RunFiles(tmp_path, False, test_private=False)
  row = {'round': 3, 'epsilon_rdp': 1.0, 'test_accuracy': 0.5}
  assert files.split(row) == (
    {'round': 3, 'epsilon_rdp': 1.0},
    {'round': 3, 'test_accuracy': 0.5},
  )
  assert files.shown(row) == {'round': 3, 'epsilon_rdp': 1.0}
  summary = {'final': {'test_accuracy': 0.5}, 'bytes_up_total': 7, 'a': 1}
  assert files.returned_summary(summary) == {'final': {}, 'a': 1}
  released = outputs.RunFiles(tmp_path, True, test_private=False)
  assert released.split_summary(summary) == (
    {'final': {}, 'a': 1},
    {'bytes_up_total': 7, 'final': {'test_accuracy': 0.5}},
  )


def test_a_noise_seed_reused_for_another_configuration_stops_the_run(
  tmp_path,
):
  strict = dict(allow_noise_seed_reuse=False, rounds=1)
  training.run_experiment(_config(tmp_path, 'a', **strict))
  with pytest.raises(ValueError, match='--noise_seed was already used'):
    training.run_experiment(_config(tmp_path, 'b', clip=0.5, **strict))
  # Refused before any work.
  assert not (tmp_path / 'b' / 'metrics.csv').exists()
  # A research run may pass, and its summary says the guarantee fails.
  summary = training.run_experiment(
    _config(tmp_path, 'c', clip=0.5, rounds=1, allow_noise_seed_reuse=True)
  )
  section = summary['privacy']
  assert section['noise_seed_reused_in'] == str(tmp_path / 'a')
  assert section['guarantee_holds'] is False
  assert section['research_run'] is True


def test_client_held_test_metrics_count_as_tuning_once_released():
  class _Task:
    test_held_by_clients = True

  method = methods.METHODS['dp_fedavg']
  config = training.ExperimentConfig.create(
    task='emnist', method='dp_fedavg', noise_multiplier=1.0
  )
  assert outputs._client_test_tuning(config, _Task()) == []  # pylint: disable=protected-access
  released = config.replace(release_non_private_metrics=True)
  (step,) = outputs._client_test_tuning(released, _Task())  # pylint: disable=protected-access
  assert 'held-out examples' in step
  assert outputs.tuning_outside_ledger(released, method) == []


def test_dp_fraction_clipped_is_written_by_default_at_the_same_epsilon(
  tmp_path,
):
  strict = dict(
    rounds=2,
    noise_seed=None,
    release_non_private_metrics=False,
    allow_noise_seed_reuse=False,
  )
  plain = training.run_experiment(_config(tmp_path, 'plain', **strict))
  with_fraction = training.run_experiment(
    _config(tmp_path, 'fraction', fraction_clipped_stddev=1.0, **strict)
  )
  rows = _rows(tmp_path / 'fraction' / 'metrics.csv')
  assert all(0 <= float(r['dp_fraction_clipped']) <= 1 for r in rows)
  assert (
    'dp_fraction_clipped' not in _rows(tmp_path / 'plain' / 'metrics.csv')[0]
  )
  # Its release is charged inside the requested multiplier: the merged
  # event, and so epsilon, is the plain run's (up to float32 state).
  for key in ('epsilon_rdp', 'epsilon_pld'):
    assert with_fraction[key] == pytest.approx(plain[key], rel=1e-5)
  # The ledger records the merged Gaussian of the two releases.
  (event,) = (privacy.event_from_dict(e) for e in with_fraction['dp_events'])
  (plain_event,) = (privacy.event_from_dict(e) for e in plain['dp_events'])
  assert event.event.noise_multiplier == pytest.approx(
    plain_event.event.noise_multiplier, rel=1e-6
  )


def test_a_run_from_before_non_private_dir_resumes_only_releasing(tmp_path):
  # Its config.json has no release_non_private_metrics: it wrote everything.
  config = _config(tmp_path, 'legacy', release_non_private_metrics=False)
  old = config.to_dict()
  del old['release_non_private_metrics']
  run_dir = tmp_path / 'legacy'
  run_dir.mkdir()
  (run_dir / 'config.json').write_text(json.dumps(old))
  with pytest.raises(ValueError, match='add --release_non_private_metrics'):
    outputs.check_same_config(run_dir, config)
  outputs.check_same_config(
    run_dir, config.replace(release_non_private_metrics=True)
  )
  # Its histograms move to non_private/ with the rest.
  (run_dir / outputs.DIAGNOSTICS_FILE).write_text('{"round": 1}\n')
  outputs.move_legacy_non_private(run_dir)
  assert not (run_dir / outputs.DIAGNOSTICS_FILE).exists()
  moved = run_dir / outputs.NON_PRIVATE_DIR / outputs.DIAGNOSTICS_FILE
  assert moved.read_text() == '{"round": 1}\n'


def test_the_summary_records_the_code_libraries_and_data_it_ran(tmp_path):
  import hashlib
  import importlib.metadata

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  import tensorflow_privacy as tfp  # pylint: disable=g-import-not-at-top
  from tff_dp.tasks import data_dir  # pylint: disable=g-import-not-at-top

  training.run_experiment(_config(tmp_path, 'provenance', rounds=1))
  run_dir = tmp_path / 'provenance'
  saved = json.loads((run_dir / 'summary.json').read_text())
  extra = json.loads(
    (run_dir / outputs.NON_PRIVATE_DIR / 'summary.json').read_text()
  )
  provenance = saved['provenance']
  versions = provenance['versions']
  assert versions['tensorflow'] == tf.__version__
  assert versions['tensorflow_federated'] == tff.__version__
  assert versions['tensorflow_privacy'] == tfp.__version__
  # dp_accounting has no __version__: its distribution's.
  assert versions['dp_accounting'] == importlib.metadata.version(
    'dp-accounting'
  )
  assert versions['python'] == '.'.join(map(str, sys.version_info[:3]))
  # The one file heart disease reads, by its absolute path; its hash only
  # in the non-private part (a function of the clients' data).
  csv_path = (
    data_dir.resolve_data_dir() / 'heart_disease_4sites.csv'
  ).resolve()
  assert provenance['data']['sources'] == [
    {'kind': 'UCI heart disease', 'files': [str(csv_path)], 'cache': None}
  ]
  assert 'data_files_sha256' not in saved
  assert extra['data_files_sha256'] == {
    str(csv_path): hashlib.sha256(csv_path.read_bytes()).hexdigest()
  }
  # The commit of the source tree this test imported, and its state.
  code = provenance['code']
  repo = pathlib.Path(outputs.__file__).resolve().parents[2]
  head = subprocess.run(
    ['git', '-C', str(repo), 'rev-parse', 'HEAD'],
    capture_output=True,
    text=True,
  )
  if head.returncode == 0:  # A git checkout (not a Bazel runfiles tree).
    assert code['git_commit'] == head.stdout.strip()
    assert isinstance(code['git_dirty'], bool)
    assert code['git_unavailable_reason'] is None
  else:
    assert code['git_commit'] is None and code['git_unavailable_reason']
  assert str(repo / 'tff_dp') in code['source_dirs']


def test_code_outside_a_git_checkout_records_no_commit_and_says_why(
  tmp_path,
):
  code = outputs.code_provenance([str(tmp_path)])
  assert code['git_commit'] is None and code['git_dirty'] is None
  assert 'not in a git checkout' in code['git_unavailable_reason']


def test_ddgauss_under_poisson_sampling_says_its_guarantee_is_not_rigorous():
  from tff_dp.aggregators import ddgauss  # pylint: disable=g-import-not-at-top

  class _Task:
    test_held_by_clients = True

  event = ddgauss.round_event_from_measurements(
    dict(
      min_clients=19.0,
      scaled_local_stddev=8988.6005859375,
      scaled_inflated_l2=30015.53515625,
      padded_dim=1206590.0,
    )
  )
  sections = {}
  for mode, kwargs in (
    ('poisson', dict(client_sampling_rate=0.1)),
    ('fixed', dict(clients_per_round=30)),
  ):
    sampling = privacy.Sampling(
      mode,
      300,
      rate=kwargs.get('client_sampling_rate'),
      clients_per_round=kwargs.get('clients_per_round'),
    )
    ledger = privacy.PrivacyLedger(sampling, 0.00333333)
    ledger.record(event)
    config = training.ExperimentConfig.create(
      task='emnist', method='ddgauss', noise_multiplier=1.0, **kwargs
    )
    sections[mode] = outputs.privacy_section(
      config, _Task(), methods.METHODS['ddgauss'], sampling, ledger
    )
  poisson = sections['poisson']
  assert poisson['guarantee_holds'] is False
  assert poisson['guarantee_caveat'].startswith('Not rigorous: DDGauss under')
  # Fixed-size cohorts rest on a milder assumption (every sampled client
  # takes part), named as such.
  assert sections['fixed']['guarantee_caveat'] == (
    'Rests on an assumption the ledger does not charge (privacy.assumptions).'
  )
  assert outputs.guarantee_caveat([], None) is None
  assert 'a/b' in outputs.guarantee_caveat([], 'a/b')
