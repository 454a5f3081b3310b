"""Plots from results folders of `python -m tff_dp.run` and from the
studies' results stores (the library behind `python -m tff_dp.plot`)."""

import csv
import dataclasses
import json
import pathlib
import math
import re
import shlex
import textwrap
from typing import Any, Mapping, Optional, Sequence

import matplotlib

matplotlib.use('Agg')
import matplotlib.figure  # noqa: E402
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from tff_dp.client_works import diagnostics  # noqa: E402

METRICS = ('test_accuracy', 'test_balanced_accuracy', 'test_auroc')


# The run folder's subfolder of non-private outputs (`outputs.NON_PRIVATE_DIR`).
NON_PRIVATE_DIR = 'non_private'


def _read_csv(path: pathlib.Path) -> list[dict[str, float]]:
  with open(path, newline='') as f:
    out = []
    for r in csv.DictReader(f):
      row = {}
      for k, v in r.items():
        try:
          row[k] = float(v)
        except (TypeError, ValueError):
          pass
      out.append(row)
  return out


def read_rows(run_dir: pathlib.Path) -> list[dict[str, float]]:
  """The numeric cells of a run's `metrics.csv`, a dict per round, with its
  `non_private/metrics.csv` columns merged in by round where it has one."""
  rows = _read_csv(run_dir / 'metrics.csv')
  extra = run_dir / NON_PRIVATE_DIR / 'metrics.csv'
  if extra.exists():
    by_round = {r['round']: r for r in _read_csv(extra)}
    rows = [{**by_round.get(r['round'], {}), **r} for r in rows]
  return rows


def pick_metric(rows: Sequence[dict]) -> str:
  for m in METRICS:
    if any(m in r for r in rows):
      return m
  raise ValueError(
    'No test metric in metrics.csv (evaluate with --eval_every; a task '
    'whose test examples belong to clients writes them only to '
    'non_private/, with --release_non_private_metrics).'
  )


def _series(rows, x_key, metric):
  pts = [(r[x_key], r[metric]) for r in rows if x_key in r and metric in r]
  return [p[0] for p in pts], [p[1] for p in pts]


# Runs of one method on one plot share its colour and marker; these tell
# them apart.
_LINESTYLES = ('-', '--', ':', '-.', (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))


def run_flags(run_dir: pathlib.Path) -> dict[str, Any]:
  """A run's settings by flag name (`summary.json`'s config), with its
  sampling mode's fixed cohort size where it had one."""
  summary = json.loads((pathlib.Path(run_dir) / 'summary.json').read_text())
  flags = dict(summary.get('config', {}))
  sampling = summary.get('sampling', {})
  if sampling.get('mode') == 'fixed':
    flags['clients_per_round'] = sampling.get('clients_per_round')
  return flags


def run_styles(methods: Sequence[str]) -> list[dict[str, Any]]:
  """A (colour, marker, line style) for each run of a plot, from its
  method (a `METHOD_STYLES` key): the method's colour and marker, and
  the n-th run of a method the n-th line style.

  Raises:
    ValueError: If a method has no style, or more runs than line styles.
  """
  seen: dict[str, int] = {}
  out = []
  for m in methods:
    style = method_style(m)
    n = seen.get(m, 0)
    if n >= len(_LINESTYLES):
      raise ValueError(
        f'can draw at most {len(_LINESTYLES)} runs of method {m!r} on one '
        f'plot, got more'
      )
    seen[m] = n + 1
    out.append(
      {
        'color': style.color,
        'marker': style.marker,
        'linestyle': _LINESTYLES[n],
      }
    )
  return out


def plot_runs(
  run_dirs: Sequence[pathlib.Path],
  output_dir: pathlib.Path,
  labels: Optional[Sequence[str]] = None,
) -> list[pathlib.Path]:
  """The three comparison plots; returns the files written.

  Each run is drawn in its method's colour and marker (`METHOD_STYLES`);
  a DDGauss run under Poisson sampling says in the legend that its
  epsilon is not rigorous (`epsilon_caveat`).
  """
  output_dir.mkdir(parents=True, exist_ok=True)
  runs = [(d, read_rows(d)) for d in run_dirs]
  names = list(labels or [d.name for d in run_dirs])
  flags = [run_flags(d) for d in run_dirs]
  labels = [
    f'{n} ({epsilon_caveat(f)})' if epsilon_caveat(f) else n
    for n, f in zip(names, flags)
  ]
  metric = pick_metric(runs[0][1])
  scale = _scale(metric)
  styles = run_styles([method_key(f) for f in flags])
  written = []
  for x_key, name, xlabel in (
    ('round', 'round', 'round'),
    ('epsilon_rdp', 'epsilon', 'ε spent so far (RDP accountant)'),
    ('bytes_up_total', 'bytes_up', 'bytes uploaded so far, all clients'),
  ):
    # The legend goes right of the axes, so it never hides a curve.
    fig, ax = plt.subplots(figsize=(8.5, 4))
    drawn = 0
    for (_, rows), label, style in zip(runs, labels, styles):
      x, y = _series(rows, x_key, metric)
      if x:
        ax.plot(x, [v * scale for v in y], label=label, markersize=3, **style)
        drawn += 1
    if not drawn:
      plt.close(fig)
      continue
    if x_key == 'bytes_up_total':
      ax.set_xscale('log')
    ax.set_xlabel(xlabel)
    ax.set_ylabel(metric_axis_label(metric))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0))
    path = output_dir / f'{metric}_vs_{name}.png'
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
  for d, name in zip(run_dirs, names):
    path = plot_norm_angle(d, output_dir / f'update_norm_angle_{name}.png')
    if path is not None:
      written.append(path)
  return written


class ShortLogFormatter(matplotlib.ticker.LogFormatter):
  """Log-axis tick labels as short plain numbers: '0.9', '1', '1.2'.

  It labels the ticks matplotlib's `LogFormatter` labels (which minor
  ticks, by how many decades are in view: `short_log_ticks`), but as
  '%.2g': the default math text '1.1 x 10^0' on each minor tick overlaps
  its neighbours.
  """

  def __call__(self, x, pos=None):
    return f'{x:.2g}' if super().__call__(x, pos) else ''


# Decades in view up to which minor ticks are labelled: all of them up
# to 0.4 (matplotlib's default), matplotlib's subset (1, 2, 3, 4 and 6
# in each decade) up to 1.4, none above. Matplotlib's own limit for the
# subset, 1 decade, left a panel spanning 0.1 to 1.75 (update norms of a
# Cheng et al. 2022 run) with the one label '1'; above about 1.5 decades
# the subset's '0.03' and '0.04' touch on a half-width panel, while two
# decade labels are then in view or nearly so.
_MINOR_LABEL_DECADES = (1.4, 0.4)


def short_log_ticks(axis) -> None:
  """Short labels on the major and minor ticks of a log-scale axis."""
  axis.set_major_formatter(ShortLogFormatter())
  axis.set_minor_formatter(
    ShortLogFormatter(
      labelOnlyBase=False, minor_thresholds=_MINOR_LABEL_DECADES
    )
  )


def plot_norm_angle(
  run_dir: pathlib.Path, path: pathlib.Path, round_num: Optional[int] = None
) -> Optional[pathlib.Path]:
  """Norm x cosine cells of one round, and norm quantiles per round."""
  diag = run_dir / NON_PRIVATE_DIR / 'diagnostics.jsonl'
  if not diag.exists():  # A run from before non_private/ existed.
    diag = run_dir / 'diagnostics.jsonl'
  if not diag.exists():
    return None
  lines = [json.loads(l) for l in diag.read_text().splitlines() if l]
  with_angles = [l for l in lines if l.get('joint_hist')]
  if round_num is not None:
    with_angles = [l for l in with_angles if l['round'] == round_num]
  rows = read_rows(run_dir)
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  if with_angles:
    line = with_angles[-1]
    norm_mid = np.sqrt(diagnostics.EDGES[:-1] * diagnostics.EDGES[1:])
    xs, ys, ss = [], [], []
    for key, count in line['joint_hist'].items():
      i, j = (int(v) for v in key.split(','))
      # Bucket i holds [EDGES[i-1], EDGES[i]); cosine bucket j is 0.1 wide.
      xs.append(norm_mid[min(max(i - 1, 0), len(norm_mid) - 1)])
      ys.append(-1 + (j + 0.5) * 2 / diagnostics.ANGLE_BUCKETS)
      ss.append(count)
    left.scatter(xs, ys, s=20 * np.asarray(ss), alpha=0.6)
    left.set_xscale('log')
    short_log_ticks(left.xaxis)
    left.set_ylim(-1.05, 1.05)
    left.set_title(f'round {line["round"]}: clients by update norm and angle')
  else:
    left.set_title('no angles recorded')
  left.set_xlabel('client update L2 norm')
  left.set_ylabel('cosine to the last global update')
  for q in ('q10', 'q50', 'q90'):
    x, y = _series(rows, 'round', f'update_norm_{q}')
    if x:
      right.plot(x, y, label=q)
  x, y = _series(rows, 'round', 'clip')
  if x:
    right.plot(x, y, 'k--', label='clip')
  right.set_yscale('log')
  short_log_ticks(right.yaxis)
  right.set_xlabel('round')
  right.set_ylabel('pre-clip update norm')
  right.legend(fontsize=8)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


@dataclasses.dataclass(frozen=True)
class MethodStyle:
  """How one method is drawn in every plot: its legend name, colour and
  marker (filled for our runs, hollow for a paper's number)."""

  name: str
  color: str
  marker: str


# One entry per method (the `--method` flag), fixed across every plot, so
# a method never changes colour between plots. Colours: the Okabe-Ito set
# and a few more, chosen so that the methods of one study differ in colour
# as well as in marker, and that no two methods that take correlated noise
# share a colour.
_K, _BLUE, _SKY, _GREEN = '#000000', '#0072B2', '#56B4E9', '#009E73'
_ORANGE, _VERMILION, _PINK = '#E69F00', '#D55E00', '#CC79A7'
_PURPLE, _BROWN, _CYAN, _OLIVE = '#9467bd', '#8c564b', '#17becf', '#bcbd22'
_GREY, _NAVY, _WINE = '#7f7f7f', '#332288', '#882255'
METHOD_STYLES: dict[str, MethodStyle] = {
  'fedavg': MethodStyle('FedAvg (no DP)', _K, 's'),
  'dp_fedavg': MethodStyle('DP-FedAvg', _BLUE, 'o'),
  'dp_fedavg_adaptive': MethodStyle('DP-FedAvg, adaptive clip', _SKY, 'o'),
  'ddgauss': MethodStyle('DDGauss', _PINK, 'D'),
  'dp_randagg': MethodStyle('DP-RandAgg', _VERMILION, 'v'),
  'cmp_fed': MethodStyle('CMP-Fed', _GREEN, '^'),
  'uv_fed': MethodStyle('UV-Fed (no DP)', _BROWN, '<'),
  'blur': MethodStyle('DP-FedAvg + BLUR', _CYAN, 'p'),
  'lus': MethodStyle('DP-FedAvg + LUS', _ORANGE, 'X'),
  'blur_lus': MethodStyle('DP-FedAvg + BLUR + LUS', _PURPLE, 'P'),
  'fl_top': MethodStyle('FL-TOP (no DP)', _ORANGE, '>'),
  'fl_top_dp': MethodStyle('FL-TOP-DP', _WINE, '^'),
  'fl_basic': MethodStyle('FL-BASIC (no DP)', _OLIVE, '<'),
  'fl_basic_dp': MethodStyle('FL-BASIC-DP', _NAVY, 'v'),
  'fetchsgd': MethodStyle('FetchSGD (no DP)', _GREY, 'd'),
  'dpsfl': MethodStyle('DPSFL', _BROWN, 'd'),
  'dpsfl_ac': MethodStyle('DPSFL-AC', _PINK, '*'),
  'model_clip': MethodStyle('model clipping (no DP)', _BROWN, 'p'),
  'ce_fedavg': MethodStyle('CE-FedAvg (no DP)', _OLIVE, 'X'),
}
# The methods that take `--noise=banded|blt` (`Method.correlated_noise`).
# Each variant, '<method>+<noise>', keeps its method's colour (DP-FedAvg's
# turn sky blue), with a hexagon for banded MF noise and a turned one for
# BLT.
CORRELATED_NOISE_METHODS = (
  'dp_fedavg',
  'dp_randagg',
  'blur',
  'lus',
  'blur_lus',
  'fl_top_dp',
  'fl_basic_dp',
  'dpsfl',
  'dpsfl_ac',
  'cmp_fed',
)
_NOISE_STYLES = {'banded': ('banded MF noise', 'h'), 'blt': ('BLT noise', 'H')}
METHOD_STYLES.update(
  {
    f'{m}+{noise}': MethodStyle(
      f'{METHOD_STYLES[m].name}, {words}',
      # DP-FedAvg's variants sit beside it at its upload: a lighter blue
      # tells them apart at a glance.
      _SKY if m == 'dp_fedavg' else METHOD_STYLES[m].color,
      marker,
    )
    for m in CORRELATED_NOISE_METHODS
    for noise, (words, marker) in _NOISE_STYLES.items()
  }
)
# The method whose rows draw the non-private ceiling.
CEILING_METHOD = 'fedavg'


def method_key(flags: Mapping[str, Any]) -> str:
  """The `METHOD_STYLES` key of a run from its flags (`--method`, and
  `--noise` when it is not 'iid')."""
  method = str(flags.get('method') or '')
  noise = str(flags.get('noise') or 'iid')
  return method if noise == 'iid' else f'{method}+{noise}'


def method_style(key: str) -> MethodStyle:
  """`METHOD_STYLES[key]`.

  Raises:
    ValueError: If the method has no entry (add one: a method's colour and
      marker must be the same in every plot).
  """
  if key not in METHOD_STYLES:
    raise ValueError(
      f'No style for method {key!r} in tff_dp.reporting.plot.METHOD_STYLES; '
      f'it has {sorted(METHOD_STYLES)}.'
    )
  return METHOD_STYLES[key]


# A metric's axis words, unit and the factor from its stored value.
_METRIC_AXES = {
  'test_accuracy': ('test accuracy', '%', 100.0),
  'test_balanced_accuracy': ('test balanced accuracy', '%', 100.0),
  'test_auroc': ('test AUROC', '0.5 = chance, 1 = perfect', 1.0),
}


def metric_axis_label(metric: str) -> str:
  """'test accuracy (%)': the metric named with its unit."""
  words, unit, _ = _METRIC_AXES[metric]
  return f'{words} ({unit})'


def _scale(metric: str) -> float:
  return _METRIC_AXES[metric][2]


def command_flags(command: str) -> dict[str, str]:
  """`--name=value` pairs of a recorded `python -m tff_dp.run ...`
  command, as strings (a bare `--name` is 'True')."""
  out = {}
  for arg in shlex.split(command or ''):
    if arg.startswith('--'):
      name, eq, value = arg[2:].partition('=')
      out[name] = value if eq else 'True'
  return out


def _number(value: Any) -> Optional[float]:
  """A finite float, or None for '', None, NaN and non-numbers."""
  if isinstance(value, bool):
    return None
  try:
    v = float(value)
  except (TypeError, ValueError):
    return None
  return v if math.isfinite(v) else None


def format_probability(p: float) -> str:
  """A rate or delta as a reader writes it: '0.1', '1/60', '1e-4'."""
  n = round(1 / p) if p > 0 else 0
  exact = n > 0 and abs(n * p - 1) < 1e-4
  power_of_ten = exact and n > 1 and 10 ** round(math.log10(n)) == n
  if p >= 0.05 or (power_of_ten and p >= 0.01) or not exact or n == 1:
    return f'{p:.3g}'
  if power_of_ten:
    return f'1e-{round(math.log10(n))}'
  return f'1/{n}'


def sampling_words(flags: Mapping[str, Any]) -> str:
  """How a run sampled its clients each round, from its flags."""
  participation = str(flags.get('participation') or 'independent')
  per_round = _number(flags.get('clients_per_round'))
  rate = _number(flags.get('client_sampling_rate'))
  # Balanced groups: the epsilon holds for zero-out neighbouring only.
  zero_out = (
    ', zero-out' if flags.get('participation_partition') == 'balanced' else ''
  )
  if participation == 'cyclic_poisson':
    return f'cyclic Poisson{zero_out}, q = {format_probability(rate)}'
  if participation == 'cyclic':
    return f'cyclic (min-separation{zero_out}), q = {format_probability(rate)}'
  if per_round:
    return f'fixed cohorts of {per_round:g}'
  if rate is None:
    return 'sampling not recorded'
  return f'Poisson q = {format_probability(rate)}'


# A row whose table (or summary) says its epsilon is not a rigorous
# guarantee, for a reason the flags do not show.
_TABLE_CAVEAT = 'ε not rigorous: see its guarantee caveat'


def epsilon_caveat(flags: Mapping[str, Any]) -> str:
  """Why a private run's epsilon is not comparable with the others', or ''.

  DDGauss under Poisson sampling: its round reveals the cohort's count,
  which the subsampling bound assumes hidden (`privacy.assumptions`;
  benchmarks/results/ddgauss_reaccounting.md), so its epsilon is not
  rigorous.
  """
  if flags.get('method') == 'ddgauss' and sampling_words(flags).startswith(
    'Poisson'
  ):
    return 'Poisson: ε not rigorous'
  return ''


@dataclasses.dataclass(frozen=True)
class FrontierPoint:
  """One run (or results row) on the metric-upload plane.

  `final` is the test metric at the run's last evaluation; `last_three`
  the mean of its last three evaluations where they are known (a kept
  run folder, or a results row that records them), else None. `best`
  (over rounds, picked on the test set) is kept for tables only.
  """

  group: str  # Runs of one group differ only by seed.
  label: str
  kb_up_per_round: float
  final: float
  epsilon: Optional[float]  # RDP; None for a non-private run.
  paper: Optional[float] = None
  method: str = 'dp_fedavg'  # A METHOD_STYLES key.
  flags: Mapping[str, str] = dataclasses.field(default_factory=dict)
  last_three: Optional[float] = None
  epsilon_pld: Optional[float] = None
  best: Optional[float] = None
  rounds: Optional[int] = None
  # Why its epsilon is not comparable (`epsilon_caveat`), or ''.
  caveat: str = ''


_SEED_SUFFIX = re.compile(r'_seed\d+$')
_SEED_LABEL = re.compile(r', seed \d+$')
# A results row's column with the mean of its last three evaluations
# (rows that record it; older rows have only best and final).
LAST_THREE_COLUMN = 'mean of last 3 test metrics'


def last_evaluations_mean(
  run_dir: pathlib.Path, metric: str, n: int = 3
) -> Optional[float]:
  """The mean of `metric` over a run's last `n` evaluated rounds, or None
  if the run folder has no metrics.csv or fewer than `n` evaluations."""
  if not (pathlib.Path(run_dir) / 'metrics.csv').exists():
    return None
  values = [r[metric] for r in read_rows(pathlib.Path(run_dir)) if metric in r]
  if len(values) < n:
    return None
  return float(np.mean(values[-n:]))


def frontier_points_from_results(
  path: pathlib.Path,
  rows: Optional[Sequence[str]] = None,
  metric: Optional[str] = None,
  runs_dir: Optional[pathlib.Path] = None,
) -> list[FrontierPoint]:
  """Points from a study's results store (`benchmarks/results/<study>.json`).

  Args:
    path: The results store.
    rows: Its rows to read, in order (default: all).
    metric: The study's test metric (a `metrics.csv` column), needed to
      read the last three evaluations from kept run folders.
    runs_dir: Where the study's finished rows keep their run files
      (`<runs_dir>/<row>/metrics.csv`; default: `runs/<study>` beside the
      store). A row's last-three mean comes from its `LAST_THREE_COLUMN`,
      else from its kept folder, else is None.

  Raises:
    ValueError: If a row is not in the store, or a kept folder's last
      evaluation differs from the row's final test metric (another metric
      or another run).
  """
  path = pathlib.Path(path)
  table = json.loads(path.read_text())
  names = list(rows) if rows else list(table)
  unknown = [n for n in names if n not in table]
  if unknown:
    raise ValueError(
      f'rows {unknown} are not in {path}; it has {sorted(table)}'
    )
  if runs_dir is None:
    runs_dir = path.parent / 'runs' / path.stem
  points = []
  for name in names:
    r = table[name]
    flags = command_flags(r.get('command', ''))
    final = float(r['final test metric'])
    last_three = _number(r.get(LAST_THREE_COLUMN))
    if last_three is None and metric:
      kept = pathlib.Path(runs_dir) / name
      last_three = last_evaluations_mean(kept, metric)
      if last_three is not None:
        last = last_evaluations_mean(kept, metric, n=1)
        if abs(last - final) > 1e-6:
          raise ValueError(
            f'{kept}: its last {metric} is {last:.6g}, the row says '
            f'{final:.6g}: not the row run, or not the study metric'
          )
    rounds = _number(flags.get('rounds'))
    points.append(
      FrontierPoint(
        group=_SEED_SUFFIX.sub('', name),
        label=_SEED_LABEL.sub('', r.get('method') or name),
        kb_up_per_round=float(r['KB up / client / round']),
        final=final,
        epsilon=_number(r.get('epsilon RDP')),
        paper=_number(r.get('paper')),
        method=method_key(flags),
        flags=flags,
        last_three=last_three,
        epsilon_pld=_number(r.get('epsilon PLD')),
        best=_number(r.get('best test metric')),
        rounds=int(rounds) if rounds else None,
        caveat=epsilon_caveat(flags)
        or (_TABLE_CAVEAT if r.get('guarantee caveat') else ''),
      )
    )
  return points


def frontier_points_from_runs(
  run_dirs: Sequence[pathlib.Path], labels: Optional[Sequence[str]] = None
) -> list[FrontierPoint]:
  """Points from results folders of `python -m tff_dp.run` (runs with one
  label are one group)."""
  points = []
  for i, d in enumerate(run_dirs):
    d = pathlib.Path(d)
    summary = json.loads((d / 'summary.json').read_text())
    config = summary.get('config', {})
    rows = read_rows(d)
    metric = pick_metric(rows)
    values = [r[metric] for r in rows if metric in r]
    label = labels[i] if labels else _SEED_SUFFIX.sub('', d.name)
    sampling = summary.get('sampling', {})
    flags = {
      k: str(v)
      for k, v in config.items()
      if v is not None and not isinstance(v, (dict, list))
    }
    # The sampling the run used, in its flags' words.
    if sampling.get('mode') == 'fixed':
      flags['clients_per_round'] = str(sampling.get('clients_per_round'))
    if summary.get('delta') is not None:
      flags['delta'] = str(summary['delta'])
    points.append(
      FrontierPoint(
        group=label,
        label=label,
        kb_up_per_round=summary['bytes_per_client_per_round']['up'] / 1000,
        final=values[-1],
        epsilon=_number(summary.get('epsilon_rdp')),
        method=method_key(config),
        flags=flags,
        last_three=float(np.mean(values[-3:])) if len(values) >= 3 else None,
        epsilon_pld=_number(summary.get('epsilon_pld')),
        best=max(values),
        rounds=summary.get('rounds_completed'),
        caveat=epsilon_caveat(config)
        or (
          _TABLE_CAVEAT
          if summary.get('privacy', {}).get('guarantee_caveat')
          else ''
        ),
      )
    )
  return points


@dataclasses.dataclass
class FrontierGroup:
  """The seeds of one configuration: one point, its bar their range."""

  name: str
  label: str
  method: str
  flags: Mapping[str, str]
  x: float  # KB up per client per round.
  values: list[float]  # The plotted statistic, one per seed.
  private: bool
  paper: Optional[float]
  epsilon: Optional[float]
  epsilon_pld: Optional[float]
  caveat: str = ''

  @property
  def mean(self) -> float:
    return float(np.mean(self.values))

  @property
  def min(self) -> float:
    return float(np.min(self.values))

  @property
  def max(self) -> float:
    return float(np.max(self.values))

  @property
  def seeds(self) -> int:
    return len(self.values)


def frontier_groups(
  points: Sequence[FrontierPoint], statistic: str = 'final'
) -> list[FrontierGroup]:
  """One group per configuration, in first-seen order, holding each
  seed's `statistic` ('final' or 'last_three').

  Raises:
    ValueError: If a group's points differ in upload or method (they are
      not seeds of one configuration), or a point lacks the statistic.
  """
  groups: dict[str, list[FrontierPoint]] = {}
  for p in points:
    groups.setdefault(p.group, []).append(p)
  out = []
  for name, members in groups.items():
    xs = [p.kb_up_per_round for p in members]
    if max(xs) > 1.001 * min(xs):
      raise ValueError(
        f'group {name!r} mixes uploads {min(xs):.4g} to {max(xs):.4g} KB: '
        'only seeds of one configuration share a point'
      )
    if len({p.method for p in members}) > 1:
      raise ValueError(f'group {name!r} mixes methods')
    values = [getattr(p, statistic) for p in members]
    if any(v is None for v in values):
      raise ValueError(f'group {name!r} has no {statistic} for every seed')
    first = members[0]
    out.append(
      FrontierGroup(
        name=name,
        label=first.label,
        method=first.method,
        flags=first.flags,
        x=float(np.mean(xs)),
        values=[float(v) for v in values],
        private=first.epsilon is not None,
        paper=first.paper,
        epsilon=first.epsilon,
        epsilon_pld=first.epsilon_pld,
        caveat=first.caveat,
      )
    )
  return out


def pareto_front(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
  """Indices of the points no other point beats: none uploads at most as
  much and scores at least as high, one of them strictly. In order of
  upload; of equal points, the first."""
  order = sorted(range(len(xs)), key=lambda i: (xs[i], -ys[i], i))
  front, best = [], -math.inf
  for i in order:
    if ys[i] > best:
      front.append(i)
      best = ys[i]
  return front


def upload_clusters(xs: Sequence[float], tol: float = 0.01) -> list[list[int]]:
  """Indices of the points that share an upload (within `tol` in log10 of
  the cluster's first), by upload, each cluster in index order."""
  logs = [math.log10(x) for x in xs]
  clusters: list[list[int]] = []
  for i in sorted(range(len(xs)), key=lambda i: (logs[i], i)):
    if clusters and logs[i] - logs[clusters[-1][0]] <= tol:
      clusters[-1].append(i)
    else:
      clusters.append([i])
  return [sorted(c) for c in clusters]


def dodge(xs: Sequence[float], step: float) -> list[float]:
  """Spreads points that share an upload (`upload_clusters`) about their
  mean, `step` apart in log10, in index order: each stays visible."""
  out = list(xs)
  for members in upload_clusters(xs):
    centre = np.mean([math.log10(xs[i]) for i in members])
    for k, i in enumerate(members):
      out[i] = 10 ** (centre + (k - (len(members) - 1) / 2) * step)
  return out


# Flags that tell a method's configurations apart on a plot, in words.
_FLAG_WORDS = {
  'cmp_rank': lambda v: f'rank {v}',
  'randagg_fraction': lambda v: f'k/d {100 * float(v):.2g}%',
  'lus_sparsity': lambda v: f'sparsity {v}',
  'blur_lambda': lambda v: f'λ {v}',
  'top_k_ratio': lambda v: f'r {100 * float(v):g}%',
  'clip': lambda v: f'clip {v}',
  'server_lr': lambda v: f'server lr {v}',
  'clip_from_public_round': lambda v: 'S from a public round'
  if v == 'True'
  else '',
  'top_k_nonprivate_clip': lambda v: 'K values clipped' if v == 'True' else '',
  'cmp_dense_below': lambda v: f'dense below {int(v):,} params',
  'dpsfl_bit_noise': lambda v: f'bit noise {v}',
  'dpsfl_impact_threshold': lambda v: f'γ {v}',
  'rounds': lambda v: f'{v} rounds',
}
# Flags that never tell configurations apart (seeds, paths, bookkeeping).
_NOT_A_VARIANT = frozenset(
  (
    'seed',
    'noise_seed',
    'root_output_dir',
    'output_dir',
    'eval_every',
    'release_non_private_metrics',
    'allow_noise_seed_reuse',
    'method',
    'noise',
    'clip_source',
    # The sampling: `point_words` says it where it is not the plot's.
    'client_sampling_rate',
    'clients_per_round',
    'participation',
    'participation_groups',
  )
)


def variant_words(groups: Sequence[FrontierGroup]) -> dict[str, str]:
  """Short words that tell apart the configurations of one method: the
  flags whose values differ among them, read by `_FLAG_WORDS` (a flag a
  row does not set is left out of its words; a clip is left out where a
  public round replaced it; sampling flags are `point_words`')."""
  if len(groups) < 2:
    return {g.name: '' for g in groups}
  keys = set().union(*(g.flags for g in groups)) - _NOT_A_VARIANT
  order = list(_FLAG_WORDS)
  differing = sorted(
    (k for k in keys if len({g.flags.get(k) for g in groups}) > 1),
    key=lambda k: (order.index(k) if k in order else len(order), k),
  )
  words = {}
  for g in groups:
    parts = []
    for k in differing:
      v = g.flags.get(k)
      if v is None or (
        k == 'clip' and g.flags.get('clip_from_public_round') == 'True'
      ):
        continue
      text = _FLAG_WORDS[k](v) if k in _FLAG_WORDS else f'{k} {v}'
      if text:
        parts.append(text)
    words[g.name] = ', '.join(parts)
  return words


_ROUNDS_LABEL = re.compile(r'\s*\(\d+ rounds\)')


def _common_word_prefix(labels: Sequence[str]) -> str:
  prefix = labels[0]
  for label in labels[1:]:
    while not label.startswith(prefix):
      prefix = prefix[:-1]
  # Back to a word boundary.
  cut = max(prefix.rfind(' '), prefix.rfind(','), prefix.rfind(':'))
  return prefix if prefix in labels else prefix[: cut + 1]


def _shorten(text: str, n: int = 56) -> str:
  return text if len(text) <= n else text[: n - 1].rstrip(' ,') + '…'


def _range_words(values: Sequence[float], digits: int = 3) -> str:
  lo, hi = min(values), max(values)
  if hi <= lo * 1.005:
    return f'{lo:.{digits}g}'
  return f'{lo:.{digits}g}–{hi:.{digits}g}'


def privacy_words(groups: Sequence[FrontierGroup]) -> str:
  """The title's privacy line: epsilon and its accountant (with the PLD
  reading), delta and the sampling, over the private groups.

  Raises:
    ValueError: If the private groups' RDP epsilons differ by more than
      1% (a frontier compares methods at one epsilon).
  """
  private = [g for g in groups if g.private]
  if not private:
    return f'no DP, {_common_sampling(groups)}'
  eps = sorted(g.epsilon for g in private)
  if eps[-1] > 1.01 * eps[0]:
    raise ValueError(
      f'the private points have epsilons {eps[0]:.4g} to {eps[-1]:.4g}: a '
      'frontier compares methods at one epsilon (within 1%)'
    )
  accountants = sorted(
    {str(g.flags.get('accountant') or 'rdp').upper() for g in private}
  )
  pld = [
    g.epsilon_pld for g in private if g.epsilon_pld is not None and not g.caveat
  ]
  pld_words = f'; PLD: {_range_words(pld, 2)}' if pld else ''
  deltas = sorted({_number(g.flags.get('delta')) for g in private} - {None})
  delta_words = (
    'δ = ' + ', '.join(format_probability(d) for d in deltas)
    if deltas
    else 'δ not recorded'
  )
  return (
    f'ε = {eps[0]:.2f} ({"/".join(accountants)} accountant{pld_words}), '
    f'{delta_words}, {_common_sampling(groups)}'
  )


def _majority_sampling(groups: Sequence[FrontierGroup]) -> tuple[str, bool]:
  """The sampling words most groups share, and whether all share them."""
  words = [sampling_words(g.flags) for g in groups]
  common = max(words, key=words.count)
  return common, words.count(common) == len(words)


def _common_sampling(groups: Sequence[FrontierGroup]) -> str:
  common, everyone = _majority_sampling(groups)
  return common if everyone else f'{common} (other rows as labelled)'


def point_words(
  groups: Sequence[FrontierGroup],
) -> tuple[dict[str, str], dict[str, str]]:
  """What the plot writes beside each point, and after each method's name
  in the legend.

  Beside a point: its `variant_words`, and its sampling where that is not
  the plot's; a configuration whose words are still empty or another's
  gets its row label less the part its method's labels share. In the
  legend: a sampling all of a method's configurations share that is not
  the plot's, and the method's epsilon caveat.
  """
  common, _ = _majority_sampling(groups)
  methods = list(dict.fromkeys(g.method for g in groups))
  words, legend = {}, {}
  for m in methods:
    members = [g for g in groups if g.method == m]
    own = variant_words(members)
    extra = [
      '' if sampling_words(g.flags) == common else sampling_words(g.flags)
      for g in members
    ]
    in_legend = []
    if extra[0] and all(e == extra[0] for e in extra):
      in_legend.append(extra[0])
    else:
      for g, e in zip(members, extra):
        own[g.name] = ', '.join(filter(None, [own[g.name], e]))
    if len(members) > 1:
      texts = list(own.values())
      prefix = _common_word_prefix([g.label for g in members])
      for g in members:
        if not own[g.name] or texts.count(own[g.name]) > 1:
          own[g.name] = _label_rest(g.label, prefix) or own[g.name]
    words.update(own)
    if members[0].caveat:
      in_legend.append(members[0].caveat)
    legend[m] = ', '.join(in_legend)
  return words, legend


def _label_rest(label: str, prefix: str) -> str:
  """A row label less `prefix` and its round count, shortened."""
  rest = _ROUNDS_LABEL.sub('', label[len(prefix) :]).strip(' ,:')
  if rest.startswith('(') and rest.endswith(')'):
    rest = rest[1:-1]
  return _shorten(rest)


def _statistic(points: Sequence[FrontierPoint]) -> tuple[str, str, str]:
  """('last_three' or 'final', the y axis's words, the footnote's)."""
  have = sum(p.last_three is not None for p in points)
  rounds = sorted({p.rounds for p in points if p.rounds})
  at = f' (round {rounds[0]})' if len(rounds) == 1 else ''
  if have == len(points):
    return (
      'last_three',
      'mean of the last 3 evaluations',
      'y: the mean of the last 3 evaluations of each run'
      f'{at and " up to" + at}, averaged over seeds.',
    )
  return (
    'final',
    'at the last evaluation',
    f'y: the test metric at the last evaluation{at}, averaged over seeds '
    f'(the mean of the last 3 needs per-round files, committed for {have} '
    f'of {len(points)} runs here, so no point uses it). Not the best round.',
  )


def frontier_figure(
  points: Sequence[FrontierPoint],
  title: str = '',
  metric: str = 'test_accuracy',
  paper_words: str = '',
  note: str = '',
) -> matplotlib.figure.Figure:
  """The metric-upload frontier, as a figure (`plot_frontier` saves it).

  One point per configuration (its seeds' mean, a bar over their min-max),
  in its method's `METHOD_STYLES` colour and marker, against the upload
  per participating client per round (log axis); configurations at one
  upload are spread sideways (`dodge`) over a grey band at their upload.
  The y value is the mean of each run's last 3 evaluations when every
  point has it, else every point's last evaluation (the footnote says
  which); never the best round, which was picked on the test set. A
  method's configurations are labelled by what differs (`point_words`).
  The paper's number is a hollow marker at its configuration, only where
  the row has one (once per method, value and upload), described by
  `paper_words` (its table and rounds). A dashed line is the non-private
  FedAvg rows' ceiling, or the legend says there is no non-private run. A
  grey step line is the Pareto front of the private configurations (those
  with a caveat on their epsilon left out). The title's second line gives
  epsilon, its accountant, delta and the sampling (`privacy_words`).

  Raises:
    ValueError: If there are no points, the private points' epsilons
      differ by more than 1%, or paper numbers are drawn without
      `paper_words`.
  """
  if not points:
    raise ValueError('no points to draw')
  statistic, y_words, y_note = _statistic(points)
  groups = frontier_groups(points, statistic)
  privacy = privacy_words(groups)
  if any(g.paper is not None for g in groups) and not paper_words:
    raise ValueError(
      'rows carry paper numbers: say which table and rounds (paper_words)'
    )
  notes = [y_note]
  if any(g.paper is not None for g in groups):
    notes.append(f"Hollow: the paper's reported number ({paper_words}).")
  if note:
    notes.append(note)
  footnote = '\n'.join(textwrap.fill(n, 160) for n in notes)

  width, height = 11.5, 6.2
  fig = plt.figure(figsize=(width, height))
  bottom = (0.75 + 0.13 * (footnote.count('\n') + 1)) / height
  ax = fig.add_axes([0.065, bottom, 0.56, 0.87 - bottom])
  xs = _frontier_x(ax, groups, width_in=0.56 * width)
  scale = _scale(metric)
  legend = _draw_points(ax, groups, xs, scale)
  legend += _draw_paper(ax, groups, xs, scale)
  legend += _draw_front(ax, groups, xs, scale)
  legend += _draw_ceiling(ax, groups, scale)
  seeds = sorted({g.seeds for g in groups if g.seeds > 1})
  if seeds:
    legend.append(
      (
        matplotlib.lines.Line2D(
          [], [], color='0.3', marker='_', markersize=12, linewidth=1.4
        ),
        f'bar: min–max over {"/".join(map(str, seeds))} seeds '
        '(no bar: 1 seed)',
      )
    )
  if any(len(c) > 1 for c in upload_clusters([g.x for g in groups])):
    legend.append(
      (
        matplotlib.lines.Line2D([], [], color='0.8', linewidth=4, alpha=0.6),
        'grey band: one upload; its points spread sideways',
      )
    )
  ax.set_xlabel('upload per participating client per round (KB, log scale)')
  ax.set_ylabel(f'{metric_axis_label(metric)}, {y_words}')
  ax.xaxis.set_major_formatter(PlainLogFormatter())
  ax.xaxis.set_minor_formatter(
    PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1.4, 0.4))
  )
  ax.grid(alpha=0.3)
  fig.suptitle((f'{title}\n' if title else '') + privacy, fontsize=10, y=0.985)
  ax.legend(
    [h for h, _ in legend],
    [n for _, n in legend],
    fontsize=7.5,
    loc='upper left',
    bbox_to_anchor=(1.02, 1.0),
    frameon=False,
  )
  fig.text(0.01, 0.015, footnote, fontsize=7, va='bottom', color='0.25')
  words, _ = point_words(groups)
  _place_labels(
    fig,
    ax,
    [
      (x, g.mean * scale, words[g.name], method_style(g.method).color)
      for g, x in zip(groups, xs)
      if words[g.name]
    ],
  )
  return fig


def plot_frontier(
  points: Sequence[FrontierPoint],
  path: pathlib.Path,
  title: str = '',
  metric: str = 'test_accuracy',
  paper_words: str = '',
  note: str = '',
) -> pathlib.Path:
  """Draws `frontier_figure(points, ...)` to `path` (PNG) and returns it."""
  fig = frontier_figure(points, title, metric, paper_words, note)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def _frontier_x(ax, groups: Sequence[FrontierGroup], width_in: float):
  """Sets the log upload axis (the data's decades, at least 0.8, padded
  for the spread) and returns each group's drawn x (`dodge`d: neighbours
  0.14 in apart), with a grey band at each shared upload."""
  logs = [math.log10(g.x) for g in groups]
  span = max(max(logs) - min(logs), 0.8)
  centre = (max(logs) + min(logs)) / 2
  clusters = upload_clusters([g.x for g in groups])
  widest = max(len(c) for c in clusters)
  step = view = 0.0
  for _ in range(4):  # Converges: the spread is small against the span.
    view = span + 2 * (0.1 * span + (widest - 1) / 2 * step)
    step = 0.14 / width_in * view
  ax.set_xscale('log')
  ax.set_xlim(10 ** (centre - view / 2), 10 ** (centre + view / 2))
  for members in clusters:
    if len(members) > 1:
      x = 10 ** np.mean([logs[i] for i in members])
      ax.axvline(x, color='0.8', linewidth=4, zorder=0, alpha=0.6)
  return dodge([g.x for g in groups], step)


# Markers that look small at one size get more of it.
_MARKER_SIZE = {'*': 11.0, 'd': 9.0, 'p': 9.0, 'h': 9.0, 'H': 9.0}


def _marker_handle(style: MethodStyle, hollow: bool = False):
  return matplotlib.lines.Line2D(
    [],
    [],
    marker=style.marker,
    color=style.color,
    markerfacecolor='none' if hollow else style.color,
    markeredgecolor=style.color if hollow else 'white',
    markersize=_MARKER_SIZE.get(style.marker, 8.0),
    linestyle='none',
  )


def _draw_points(ax, groups, xs, scale) -> list[tuple[Any, str]]:
  """Each group's marker and min-max bar; a legend entry per method."""
  _, legend_words = point_words(groups)
  legend = {}
  for g, x in zip(groups, xs):
    style = method_style(g.method)
    y = g.mean * scale
    ax.plot(
      x,
      y,
      marker=style.marker,
      color=style.color,
      markersize=_MARKER_SIZE.get(style.marker, 8.0),
      markeredgecolor='white',
      markeredgewidth=0.6,
      linestyle='none',
      zorder=5,
    )
    if g.seeds > 1:
      # Caps wider than the marker (drawn over the bar): a range narrower
      # than the marker still shows.
      ax.errorbar(
        x,
        y,
        yerr=[[y - g.min * scale], [g.max * scale - y]],
        ecolor=style.color if style.color != _K else '0.35',
        elinewidth=1.4,
        capsize=6,
        capthick=1.4,
        linestyle='none',
        zorder=4,
      )
    if g.method not in legend:
      extra = legend_words[g.method]
      legend[g.method] = (
        _marker_handle(style),
        f'{style.name} ({extra})' if extra else style.name,
      )
  return list(legend.values())


def _draw_paper(ax, groups, xs, scale) -> list[tuple[Any, str]]:
  """The paper's numbers, hollow in the method's marker: once per method
  (correlated-noise variants count as their base method), value and
  upload, at the first such group."""
  drawn = set()
  for g, x in zip(groups, xs):
    base = g.method.split('+')[0]
    key = (base, g.paper, round(g.x, 3))
    if g.paper is None or key in drawn:
      continue
    drawn.add(key)
    style = method_style(base if base in METHOD_STYLES else g.method)
    ax.plot(
      x,
      g.paper * scale,
      marker=style.marker,
      markerfacecolor='none',
      markeredgecolor=style.color,
      markeredgewidth=1.3,
      markersize=_MARKER_SIZE.get(style.marker, 8.0) + 1,
      linestyle='none',
      zorder=3,
    )
  if not drawn:
    return []
  return [
    (
      _marker_handle(MethodStyle('', '0.2', 'o'), hollow=True),
      "hollow: the paper's number for the same method",
    )
  ]


def _draw_front(ax, groups, xs, scale) -> list[tuple[Any, str]]:
  """The step line through the Pareto front of the private groups whose
  epsilon carries no caveat, flat after its last point."""
  eligible = [i for i, g in enumerate(groups) if g.private and not g.caveat]
  front = [
    eligible[i]
    for i in pareto_front(
      [groups[i].x for i in eligible], [groups[i].mean for i in eligible]
    )
  ]
  if not front:
    return []
  fx = [xs[i] for i in front]
  fy = [groups[i].mean * scale for i in front]
  # Flat after the last point: the best at any larger upload.
  ax.step(
    fx + [ax.get_xlim()[1]],
    fy + [fy[-1]],
    where='post',
    color='0.45',
    linewidth=1.2,
    zorder=2,
  )
  left_out = dict.fromkeys(
    method_style(g.method).name for g in groups if g.private and g.caveat
  )
  words = 'Pareto front of the private points'
  if left_out:
    words += f' ({", ".join(left_out)} left out)'
  return [(matplotlib.lines.Line2D([], [], color='0.45', linewidth=1.2), words)]


def _draw_ceiling(ax, groups, scale) -> list[tuple[Any, str]]:
  """A dashed line at each non-private FedAvg group, or a legend line that
  says the study has none."""
  ceilings = [g for g in groups if g.method == CEILING_METHOD]
  for g in ceilings:
    ax.axhline(g.mean * scale, color=_K, linestyle='--', linewidth=1, zorder=1)
  if not ceilings:
    return [
      (
        matplotlib.lines.Line2D([], [], linestyle='none'),
        'no non-private run: no ceiling',
      )
    ]
  return [
    (
      matplotlib.lines.Line2D([], [], color=_K, linestyle='--', linewidth=1),
      'non-private FedAvg (ceiling): '
      + ', '.join(f'{g.mean * scale:.1f}' for g in ceilings),
    )
  ]


class PlainLogFormatter(matplotlib.ticker.LogFormatter):
  """Log-axis tick labels as plain numbers: '0.1', '3', '2,000', '10,000'
  (on the ticks matplotlib's `LogFormatter` labels)."""

  def __call__(self, x, pos=None):
    if not super().__call__(x, pos):
      return ''
    return f'{x:,.0f}' if x >= 1 else f'{x:.2g}'


def _place_labels(fig, ax, labels) -> None:
  """Writes each (x, y, text, colour) right of its point, then moves
  labels up or down until none overlaps another label or a marker, with a
  thin grey line back to the point from a label that moved."""
  if not labels:
    return
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  to_display = ax.transData.transform
  points_per_px = 72 / fig.dpi
  texts = [
    ax.annotate(
      text,
      (x, y),
      xytext=(6, 0),
      textcoords='offset points',
      fontsize=6.5,
      color=colour,
      va='center',
      ha='left',
      zorder=6,
      # Readable over grid and front lines.
      bbox=dict(boxstyle='square,pad=0.05', fc='white', ec='none', alpha=0.8),
    )
    for x, y, text, colour in labels
  ]
  # Left of the point where the right would cross the axes' edge.
  right_edge = ax.get_window_extent(renderer).x1
  sides = [6] * len(texts)
  for i, t in enumerate(texts):
    if t.get_window_extent(renderer).x1 > right_edge:
      sides[i] = -6
      t.set_horizontalalignment('right')
      t.xyann = (-6, 0)
  markers = []
  for line in ax.get_lines():
    if line.get_marker() in (None, 'None', '', ' '):
      continue
    for xy in line.get_xydata():
      px, py = to_display(xy)
      markers.append((px - 6, py - 6, px + 6, py + 6))
  offsets = [0.0] * len(texts)
  for _ in range(300):
    boxes = [t.get_window_extent(renderer) for t in texts]
    moved = False
    for i, b in enumerate(boxes):
      push = 0.0
      others = [(o.x0, o.y0, o.x1, o.y1) for j, o in enumerate(boxes) if j != i]
      for x0, y0, x1, y1 in others + markers:
        if b.x0 < x1 and x0 < b.x1 and b.y0 < y1 and y0 < b.y1:
          # Away from the other box's centre (ties: by position in list).
          if (b.y0 + b.y1) / 2 >= (y0 + y1) / 2:
            push += y1 - b.y0 + 1
          else:
            push -= b.y1 - y0 + 1
      if push:
        step = max(-3.0, min(3.0, push / 2))
        offsets[i] += step * points_per_px
        texts[i].xyann = (sides[i], offsets[i])
        moved = True
    if not moved:
      break
  for t, side, offset in zip(texts, sides, offsets):
    if abs(offset) > 5:
      ax.annotate(
        '',
        t.xy,
        xytext=(side, offset),
        textcoords='offset points',
        arrowprops=dict(
          arrowstyle='-', color='0.6', linewidth=0.5, shrinkA=0, shrinkB=4
        ),
        zorder=1,
      )
