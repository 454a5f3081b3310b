"""Issue 22's corrections of the committed study rows (rerun-safe).

1. Re-accounting. Fixed-size (`--clients_per_round`) runs were accounted
with the replace-one sensitivity C instead of 2C, so their epsilon was too
small.
This re-accounts every DP row of the studies' results whose command used
fixed-size sampling, from what it ran (task size N, cohort m, rounds, the
noise multiplier recorded in the row, delta) with `tff_dp.privacy`'s
ledger, keeps the old figure as `epsilon RDP as first reported`, and
rewrites the row's command so it reruns what ran: the recorded multiplier
instead of `--target_epsilon` (which today calibrates more noise), and
`--noise_seed` equal to its `--seed` (the noise and cohorts it drew then).
2. Labels. Every row gets `tuning outside ledger`: what its run chose from
client data outside the ledger, as
`tff_dp.job.privacy_summary.tuning_outside_ledger` states it in a run's
summary (clips taken from other runs, the medical tasks' preprocessing,
FL-TOP's public batch).

The tables keep their notes as committed (except seed 003's, whose study
notes now say it was re-accounted).

  python -m benchmarks.privacy_backfill
"""

import json
import pathlib
import re
import shlex

import dp_accounting

from benchmarks import results_table
from benchmarks import studies
from tff_dp import methods
from tff_dp import privacy
from tff_dp import tasks
from tff_dp.job import training
from tff_dp.job import privacy_summary

RESULTS = pathlib.Path(__file__).parent / 'results'
OLD = 'epsilon RDP as first reported'


def _flags(command: str) -> dict[str, list[str]]:
  out: dict[str, list[str]] = {}
  for arg in shlex.split(command):
    m = re.fullmatch(r'--([a-z_]+)=(.*)', arg)
    if m:
      out.setdefault(m.group(1), []).append(m.group(2))
  return out


def _num_clients(flags: dict[str, list[str]]) -> int:
  options = dict(o.split('=', 1) for o in flags.get('task_option', []))
  options = {k: v for k, v in options.items() if k != 'model'}
  task = tasks.load_task(
    flags['task'][0],
    **{k: float(v) if '.' in v else int(v) for k, v in options.items()},
  )
  return len(task.train_data.client_ids)


def reaccount(row: dict) -> dict:
  """The row re-accounted (unchanged if it ran no fixed-size DP)."""
  flags = _flags(row['command'])
  z = row.get('noise multiplier')
  if 'clients_per_round' not in flags or not isinstance(z, float):
    return row
  sampling = privacy.Sampling(
    'fixed',
    _num_clients(flags),
    clients_per_round=int(flags['clients_per_round'][0]),
  )
  ledger = privacy.PrivacyLedger(sampling, float(flags['delta'][0]))
  for _ in range(int(flags['rounds'][0])):
    ledger.record(dp_accounting.GaussianDpEvent(z))
  row = dict(row)
  row.setdefault(OLD, row['epsilon RDP'])
  row['epsilon RDP'], row['epsilon PLD'] = ledger.epsilon()
  row['command'] = re.sub(
    r'--target_epsilon=\S+', f'--noise_multiplier={z!r}', row['command']
  )
  return row


def clip_source(row_def: studies.Row) -> str | None:
  """What `studies.run_row` passes as --clip_source for this row."""
  if row_def.clip_from is not None:
    return (
      f'median client update norm of the non-private {row_def.clip_from} run'
    )
  if row_def.clip_half_mean_of is not None:
    return (
      '0.5 x the mean update norm of the non-private '
      f'{row_def.clip_half_mean_of} run'
    )
  if row_def.clip_half_model_norm_of is not None:
    return (
      f'0.5 x the final model norm of the {row_def.clip_half_model_norm_of} run'
    )
  return None


def with_tuning_label(row: dict, row_def: studies.Row | None) -> dict:
  flags = _flags(row.get('command', ''))
  if 'task' not in flags or 'method' not in flags:
    return row
  config = training.ExperimentConfig.create(
    task=flags['task'][0],
    method=flags['method'][0],
    clip=float(flags.get('clip', ['1.0'])[0]),
    clip_source=clip_source(row_def) if row_def is not None else None,
  )
  steps = privacy_summary.tuning_outside_ledger(
    config, methods.METHODS[config.method]
  )
  return dict(row, **{'tuning outside ledger': '; '.join(steps)})


def with_noise_seed(row: dict) -> dict:
  """`--noise_seed=S` after `--seed=S`: the streams the row drew then."""
  command = row.get('command', '')
  if 'tff_dp.run' not in command or '--noise_seed=' in command:
    return row
  return dict(
    row,
    command=re.sub(r'--seed=(\d+)', r'--seed=\1 --noise_seed=\1', command),
  )


def main() -> None:
  for name, study in studies.STUDIES.items():
    store = RESULTS / f'{name}.json'
    if not store.exists():
      continue
    rows = json.loads(store.read_text())
    row_defs = {r.name: r for r in study.rows}
    fixed = {
      k: with_tuning_label(with_noise_seed(reaccount(r)), row_defs.get(k))
      for k, r in rows.items()
    }
    if fixed == rows:
      continue
    md = str(RESULTS / f'{name}.md')
    text = (RESULTS / f'{name}.md').read_text()
    # The committed notes: between the title and the table.
    notes = text.split('\n', 1)[1].split('\n| ', 1)[0].strip()
    if name == 'seed003_clipping':
      machine = re.search(r'^Machine: .*$', text, re.M)
      notes = study.notes + (f'\n{machine.group(0)}' if machine else '')
    for key, row in fixed.items():
      results_table.update(
        md, key, row, title=study.title, columns=study.columns, notes=notes
      )
      if row.get(OLD) is not None and row is not rows[key]:
        print(
          f'{name}/{key}: epsilon {row[OLD]:.3f} -> {row["epsilon RDP"]:.3f}'
        )


if __name__ == '__main__':
  main()
