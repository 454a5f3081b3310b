"""The study runner: one row is one `python -m tff_dp.run` command, then a
results-table row (benchmarks/results/<study>.md and .json)."""

import json
import math
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np

from benchmarks import results_table
from tff_dp.reporting import run_folders
from tff_dp import privacy

from benchmarks.studies.study import Row
from benchmarks.studies.study import Study

RUNS = pathlib.Path('runs/studies')
RESULTS = pathlib.Path('benchmarks/results')
# A finished row's small files, kept under RESULTS / 'runs' / <study> / <row>
# (`keep_run_files`): `runs/` is git-ignored and does not outlive the
# machine, and without these a row's curves could not be replotted.
KEPT_RUN_FILES = (
  'config.json',
  'summary.json',
  'metrics.csv',
  'diagnostics.jsonl',  # Rows run before non_private/ existed.
  'non_private/summary.json',
  'non_private/metrics.csv',
  'non_private/diagnostics.jsonl',
)
# Every row is a research run: it publishes its --noise_seed (shared by
# the study's rows), and its tables read the non-private outputs
# (update norms, timings). Both flags change what is written and allowed,
# not what a round computes.
RESEARCH_FLAGS = {
  'release_non_private_metrics': True,
  'allow_noise_seed_reuse': True,
}


def _flag_args(values: dict[str, Any]) -> list[str]:
  """`--name=value` per value; None leaves the flag at its default."""
  args = []
  for k, v in values.items():
    if v is None:
      continue
    if isinstance(v, (list, tuple)):
      args += [f'--{k}={x}' for x in v]
    elif isinstance(v, float):
      args.append(f'--{k}={v:.6g}')
    else:
      args.append(f'--{k}={v}')
  return args


def read_metrics(run_dir: pathlib.Path) -> list[dict[str, float]]:
  """The numeric cells of a run's metrics.csv, a dict per round."""
  return run_folders.read_rows(run_dir)


def _median(values: list[float]) -> float:
  values = sorted(v for v in values if v is not None and math.isfinite(v))
  if not values:
    return float('nan')
  n = len(values)
  return (
    values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])
  )


def _median_over_rounds(run_dir: pathlib.Path, key: str, missing: str) -> float:
  """A clip: the median over a run's rounds of `key` (3 significant digits);
  raises `ValueError(f'{run_dir} has no {missing}.')` if it has none."""
  clip = _median([r.get(key) for r in read_metrics(run_dir)])
  if not math.isfinite(clip) or clip <= 0:
    raise ValueError(f'{run_dir} has no {missing}.')
  return float(f'{clip:.3g}')


def clip_from_run(run_dir: pathlib.Path) -> float:
  """Median over rounds of the cohort's median pre-clip update norm."""
  return _median_over_rounds(
    run_dir, 'update_norm_q50', 'update-norm diagnostics'
  )


# CMP-Fed's clip flag -> its phase's payload norm in `client_norms`.
_CMP_PHASES = {'cmp_clip_u': 'u_payload', 'cmp_clip_v': 'v_payload'}
CMP_CLIENT_NORMS = 'tff/aggregator/client_norms/'


def cmp_clip_from_run(run_dir: pathlib.Path, clip_flag: str) -> float:
  """Seed 001's clip rule for one CMP-Fed phase, from a probe run.

  "The clipping parameter is selected according to the median of the l2-norm
  of the subspace/embedding/model to be clipped" (seed 001, Sec. V): the
  median over the probe's rounds of the cohort's mean pre-clip norm of that
  phase's whole payload (`client_norms/{u,v}_payload`: its matrices and,
  in the phase that carries them, the vectors). The cohort mean stands in
  for the cohort median, which a federated mean cannot give; the row run at
  the resulting clip reports the fraction each clip cut
  (`client_norms/{u,v}_clipped`), 0.5 when the clip sits at the median.
  """
  if clip_flag not in _CMP_PHASES:
    raise ValueError(
      f'clip_flag must be one of {sorted(_CMP_PHASES)}. Found {clip_flag!r}.'
    )
  key = CMP_CLIENT_NORMS + _CMP_PHASES[clip_flag]
  return _median_over_rounds(run_dir, key, f'CMP-Fed {key} measurements')


def final_model_norm(run_dir: pathlib.Path) -> float:
  """L2 norm of a finished run's final global model (trainable weights)."""
  path = run_dir / 'final_model_weights.npz'
  if not path.exists():
    raise ValueError(f'{run_dir} has no final_model_weights.npz (unfinished?).')
  with np.load(path) as weights:
    squares = [
      float(np.sum(np.square(weights[k].astype(np.float64))))
      for k in weights.files
      if k.startswith('trainable_')
    ]
  if not squares:
    raise ValueError(f'{path} holds no trainable weights.')
  return math.sqrt(sum(squares))


def cmp_signal_shares(run_dir: pathlib.Path) -> tuple[float, float]:
  """CMP-Fed: median over rounds of each phase's estimated signal share.

  From the measured norms of the two released means and the noise energy
  of the aggregator the run built (`CMPFedFactory.noise_energy`, rebuilt
  from the run's config, noise multiplier and cohort) over the model's
  shapes, through `cmp_fed.signal_share`.
  """
  # Only CMP-Fed rows need TFF.
  from tff_dp import methods
  from tff_dp import privacy
  from tff_dp.aggregators import cmp_fed

  summary = json.loads((run_dir / 'summary.json').read_text())
  # summary.json says only whether a noise seed was given, never its value
  # (experiment_config.noise_seed_status); the noise's energy does not
  # depend on it.
  config = dict(summary['config'], noise_seed=None)
  with np.load(run_dir / 'final_model_weights.npz') as weights:
    shapes = [
      weights[k].shape for k in weights.files if k.startswith('trainable_')
    ]
  # The same config -> MethodParams -> aggregator path as the run.
  params = methods.MethodParams.from_config(
    config,
    num_model_params=summary['num_model_params'],
    expected_clients_per_round=privacy.Sampling(
      **summary['sampling']
    ).expected_clients_per_round,
    noise_multiplier=summary['noise_multiplier'],
  )
  energies = (
    methods.METHODS[config['method']]
    .build_aggregator(params)
    .noise_energy(shapes)
  )
  rows = read_metrics(run_dir)
  return tuple(
    _median(
      [cmp_fed.signal_share(r[key], energy) for r in rows if r.get(key, 0) > 0]
    )
    for key, energy in zip(
      (
        'tff/aggregator/mean_norms/u_norm',
        'tff/aggregator/mean_norms/v_norm',
      ),
      energies,
    )
  )


def sampling_fraction(sampling: dict[str, Any]) -> float:
  """The expected fraction of clients in a round, from a run summary's
  `sampling` record (`privacy.Sampling.to_dict`): the Poisson rate, or
  clients_per_round / num_clients for fixed-size cohorts."""
  s = privacy.Sampling.from_dict(sampling)
  return s.expected_clients_per_round / s.num_clients


def summarize_run(run_dir: pathlib.Path, metric: str) -> dict[str, Any]:
  summary = json.loads((run_dir / 'summary.json').read_text())
  # The fraction of clients a round, as the run sampled them: the per-client
  # KB columns count a client's expected rounds (round x q).
  q = sampling_fraction(summary['sampling'])
  rows = read_metrics(run_dir)
  evaluated = [r for r in rows if metric in r]
  best = max(evaluated, key=lambda r: r[metric])
  cost = summary['bytes_per_client_per_round']
  out = {
    'best test metric': best[metric],
    'round of best': int(best['round']),
    'final test metric': evaluated[-1][metric],
    'KB down / client (to best)': cost['down'] * best['round'] * q / 1000,
    'KB up / client (to best)': cost['up'] * best['round'] * q / 1000,
    'epsilon RDP': summary['epsilon_rdp'],
    'epsilon PLD': summary['epsilon_pld'],
    'noise multiplier': summary['noise_multiplier'],
    'median pre-clip norm': _median([r.get('update_norm_q50') for r in rows]),
    'fraction clipped': _median([r.get('fraction_clipped') for r in rows]),
    # Seed 003's concentration of updates: the spread of the cohort's
    # pre-clip norms relative to their mean, median over rounds.
    'update norm std / mean': _median(
      [
        r['update_norm_std'] / r['update_norm_mean']
        for r in rows
        if r.get('update_norm_mean')
      ]
    ),
    's/round': _median([r.get('round_seconds') for r in rows]),
    'tuning outside ledger': '; '.join(
      summary.get('privacy', {}).get('tuning_outside_ledger', [])
    ),
    # Why the epsilon is not a rigorous guarantee, if the run says so
    # (`privacy_summary.guarantee_caveat`; e.g. DDGauss under Poisson sampling).
    'guarantee caveat': summary.get('privacy', {}).get('guarantee_caveat')
    or '',
  }
  if 'test_auroc' in best:
    out['AUROC at best'] = best['test_auroc']
  out['KB up / client / round'] = cost['up'] / 1000
  out['KB down / client / round'] = cost['down'] / 1000
  # The whole model as run (frozen weights and adapter factors included):
  # a partial model's `num_model_params` is only its trained part.
  dense = 4 * (
    summary['num_model_params'] + summary.get('num_frozen_params', 0)
  )
  out['upload compression x'] = dense / cost['up'] if cost['up'] else ''
  clips = [r['clip'] for r in rows if 'clip' in r]
  out['final clip'] = clips[-1] if clips else ''
  out['U signal share'] = out['V signal share'] = ''
  if summary['config'].get('method') == 'cmp_fed':
    out['U signal share'], out['V signal share'] = cmp_signal_shares(run_dir)
  out.update(_cmp_client_norms(summary['config'], rows))
  # --clip, or what replaced it (--clip_from_public_round).
  out['clip in force'] = summary.get('clip')
  out.update(compression_columns(summary, rows))
  return out


def compression_columns(summary, rows) -> dict[str, Any]:
  """--compression's rows, its b, and the decode's error on the mean over
  the DP noise's energy d z^2 C^2 / n^2 (medians over rounds): predicted
  from each round's measured ||mu|| and measured (non-private research
  measurements, `LinearCompressionFactory(measure_error_clip=...)`)."""
  from tff_dp.aggregators import linear_compression as lc

  out = dict.fromkeys(
    (
      'sketch rows b',
      'median ||mu|| / C',
      'added error / noise: predicted / measured',
    ),
    '',
  )
  config = summary['config']
  if config.get('compression', 'none') == 'none':
    return out
  key = 'tff/aggregator/'
  b = next(
    (r[key + 'sketch_rows'] for r in rows if key + 'sketch_rows' in r), None
  )
  if b is None:
    return out
  b = int(b)
  out['sketch rows b'] = b
  measured = [r for r in rows if key + lc.ERROR_SQ in r]
  z, clip = summary['noise_multiplier'], summary['clip']
  if not measured or not z:
    return out
  d = summary['num_model_params']
  s = privacy.Sampling.from_dict(summary['sampling'])
  noise = d * (z * clip / s.expected_clients_per_round) ** 2
  factor = lc.error_factor(config.get('compression_sketch', 'srht'), d, b)
  out['median ||mu|| / C'] = _median(
    [math.sqrt(r[key + lc.MEAN_SQ]) / clip for r in measured]
  )
  predicted = _median([factor * r[key + lc.MEAN_SQ] / noise for r in measured])
  actual = _median([r[key + lc.ERROR_SQ] / noise for r in measured])
  out['added error / noise: predicted / measured'] = (
    f'{predicted:.3g} / {actual:.3g}'
  )
  return out


def _cmp_client_norms(config, rows) -> dict[str, str]:
  """CMP-Fed's clips, mean pre-clip norms and clipped fractions (medians
  over rounds), for runs that measured them (after issue #24)."""
  prefix = CMP_CLIENT_NORMS
  if config.get('method') != 'cmp_fed' or not any(
    prefix + 'u_clipped' in r for r in rows
  ):
    return dict.fromkeys(
      ('C1 / C2', 'mean ||U_i|| / ||V_i|| / ||vectors||', 'U / V clipped'), ''
    )

  def med(key):
    return _median([r.get(prefix + key) for r in rows])

  clips = [
    config.get(k) or config.get('clip') for k in ('cmp_clip_u', 'cmp_clip_v')
  ]
  return {
    'C1 / C2': ' / '.join(f'{c:.3g}' for c in clips),
    'mean ||U_i|| / ||V_i|| / ||vectors||': ' / '.join(
      f'{med(k):.3g}' for k in ('u', 'v', 'vectors')
    ),
    'U / V clipped': f"{med('u_clipped'):.2f} / {med('v_clipped'):.2f}",
  }


def wall_label(run_dir: pathlib.Path, wall: float) -> Any:
  """The row's 'wall s': `wall` rounded, or, for a run this invocation
  resumed from a checkpoint (a row continued over sessions), a label that
  says the seconds cover only the rounds from where it resumed."""
  summary = json.loads((run_dir / 'summary.json').read_text())
  first = summary.get('first_round_this_invocation', 1)
  if first <= 1:
    return round(wall, 1)
  return f'{wall:.1f} (rounds {first}-{summary["rounds_completed"]} only)'


def keep_run_files(
  study_name: str, row_name: str, run_dir: pathlib.Path
) -> pathlib.Path:
  """Copies a finished row's `KEPT_RUN_FILES` (those it has) to
  `RESULTS/runs/<study>/<row>/`, replacing any copied before; checkpoints
  and TensorBoard events stay behind. `python -m tff_dp.plot --runs=` reads
  the copy like a run folder. Returns the copy's folder."""
  kept = RESULTS / 'runs' / study_name / row_name
  kept.mkdir(parents=True, exist_ok=True)
  for name in KEPT_RUN_FILES:
    if (run_dir / name).exists():
      (kept / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(run_dir / name, kept / name)
    elif (kept / name).exists():
      (kept / name).unlink()
  return kept


def source_run(study_name: str, row_name: str) -> pathlib.Path:
  """The run folder a row takes its clip from: the run under `RUNS`, else
  the finished run's files kept under `RESULTS / 'runs'` (a fresh checkout
  has no `runs/`, yet resumes rows from `benchmarks/in_progress/`)."""
  places = [
    RUNS / study_name / row_name,
    RESULTS / 'runs' / study_name / row_name,
  ]
  for run_dir in places:
    if run_dir.exists():
      return run_dir
  raise ValueError(
    f'Row {row_name!r} of {study_name!r} has not run: neither '
    f'{places[0]} nor {places[1]} exists. Run it first.'
  )


def run_row(
  study_name: str, study: Study, row: Row, rerun: bool, timeout_s: int = 3600
) -> None:
  """Runs one row (unless it finished before) and writes its table row."""
  run_dir = RUNS / study_name / row.name
  values = dict(RESEARCH_FLAGS)
  values.update(study.common)
  values.update(row.flags)
  if row.clip_from is not None:
    values['clip'] = clip_from_run(source_run(study_name, row.clip_from))
    values['clip_source'] = (
      f'median client update norm of the non-private {row.clip_from} run'
    )
  if row.clip_half_mean_of is not None:
    rows = read_metrics(source_run(study_name, row.clip_half_mean_of))
    norms = [r['update_norm_mean'] for r in rows if 'update_norm_mean' in r]
    values['clip'] = float(f'{0.5 * sum(norms) / len(norms):.3g}')
    values['clip_source'] = (
      f'0.5 x the mean update norm of the non-private '
      f'{row.clip_half_mean_of} run'
    )
  if row.clip_half_model_norm_of is not None:
    norm = final_model_norm(RUNS / study_name / row.clip_half_model_norm_of)
    values['clip'] = float(f'{0.5 * norm:.3g}')
    values['clip_source'] = (
      f'0.5 x the final model norm of the {row.clip_half_model_norm_of} run'
    )
  for clip_flag, probe in sorted(row.cmp_clips_from.items()):
    values[clip_flag] = cmp_clip_from_run(
      source_run(study_name, probe), clip_flag
    )
  if row.cmp_clips_from:
    values['clip_source'] = 'CMP-Fed clips at the median rule: ' + ', '.join(
      f'{flag} = mean pre-clip client norm of the {probe} probe run'
      for flag, probe in sorted(row.cmp_clips_from.items())
    )
  values['root_output_dir'] = str(run_dir)
  args = _flag_args(values)
  command = 'python -m tff_dp.run ' + ' '.join(shlex.quote(a) for a in args)
  if rerun and run_dir.exists():
    subprocess.run(['rm', '-rf', str(run_dir)], check=True)
  wall = None
  if not (run_dir / 'summary.json').exists():
    print(f'[{study_name}/{row.name}] {command}', flush=True)
    start = time.time()
    subprocess.run(
      [sys.executable, '-m', 'tff_dp.run'] + args,
      check=True,
      timeout=timeout_s,
    )
    wall = time.time() - start
  result = summarize_run(run_dir, study.metric)
  if values.get('method') == 'model_clip':
    # Its diagnostics see the reported update (the round's model minus the
    # clipped model), not the model it clips: no clipped fraction to show.
    result['fraction clipped'] = ''
  clip_in_force = result.pop('clip in force', None)
  if clip_in_force is None:  # A summary from before it recorded the clip.
    clip_in_force = values.get('clip', 1.0)
  paper = row.paper
  record = {
    'row': row.name,
    'method': row.label,
    **result,
    'paper': paper.get('best', ''),
    'paper AUROC': paper.get('auroc', ''),
    'paper KB down / up': paper.get('kb', ''),
    'paper epsilon': paper.get('eps', ''),
    # The clip in force (non-private methods other than CE-FedAvg and model
    # clipping do not clip).
    'clip': clip_in_force
    if result['epsilon RDP'] is not None
    or values.get('method') in ('ce_fedavg', 'model_clip')
    else '',
    'seed': values.get('seed', 0),
    'date': results_table.today(),
    'wall s': wall_label(run_dir, wall) if wall is not None else '',
    'command': command,
  }
  keep_run_files(study_name, row.name, run_dir)
  record['run files'] = run_files_cell(study_name, row.name)
  md = RESULTS / f'{study_name}.md'
  if wall is None:  # Re-read: keep the recorded date and wall time.
    store = md.with_suffix('.json')
    old = (
      json.loads(store.read_text()).get(row.name) if store.exists() else None
    )
    if old:
      record['date'], record['wall s'] = old['date'], old['wall s']
  results_table.update(str(md), row.name, record, **_table_layout(study))
  print(f'[{study_name}/{row.name}] {result}', flush=True)


# Every study table's column that says whether a row's run files are
# committed (`run_files_cell`), before the command; and the notes every
# table ends with (that column's, and how its commands were amended).
RUN_FILES = 'run files'
_COMMON_NOTES = """
Run files: `kept` links the summary.json of the row's run folder,
committed under `benchmarks/results/runs/<study>/<row>/` with its
config.json, metrics.csv and the non-private ones (curves can be replotted
and the settings read); `not kept`: the run's folder lived only under the
git-ignored `runs/` and is gone, so this table's numbers and command are
all that remain of it.

Commands of rows dated before 2026-12-01 carry
`--release_non_private_metrics=True --allow_noise_seed_reuse=True`,
written in on 2026-12-03: those rows ran before the flags existed (commit
ce8dbc1, 2026-12-01), when every run wrote its non-private outputs (this
table's update norms, timings) and a noise seed could serve several
configurations; the runner passes both to every row since.
`tests/benchmarks/command_replay_test.py` checks that every command here
parses against today's flags and carries each flag whose default changed
after its row ran.
"""


def run_files_cell(study_name: str, row_name: str) -> str:
  """The row's 'run files' cell: 'kept', linked (relative to the table) to
  the summary.json in its committed run folder, or 'not kept'.

  The link names a file, not the folder: the docs site serves the results
  as files (docs/hooks/results.py), and `mkdocs build --strict` refuses a
  link to a folder.
  """
  kept = RESULTS / 'runs' / study_name / row_name
  if (kept / 'summary.json').is_file():
    return f'[kept](runs/{study_name}/{row_name}/summary.json)'
  if kept.is_dir():
    return f'kept, without summary.json (runs/{study_name}/{row_name}/)'
  return 'not kept'


def _table_layout(study: Study) -> dict[str, Any]:
  columns = [c for c in study.columns if c != RUN_FILES]
  at = columns.index('command') if 'command' in columns else len(columns)
  columns.insert(at, RUN_FILES)
  return dict(
    title=study.title,
    columns=tuple(columns),
    notes=study.notes
    + _COMMON_NOTES
    + f'\nMachine: {results_table.machine()}.',
  )


def render_table(study_name: str, study: Study) -> pathlib.Path:
  """Rewrites `benchmarks/results/<study>.md` from its JSON store with the
  study's current title, notes and columns; runs nothing.

  Changes no measured cell: only each row's 'run files' cell, which says
  whether its run folder is committed now (`run_files_cell`), is brought
  up to date in the store first.
  """
  md = RESULTS / f'{study_name}.md'
  store = md.with_suffix('.json')
  if store.exists():
    rows = json.loads(store.read_text())
    fresh = {
      name: dict(row, **{RUN_FILES: run_files_cell(study_name, name)})
      for name, row in rows.items()
    }
    if fresh != rows:
      store.write_text(json.dumps(fresh, indent=2, sort_keys=True) + '\n')
  results_table.render(str(md), **_table_layout(study))
  return md
