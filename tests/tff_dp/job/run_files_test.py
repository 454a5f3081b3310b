"""Tests of where a run's results go: only what the ledger covers in the
run folder, the rest in non_private/ when released."""

import json
import re

import pytest

from tff_dp.job import training
from tff_dp.job import checkpoints
from tff_dp.job import metrics_log
from tff_dp.job import run_files

import job_testing

pytestmark = pytest.mark.usefixtures('shared_data_dir')


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


def test_default_run_writes_only_what_the_ledger_covers(tmp_path):
  config = job_testing.config(
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
  allowed = set(metrics_log.PRIVATE_COLUMNS)
  columns = list(job_testing.rows(run_dir / 'metrics.csv')[0])
  assert 'test_auroc' in columns and 'epsilon_pld' in columns
  assert {c for c in columns if not c.startswith('test_')} <= allowed
  tags = job_testing.tensorboard_tags(run_dir)
  assert 'test_auroc' in tags and 'epsilon_rdp' in tags
  assert {t for t in tags if not t.startswith('test_')} <= allowed
  # No file holds any non-private name: not the checkpoints' runner state,
  # nor TensorBoard, nor the summary beyond its privacy section's list of
  # what is withheld.
  saved = json.loads((run_dir / 'summary.json').read_text())
  listed = dict(saved, privacy=dict(saved['privacy'], non_private_outputs=[]))
  for path in job_testing.files(run_dir):
    data = path.read_bytes()
    if path.name == 'summary.json':
      data = json.dumps(listed).encode()
    for name in _NON_PRIVATE_NAMES:
      assert not _holds_name(data, name), (path, name)
  # The task's description counts the patients: withheld too.
  assert 'task_description' not in saved
  assert saved == json.loads(json.dumps(summary))
  for key in run_files.NON_PRIVATE_SUMMARY_KEYS:
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
    p: (p.read_bytes(), p.stat().st_mtime_ns)
    for p in job_testing.files(run_dir)
  }
  assert training.run_experiment(config) == saved
  assert {
    p: (p.read_bytes(), p.stat().st_mtime_ns)
    for p in job_testing.files(run_dir)
  } == released


def test_test_metrics_on_a_sites_own_patients_are_withheld(tmp_path):
  # One client a site (the default): its held-out patients are its data.
  summary = training.run_experiment(
    job_testing.config(
      tmp_path,
      'sites',
      rounds=1,
      release_non_private_metrics=False,
      allow_noise_seed_reuse=False,
    )
  )
  columns = job_testing.rows(tmp_path / 'sites' / 'metrics.csv')[0]
  assert not [c for c in columns if c.startswith('test_')]
  assert summary['final'] == {}
  assert summary['privacy']['test_metrics'].startswith('not covered')


def test_released_non_private_metrics_go_to_their_own_folder(tmp_path):
  config = job_testing.config(
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
  extra = run_dir / metrics_log.NON_PRIVATE_DIR
  assert sorted(p.name for p in extra.iterdir()) == [
    'diagnostics.jsonl',
    'metrics.csv',
    'summary.json',
    'tensorboard',
  ]
  private = job_testing.read_csv(run_dir / 'metrics.csv')
  non_private = job_testing.read_csv(extra / 'metrics.csv')
  assert [r['round'] for r in non_private] == ['1', '2']
  for key in ('sampled_clients', 'train_loss', 'round_seconds'):
    assert key in non_private[0] and key not in private[0]
  # Heart disease's held-out patients are its hospitals' own.
  assert 'test_auroc' in non_private[0] and 'test_auroc' not in private[0]
  extra_summary = json.loads((extra / 'summary.json').read_text())
  # With the final test metrics, the hospitals' own patients' (above).
  assert set(extra_summary) == {*run_files.NON_PRIVATE_SUMMARY_KEYS, 'final'}
  assert 'test_auroc' in extra_summary['final']
  assert extra_summary['bytes_up_total'] == summary['bytes_up_total'] > 0
  assert 'train_loss' in job_testing.tensorboard_tags(extra)
  assert 'train_loss' not in job_testing.tensorboard_tags(run_dir)
  # The checkpoint keeps the released columns, so the byte check of the
  # default run above has the power to see them.
  assert any(
    _holds_name(p.read_bytes(), 'sampled_clients')
    for p in job_testing.files(run_dir / checkpoints.CHECKPOINT_DIR)
  )
  assert not _holds_name(b'dp_fraction_clipped', 'fraction_clipped')
  assert _holds_name(b'"update_norm_mean"', 'update_norm_')
  assert summary['privacy']['non_private_metrics_released'] is True
  assert summary['privacy']['non_private_dir'] == metrics_log.NON_PRIVATE_DIR


def test_test_metrics_of_client_held_test_data_are_non_private(tmp_path):
  files = run_files.RunFiles(tmp_path, False, test_private=False)
  row = {'round': 3, 'epsilon_rdp': 1.0, 'test_accuracy': 0.5}
  assert files.split(row) == (
    {'round': 3, 'epsilon_rdp': 1.0},
    {'round': 3, 'test_accuracy': 0.5},
  )
  assert files.shown(row) == {'round': 3, 'epsilon_rdp': 1.0}
  summary = {'final': {'test_accuracy': 0.5}, 'bytes_up_total': 7, 'a': 1}
  assert files.returned_summary(summary) == {'final': {}, 'a': 1}
  released = run_files.RunFiles(tmp_path, True, test_private=False)
  assert released.split_summary(summary) == (
    {'final': {}, 'a': 1},
    {'bytes_up_total': 7, 'final': {'test_accuracy': 0.5}},
  )


def test_a_run_from_before_non_private_dir_resumes_only_releasing(tmp_path):
  # Its config.json has no release_non_private_metrics: it wrote everything.
  config = job_testing.config(
    tmp_path, 'legacy', release_non_private_metrics=False
  )
  old = config.to_dict()
  del old['release_non_private_metrics']
  run_dir = tmp_path / 'legacy'
  run_dir.mkdir()
  (run_dir / 'config.json').write_text(json.dumps(old))
  with pytest.raises(ValueError, match='add --release_non_private_metrics'):
    checkpoints.check_same_config(run_dir, config)
  checkpoints.check_same_config(
    run_dir, config.replace(release_non_private_metrics=True)
  )
  # Its histograms move to non_private/ with the rest.
  (run_dir / run_files.DIAGNOSTICS_FILE).write_text('{"round": 1}\n')
  run_files.move_legacy_non_private(run_dir)
  assert not (run_dir / run_files.DIAGNOSTICS_FILE).exists()
  moved = run_dir / metrics_log.NON_PRIVATE_DIR / run_files.DIAGNOSTICS_FILE
  assert moved.read_text() == '{"round": 1}\n'
