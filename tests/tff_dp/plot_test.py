"""The plot command draws non-empty PNGs from a tiny real run."""

import pytest

from tff_dp import plot
from tff_dp import training


@pytest.mark.usefixtures('shared_data_dir')
def test_plots_from_a_tiny_run(tmp_path):
  runs = []
  for method in ('dp_fedavg', 'fedavg'):
    out = tmp_path / method
    training.run_experiment(
      training.ExperimentConfig.create(
        task='heart_disease',
        method=method,
        rounds=3,
        clients_per_round=4,
        noise_multiplier=0.3,
        delta=1e-3,
        batch_size=32,
        output_dir=str(out),
      )
    )
    runs.append(out)
  assert (runs[0] / 'diagnostics.jsonl').read_text().count('\n') == 3
  files = plot.plot_runs(runs, tmp_path / 'plots')
  names = sorted(p.name for p in files)
  assert names == sorted(
    [
      'test_balanced_accuracy_vs_round.png',
      'test_balanced_accuracy_vs_epsilon.png',
      'test_balanced_accuracy_vs_bytes_up.png',
      'update_norm_angle_dp_fedavg.png',
      'update_norm_angle_fedavg.png',
    ]
  )
  for f in files:
    assert f.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert f.stat().st_size > 10_000


def test_line_styles_are_distinct_past_the_colour_cycle():
  styles = plot.line_styles(17)
  assert len({tuple(sorted(s.items())) for s in styles}) == 17
  assert styles[0]['color'] == styles[10]['color']
  assert styles[0]['linestyle'] != styles[10]['linestyle']
  assert len(plot.line_styles(40)) == 40
  with pytest.raises(ValueError, match='at most 40 runs.*got 41'):
    plot.line_styles(41)


@pytest.mark.usefixtures('shared_data_dir')
def test_clip_from_fedavg_is_a_fraction_of_the_mean_norm():
  config = training.ExperimentConfig.create(
    task='heart_disease', method='dp_fedavg', clients_per_round=4, batch_size=32
  )
  rows = []
  training.run_experiment(
    training.ExperimentConfig.create(
      task='heart_disease',
      method='fedavg',
      rounds=2,
      eval_every=2,
      clients_per_round=4,
      batch_size=32,
      # The probe draws its cohorts and shuffles from the public --seed.
      noise_seed=config.seed,
    ),
    rows_out=rows,
  )
  mean = sum(r['update_norm_mean'] for r in rows) / 2
  assert training.clip_from_fedavg(config, 2, 0.5) == pytest.approx(0.5 * mean)
  with pytest.raises(ValueError, match=r'fraction must be in \(0, 1\]'):
    training.clip_from_fedavg(config, 2, 1.5)
