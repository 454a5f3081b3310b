"""Tests of a run's checkpoints and resume on the real (small) heart data:
the same flags to resume, the secret folder, and no round released that
no checkpoint on disk covers."""

import gc
import json
import os
import pathlib
import subprocess
import sys

import asyncio
import numpy as np
import pytest

from tff_dp import methods
from tff_dp.job import training
from tff_dp.job import checkpoints
from tff_dp.job import metrics_log

import job_testing

pytestmark = pytest.mark.usefixtures('shared_data_dir')


# The uninterrupted run the resumed ones are compared with.
reference = job_testing.reference


def test_other_flags_in_same_dir_fail(tmp_path):
  training.run_experiment(job_testing.config(tmp_path, 'run', rounds=1))
  with pytest.raises(training.ConfigError) as e:
    training.run_experiment(
      job_testing.config(tmp_path, 'run', rounds=1, clip=2.0)
    )
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
  config = job_testing.config(tmp_path, 'old', rounds=1, method='fetchsgd')
  out = _saved_before(config, 'sketch_hashing')
  checkpoints.check_same_config(out, config)
  with pytest.raises(
    training.ConfigError,
    match=r"different flags \(--sketch_hashing: 'murmur' there, 'block' now\)",
  ):
    checkpoints.check_same_config(out, config.replace(sketch_hashing='block'))


def test_a_setting_whose_default_changed_resumes_at_its_legacy_value(
  tmp_path,
):
  # A config.json written before `top_k_nonprivate_clip` existed ran with
  # the clip (methods.LEGACY_DEFAULTS), not with today's default: today's
  # default is a different run, and a rebuilt aggregator gets the old value.
  assert methods.LEGACY_DEFAULTS['top_k_nonprivate_clip'] is True
  config = job_testing.config(tmp_path, 'old', rounds=1, method='fl_top')
  assert config.options.top_k_nonprivate_clip is False
  out = _saved_before(config, 'top_k_nonprivate_clip')
  old = json.loads((out / 'config.json').read_text())
  with pytest.raises(
    training.ConfigError,
    match=r'different flags \(--top_k_nonprivate_clip: True there, False now',
  ):
    checkpoints.check_same_config(out, config)
  checkpoints.check_same_config(out, config.replace(top_k_nonprivate_clip=True))
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
  cyclic = job_testing.config(
    tmp_path,
    'cyclic',
    rounds=1,
    participation='cyclic_poisson',
    noise='banded',
    bands='2',
    noise_multiplier=1.0,
  )
  assert cyclic.participation_partition == 'by_client_id'
  plain = job_testing.config(tmp_path, 'plain', rounds=1)
  cyclic_dir = _saved_before(cyclic, 'participation_partition')
  plain_dir = _saved_before(plain, 'participation_partition')
  with pytest.raises(
    training.ConfigError,
    match=r"different flags \(--participation_partition: 'balanced' there",
  ):
    checkpoints.check_same_config(cyclic_dir, cyclic)
  checkpoints.check_same_config(
    cyclic_dir, cyclic.replace(participation_partition='balanced')
  )
  checkpoints.check_same_config(plain_dir, plain)


def test_compression_settings_matter_only_with_compression(tmp_path):
  # --compression_sketch's default changed (srht -> srht_interleaved): an
  # uncompressed run saved with the old default resumes under the new
  # one; a compressed run does not.
  for compression, resumes in (('none', True), ('100', False)):
    config = job_testing.config(
      tmp_path, compression, rounds=1, compression=compression
    )
    assert config.options.compression_sketch == 'srht_interleaved'
    out = pathlib.Path(config.output_dir)
    out.mkdir(parents=True)
    old = dict(config.to_dict(), compression_sketch='srht')
    (out / 'config.json').write_text(json.dumps(old))
    if resumes:
      checkpoints.check_same_config(out, config)
    else:
      with pytest.raises(
        training.ConfigError,
        match=r"different flags \(--compression_sketch: 'srht' there",
      ):
        checkpoints.check_same_config(out, config)


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
    runner = checkpoints.RunnerState(1, {}, None, [])
    asyncio.run(manager.save((state, np.str_(runner.to_json())), 1))
    left_by_tff_save = gc.collect()
    runner = checkpoints.RunnerState(2, {}, None, [])
    assert checkpoints.save_checkpoint(manager, state, runner) >= 0
    left_by_ours = gc.collect()
  finally:
    gc.enable()
  # About 900 objects in cycles after each TFF save in TFF 0.87; none after
  # ours.
  assert left_by_tff_save > 100
  assert left_by_ours == 0
  restored = asyncio.run(manager.load(2, (state, np.str_(''))))
  np.testing.assert_array_equal(restored[0][1], state[1])
  assert checkpoints.RunnerState.from_json(restored[1]).round_num == 2


def _released_files(run_dir):
  """Every released file of a run folder (not its secret one), its bytes."""
  secret = run_dir / checkpoints.SECRET_DIR
  return {
    p: p.read_bytes()
    for p in job_testing.files(run_dir)
    if secret not in p.parents
  }


def test_released_rounds_that_no_checkpoint_covers_are_refused(
  tmp_path, reference
):
  import shutil  # pylint: disable=g-import-not-at-top

  # The reference run stopped after its round-4 checkpoint (its summary not
  # yet written), its rounds 1-4 released; the copy's config names it.
  run_dir, _ = reference
  shutil.copytree(run_dir, tmp_path / 'run')
  config = job_testing.config(tmp_path, 'run')
  (tmp_path / 'run' / 'config.json').write_text(json.dumps(config.to_dict()))
  (tmp_path / 'run' / 'summary.json').unlink()
  released = _released_files(tmp_path / 'run')
  ckpt = tmp_path / 'run' / checkpoints.CHECKPOINT_DIR
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
  shutil.rmtree(tmp_path / 'run' / checkpoints.SECRET_DIR)
  with pytest.raises(training.ConfigError, match='results of rounds 1-4 '):
    training.run_experiment(config)
  assert _released_files(tmp_path / 'run') == released


def test_a_checkpoint_torn_before_its_release_falls_back(
  tmp_path, reference, monkeypatch
):
  # A crash while round 3's checkpoint is written: it is unreadable, and
  # round 3 was not released, so the run resumes from round 2's.
  save = checkpoints.save_checkpoint

  def save_torn(manager, state, runner):
    seconds = save(manager, state, runner)
    if runner.round_num == 3:
      pb = tmp_path / 'run' / checkpoints.CHECKPOINT_DIR / 'round_3'
      pb = pb / 'saved_model.pb'
      pb.write_bytes(pb.read_bytes()[:100])
      raise job_testing.Interrupt()
    return seconds

  config = job_testing.config(tmp_path, 'run')
  monkeypatch.setattr(checkpoints, 'save_checkpoint', save_torn)
  with pytest.raises(job_testing.Interrupt):
    training.run_experiment(config)
  monkeypatch.setattr(checkpoints, 'save_checkpoint', save)
  rows = job_testing.rows(tmp_path / 'run' / 'metrics.csv')
  assert [r['round'] for r in rows] == ['1', '2']
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == 3
  run_dir, _ = reference
  before, after = (
    job_testing.final_weights(run_dir),
    job_testing.final_weights(tmp_path / 'run'),
  )
  for k in before:
    np.testing.assert_array_equal(before[k], after[k])
  assert [
    r['train_loss'] for r in job_testing.rows(tmp_path / 'run' / 'metrics.csv')
  ] == [r['train_loss'] for r in job_testing.rows(run_dir / 'metrics.csv')]


def test_a_crash_between_checkpoints_releases_no_round_past_the_last(
  tmp_path, reference
):
  def crash_after_three(round_num):
    if round_num == 3:
      raise job_testing.Interrupt()

  config = job_testing.config(tmp_path, 'run', checkpoint_every=2)
  with pytest.raises(job_testing.Interrupt):
    training.run_experiment(config, round_callback=crash_after_three)
  run_dir = tmp_path / 'run'
  # Round 3 trained, but its checkpoint (round 4's) was never written: no
  # file the ledger covers shows it. (non_private/, which no epsilon
  # covers, is written every round.)
  assert [
    r['round'] for r in job_testing.read_csv(run_dir / 'metrics.csv')
  ] == [
    '1',
    '2',
  ]
  assert {e.step for e in job_testing.tensorboard_events(run_dir)} == {1, 2}
  assert checkpoints.released_rounds(run_dir)[0] == 2
  extra = run_dir / metrics_log.NON_PRIVATE_DIR
  assert [r['round'] for r in job_testing.read_csv(extra / 'metrics.csv')] == [
    '1',
    '2',
    '3',
  ]
  # The same command again trains rounds 3 and 4 once, as the reference.
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == 3
  reference_dir, _ = reference
  a, b = (
    job_testing.rows(reference_dir / 'metrics.csv'),
    job_testing.rows(run_dir / 'metrics.csv'),
  )
  assert [(r['round'], r['train_loss'], r['epsilon_rdp']) for r in a] == [
    (r['round'], r['train_loss'], r['epsilon_rdp']) for r in b
  ]
  assert sorted(e.step for e in job_testing.tensorboard_events(run_dir)) == [
    1,
    2,
    3,
    4,
  ]


def test_a_stop_inside_the_last_release_is_completed_on_rerun(
  tmp_path, reference, monkeypatch
):
  # Stopped after round 4's events were written but before metrics.csv
  # was: the rerun writes the missing rows, no event twice, and trains
  # nothing again.
  write_csv = metrics_log.write_csv

  def stop_at_round_4(path, rows):
    if rows and rows[-1]['round'] == 4 and path.parent == tmp_path / 'run':
      raise job_testing.Interrupt()
    write_csv(path, rows)

  config = job_testing.config(tmp_path, 'run', checkpoint_every=2)
  monkeypatch.setattr(metrics_log, 'write_csv', stop_at_round_4)
  with pytest.raises(job_testing.Interrupt):
    training.run_experiment(config)
  run_dir = tmp_path / 'run'
  assert [
    r['round'] for r in job_testing.read_csv(run_dir / 'metrics.csv')
  ] == [
    '1',
    '2',
  ]
  assert sorted(e.step for e in job_testing.tensorboard_events(run_dir)) == [
    1,
    2,
    3,
    4,
  ]
  monkeypatch.setattr(metrics_log, 'write_csv', write_csv)
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == 5  # Nothing trained.
  reference_dir, _ = reference
  assert (run_dir / 'metrics.csv').read_text() == (
    reference_dir / 'metrics.csv'
  ).read_text()
  assert sorted(e.step for e in job_testing.tensorboard_events(run_dir)) == [
    1,
    2,
    3,
    4,
  ]


def test_a_run_from_before_the_secret_folder_resumes_its_checkpoints(
  tmp_path,
):
  def crash_after_one(round_num):
    if round_num == 1:
      raise job_testing.Interrupt()

  config = job_testing.config(tmp_path, 'run', rounds=2)
  with pytest.raises(job_testing.Interrupt):
    training.run_experiment(config, round_callback=crash_after_one)
  # The layout of a run started before the secret folder existed.
  run_dir = tmp_path / 'run'
  os.replace(
    run_dir / checkpoints.CHECKPOINT_DIR,
    run_dir / checkpoints.LEGACY_CHECKPOINT_DIR,
  )
  (run_dir / checkpoints.SECRET_DIR).rmdir()
  summary = training.run_experiment(config)
  assert summary['first_round_this_invocation'] == 2
  assert summary['rounds_completed'] == 2
  # Moved to the secret folder, deleted with it once the run finished.
  assert not (run_dir / checkpoints.LEGACY_CHECKPOINT_DIR).exists()
  assert not (run_dir / checkpoints.SECRET_DIR).exists()


# `python -m tff_dp.run` whose job blocks once round 3's checkpoint is saved.
_BLOCK_AFTER_ROUND_3 = """
import pathlib, time
from absl import app
from tff_dp import run
from tff_dp.job import checkpoints
save = checkpoints.save_checkpoint
def save_then_block(manager, state, runner):
  seconds = save(manager, state, runner)
  if runner.round_num == 3:
    pathlib.Path({marker!r}).touch()
    time.sleep(3600)
  return seconds
checkpoints.save_checkpoint = save_then_block
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
    '--nobackground_evaluation',
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
  assert (killed / checkpoints.CHECKPOINT_DIR / 'round_3').is_dir()
  os.killpg(proc.pid, signal.SIGKILL)  # The binary and its worker_binary.
  proc.wait(timeout=60)
  assert not (killed / 'summary.json').exists()
  subprocess.run(
    args + [f'--root_output_dir={killed}'], env=env, check=True, timeout=400
  )
  wa, wb = job_testing.final_weights(full), job_testing.final_weights(killed)
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
