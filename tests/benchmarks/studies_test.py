"""Tests of the study runner's clip rules (no training: fabricated runs)."""

import csv
import json

import pytest

from benchmarks import studies

# The runner's CSV name of CMP-Fed's `client_norms` measurement: the
# aggregator's measurements under TFF's 'aggregator' key, with 'tff/' before.
_PREFIX = 'tff/aggregator/client_norms/'


def _probe(tmp_path, rows):
  fields = ['round', _PREFIX + 'u_payload', _PREFIX + 'v_payload']
  with open(tmp_path / 'metrics.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(fields)
    for i, (u, v) in enumerate(rows, start=1):
      writer.writerow([i, u, v])
  return tmp_path


def _finished_run(run_dir, config, clip, up_bytes, metric, values):
  """A fabricated finished run folder: summary.json and metrics.csv."""
  summary = {
    'config': config.to_dict(),
    'num_model_params': 210,
    'bytes_per_client_per_round': {'down': 840, 'up': up_bytes},
    'epsilon_rdp': 1.0,
    'epsilon_pld': 0.9,
    'noise_multiplier': 1.0,
    'clip': clip,
    'sampling': {'mode': 'poisson', 'num_clients': 100, 'rate': 0.1},
  }
  (run_dir / 'summary.json').write_text(json.dumps(summary))
  with open(run_dir / 'metrics.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', metric])
    writer.writerows(enumerate(values, start=1))


def test_cmp_clips_are_medians_over_rounds_of_each_phase_payload(tmp_path):
  assert studies.CMP_CLIENT_NORMS == _PREFIX
  rows = [(0.1, 5.0), (0.3, 5.0), (0.2, 3.0), (9.0, 5.0), (0.25, 100.0)]
  run = _probe(tmp_path, rows)
  assert studies.cmp_clip_from_run(run, 'cmp_clip_u') == 0.25
  assert studies.cmp_clip_from_run(run, 'cmp_clip_v') == 5.0


def test_cmp_clip_from_a_run_without_the_measurement_or_a_bad_flag(tmp_path):
  (tmp_path / 'metrics.csv').write_text('round,train_loss\n1,0.5\n')
  with pytest.raises(ValueError, match='no CMP-Fed .*v_payload'):
    studies.cmp_clip_from_run(tmp_path, 'cmp_clip_v')
  with pytest.raises(ValueError, match="clip_flag must be one of .* 'clip'"):
    studies.cmp_clip_from_run(tmp_path, 'clip')


def _cmp_run(run_dir, noise_seed):
  """A fabricated finished CMP-Fed run: summary, final weights, metrics."""
  import numpy as np

  from tff_dp import privacy
  from tff_dp.job import training

  run_dir.mkdir()
  config = training.ExperimentConfig.create(
    method='cmp_fed', clip=1.0, noise_multiplier=1.0, noise_seed=noise_seed
  )
  sampling = privacy.Sampling(mode='poisson', num_clients=100, rate=0.1)
  summary = {
    'config': config.to_dict(),
    'num_model_params': 20 * 10 + 10,
    'sampling': sampling.to_dict(),
    'noise_multiplier': 1.0,
  }
  (run_dir / 'summary.json').write_text(json.dumps(summary))
  np.savez(
    run_dir / 'final_model_weights.npz',
    trainable_0=np.zeros((20, 10), np.float32),
    trainable_1=np.zeros((10,), np.float32),
  )
  u, v = 'tff/aggregator/mean_norms/u_norm', 'tff/aggregator/mean_norms/v_norm'
  with open(run_dir / 'metrics.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', u, v])
    writer.writerows([[1, 5.0, 20.0], [2, 7.0, 30.0], [3, 6.0, 10.0]])
  return run_dir


def test_cmp_signal_shares_of_a_run_whose_summary_hides_its_noise_seed(
  tmp_path,
):
  # summary.json records 'given by --noise_seed ...', not the seed itself;
  # the shares (which do not depend on the seed) must still be computed.
  seeded = _cmp_run(tmp_path / 'seeded', noise_seed=0)
  secret = _cmp_run(tmp_path / 'secret', noise_seed=None)
  shares = studies.cmp_signal_shares(seeded)
  assert shares == studies.cmp_signal_shares(secret)
  assert all(0 < s < 1 for s in shares)
  # A larger released norm over the same noise is a larger signal share.
  assert shares[0] < shares[1]


def test_a_row_reports_the_clip_in_force_not_the_flag(tmp_path):
  # FL-TOP-DP with --clip_from_public_round: --clip is replaced by the
  # public round's update norm, which summary.json records as "clip".
  from tff_dp.job import training

  config = training.ExperimentConfig.create(
    method='fl_top_dp', clip=1.0, clip_from_public_round=True
  )
  _finished_run(tmp_path, config, 0.998, 84, 'test_accuracy', [0.5, 0.6])
  out = studies.summarize_run(tmp_path, 'test_accuracy')
  assert out['clip in force'] == 0.998
  assert out['best test metric'] == 0.6
  # 84 bytes up a round x 2 rounds x q = 0.1.
  assert out['KB up / client (to best)'] == pytest.approx(84 * 2 * 0.1 / 1000)


def test_a_partial_models_upload_ratio_is_against_the_whole_model(tmp_path):
  # --train_layers: summary.json's num_model_params is the trained part
  # (210 weights, 840 bytes up), num_frozen_params the rest (1,890).
  from tff_dp.job import training

  config = training.ExperimentConfig.create(method='dp_fedavg', clip=1.0)
  _finished_run(tmp_path, config, 1.0, 840, 'test_accuracy', [0.5, 0.6])
  whole = studies.summarize_run(tmp_path, 'test_accuracy')
  assert whole['upload compression x'] == pytest.approx(1.0)
  summary = json.loads((tmp_path / 'summary.json').read_text())
  summary['num_frozen_params'] = 1890
  (tmp_path / 'summary.json').write_text(json.dumps(summary))
  out = studies.summarize_run(tmp_path, 'test_accuracy')
  assert out['upload compression x'] == pytest.approx(10.0)


def test_a_rows_guarantee_caveat_comes_from_its_summary(tmp_path):
  from tff_dp.job import training

  config = training.ExperimentConfig.create(
    method='ddgauss', noise_multiplier=1.0, client_sampling_rate=0.1
  )
  _finished_run(tmp_path, config, 0.03, 84, 'test_accuracy', [0.5, 0.6])
  summary = json.loads((tmp_path / 'summary.json').read_text())
  summary['privacy'] = {'guarantee_caveat': 'Not rigorous: DDGauss ...'}
  (tmp_path / 'summary.json').write_text(json.dumps(summary))
  out = studies.summarize_run(tmp_path, 'test_accuracy')
  assert out['guarantee caveat'] == 'Not rigorous: DDGauss ...'


def test_a_resumed_rows_wall_time_says_which_rounds_it_covers(tmp_path):
  summary = {'rounds_completed': 180, 'first_round_this_invocation': 1}
  (tmp_path / 'summary.json').write_text(json.dumps(summary))
  assert studies.runner.wall_label(tmp_path, 1234.56) == 1234.6
  summary['first_round_this_invocation'] = 121
  (tmp_path / 'summary.json').write_text(json.dumps(summary))
  label = studies.runner.wall_label(tmp_path, 500.04)
  assert label == '500.0 (rounds 121-180 only)'


def test_per_client_kb_use_the_runs_own_sampling():
  # Fixed-size cohorts record rate None: a client is in a round with
  # probability clients_per_round / num_clients (a row setting
  # client_sampling_rate=None used to crash on float(None)).
  fixed = {
    'mode': 'fixed',
    'num_clients': 6000,
    'rate': None,
    'clients_per_round': 100,
  }
  assert studies.sampling_fraction(fixed) == pytest.approx(1 / 60)
  poisson = {'mode': 'poisson', 'num_clients': 6000, 'rate': 0.016667}
  assert studies.sampling_fraction(poisson) == pytest.approx(0.016667)
  with pytest.raises(ValueError, match='clients_per_round must be'):
    studies.sampling_fraction(
      {'mode': 'fixed', 'num_clients': 6000, 'rate': None}
    )


def test_the_study_command_starts():
  """`python -m benchmarks.studies` defines its flags beside those of the
  modules it imports (the plot module's once clashed on --rows, and every
  row of a queued study failed at start)."""
  import subprocess
  import sys

  done = subprocess.run(
    [
      sys.executable,
      '-m',
      'benchmarks.studies',
      '--study=seed004_medical',
      '--rows=no_such_row',
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  # It reaches main, which refuses the row (absl exits 1 on a UsageError).
  assert "Unknown rows ['no_such_row']" in done.stderr, done.stderr[-2000:]
  assert 'DuplicateFlagError' not in done.stderr
  done = subprocess.run(
    done.args + ['--render_only'], capture_output=True, text=True, timeout=300
  )
  assert done.returncode == 1
  assert '--render_only takes no --rows' in done.stderr, done.stderr[-2000:]


def test_every_study_row_is_unique_and_headline_seeds_reseed():
  for name, study in studies.STUDIES.items():
    names = [r.name for r in study.rows]
    assert len(names) == len(set(names)), name
    for row in study.rows:
      if '_seed' in row.name:
        seed = int(row.name.rsplit('_seed', 1)[1])
        assert row.flags['seed'] == row.flags['noise_seed'] == seed
  iid = {r.name: r for r in studies.STUDIES['seed001_iid'].rows}
  assert iid['cmp_fed_r16_180'].flags['rounds'] == 180
  assert iid['cmp_fed_r16_180_seed2'].flags == dict(
    iid['cmp_fed_r16_180'].flags, seed=2, noise_seed=2
  )
  assert iid['dp_fedavg_clip0.5_180_seed1'].flags == dict(
    iid['dp_fedavg_clip0.5_180'].flags, seed=1, noise_seed=1
  )
  # The 5-label split takes the IID grid's winner as it is, no grid.
  labels5 = {r.name: r for r in studies.STUDIES['seed001_5labels'].rows}
  assert [n for n in labels5 if 'clip' in n] == ['dp_fedavg_clip0.5_180']
  assert (
    labels5['dp_fedavg_clip0.5_180'].flags == iid['dp_fedavg_clip0.5_180'].flags
  )


def test_render_only_rewrites_the_table_from_its_store(tmp_path, monkeypatch):
  study = studies.STUDIES['seed004_medical']
  monkeypatch.setattr(studies.runner, 'RESULTS', tmp_path)
  with pytest.raises(FileNotFoundError, match='No results store'):
    studies.runner.render_table('seed004_medical', study)
  rows = {
    'b_row': {'row': 'b_row', 'best test metric': 0.61234, 'command': 'x|y'},
    'a_row': {'row': 'a_row', 'seed': 2},
  }
  store = tmp_path / 'seed004_medical.json'
  store.write_text(json.dumps(rows, indent=2, sort_keys=True) + '\n')
  # b_row's run files are kept beside the results; a_row's are not.
  kept = tmp_path / 'runs' / 'seed004_medical' / 'b_row'
  kept.mkdir(parents=True)
  (kept / 'summary.json').write_text('{}')
  md = studies.runner.render_table('seed004_medical', study)
  assert md == tmp_path / 'seed004_medical.md'
  text = md.read_text()
  assert text.startswith(f'# {study.title}\n')
  assert study.notes.strip() in text
  assert '\nMachine: ' in text
  # The study's columns, and whether each row's run files are committed
  # before the command.
  columns = study.columns[:-1] + ('run files', 'command')
  assert study.columns[-1] == 'command'
  assert '| ' + ' | '.join(columns) + ' |' in text
  # Rows in the store's order, floats to 4 digits, '|' escaped.
  assert text.index('| a_row |') < text.index('| b_row |')
  assert '| 0.6123 |' in text and '`x\\|y`' in text
  assert '| not kept | `` |' in text
  link = '[kept](runs/seed004_medical/b_row/summary.json)'
  assert f'| {link} | `x\\|y` |' in text
  # The store changes only in that cell.
  assert json.loads(store.read_text()) == {
    'a_row': dict(rows['a_row'], **{'run files': 'not kept'}),
    'b_row': dict(rows['b_row'], **{'run files': link}),
  }


def test_a_finished_rows_small_files_are_kept_for_replotting(
  tmp_path, monkeypatch
):
  from tff_dp.reporting import run_folders

  monkeypatch.setattr(studies.runner, 'RESULTS', tmp_path / 'results')
  run_dir = tmp_path / 'run'
  (run_dir / 'checkpoints' / 'round_10').mkdir(parents=True)
  (run_dir / 'checkpoints' / 'round_10' / 'saved_model.pb').write_bytes(b'x')
  (run_dir / 'tensorboard').mkdir()
  (run_dir / 'config.json').write_text('{"rounds": 10}')
  (run_dir / 'summary.json').write_text('{"rounds_completed": 10}')
  (run_dir / 'diagnostics.jsonl').write_text('{"round": 10}\n')
  with open(run_dir / 'metrics.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', 'test_accuracy'])
    writer.writerows([[5, ''], [10, 0.625]])
  (run_dir / 'non_private').mkdir()
  (run_dir / 'non_private' / 'summary.json').write_text('{"bytes_up_total": 1}')
  (run_dir / 'non_private' / 'diagnostics.jsonl').write_text('{"round": 5}\n')
  with open(run_dir / 'non_private' / 'metrics.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', 'train_loss'])
    writer.writerows([[5, 0.5], [10, 0.25]])
  kept = studies.keep_run_files('some_study', 'some_row', run_dir)
  assert kept == tmp_path / 'results' / 'runs' / 'some_study' / 'some_row'
  assert sorted(
    str(p.relative_to(kept)) for p in kept.rglob('*') if p.is_file()
  ) == sorted(studies.runner.KEPT_RUN_FILES)
  for name in studies.runner.KEPT_RUN_FILES:
    assert (kept / name).read_bytes() == (run_dir / name).read_bytes()
  # The copy reads like the run folder for the plots.
  assert run_folders.read_rows(kept) == run_folders.read_rows(run_dir)
  # With the non-private columns merged in by round.
  assert run_folders.read_rows(kept)[1] == {
    'round': 10.0,
    'test_accuracy': 0.625,
    'train_loss': 0.25,
  }
  # A rerun replaces the copy; a file the run no longer has goes.
  (run_dir / 'diagnostics.jsonl').unlink()
  (run_dir / 'config.json').write_text('{"rounds": 20}')
  studies.keep_run_files('some_study', 'some_row', run_dir)
  assert not (kept / 'diagnostics.jsonl').exists()
  assert (kept / 'config.json').read_text() == '{"rounds": 20}'


def _read_back(tmp_path, monkeypatch, study_name, row_name, method, clip):
  """`run_row` over a fabricated finished run folder under a temporary
  `runs/` (it trains nothing); returns the row and its stored record."""
  from tff_dp.job import training

  monkeypatch.setattr(studies.runner, 'RESULTS', tmp_path / 'results')
  monkeypatch.setattr(studies.runner, 'RUNS', tmp_path / 'runs')
  study = studies.STUDIES[study_name]
  row = next(r for r in study.rows if r.name == row_name)
  run_dir = tmp_path / 'runs' / study_name / row.name
  run_dir.mkdir(parents=True, exist_ok=True)
  config = training.ExperimentConfig.create(method=method, clip=clip)
  _finished_run(run_dir, config, clip, 840, study.metric, [0.5, 0.7])
  studies.run_row(study_name, study, row, rerun=False)
  store = json.loads((tmp_path / 'results' / f'{study_name}.json').read_text())
  return row, store[row.name]


def test_a_row_read_back_from_its_run_folder_keeps_its_files(
  tmp_path, monkeypatch
):
  # run_row over a finished run folder trains nothing: it writes the table
  # row and keeps the run's small files beside the results.
  row, record = _read_back(
    tmp_path,
    monkeypatch,
    'seed004_medical',
    'dp_fedavg_seed1',
    'dp_fedavg',
    1.0,
  )
  assert record['best test metric'] == 0.7
  kept = tmp_path / 'results' / 'runs' / 'seed004_medical' / row.name
  assert sorted(p.name for p in kept.iterdir()) == [
    'metrics.csv',
    'summary.json',
  ]
  assert record['run files'] == (
    f'[kept](runs/seed004_medical/{row.name}/summary.json)'
  )
  # A summary without a caveat (its guarantee holds) leaves the cell empty.
  assert record['guarantee caveat'] == ''


def test_a_clip_source_is_read_from_its_kept_files_on_a_fresh_checkout(
  tmp_path, monkeypatch
):
  # A fresh checkout has no runs/: a CE-FedAvg row resumed there takes its
  # clip from the FedAvg row's files kept beside the results.
  args = ('seed003_clipping', 'emnist_cnn_2layers_paper_ce_fedavg_200')
  source = 'emnist_cnn_2layers_paper_fedavg_200'
  with pytest.raises(ValueError, match=source):
    _read_back(tmp_path, monkeypatch, *args, 'ce_fedavg', 0.225)
  kept = tmp_path / 'results' / 'runs' / 'seed003_clipping' / source
  kept.mkdir(parents=True)
  (kept / 'metrics.csv').write_text('round,update_norm_mean\n1,0.4\n2,0.5\n')
  _, record = _read_back(tmp_path, monkeypatch, *args, 'ce_fedavg', 0.225)
  assert '--clip=0.225 ' in record['command']
