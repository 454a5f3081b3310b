"""A round's row: which of its columns the privacy ledger covers
(`PRIVATE_COLUMNS`, `split_row`; the others go to `NON_PRIVATE_DIR`), the
row flattened from TFF's measurements (`flatten`), metrics.csv
(`write_csv`, written atomically like every rewritten file here,
`atomic_write`) and the round's progress line (`progress_line`).
"""

import csv
import math
import os
import pathlib
import tempfile

import numpy as np


# What the ledger does not cover, only with --release_non_private_metrics.
NON_PRIVATE_DIR = 'non_private'  # Also `run_folders.NON_PRIVATE_DIR`.


# The columns of a round's row that the ledger covers: public settings,
# what the aggregator's DP releases determine (epsilon, the clip in force,
# adaptive clipping's included, the DP fraction clipped of
# --fraction_clipped_stddev), the bytes one client sends (a function of
# the settings, not of the cohort), and test metrics when no client holds
# the test data (post-processing of the released model).
PRIVATE_COLUMNS = (
  'round',
  'epsilon_rdp',
  'epsilon_pld',
  'noise_multiplier',
  'clip',
  # A noised estimate, charged to the round's event.
  'dp_fraction_clipped',
  'client_lr',
  'bytes_down_per_client',
  'bytes_up_per_client',
)


def split_row(row: dict, test_private: bool) -> tuple[dict, dict]:
  """`(private, non_private)` parts of a round's row.

  Args:
    row: Everything the round measured.
    test_private: Whether test metrics are post-processing of the model
      (the task's test data belongs to no client).

  Returns:
    The columns the ledger covers (`PRIVATE_COLUMNS`, and `test_*` when
    `test_private`), and every other column, each with `round`.
  """
  private, non_private = {}, {'round': row['round']}
  for k, v in row.items():
    covered = k in PRIVATE_COLUMNS or (test_private and k.startswith('test_'))
    (private if covered else non_private)[k] = v
  return private, non_private


def flatten(prefix: str, value, out: dict) -> None:
  if isinstance(value, dict):
    for k, v in value.items():
      flatten(f'{prefix}/{k}' if prefix else str(k), v, out)
  elif isinstance(value, (int, float, np.number)) or (
    isinstance(value, np.ndarray) and value.ndim == 0
  ):
    out[prefix] = float(value)


def atomic_write(path: pathlib.Path, text: str) -> None:
  with tempfile.NamedTemporaryFile(
    'w', dir=path.parent, delete=False, prefix=f'.{path.name}'
  ) as f:
    f.write(text)
  os.replace(f.name, path)


def write_csv(path: pathlib.Path, rows: list[dict]) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  first = [
    'round',
    'sampled_clients',
    'train_loss',
    'epsilon_rdp',
    'epsilon_pld',
    'noise_multiplier',
    'clip',
    'bytes_down_per_client',
    'bytes_up_per_client',
    'bytes_down_total',
    'bytes_up_total',
    'round_seconds',
  ]
  keys = {k for r in rows for k in r}
  test = sorted(k for k in keys if k.startswith('test_'))
  rest = sorted(keys - set(first) - set(test))
  columns = [k for k in first if k in keys] + test + rest
  with tempfile.NamedTemporaryFile(
    'w', dir=path.parent, delete=False, prefix=f'.{path.name}', newline=''
  ) as f:
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
  os.replace(f.name, path)


def progress_line(row: dict, rounds: int) -> str:
  """A round's log line from the columns `row` has (non-private ones
  only when the run releases them); eps_pld only where it is computed
  (not NaN)."""
  parts = [f'round {row["round"]}/{rounds}']
  if 'sampled_clients' in row:
    parts.append(f'clients {row["sampled_clients"]}')
  if 'train_loss' in row:
    parts.append(f'train_loss {row["train_loss"]:.4f}')
  for k in ('test_accuracy', 'test_auroc', 'test_balanced_accuracy'):
    if k in row:
      parts.append(f'{k[5:]} {row[k]:.4f}')
  if 'epsilon_rdp' in row:
    eps = f'eps_rdp {row["epsilon_rdp"]:.3f}'
    if not math.isnan(row.get('epsilon_pld', math.nan)):
      eps += f' eps_pld {row["epsilon_pld"]:.3f}'
    parts.append(eps)
  if 'bytes_up_total' in row:
    parts.append(f'up {row["bytes_up_total"] / 1e6:.1f} MB total')
  else:
    parts.append(f'up {row["bytes_up_per_client"] / 1e3:.1f} KB/client')
  if 'round_seconds' in row:
    parts.append(f'{row["round_seconds"]:.1f}s')
  return ' | '.join(parts)
