"""End-to-end tests of the training loop on the real (small) heart data."""

import dataclasses
import json
import os
import subprocess
import sys

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
import pytest

from tff_dp.job import training
from tff_dp.job import checkpoints
from tff_dp import privacy

import job_testing

pytestmark = pytest.mark.usefixtures('shared_data_dir')


# The uninterrupted run the resumed ones are compared with.
reference = job_testing.reference


def test_dp_fedavg_end_to_end_and_ledger(reference):
  run_dir, summary = reference
  rows = job_testing.rows(run_dir / 'metrics.csv')
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
  scalars = job_testing.tensorboard_scalars(run_dir, 'epsilon_rdp')
  assert [(e.step, e.wall_time) for e in scalars] == [
    (t, start + t) for t in (1, 2, 3, 4)
  ]
  assert [e.value for e in scalars] == pytest.approx(
    [float(r['epsilon_rdp']) for r in rows], rel=1e-6
  )
  # Kept (--keep_checkpoints): the secret state, owner-only.
  secret = run_dir / checkpoints.SECRET_DIR
  assert sorted(
    p.name for p in (run_dir / checkpoints.CHECKPOINT_DIR).iterdir()
  ) == [
    'round_3',
    'round_4',
  ]
  assert not (run_dir / checkpoints.LEGACY_CHECKPOINT_DIR).exists()
  for path in [secret, *secret.rglob('*')]:
    mode = path.stat().st_mode & 0o777
    assert mode == (0o700 if path.is_dir() else 0o600), path


def test_client_lr_decay_per_round_and_exact_on_resume(tmp_path, reference):
  # Seed 001's 0.99 decay, here 0.5: round t trains at 0.1 x 0.5^(t-1);
  # the rate is a function of the round, so a resumed run is identical.
  full = job_testing.config(tmp_path, 'full', client_lr_decay=0.5)
  training.run_experiment(full)
  rows = job_testing.rows(tmp_path / 'full' / 'metrics.csv')
  lrs = [float(r['client_lr']) for r in rows]
  assert lrs == pytest.approx([0.1, 0.05, 0.025, 0.0125])

  def crash_after_one(round_num):
    if round_num == 1:
      raise job_testing.Interrupt()

  resumed = job_testing.config(tmp_path, 'resumed', client_lr_decay=0.5)
  with pytest.raises(job_testing.Interrupt):
    training.run_experiment(resumed, round_callback=crash_after_one)
  training.run_experiment(resumed)
  a = job_testing.final_weights(tmp_path / 'full')
  b = job_testing.final_weights(tmp_path / 'resumed')
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  # The reference run is the same command without the decay.
  constant_dir, _ = reference
  c = job_testing.final_weights(constant_dir)
  assert any(not np.array_equal(a[k], c[k]) for k in a)
  assert 'client_lr' not in job_testing.rows(constant_dir / 'metrics.csv')[0]


def test_kill_and_resume_equals_uninterrupted(tmp_path, reference):
  full_dir, _ = reference

  def crash_after_two(round_num):
    if round_num == 2:
      raise job_testing.Interrupt()

  resumed = job_testing.config(tmp_path, 'resumed')
  with pytest.raises(job_testing.Interrupt):
    training.run_experiment(resumed, round_callback=crash_after_two)
  assert len(job_testing.rows(tmp_path / 'resumed' / 'metrics.csv')) == 2
  summary = training.run_experiment(resumed)  # The same command again.
  assert summary['rounds_completed'] == 4
  assert summary['first_round_this_invocation'] == 3
  a = job_testing.rows(full_dir / 'metrics.csv')
  b = job_testing.rows(tmp_path / 'resumed' / 'metrics.csv')
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
  wa = job_testing.final_weights(full_dir)
  wb = job_testing.final_weights(tmp_path / 'resumed')
  assert sorted(wa) == sorted(wb) and len(wa) == 4
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k])


@pytest.mark.slow  # An execution setting: `make test-slow`.
def test_worker_threads_do_not_change_results(tmp_path):
  # One client computation at a time on TF's default pools, against the
  # defaults (3 concurrent calls, 1 intra-op and 4 inter-op threads): every
  # client of every round, same numbers to the bit.
  serial = job_testing.config(
    tmp_path,
    'serial',
    rounds=2,
    client_sampling_rate=1.0,
    max_concurrent_computation_calls=1,
    intra_op_threads=0,
    inter_op_threads=0,
  )
  training.run_experiment(serial)
  default = job_testing.config(
    tmp_path, 'default', rounds=2, client_sampling_rate=1.0
  )
  assert default.max_concurrent_computation_calls == 3
  assert (default.intra_op_threads, default.inter_op_threads) == (1, 4)
  training.run_experiment(default)
  a = job_testing.rows(tmp_path / 'serial' / 'metrics.csv')
  b = job_testing.rows(tmp_path / 'default' / 'metrics.csv')
  assert [r['train_loss'] for r in a] == [r['train_loss'] for r in b]
  wa = job_testing.final_weights(tmp_path / 'serial')
  wb = job_testing.final_weights(tmp_path / 'default')
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
    job_testing.config(
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
    job_testing.config(
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
  weights = job_testing.final_weights(output_dir)
  model.set_weights(
    [weights[f'trainable_{i}'] for i in range(len(model.trainable_weights))]
  )
  logits = model.predict(task.test_x, verbose=0).reshape(-1)
  return sk_metrics.roc_auc_score(task.test_y.reshape(-1), logits)


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
    '--nobackground_evaluation',
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
    job_testing.config(
      tmp_path,
      'run',
      task='heart_with_empty',
      rounds=2,
      client_sampling_rate=None,
      clients_per_round=5,
    )
  )
  rows = job_testing.rows(tmp_path / 'run' / 'metrics.csv')
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
    training.run_experiment(
      job_testing.config(tmp_path, name, rounds=2, noise_seed=None)
    )
    for name in ('a', 'b')
  ]
  wa, wb = (
    job_testing.final_weights(tmp_path / 'a'),
    job_testing.final_weights(tmp_path / 'b'),
  )
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
      job_testing.config(tmp_path, name, rounds=2, noise_seed=seed)
    )
  wa, wb = (
    job_testing.final_weights(tmp_path / 'a'),
    job_testing.final_weights(tmp_path / 'b'),
  )
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
      raise job_testing.Interrupt()

  config = job_testing.config(tmp_path, 'a', rounds=2, noise_seed=None)
  with pytest.raises(job_testing.Interrupt):
    training.run_experiment(config, round_callback=crash_after_one)
  import shutil  # pylint: disable=g-import-not-at-top

  shutil.copytree(tmp_path / 'a', tmp_path / 'b')
  config_b = dataclasses.replace(config, output_dir=str(tmp_path / 'b'))
  # The copy's config names its own directory (the rest is the same run).
  (tmp_path / 'b' / 'config.json').write_text(json.dumps(config_b.to_dict()))
  training.run_experiment(config)
  training.run_experiment(config_b)
  wa, wb = (
    job_testing.final_weights(tmp_path / 'a'),
    job_testing.final_weights(tmp_path / 'b'),
  )
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k])
  ra, rb = (
    job_testing.rows(tmp_path / 'a' / 'metrics.csv'),
    job_testing.rows(tmp_path / 'b' / 'metrics.csv'),
  )
  assert [r['sampled_clients'] for r in ra] == [
    r['sampled_clients'] for r in rb
  ]


def test_fixed_size_summary_names_replace_one(tmp_path):
  summary = training.run_experiment(
    job_testing.config(
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


def test_a_noise_seed_reused_for_another_configuration_stops_the_run(
  tmp_path,
):
  strict = dict(allow_noise_seed_reuse=False, rounds=1)
  training.run_experiment(job_testing.config(tmp_path, 'a', **strict))
  with pytest.raises(ValueError, match='--noise_seed was already used'):
    training.run_experiment(
      job_testing.config(tmp_path, 'b', clip=0.5, **strict)
    )
  # Refused before any work.
  assert not (tmp_path / 'b' / 'metrics.csv').exists()
  # A research run may pass, and its summary says the guarantee fails.
  summary = training.run_experiment(
    job_testing.config(
      tmp_path, 'c', clip=0.5, rounds=1, allow_noise_seed_reuse=True
    )
  )
  section = summary['privacy']
  assert section['noise_seed_reused_in'] == str(tmp_path / 'a')
  assert section['guarantee_holds'] is False
  assert section['research_run'] is True


def test_dp_fraction_clipped_is_written_by_default_at_the_same_epsilon(
  tmp_path,
):
  strict = dict(
    rounds=2,
    noise_seed=None,
    release_non_private_metrics=False,
    allow_noise_seed_reuse=False,
  )
  plain = training.run_experiment(
    job_testing.config(tmp_path, 'plain', **strict)
  )
  with_fraction = training.run_experiment(
    job_testing.config(
      tmp_path, 'fraction', fraction_clipped_stddev=1.0, **strict
    )
  )
  rows = job_testing.rows(tmp_path / 'fraction' / 'metrics.csv')
  assert all(0 <= float(r['dp_fraction_clipped']) <= 1 for r in rows)
  assert (
    'dp_fraction_clipped'
    not in job_testing.rows(tmp_path / 'plain' / 'metrics.csv')[0]
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
