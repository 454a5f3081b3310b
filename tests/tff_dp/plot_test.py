"""The plot command draws non-empty PNGs from a tiny real run."""

import json

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
        release_non_private_metrics=True,
      )
    )
    runs.append(out)
  diag = runs[0] / 'non_private' / 'diagnostics.jsonl'
  assert diag.read_text().count('\n') == 3
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
  # The frontier from the same run folders: upload and best metric as the
  # runs recorded them.
  points = plot.frontier_points_from_runs(runs)
  for point, run in zip(points, runs):
    summary = json.loads((run / 'summary.json').read_text())
    assert point.kb_up_per_round == (
      summary['bytes_per_client_per_round']['up'] / 1000
    )
    # Heart disease's test metrics (its hospitals' own held-out patients)
    # are in non_private/; the reader merges them in.
    metrics = plot.read_rows(run)
    best = max(
      r['test_balanced_accuracy']
      for r in metrics
      if 'test_balanced_accuracy' in r
    )
    assert point.metric == pytest.approx(best)
    assert point.group == run.name
  assert points[0].epsilon == summary_eps(runs[0]) and points[1].epsilon is None
  png = plot.plot_frontier(points, tmp_path / 'plots' / 'frontier.png')
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def summary_eps(run):
  return json.loads((run / 'summary.json').read_text())['epsilon_rdp']


def _row(method, kb, best, eps, paper=''):
  return {
    'method': method,
    'KB up / client / round': kb,
    'best test metric': best,
    'epsilon RDP': eps,
    'paper': paper,
  }


def test_frontier_from_a_results_store_groups_seeds(tmp_path):
  store = tmp_path / 'study.json'
  store.write_text(
    json.dumps(
      {
        'dp': _row('DP-FedAvg', 100.0, 0.70, 1.0, 0.78),
        'dp_seed1': _row('DP-FedAvg, seed 1', 100.0, 0.60, 1.0, 0.78),
        'dp_seed2': _row('DP-FedAvg, seed 2', 100.0, 0.65, 1.0, 0.78),
        'top': _row('FL-TOP-DP', 5.0, 0.64, 1.0 + 1e-7),
        'fedavg': _row('FedAvg', 100.0, 0.80, None, 0.86),
      }
    )
  )
  points = plot.frontier_points_from_results(store)
  groups = {g['group']: g for g in plot.frontier_groups(points)}
  assert list(groups) == ['dp', 'top', 'fedavg']
  assert groups['dp']['label'] == 'DP-FedAvg'
  assert groups['dp']['seeds'] == 3
  assert groups['dp']['mean'] == pytest.approx(0.65)
  assert (groups['dp']['min'], groups['dp']['max']) == (0.60, 0.70)
  assert groups['dp']['paper'] == 0.78 and groups['top']['paper'] is None
  assert not groups['fedavg']['private'] and groups['top']['private']
  png = plot.plot_frontier(points, tmp_path / 'frontier.png', 'study')
  assert png.stat().st_size > 10_000
  chosen = plot.frontier_points_from_results(store, ['top', 'fedavg'])
  assert [p.group for p in chosen] == ['top', 'fedavg']
  with pytest.raises(ValueError, match=r"rows \['nope'\] are not in"):
    plot.frontier_points_from_results(store, ['nope'])


def test_frontier_refuses_unequal_epsilon_and_mixed_groups(tmp_path):
  a = plot.FrontierPoint('a', 'A', 10.0, 0.5, 1.0)
  b = plot.FrontierPoint('b', 'B', 10.0, 0.6, 1.5)
  with pytest.raises(ValueError, match='epsilons 1 to 1.5'):
    plot.plot_frontier([a, b], tmp_path / 'f.png')
  c = plot.FrontierPoint('a', 'A', 20.0, 0.6, 1.0)
  with pytest.raises(ValueError, match="group 'a' mixes uploads 10 to 20"):
    plot.frontier_groups([a, c])
  with pytest.raises(ValueError, match='no points'):
    plot.plot_frontier([], tmp_path / 'f.png')


def test_line_styles_are_distinct_past_the_colour_cycle():
  styles = plot.line_styles(17)
  assert len({tuple(sorted(s.items())) for s in styles}) == 17
  assert styles[0]['color'] == styles[10]['color']
  assert styles[0]['linestyle'] != styles[10]['linestyle']
  assert len(plot.line_styles(40)) == 40
  with pytest.raises(ValueError, match='at most 40 runs.*got 41'):
    plot.line_styles(41)


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
  fig, ax = plot.plt.subplots()
  ax.scatter([lo, hi], [0, 1])
  ax.set_xscale('log')
  plot.short_log_ticks(ax.xaxis)
  fig.canvas.draw()
  left, right = ax.get_xlim()
  ticks = ax.get_xticklabels() + ax.get_xticklabels(minor=True)
  labels = sorted(
    (t.get_position()[0], t.get_text())
    for t in ticks
    if t.get_text() and left <= t.get_position()[0] <= right
  )
  plot.plt.close(fig)
  assert [text for _, text in labels] == expected


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
      # Update norms: non-private diagnostics, as the probe computes them.
      release_non_private_metrics=True,
    ),
    rows_out=rows,
  )
  mean = sum(r['update_norm_mean'] for r in rows) / 2
  assert training.clip_from_fedavg(config, 2, 0.5) == pytest.approx(0.5 * mean)
  with pytest.raises(ValueError, match=r'fraction must be in \(0, 1\]'):
    training.clip_from_fedavg(config, 2, 1.5)
