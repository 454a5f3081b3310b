"""The plots: PNGs from a tiny real run, and the frontier's parts (its
statistic, title, colours, paper numbers, Pareto front, ceiling) from
small results stores."""

import dataclasses
import json
import math

import pytest

from tff_dp.reporting import plot
from tff_dp.job import training


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
  # The frontier from the same run folders: upload and the metric's last
  # evaluations as the runs recorded them.
  points = plot.frontier_points_from_runs(runs)
  for point, run in zip(points, runs):
    summary = json.loads((run / 'summary.json').read_text())
    assert point.kb_up_per_round == (
      summary['bytes_per_client_per_round']['up'] / 1000
    )
    # Heart disease's test metrics (its hospitals' own held-out patients)
    # are in non_private/; the reader merges them in.
    metrics = [
      r['test_balanced_accuracy']
      for r in plot.read_rows(run)
      if 'test_balanced_accuracy' in r
    ]
    assert point.final == pytest.approx(metrics[-1])
    assert point.best == pytest.approx(max(metrics))
    assert point.last_three == pytest.approx(sum(metrics[-3:]) / 3)
    assert point.group == run.name
    assert point.method == run.name  # Each run is its method.
  assert points[0].epsilon == summary_eps(runs[0]) and points[1].epsilon is None
  png = plot.plot_frontier(
    points,
    tmp_path / 'plots' / 'frontier.png',
    metric='test_balanced_accuracy',
  )
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def summary_eps(run):
  return json.loads((run / 'summary.json').read_text())['epsilon_rdp']


_COMMON = (
  'python -m tff_dp.run --task=t --rounds=30 --client_sampling_rate=0.0166667'
  ' --delta=0.0001 --target_epsilon=1 --seed={seed} --noise_seed={seed}'
)


def _row(method, label, kb, final, eps, paper='', seed=0, pld=None, **flags):
  command = _COMMON.format(seed=seed) + f' --method={method}'
  command += ''.join(f' --{k}={v}' for k, v in flags.items())
  return {
    'method': label,
    'KB up / client / round': kb,
    'best test metric': final + 0.05,
    'final test metric': final,
    'epsilon RDP': eps,
    'epsilon PLD': pld if pld is not None else (0.8 if eps else None),
    'paper': paper,
    'seed': seed,
    'command': command,
  }


def _store(tmp_path, rows):
  path = tmp_path / 'results' / 'study.json'
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(rows))
  return path


_STUDY = {
  'dp': _row('dp_fedavg', 'DP-FedAvg', 6000.0, 0.70, 1.0, 0.78),
  'dp_seed1': _row(
    'dp_fedavg', 'DP-FedAvg, seed 1', 6000.0, 0.60, 1.0, 0.78, 1
  ),
  'dp_seed2': _row(
    'dp_fedavg', 'DP-FedAvg, seed 2', 6000.0, 0.65, 1.0, 0.78, 2
  ),
  'top': _row('fl_top_dp', 'FL-TOP-DP', 5.0, 0.64, 1.0 + 1e-7),
  'cmp_r1': _row(
    'cmp_fed', 'CMP-Fed rank 1', 20.0, 0.50, 1.0, 0.69, cmp_rank=1
  ),
  'cmp_r16': _row('cmp_fed', 'CMP-Fed rank 16', 300.0, 0.62, 1.0, cmp_rank=16),
  'fedavg': _row('fedavg', 'FedAvg (no DP)', 6000.0, 0.80, None, 0.86),
}


def test_frontier_from_a_results_store_groups_seeds(tmp_path):
  store = _store(tmp_path, _STUDY)
  points = plot.frontier_points_from_results(store, metric='test_accuracy')
  groups = {g.name: g for g in plot.frontier_groups(points)}
  assert list(groups) == ['dp', 'top', 'cmp_r1', 'cmp_r16', 'fedavg']
  dp = groups['dp']
  assert (dp.label, dp.method, dp.seeds) == ('DP-FedAvg', 'dp_fedavg', 3)
  # The final evaluations, not the best (0.05 higher in every row).
  assert dp.mean == pytest.approx(0.65)
  assert (dp.min, dp.max) == (0.60, 0.70)
  assert dp.paper == 0.78 and groups['top'].paper is None
  assert not groups['fedavg'].private and groups['top'].private
  assert groups['cmp_r16'].flags['cmp_rank'] == '16'
  png = plot.plot_frontier(
    points,
    tmp_path / 'frontier.png',
    'study',
    paper_words='Table 1, 180 rounds',
  )
  assert png.stat().st_size > 10_000
  chosen = plot.frontier_points_from_results(store, ['top', 'fedavg'])
  assert [p.group for p in chosen] == ['top', 'fedavg']
  with pytest.raises(ValueError, match=r"rows \['nope'\] are not in"):
    plot.frontier_points_from_results(store, ['nope'])


def _write_metrics(run_dir, values, metric='test_accuracy'):
  run_dir.mkdir(parents=True)
  lines = ['round,' + metric] + [
    f'{2 * (i + 1)},{v}' for i, v in enumerate(values)
  ]
  (run_dir / 'metrics.csv').write_text('\n'.join(lines) + '\n')


def test_last_three_evaluations_come_from_kept_run_files(tmp_path):
  rows = {
    'a': _row('dp_fedavg', 'A', 10.0, 0.58, 1.0),
    'b': _row('lus', 'B', 10.0, 0.40, 1.0),
  }
  store = _store(tmp_path, rows)
  kept = store.parent / 'runs' / 'study'
  _write_metrics(kept / 'a', [0.1, 0.5, 0.6, 0.52, 0.58])
  points = plot.frontier_points_from_results(store, metric='test_accuracy')
  assert points[0].last_three == pytest.approx((0.6 + 0.52 + 0.58) / 3)
  assert points[1].last_three is None
  # One row lacks it: every point is its last evaluation, and the plot
  # says so and why.
  fig = plot.frontier_figure(points, metric='test_accuracy')
  ax = fig.axes[0]
  assert ax.get_ylabel() == 'test accuracy (%), at the last evaluation'
  footnote = fig.texts[-1].get_text()
  assert 'committed for 1 of 2 runs' in footnote
  assert 'Not the best round' in footnote
  plot.plt.close(fig)
  # Both rows have it (b from its table column): the mean of the last 3.
  rows['b'][plot.LAST_THREE_COLUMN] = 0.41
  points = plot.frontier_points_from_results(
    _store(tmp_path, rows), metric='test_accuracy'
  )
  fig = plot.frontier_figure(points, metric='test_accuracy')
  assert fig.axes[0].get_ylabel() == (
    'test accuracy (%), mean of the last 3 evaluations'
  )
  groups = plot.frontier_groups(points, 'last_three')
  assert [g.mean for g in groups] == pytest.approx([0.5667, 0.41], abs=1e-4)
  plot.plt.close(fig)
  # A kept folder whose last evaluation is not the row's final: refused.
  rows['a']['final test metric'] = 0.3
  with pytest.raises(ValueError, match='the row says 0.3'):
    plot.frontier_points_from_results(
      _store(tmp_path, rows), metric='test_accuracy'
    )


def test_pareto_front_keeps_only_undominated_points():
  # Upload (KB) and metric of five configurations: (2, 0.4) is beaten by
  # (1, 0.5) (less upload, higher metric), (4, 0.6) by (2, 0.7); (2, 0.7)
  # and (8, 0.9) each need their upload for their metric.
  xs = [1, 2, 2, 4, 8]
  ys = [0.5, 0.4, 0.7, 0.6, 0.9]
  assert plot.pareto_front(xs, ys) == [0, 2, 4]
  # Equal points: the first; a higher upload for the same metric: beaten.
  assert plot.pareto_front([1, 1, 3], [0.5, 0.5, 0.5]) == [0]
  assert plot.pareto_front([], []) == []


def test_frontier_draws_the_front_ceiling_and_title(tmp_path):
  points = plot.frontier_points_from_results(_store(tmp_path, _STUDY))
  fig = plot.frontier_figure(
    points, 'Task: 30 rounds', paper_words='Table I, 180 rounds'
  )
  ax = fig.axes[0]
  title = fig._suptitle.get_text()  # pylint: disable=protected-access
  assert title.startswith('Task: 30 rounds\n')
  # Epsilon, its accountant, delta and the sampling rate.
  assert 'ε = 1.00 (RDP accountant; PLD: 0.8)' in title
  assert 'δ = 1e-4' in title and 'Poisson q = 1/60' in title
  assert ax.get_xscale() == 'log'
  assert 'KB' in ax.get_xlabel() and '(%)' in ax.get_ylabel()
  # The front: FL-TOP-DP (5 KB, 64%), CMP-Fed rank 16 (300 KB, 62%) is
  # beaten by it, DP-FedAvg's mean 65% (6000 KB) is not; flat after it.
  (front,) = (
    line for line in ax.get_lines() if line.get_drawstyle() == 'steps-post'
  )
  assert list(front.get_ydata()) == pytest.approx([64, 65, 65])
  # The ceiling: a dashed line at FedAvg's 80%.
  dashed = [l for l in ax.get_lines() if l.get_linestyle() == '--']
  assert [l.get_ydata()[0] for l in dashed] == pytest.approx([80])
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert 'non-private FedAvg (ceiling): 80.0' in legend
  assert 'bar: min–max over 3 seeds (no bar: 1 seed)' in legend
  plot.plt.close(fig)
  # Without a FedAvg row the plot says there is none.
  no_fedavg = [p for p in points if p.method != 'fedavg']
  fig = plot.frontier_figure(no_fedavg, paper_words='Table I')
  legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
  assert 'no non-private run: no ceiling' in legend
  plot.plt.close(fig)


def _hollow(ax):
  return [
    line
    for line in ax.get_lines()
    if line.get_markerfacecolor() == 'none' and len(line.get_xdata()) == 1
  ]


def test_paper_numbers_are_hollow_and_only_where_the_rows_have_them(
  tmp_path,
):
  points = plot.frontier_points_from_results(_store(tmp_path, _STUDY))
  fig = plot.frontier_figure(points, paper_words='Table I, 180 rounds')
  ax = fig.axes[0]
  # DP-FedAvg (once for its 3 seeds), CMP-Fed rank 1 and FedAvg.
  hollow = _hollow(ax)
  assert sorted(l.get_ydata()[0] for l in hollow) == pytest.approx([69, 78, 86])
  for line in hollow:
    (x,) = line.get_xdata()
    # At its configuration's point, in its method's marker and colour.
    (filled,) = (
      l
      for l in ax.get_lines()
      if l not in hollow
      and list(l.get_xdata()) == [x]
      and l.get_marker() not in ('None', '', '_')
    )
    assert line.get_marker() == filled.get_marker()
    assert line.get_markeredgecolor() == filled.get_color()
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert "hollow: the paper's number for the same method" in legend
  assert 'Table I, 180 rounds' in fig.texts[-1].get_text()
  plot.plt.close(fig)
  with pytest.raises(ValueError, match='say which table and rounds'):
    plot.frontier_figure(points)
  # No paper numbers: nothing hollow, no paper entry.
  bare = [dataclasses.replace(p, paper=None) for p in points]
  fig = plot.frontier_figure(bare)
  assert not _hollow(fig.axes[0])
  legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
  assert not [t for t in legend if 'paper' in t]
  assert 'paper' not in fig.texts[-1].get_text().lower()
  plot.plt.close(fig)


def _marker_of(fig, colour):
  return {
    (l.get_color(), l.get_marker())
    for l in fig.axes[0].get_lines()
    if l.get_color() == colour and l.get_marker() not in ('None', '', '_')
  }


def test_a_method_keeps_its_colour_and_marker_in_every_plot(tmp_path):
  dp = plot.METHOD_STYLES['dp_fedavg']
  first = plot.frontier_points_from_results(
    _store(tmp_path, _STUDY), ['dp', 'top', 'fedavg']
  )
  second = plot.frontier_points_from_results(
    _store(tmp_path, _STUDY), ['cmp_r1', 'cmp_r16', 'dp']
  )
  figs = [plot.frontier_figure(p, paper_words='T') for p in (first, second)]
  for fig in figs:
    # Drawn in the table's colour and marker, whatever else is on the plot.
    assert _marker_of(fig, dp.color) == {(dp.color, dp.marker)}
    plot.plt.close(fig)
  # Every registered method, and each correlated-noise variant, has its
  # own (colour, marker).
  from tff_dp import methods  # pylint: disable=g-import-not-at-top

  correlated = {n for n, m in methods.METHODS.items() if m.correlated_noise}
  assert correlated == set(plot.CORRELATED_NOISE_METHODS)
  keys = set(methods.METHODS) | {
    f'{name}+{noise}' for name in correlated for noise in ('banded', 'blt')
  }
  assert keys == set(plot.METHOD_STYLES)
  pairs = [(s.color, s.marker) for s in plot.METHOD_STYLES.values()]
  assert len(set(pairs)) == len(pairs)
  assert plot.method_key({'method': 'dp_fedavg', 'noise': 'banded'}) == (
    'dp_fedavg+banded'
  )
  with pytest.raises(ValueError, match="No style for method 'nope'"):
    plot.method_style('nope')


def test_points_at_one_upload_are_spread_apart():
  xs = plot.dodge([10.0, 100.0, 10.0, 10.0], step=0.05)
  logs = [math.log10(x) for x in xs]
  # The three at 10 KB: 0.05 apart in log10, in order, centred on 10.
  assert [logs[0], logs[2], logs[3]] == pytest.approx([0.95, 1.0, 1.05])
  assert xs[1] == 100.0
  assert plot.upload_clusters([10.0, 100.0, 10.0, 10.0]) == [[0, 2, 3], [1]]


def test_ddgauss_under_poisson_is_marked_and_left_off_the_front(tmp_path):
  rows = {
    'dp': _row('dp_fedavg', 'DP-FedAvg', 4826.0, 0.59, 6.0),
    'ddg': _row('ddgauss', 'DDGauss', 3016.0, 0.60, 6.0, pld=5.0),
  }
  points = plot.frontier_points_from_results(_store(tmp_path, rows))
  assert points[1].caveat == 'Poisson: ε not rigorous'
  fig = plot.frontier_figure(points)
  ax = fig.axes[0]
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert 'DDGauss (Poisson: ε not rigorous)' in legend
  assert 'Pareto front of the private points (DDGauss left out)' in legend
  (front,) = (l for l in ax.get_lines() if l.get_drawstyle() == 'steps-post')
  assert list(front.get_ydata()) == pytest.approx([59, 59])
  # Its published PLD epsilon is left out of the title's.
  assert 'PLD: 0.8)' in fig._suptitle.get_text()  # pylint: disable=protected-access
  plot.plt.close(fig)
  # Fixed-size cohorts: no caveat.
  fixed = {'method': 'ddgauss', 'clients_per_round': '30'}
  assert plot.epsilon_caveat(fixed) == ''


def test_variant_words_say_what_differs_within_a_method(tmp_path):
  rows = {
    'r1': _row('cmp_fed', 'CMP-Fed rank 1', 20.0, 0.5, 1.0, cmp_rank=1),
    'r16': _row('cmp_fed', 'CMP-Fed rank 16', 300.0, 0.6, 1.0, cmp_rank=16),
    'c1': _row('dp_fedavg', 'DP-FedAvg', 6000.0, 0.6, 1.0, clip=1.0),
    'pub': _row(
      'dp_fedavg',
      'DP-FedAvg, S from one round on the public batch',
      6000.0,
      0.5,
      1.0,
      clip_from_public_round=True,
    ),
    'slr': _row(
      'dp_fedavg',
      'DP-FedAvg tuning: server lr 2',
      6000.0,
      0.6,
      1.0,
      server_lr=2,
    ),
    'q1': _row(
      'dp_fedavg',
      'DP-FedAvg, all clients',
      6000.0,
      0.6,
      1.0,
      client_sampling_rate=1,
    ),
  }
  points = plot.frontier_points_from_results(_store(tmp_path, rows))
  words, legend = plot.point_words(plot.frontier_groups(points))
  assert words['r1'] == 'rank 1' and words['r16'] == 'rank 16'
  assert words['c1'] == 'clip 1.0'
  # A public round replaced the clip: its words say so, not the clip.
  assert words['pub'] == 'S from a public round'
  assert words['slr'] == 'server lr 2'
  # Sampled otherwise than the plot's other rows: said beside it.
  assert words['q1'] == 'Poisson q = 1'
  assert legend == {'cmp_fed': '', 'dp_fedavg': ''}


def test_probabilities_read_as_a_reader_writes_them():
  assert plot.format_probability(0.0166667) == '1/60'
  assert plot.format_probability(0.00333333) == '1/300'
  assert plot.format_probability(1e-4) == '1e-4'
  assert plot.format_probability(1e-5) == '1e-5'
  assert plot.format_probability(0.1) == '0.1'
  assert plot.format_probability(1.0) == '1'
  assert plot.format_probability(0.0123) == '0.0123'


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


def test_run_styles_follow_the_method_table():
  styles = plot.run_styles(['lus', 'lus', 'ddgauss'])
  lus, ddg = plot.METHOD_STYLES['lus'], plot.METHOD_STYLES['ddgauss']
  assert [(s['color'], s['marker']) for s in styles] == [
    (lus.color, lus.marker),
    (lus.color, lus.marker),
    (ddg.color, ddg.marker),
  ]
  # Runs of one method differ by line style.
  assert styles[0]['linestyle'] != styles[1]['linestyle']
  with pytest.raises(ValueError, match="at most 6 runs of method 'lus'"):
    plot.run_styles(['lus'] * 7)


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
