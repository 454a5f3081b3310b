"""The frontier's model: the test metric against upload, one point per run.

A `FrontierPoint` is one run, read from results folders of
`python -m tff_dp.run` (`frontier_points_from_runs`) or from a study's
results store and the run files its finished rows kept
(`frontier_points_from_results`). The runs of one configuration that differ
only by seed are one `FrontierGroup` (`frontier_groups`: their mean, min and
max), and `pareto_front` picks the points no other beats.
"""

import dataclasses
import json
import pathlib
import math
import re
import shlex
from typing import Mapping, Optional, Sequence

import numpy as np

from tff_dp.reporting import run_folders
from tff_dp.reporting import styles
from tff_dp.reporting import wording


def command_flags(command: str) -> dict[str, str]:
  """`--name=value` pairs of a recorded `python -m tff_dp.run ...`
  command, as strings (a bare `--name` is 'True')."""
  out = {}
  for arg in shlex.split(command or ''):
    if arg.startswith('--'):
      name, eq, value = arg[2:].partition('=')
      out[name] = value if eq else 'True'
  return out


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
    last_three = wording.number(r.get(LAST_THREE_COLUMN))
    if last_three is None and metric:
      kept = pathlib.Path(runs_dir) / name
      last_three = run_folders.last_evaluations_mean(kept, metric)
      if last_three is not None:
        last = run_folders.last_evaluations_mean(kept, metric, n=1)
        if abs(last - final) > 1e-6:
          raise ValueError(
            f'{kept}: its last {metric} is {last:.6g}, the row says '
            f'{final:.6g}: not the row run, or not the study metric'
          )
    rounds = wording.number(flags.get('rounds'))
    points.append(
      FrontierPoint(
        group=_SEED_SUFFIX.sub('', name),
        label=_SEED_LABEL.sub('', r.get('method') or name),
        kb_up_per_round=float(r['KB up / client / round']),
        final=final,
        epsilon=wording.number(r.get('epsilon RDP')),
        paper=wording.number(r.get('paper')),
        method=styles.method_key(flags),
        flags=flags,
        last_three=last_three,
        epsilon_pld=wording.number(r.get('epsilon PLD')),
        best=wording.number(r.get('best test metric')),
        rounds=int(rounds) if rounds else None,
        caveat=wording.epsilon_caveat(flags)
        or (wording.TABLE_CAVEAT if r.get('guarantee caveat') else ''),
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
    rows = run_folders.read_rows(d)
    metric = run_folders.pick_metric(rows)
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
        epsilon=wording.number(summary.get('epsilon_rdp')),
        method=styles.method_key(config),
        flags=flags,
        last_three=float(np.mean(values[-3:])) if len(values) >= 3 else None,
        epsilon_pld=wording.number(summary.get('epsilon_pld')),
        best=max(values),
        rounds=summary.get('rounds_completed'),
        caveat=wording.epsilon_caveat(config)
        or (
          wording.TABLE_CAVEAT
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


def frontier_points_from_stores(
  paths: Sequence[pathlib.Path],
  rows: Optional[Sequence[str]] = None,
  metric: Optional[str] = None,
) -> list[FrontierPoint]:
  """`frontier_points_from_results` over several studies' stores: each row
  from the one store that holds it (all rows of every store by default).

  Raises:
    ValueError: If a row is in no store, or in more than one.
  """
  tables = [
    (pathlib.Path(p), json.loads(pathlib.Path(p).read_text())) for p in paths
  ]
  if not rows:
    return [
      point
      for path, _ in tables
      for point in frontier_points_from_results(path, None, metric)
    ]
  holders = {n: [p for p, t in tables if n in t] for n in rows}
  bad = {n: [str(p) for p in ps] for n, ps in holders.items() if len(ps) != 1}
  if bad:
    raise ValueError(
      f'Each row must be in exactly one of {[str(p) for p in paths]}; '
      f'these are in none or several: {bad}'
    )
  return [
    frontier_points_from_results(holders[n][0], [n], metric)[0] for n in rows
  ]
