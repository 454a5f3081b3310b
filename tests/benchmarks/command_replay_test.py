"""Every command recorded in a committed results table reruns what made it.

`benchmarks/results/<table>.json` keeps each row's `command`, the one the
table tells a reader to run to reproduce the row. Nothing here runs one;
the checks read them:

1. Study rows (`python -m tff_dp.run ...`, the `seed0*` tables) parse
   against the runner's absl flags, as importing `tff_dp.run` defines them:
   a flag that no longer exists, or a value its flag refuses (an enum
   choice, an integer, a float), fails. The parsed flags then build the
   run's config and pass the checks `main` makes before any data loads
   (`run.config_from_flags`, `ExperimentConfig.validate`; DDGauss's
   protobuf preflight is a property of the process, not of the command,
   and is stubbed).
2. No default changed under a row. `DEFAULT_CHANGES` lists each flag whose
   default changed after study rows ran, or that was added with a default
   other than what runs did before it (its legacy value,
   `options.option(legacy=...)`), with the commit and the date (UTC) of
   the change. A row dated on or before that date (same-day rows that ran
   after the commit are named in `ran_after`), of a method and task the
   flag applies to, must carry the flag in its command (an added flag: at
   the value runs had before it); otherwise its command would rerun
   today's default, not what produced the row. `DEFAULTS` is every runner
   flag's default as of the last review (2026-12-05): a flag added or a
   default changed since fails the test until it is recorded there and,
   if rows ran otherwise before it, in `DEFAULT_CHANGES`, with their
   commands amended (their table's notes say when and why).
3. Tables of the other entry points (`python -m benchmarks.<module> ...`:
   one command that made the whole table, on each of its rows) parse
   against that module's flags, imported in a child process (several of
   them define the same flag, --rounds, so they cannot share one).

How `DEFAULT_CHANGES` was found: `tff_dp.run` imported at each of the 80
commits since 2026-11-21 that touched the flags' declarations
(tff_dp/run.py, tff_dp/methods/, experiment_config.py, training.py), every
flag's default dumped and compared commit to commit (e34bfde does not
import and was skipped). Left out: settings that change only where or how
fast a run goes, or what it may do (`experiment_config.EXECUTION_ONLY`:
--max_concurrent_computation_calls 2 -> 3, --allow_noise_seed_reuse);
flags added with the behaviour runs had before them as default (those
without `legacy=`); --noise_seed (added 2026-11-23 16:41: rows before it
drew noise and cohorts from another random stream, so a rerun is another
draw of the same algorithm); the default --method and --clients_per_round
of 2026-11-22 01:21, hours before the first row was committed (04:09 that
day). Behaviour that changed without a flag (CNN-2-layers' dropout, the
notes' `STATEFUL_DROPOUT`) cannot be seen here.
"""

import dataclasses
import json
import pathlib
import shlex
import subprocess
import sys
from typing import Any, Optional

from absl import flags
from absl.testing import flagsaver
import pytest

from tff_dp.job import experiment_config
from tff_dp import methods
from tff_dp.job import checkpoints
from tff_dp import run
from tff_dp.aggregators import ddgauss

_RESULTS = (
  pathlib.Path(__file__).resolve().parents[2] / 'benchmarks' / 'results'
)
_RUNNER = 'tff_dp.run'


@dataclasses.dataclass(frozen=True)
class DefaultChange:
  """A flag whose default changed (or that was added) after rows ran."""

  flag: str
  # What runs had before the change, as a command spells it.
  before: str
  commit: str
  date: str  # UTC date of `commit`.
  # Added by `commit` (rows before it can only have had `before`), or an
  # existing flag's default changed (rows before it may set any value).
  added: bool = True
  # The methods the flag acts on; None: every method that takes it (an
  # option's methods, or every method for a common setting).
  methods: Optional[tuple[str, ...]] = None
  # Tasks where it does nothing.
  except_tasks: tuple[str, ...] = ()
  # The --participation values it acts on; None: every one.
  participations: Optional[tuple[str, ...]] = None
  # Rows ('table/row') dated on `date` that ran after `commit`.
  ran_after: tuple[str, ...] = ()
  # (flag, value) pairs under which it does nothing: a row whose command
  # gives (or defaults to) one of them needs no value.
  inert_when: tuple[tuple[str, str], ...] = ()


DEFAULT_CHANGES = (
  DefaultChange('top_k_nonprivate_clip', 'True', 'bfd3875', '2026-11-23'),
  # FL-TOP's Top-K batch; the medical tasks use their held-out patients.
  DefaultChange(
    'public_batch',
    'first_per_class',
    '8fdec79',
    '2026-11-23',
    methods=('fl_top', 'fl_top_dp'),
    except_tasks=('physionet2012', 'heart_disease'),
  ),
  DefaultChange('dpsfl_bit_noise', '10', '41f9150', '2026-11-23', added=False),
  DefaultChange('dpsfl_impact_rule', 'absolute', '41f9150', '2026-11-23'),
  DefaultChange(
    'sketch_columns', '20000', '7f67272', '2026-11-23', added=False
  ),
  DefaultChange('sketch_k', '5000', '7f67272', '2026-11-23', added=False),
  DefaultChange('cmp_layout', 'in_out', '5f4fa8a', '2026-11-23'),
  DefaultChange('cmp_vectors_phase', 'u', '5f4fa8a', '2026-11-23'),
  DefaultChange(
    'randagg_clip_scope',
    'payload',
    '40d7376',
    '2026-11-24',
    ran_after=(
      'seed001_iid/dp_randagg_r4_smoke',
      'seed001_iid/dp_randagg_r4_median_smoke',
    ),
  ),
  # What is written, not what a round computes: the tables' non-private
  # columns (update norms, train loss, timings) need it.
  DefaultChange('release_non_private_metrics', 'True', 'ce8dbc1', '2026-12-01'),
  # The cyclic modes' groups: a permutation of the population before, a
  # hash of each client's id since (add/remove-one neighbouring holds).
  DefaultChange(
    'participation_partition',
    'balanced',
    '8c87781',
    '2026-12-03',
    participations=('cyclic_poisson', 'cyclic'),
  ),
  # Blocks of consecutive coordinates before, interleaved since (issue
  # #103); it does nothing without --compression.
  DefaultChange(
    'compression_sketch',
    'srht',
    'ea06239',
    '2026-12-05',
    added=False,
    inert_when=(('compression', 'none'),),
  ),
)

# Every runner flag's default at the last review of DEFAULT_CHANGES.
DEFAULTS = {
  'accountant': 'rdp',
  # Issue #105 (2026-12-05): no row ran with adapters before.
  'adapter_layers': [],
  'adapter_rank': 4,
  'allow_noise_seed_reuse': False,
  'background_evaluation': True,
  'bands': 'auto',
  # Issue #103 (2026-12-05): no row ran with compression before.
  'compression': 'none',
  'compression_norm_ratio': None,
  'compression_norm_source': 'assumed',
  'compression_sketch': 'srht_interleaved',
  'compression_tolerance': 0.05,
  'batch_size': 10,
  'blt_buffers': 2,
  'blur_lambda': 0.4,
  'checkpoint_every': 10,
  'client_lr': 0.05,
  'client_lr_decay': 1.0,
  'client_momentum': 0.0,
  'client_sampling_rate': None,
  'clients_per_round': None,
  'clip': 1.0,
  'clip_fraction': 0.5,
  'clip_from_fedavg_rounds': 0,
  'clip_from_public_round': False,
  'clip_learning_rate': 0.2,
  'clip_source': None,
  'clipped_count_stddev': None,
  'cmp_clip_u': None,
  'cmp_clip_v': None,
  'cmp_dense_below': 0,
  'cmp_layout': 'out_in',
  'cmp_rank': 4,
  'cmp_vectors_phase': 'v',
  'data_dir': None,
  'download': True,
  'ddgauss_bits': 20,
  'ddgauss_min_clients': None,
  'delta': None,
  'device': None,
  'dpsfl_bit_noise': None,
  'dpsfl_clip_lr': 0.2,
  'dpsfl_impact_rule': 'relative',
  'dpsfl_impact_threshold': 0.1,
  'dpsfl_target_probability': 0.5,
  'eval_every': 1,
  'fraction_clipped_stddev': None,
  'fuse_client_work': False,
  'initial_weights': None,
  'inter_op_threads': 4,
  'intra_op_threads': 1,
  'keep_checkpoints': False,
  'local_epochs': 1,
  'local_steps': None,
  'local_workers': 0,
  'lus_sparsity': 0.7,
  'max_concurrent_computation_calls': 3,
  'method': 'dp_fedavg',
  'noise': 'iid',
  'noise_multiplier': None,
  'noise_seed': None,
  'participation': 'independent',
  'participation_groups': None,
  'participation_partition': 'by_client_id',
  'public_batch': 'random',
  # Issue #105 (2026-12-05): no row ran with public data or frozen layers
  # before; the defaults are the behaviour every earlier row had.
  'public_data': None,
  'public_pretrain_batch_size': 32,
  'public_pretrain_lr': 0.05,
  'public_pretrain_steps': 0,
  'randagg_clip_scope': 'update',
  'randagg_fraction': 0.01,
  'release_non_private_metrics': False,
  'root_output_dir': None,
  'rounds': 10,
  'seed': 0,
  'server_lr': 1.0,
  'server_momentum': 0.0,
  'sketch_columns': 100000,
  'sketch_hashing': 'murmur',
  'sketch_k': 10000,
  'sketch_lr': 1.0,
  'sketch_momentum': 0.9,
  'sketch_rows': 5,
  'target_epsilon': None,
  'target_unclipped_quantile': 0.5,
  'task': 'fashion_mnist_iid',
  'task_option': [],
  'top_k_nonprivate_clip': False,
  'top_k_ratio': 0.005,
  'train_layers': [],
  'update_diagnostics': True,
  'workers': None,
}


@dataclasses.dataclass(frozen=True)
class Recorded:
  table: str
  row: str
  date: str
  command: str

  @property
  def name(self) -> str:
    return f'{self.table}/{self.row}'

  @property
  def argv(self) -> list[str]:
    return shlex.split(self.command)

  @property
  def entry_point(self) -> str:
    """The module a `python -m <module> ...` command runs, else ''."""
    argv = self.argv
    return argv[2] if argv[:2] == ['python', '-m'] and len(argv) > 2 else ''

  @property
  def args(self) -> list[str]:
    return self.argv[3:]


def _tables() -> dict[str, dict[str, Any]]:
  """The committed results stores whose rows record a command."""
  if not _RESULTS.is_dir():
    # A Bazel runfiles tree holds only declared inputs, not the results.
    pytest.skip(f'{_RESULTS} is not here (Bazel runfiles): run with pytest.')
  tables = {}
  for path in sorted(_RESULTS.glob('*.json')):
    rows = json.loads(path.read_text())
    if isinstance(rows, dict) and any(
      isinstance(r, dict) and 'command' in r for r in rows.values()
    ):
      tables[path.stem] = rows
  return tables


def _recorded() -> list[Recorded]:
  return [
    Recorded(table, name, str(row.get('date', '')), row.get('command') or '')
    for table, rows in _tables().items()
    for name, row in rows.items()
  ]


def _runner_rows() -> list[Recorded]:
  return [r for r in _recorded() if r.entry_point == _RUNNER]


def _given(args: list[str]) -> dict[str, str]:
  """`--name=value` (and `--name` / `--noname` booleans) by flag name."""
  out = {}
  for arg in args:
    name, eq, value = arg[2:].partition('=')
    if not eq and name.startswith('no') and name[2:] in DEFAULTS:
      name, value = name[2:], 'False'
    out[name] = value if eq else out.get(name, 'True')
  return out


def test_every_row_of_a_command_table_records_a_command():
  recorded = _recorded()
  assert len({r.table for r in recorded}) >= 20, sorted(
    {r.table for r in recorded}
  )
  empty = [r.name for r in recorded if not r.entry_point]
  assert not empty, f'Rows without a `python -m` command: {empty}'
  study_tables = {r.table for r in recorded if r.table.startswith('seed0')}
  assert study_tables and all(
    r.entry_point == _RUNNER for r in recorded if r.table in study_tables
  )


@pytest.fixture(name='unparsed_flags')
def _unparsed_flags(monkeypatch):
  """The global absl flags, restored (values and parsed state) after."""
  # DDGauss's preflight asks whether this process's protobuf can hold its
  # learning process: true of `python -m tff_dp.run --method=ddgauss`,
  # which picks the backend itself, whatever the command.
  monkeypatch.setattr(ddgauss, 'protobuf_supports_ddgauss', lambda: True)
  was_parsed = flags.FLAGS.is_parsed()
  with flagsaver.flagsaver():
    yield flags.FLAGS
  if not was_parsed:
    flags.FLAGS.unparse_flags()


def test_every_study_command_parses_and_builds_a_valid_config(unparsed_flags):
  rows = _runner_rows()
  assert len(rows) > 200
  failures = []
  for row in rows:
    with flagsaver.flagsaver():
      try:
        unparsed_flags.unparse_flags()
        unparsed_flags([_RUNNER] + row.args)
        run.config_from_flags().validate()
        run.probe_from_flags()
      except Exception as e:  # pylint: disable=broad-except
        failures.append(f'{row.name}: {type(e).__name__}: {e}')
  assert not failures, '\n'.join(failures)


def test_a_stale_flag_or_a_bad_value_fails_the_check(unparsed_flags):
  # The check above has the power to fail: a removed flag, a refused enum
  # value and a value the config refuses.
  for args, error in (
    (['--cmp_rotation=in_out'], flags.UnrecognizedFlagError),
    (['--cmp_layout=sideways'], flags.IllegalFlagValueError),
    (['--rounds=ten'], flags.IllegalFlagValueError),
    (['--method=dp_fedavg', '--target_epsilon=1'], ValueError),
  ):
    with flagsaver.flagsaver():
      unparsed_flags.unparse_flags()
      with pytest.raises(error):
        unparsed_flags([_RUNNER] + args)
        run.config_from_flags().validate()


def _runner_defaults() -> dict[str, Any]:
  return {
    f.name: f.default for f in flags.FLAGS.get_flags_for_module(run.__name__)
  }


def test_no_flag_was_added_or_changed_its_default_since_the_review():
  now = _runner_defaults()
  added = sorted(set(now) - set(DEFAULTS))
  removed = sorted(set(DEFAULTS) - set(now))
  changed = sorted(
    f'--{k}: {DEFAULTS[k]!r} -> {now[k]!r}'
    for k in set(now) & set(DEFAULTS)
    if now[k] != DEFAULTS[k]
  )
  assert not (added or removed or changed), (
    f'Runner flags added {added}, removed {removed}, defaults changed '
    f'{changed} since DEFAULTS was reviewed. Record them in DEFAULTS; a '
    'default that is not what earlier rows ran with also goes into '
    'DEFAULT_CHANGES (and their commands get the old value).'
  )


def test_default_changes_agree_with_the_declared_legacy_values():
  legacy = methods.LEGACY_DEFAULTS
  changes = {c.flag: c for c in DEFAULT_CHANGES}
  # Every setting declared with a legacy value is a default change here.
  assert set(legacy) <= set(changes)
  for flag, change in changes.items():
    assert flag in DEFAULTS, flag
    assert change.before != str(DEFAULTS[flag]), flag
    if flag in legacy:
      assert change.before == str(legacy[flag]), flag


def _applies(
  change: DefaultChange,
  method: str,
  task: str,
  participation: str,
  given: dict[str, str],
) -> bool:
  if task in change.except_tasks:
    return False
  if any(str(given.get(f, DEFAULTS[f])) == v for f, v in change.inert_when):
    return False
  if (
    change.participations is not None
    and participation not in change.participations
  ):
    return False
  if change.methods is not None:
    return method in change.methods
  options = methods.option_fields()
  if change.flag in options:
    return method in options[change.flag][1]
  return True


def test_rows_that_ran_before_a_default_changed_carry_the_old_value():
  rows = _runner_rows()
  names = {r.name for r in rows}
  missing = []
  for change in DEFAULT_CHANGES:
    assert set(change.ran_after) <= names, change.ran_after
    for row in rows:
      if row.date > change.date or row.name in change.ran_after:
        continue
      given = _given(row.args)
      method = given.get('method', DEFAULTS['method'])
      task = given.get('task', DEFAULTS['task'])
      participation = given.get('participation', DEFAULTS['participation'])
      if not _applies(change, method, task, participation, given):
        continue
      value = given.get(change.flag)
      if value is None or (change.added and value != change.before):
        missing.append(
          f'{row.name} ({row.date}, {method}) has {change.flag}='
          f'{value}: --{change.flag}={change.before} (the default until '
          f'{change.commit}, {change.date})'
        )
  assert not missing, '\n'.join(missing)


def test_the_seed001_rows_that_ran_before_issue_24_keep_their_algorithm():
  # The 30 rows of issue #87: CMP-Fed, UV-Fed and DP-RandAgg at ranks 1-16
  # over 30 rounds on both splits, run before the defaults changed.
  tables = _tables()
  flagged = []
  for split in ('iid', '5labels'):
    rows = tables[f'seed001_{split}']
    for method, extra in (
      ('cmp_fed', ['--cmp_layout=in_out', '--cmp_vectors_phase=u']),
      ('uv_fed', ['--cmp_layout=in_out', '--cmp_vectors_phase=u']),
      ('dp_randagg', ['--randagg_clip_scope=payload']),
    ):
      for rank in (1, 2, 4, 8, 16):
        args = shlex.split(rows[f'{method}_r{rank}']['command'])
        assert '--rounds=30' in args
        assert set(extra) <= set(args), (split, method, rank)
        flagged.append((split, method, rank))
  assert len(flagged) == 30


# Parses each entry point's recorded arguments (stdin: {module: [argv]}).
_CHILD = r"""
import importlib, json, sys
from absl import flags
out = {}
for module, argvs in json.loads(sys.stdin.read()).items():
  importlib.import_module(module)
  out[module] = []
  for argv in argvs:
    try:
      flags.FLAGS([module] + argv)
      out[module].append(None)
    except Exception as e:
      out[module].append(f'{type(e).__name__}: {e}')
    flags.FLAGS.unparse_flags()
  # Its own flags go: the next module may define the same names.
  for flag in flags.FLAGS.get_flags_for_module(module):
    delattr(flags.FLAGS, flag.name)
print('RESULT ' + json.dumps(out))
"""


def test_every_benchmark_command_parses_against_its_modules_flags():
  by_module: dict[str, list[Recorded]] = {}
  for row in _recorded():
    if row.entry_point != _RUNNER:
      by_module.setdefault(row.entry_point, []).append(row)
  assert all(m.startswith('benchmarks.') for m in by_module), list(by_module)
  done = subprocess.run(
    [sys.executable, '-c', _CHILD],
    input=json.dumps({m: [r.args for r in rs] for m, rs in by_module.items()}),
    capture_output=True,
    text=True,
    timeout=600,
    cwd=_RESULTS.parents[1],
  )
  lines = [l for l in done.stdout.splitlines() if l.startswith('RESULT ')]
  assert done.returncode == 0 and lines, done.stderr[-3000:]
  results = json.loads(lines[-1][len('RESULT ') :])
  failures = [
    f'{row.name}: {error}'
    for module, rows in by_module.items()
    for row, error in zip(rows, results[module])
    if error
  ]
  assert not failures, '\n'.join(failures)


def _kept_runs() -> list[pathlib.Path]:
  """The run folders kept beside the tables (`runner.keep_run_files`)."""
  return sorted(p for p in (_RESULTS / 'runs').glob('*/*') if p.is_dir())


def test_every_kept_run_folder_is_a_row_of_its_table():
  tables = _tables()
  kept = _kept_runs()
  assert kept
  orphans = [
    str(p.relative_to(_RESULTS))
    for p in kept
    if p.name not in tables.get(p.parent.name, {})
  ]
  assert not orphans, orphans


def test_a_kept_runs_command_rebuilds_the_config_it_ran_with(
  unparsed_flags, tmp_path
):
  # Where a row's run folder is kept, its config.json says what ran: the
  # recorded command must build the same config (settings added since read
  # at their legacy value, as a resumed run reads them; where and how fast
  # it ran aside: `checkpoints.check_same_config`).
  tables = _tables()
  checked = 0
  for run_dir in _kept_runs():
    saved = run_dir / 'config.json'
    if not saved.exists():
      continue
    command = tables[run_dir.parent.name][run_dir.name]['command']
    with flagsaver.flagsaver():
      unparsed_flags.unparse_flags()
      unparsed_flags([_RUNNER] + shlex.split(command)[3:])
      config = run.config_from_flags()
    old = json.loads(saved.read_text())
    # The noise seed is recorded only as given or not; its words changed.
    if str(old.get('noise_seed', '')).startswith('given'):
      old['noise_seed'] = experiment_config.noise_seed_status(0)
    copy = tmp_path / run_dir.parent.name / run_dir.name
    copy.mkdir(parents=True)
    (copy / 'config.json').write_text(json.dumps(old))
    checkpoints.check_same_config(copy, config)
    checked += 1
  assert checked >= 14
