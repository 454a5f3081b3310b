"""The run plots: PNGs from a tiny real run (and the frontier from its
run folders), the runs' styles and the short log-axis tick labels."""

import json

import pytest

from tff_dp.job import training
from tff_dp.reporting import frontier
from tff_dp.reporting import frontier_plot
from tff_dp.reporting import run_folders
from tff_dp.reporting import run_plots
from tff_dp.reporting import styles as styles_lib


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
        release_non_private_metrics=True,
        background_evaluation=False,
      )
    )
    runs.append(out)
  diag = runs[0] / 'non_private' / 'diagnostics.jsonl'
  assert diag.read_text().count('\n') == 3
  files = run_plots.plot_runs(runs, tmp_path / 'plots')
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
  # The frontier from the same run folders: upload and the metric's last
  # evaluations as the runs recorded them.
  points = frontier.frontier_points_from_runs(runs)
  for point, run in zip(points, runs):
    summary = json.loads((run / 'summary.json').read_text())
    assert point.kb_up_per_round == (
      summary['bytes_per_client_per_round']['up'] / 1000
    )
    # Heart disease's test metrics (its hospitals' own held-out patients)
    # are in non_private/; the reader merges them in.
    metrics = [
      r['test_balanced_accuracy']
      for r in run_folders.read_rows(run)
      if 'test_balanced_accuracy' in r
    ]
    assert point.final == pytest.approx(metrics[-1])
    assert point.best == pytest.approx(max(metrics))
    assert point.last_three == pytest.approx(sum(metrics[-3:]) / 3)
    assert point.group == run.name
    assert point.method == run.name  # Each run is its method.
  assert points[0].epsilon == summary_eps(runs[0]) and points[1].epsilon is None
  png = frontier_plot.plot_frontier(
    points,
    tmp_path / 'plots' / 'frontier.png',
    metric='test_balanced_accuracy',
  )
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def summary_eps(run):
  return json.loads((run / 'summary.json').read_text())['epsilon_rdp']


def test_run_styles_follow_the_method_table():
  styles = run_plots.run_styles(['lus', 'lus', 'ddgauss'])
  lus, ddg = (
    styles_lib.METHOD_STYLES['lus'],
    styles_lib.METHOD_STYLES['ddgauss'],
  )
  assert [(s['color'], s['marker']) for s in styles] == [
    (lus.color, lus.marker),
    (lus.color, lus.marker),
    (ddg.color, ddg.marker),
  ]
  # Runs of one method differ by line style.
  assert styles[0]['linestyle'] != styles[1]['linestyle']
  with pytest.raises(ValueError, match="at most 6 runs of method 'lus'"):
    run_plots.run_styles(['lus'] * 7)


@pytest.mark.parametrize(
  'lo, hi, expected',
  [
    # Under a decade: minor ticks labelled, as short plain numbers (the
    # default math text, '1.1 x 10^0', overlapped on seed 000's plots).
    (0.85, 1.55, ['0.9', '1', '1.1', '1.2', '1.3', '1.4', '1.5']),
    # A decade and a bit, one decade tick in view (seed 000's norms at
    # round 300): a subset of the minor ticks, not '1' alone.
    (0.15, 2.0, ['0.2', '0.3', '0.4', '0.6', '1', '2']),
    # Over 1.4 decades: decades only, where the subset would crowd.
    (0.03, 1.3, ['0.1', '1']),
    # Several decades: decades only.
    (0.01, 10, ['0.01', '0.1', '1', '10']),
  ],
)
def test_short_log_ticks_label_norm_axes_plainly(lo, hi, expected):
  fig, ax = run_plots.plt.subplots()
  ax.scatter([lo, hi], [0, 1])
  ax.set_xscale('log')
  run_plots.short_log_ticks(ax.xaxis)
  fig.canvas.draw()
  left, right = ax.get_xlim()
  ticks = ax.get_xticklabels() + ax.get_xticklabels(minor=True)
  labels = sorted(
    (t.get_position()[0], t.get_text())
    for t in ticks
    if t.get_text() and left <= t.get_position()[0] <= right
  )
  run_plots.plt.close(fig)
  assert [text for _, text in labels] == expected


# Tuning without DP (a FedAvg probe run): `make test-slow`.
@pytest.mark.slow
@pytest.mark.usefixtures('shared_data_dir')
def test_clip_from_fedavg_is_a_fraction_of_the_mean_norm():
  config = training.ExperimentConfig.create(
    task='heart_disease',
    method='dp_fedavg',
    clients_per_round=4,
    batch_size=32,
    background_evaluation=False,  # Its FedAvg probe's.
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
      # Update norms: non-private diagnostics, as the probe computes them.
      release_non_private_metrics=True,
      background_evaluation=False,
    ),
    rows_out=rows,
  )
  mean = sum(r['update_norm_mean'] for r in rows) / 2
  assert training.clip_from_fedavg(config, 2, 0.5) == pytest.approx(0.5 * mean)
  with pytest.raises(ValueError, match=r'fraction must be in \(0, 1\]'):
    training.clip_from_fedavg(config, 2, 1.5)
