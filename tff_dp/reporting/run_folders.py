"""What a results folder of `python -m tff_dp.run` holds, as the plots read
it: `metrics.csv` by round with its `non_private/metrics.csv` columns merged
in (`read_rows`), the test metric it evaluated (`pick_metric`), its flags
from `summary.json` (`run_flags`) and the mean of its last evaluations
(`last_evaluations_mean`).
"""

import csv
import json
import pathlib
from typing import Any, Optional, Sequence

import numpy as np


METRICS = ('test_accuracy', 'test_balanced_accuracy', 'test_auroc')


# The run folder's subfolder of non-private outputs
# (`tff_dp.job.metrics_log.NON_PRIVATE_DIR`).
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


def run_flags(run_dir: pathlib.Path) -> dict[str, Any]:
  """A run's settings by flag name (`summary.json`'s config), with its
  sampling mode's fixed cohort size where it had one."""
  summary = json.loads((pathlib.Path(run_dir) / 'summary.json').read_text())
  flags = dict(summary.get('config', {}))
  sampling = summary.get('sampling', {})
  if sampling.get('mode') == 'fixed':
    flags['clients_per_round'] = sampling.get('clients_per_round')
  return flags


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
