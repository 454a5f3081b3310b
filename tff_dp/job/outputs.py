"""A run's outputs: metrics.csv, TensorBoard events, progress lines,
diagnostics, checkpoints (with the runner state) in the run's secret folder,
summary.json's privacy and provenance sections and final weights."""

import csv
import dataclasses
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

import asyncio

from absl import logging
import numpy as np
from tensorboard.summary.writer import record_writer
import tensorflow as tf

from tff_dp import privacy
from tff_dp.aggregators import mf_strategy
from tff_dp.job.experiment_config import ConfigError
from tff_dp.job.experiment_config import EXECUTION_ONLY
from tff_dp.job.experiment_config import ExperimentConfig
from tff_dp.job.experiment_config import noise_seed_status
from tff_dp.job.experiment_config import with_settings_added_since
from tff_dp.runtime import processes

CHECKPOINT_PREFIX = 'round_'
# The run folder's secret state, never released: owner-only (0700, its
# files 0600), deleted when the run finishes unless --keep_checkpoints.
SECRET_DIR = 'secret'
CHECKPOINT_DIR = f'{SECRET_DIR}/checkpoints'
# Where runs kept their checkpoints before SECRET_DIR (moved on resume).
LEGACY_CHECKPOINT_DIR = 'checkpoints'


DIAGNOSTICS_FILE = 'diagnostics.jsonl'  # Per-round update histograms.
# What the ledger does not cover, only with --release_non_private_metrics.
NON_PRIVATE_DIR = 'non_private'  # Also `plot.NON_PRIVATE_DIR`.

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


# Summary keys the ledger does not cover (`RunFiles.split_summary`).
NON_PRIVATE_SUMMARY_KEYS = (
  # Derived from the data (e.g. the medical tasks' patient counts).
  'task_description',
  'bytes_down_total',
  'bytes_up_total',
  'wall_seconds_this_invocation',
  # A hash of the files the clients' data came from: a function of every
  # client's data that the ledger does not cover (with it, a guess of the
  # whole data set can be confirmed). Which files were read is in the
  # private part (`provenance`, `run_provenance`).
  'data_files_sha256',
)


class RunFiles:
  """Where a run's results go: what the ledger covers in the run folder,
  the rest in `NON_PRIVATE_DIR` with --release_non_private_metrics only.

  The run folder gets `metrics.csv`, `tensorboard/` and `summary.json` with
  `PRIVATE_COLUMNS` (and test metrics when no client holds the test data);
  `non_private/` gets the same three files with every other column, and
  `diagnostics.jsonl`. Without the flag nothing else is written anywhere.
  The run folder's rows are written once the checkpoint that covers them
  is on disk (`write_released`), `non_private/`'s every round.
  """

  def __init__(
    self,
    output_dir: Optional[pathlib.Path],
    release_non_private: bool,
    test_private: bool,
  ):
    self.output_dir = output_dir
    self.release = bool(release_non_private)
    self.test_private = bool(test_private)
    self.non_private_dir = (
      output_dir / NON_PRIVATE_DIR
      if output_dir is not None and self.release
      else None
    )
    # Taken now, before any round trains: the events' times.
    self._writers = {d: EventFile(d / 'tensorboard') for d in self._dirs()}

  def split(self, row: dict) -> tuple[dict, dict]:
    return split_row(row, self.test_private)

  def shown(self, row: dict) -> dict:
    """The columns a log line may show."""
    return row if self.release else self.split(row)[0]

  @property
  def diagnostics_path(self) -> Optional[pathlib.Path]:
    if self.non_private_dir is None:
      return None
    return self.non_private_dir / DIAGNOSTICS_FILE

  def _dirs(self):
    dirs = [] if self.output_dir is None else [self.output_dir]
    return dirs + ([self.non_private_dir] if self.non_private_dir else [])

  def write_non_private(self, rows: list[dict], hists: Optional[dict]) -> None:
    """`NON_PRIVATE_DIR`'s files, each round: metrics.csv (rewritten),
    TensorBoard and histograms of `rows[-1]`. No epsilon covers them, so
    they are written before the round's checkpoint (a resumed run writes
    the rounds it trains again over them)."""
    d = self.non_private_dir
    if d is None:
      return
    write_csv(d / 'metrics.csv', [self.split(r)[1] for r in rows])
    self._writers[d].write([self.split(rows[-1])[1]])
    if hists:
      with open(self.diagnostics_path, 'a') as f:
        f.write(json.dumps({'round': int(rows[-1]['round']), **hists}) + '\n')

  def write_released(self, rows: list[dict], new: list[dict]) -> None:
    """The run folder's files: TensorBoard events of `new` (rounds not
    released before), then metrics.csv rewritten with `rows` (every round
    so far); the columns the ledger covers only."""
    if self.output_dir is None or not rows:
      return
    d = self.output_dir
    if new:
      self._writers[d].write([self.split(r)[0] for r in new])
    write_csv(d / 'metrics.csv', [self.split(r)[0] for r in rows])

  def split_summary(self, summary: dict) -> tuple[dict, dict]:
    """`(private, non_private)` parts of the run's summary."""
    private = {
      k: v for k, v in summary.items() if k not in NON_PRIVATE_SUMMARY_KEYS
    }
    non_private = {
      k: v for k, v in summary.items() if k in NON_PRIVATE_SUMMARY_KEYS
    }
    if not self.test_private:
      non_private['final'] = private.pop('final', {})
      private['final'] = {}
    return private, non_private

  def runner_state(
    self, round_num: int, rng_state: dict, ledger_json, rows: list
  ) -> 'RunnerState':
    """The checkpoint's runner state: the rows' non-private columns only
    when they are released, so the run folder holds none otherwise."""
    parts = [self.split(r) for r in rows]
    return RunnerState(
      round_num,
      rng_state,
      ledger_json,
      [p[0] for p in parts],
      [p[1] for p in parts] if self.release else [],
    )

  def returned_summary(self, summary: dict) -> dict:
    """What the runner returns: the private part, and the rest only when
    it is released."""
    private, non_private = self.split_summary(summary)
    return {**private, **non_private} if self.release else private

  def write_summary(self, summary: dict) -> None:
    for d, part in zip(self._dirs(), self.split_summary(summary)):
      atomic_write(d / 'summary.json', json.dumps(part, indent=2))


# TensorBoard's event files are found by this in their name.
_EVENTS_PREFIX = 'events.out.tfevents.'


class EventFile:
  """TensorBoard events whose times say nothing of the clients.

  `tf.summary`'s writers stamp each event with the wall-clock time it was
  written, and so each round's duration, which follows the cohort's size
  (secret under Poisson sampling). Here each round's scalars (as
  `simple_value`s) carry the wall time `start + round`, `start` being the
  whole seconds when the run's first event file was begun (read back from
  its name on resume), and the file is named
  `events.out.tfevents.<start>.tff_dp.<first round>` (no host name or
  process id). Each invocation that releases rounds begins a file of its
  own, from the first round it writes; files sort by round.
  """

  def __init__(self, log_dir: pathlib.Path):
    self.log_dir = log_dir
    starts = [
      int(p.name.split('.')[3])
      for p in (log_dir.glob(_EVENTS_PREFIX + '*.tff_dp.*'))
      if p.name.split('.')[3].isdigit()
    ]
    # A folder without one (or with tf.summary's files only, from before
    # this writer): this invocation's start, after any file before it.
    self.start = min(starts) if starts else int(time.time())
    self._path = None

  def write(self, rows: list[dict]) -> None:
    """Each row's finite float values, as scalars of step `row['round']`,
    appended to this invocation's file (begun by its first row)."""
    if not rows:
      return
    if self._path is None:
      self.log_dir.mkdir(parents=True, exist_ok=True)
      first = int(rows[0]['round'])
      self._path = self.log_dir / (
        f'{_EVENTS_PREFIX}{self.start:010d}.tff_dp.{first:06d}'
      )
    events = []
    if not self._path.exists() or not self._path.stat().st_size:
      events.append(
        tf.compat.v1.Event(
          wall_time=self.start + int(rows[0]['round']),
          file_version='brain.Event:2',
        )
      )
    for row in rows:
      step = int(row['round'])
      values = [
        tf.compat.v1.Summary.Value(tag=k, simple_value=v)
        for k, v in row.items()
        if k != 'round' and isinstance(v, float) and math.isfinite(v)
      ]
      events.append(
        tf.compat.v1.Event(
          wall_time=self.start + step,
          step=step,
          summary=tf.compat.v1.Summary(value=values),
        )
      )
    with open(self._path, 'ab') as f:
      writer = record_writer.RecordWriter(f)  # TFRecords, as TF writes them.
      for event in events:
        writer.write(event.SerializeToString())


def _tensorboard_steps(log_dir: pathlib.Path) -> list[int]:
  """The steps of the events in `log_dir`'s event files (a torn record at
  a file's end, from a crash mid-write, ends that file's reading)."""
  steps = []
  for path in sorted(log_dir.glob(_EVENTS_PREFIX + '*')):
    try:
      for record in tf.data.TFRecordDataset(str(path)):
        event = tf.compat.v1.Event.FromString(record.numpy())
        if event.HasField('summary') and event.summary.value:
          steps.append(int(event.step))
    except tf.errors.OpError:
      pass
  return steps


def released_rounds(output_dir: pathlib.Path) -> tuple[int, list[str]]:
  """`(last, files)`: the last round whose results the run folder holds
  (metrics.csv, TensorBoard and a finished run's summary.json: what the
  ledger covers), 0 if none, and the files that hold them."""
  last, files = 0, []
  csv_path = output_dir / 'metrics.csv'
  if csv_path.exists():
    with open(csv_path, newline='') as f:
      rounds = [int(float(r['round'])) for r in csv.DictReader(f)]
    if rounds:
      last = max(rounds)
      files.append(str(csv_path))
  steps = _tensorboard_steps(output_dir / 'tensorboard')
  if steps:
    last = max(last, max(steps))
    files.append(str(output_dir / 'tensorboard'))
  summary = output_dir / 'summary.json'
  if summary.exists():
    last = max(last, int(json.loads(summary.read_text())['rounds_completed']))
    files.append(str(summary))
  return last, files


def last_event_round(output_dir: pathlib.Path) -> int:
  """The last round of the run folder's TensorBoard events, 0 if none."""
  return max(_tensorboard_steps(output_dir / 'tensorboard'), default=0)


def checkpoint_dir(output_dir: pathlib.Path) -> pathlib.Path:
  """The run's checkpoint folder, `CHECKPOINT_DIR`, in a `SECRET_DIR` made
  owner-only; a run's `LEGACY_CHECKPOINT_DIR` (from before the secret
  folder) is moved there."""
  secret = output_dir / SECRET_DIR
  secret.mkdir(mode=0o700, exist_ok=True)
  secret.chmod(0o700)
  path = output_dir / CHECKPOINT_DIR
  legacy = output_dir / LEGACY_CHECKPOINT_DIR
  if legacy.is_dir() and not path.exists():
    os.replace(legacy, path)
    logging.info('Moved the checkpoints of %s to %s.', legacy, path)
  elif legacy.is_dir():
    logging.warning(
      '%s and %s both exist: resuming from the second; the first holds '
      'secret state, never publish it.',
      legacy,
      path,
    )
  if path.exists():
    protect(path)
  return path


def has_checkpoints(output_dir: pathlib.Path) -> bool:
  """Whether the run folder holds a checkpoint (readable or not)."""
  return any(
    p.name.startswith(CHECKPOINT_PREFIX)
    for d in (CHECKPOINT_DIR, LEGACY_CHECKPOINT_DIR)
    if (output_dir / d).is_dir()
    for p in (output_dir / d).iterdir()
  )


def protect(path: pathlib.Path) -> None:
  """Makes `path` and everything under it owner-only (folders 0700, files
  0600) and durable (each file and folder synced to disk)."""
  for root, _, files in os.walk(path, topdown=False):
    for name in files:
      file_path = os.path.join(root, name)
      os.chmod(file_path, 0o600)
      with open(file_path, 'rb') as f:
        os.fsync(f.fileno())
    os.chmod(root, 0o700)
    _fsync_dir(root)


def _fsync_dir(path) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def delete_secret(output_dir: pathlib.Path) -> None:
  """Deletes the run's secret state (`SECRET_DIR`, and a legacy
  `LEGACY_CHECKPOINT_DIR`) once the run has finished."""
  for name in (SECRET_DIR, LEGACY_CHECKPOINT_DIR):
    if (output_dir / name).exists():
      shutil.rmtree(output_dir / name)
      logging.info('Deleted the secret state in %s.', output_dir / name)


def finished_summary(
  output_dir: pathlib.Path, release_non_private: bool
) -> Optional[dict]:
  """What a finished run returns, if `output_dir` holds one whose secret
  state was deleted (its summary.json and no checkpoint), else None: it
  cannot be resumed, and running it again would release it again."""
  path = output_dir / 'summary.json'
  if not path.exists() or has_checkpoints(output_dir):
    return None
  summary = json.loads(path.read_text())
  extra = output_dir / NON_PRIVATE_DIR / 'summary.json'
  if release_non_private and extra.exists():
    summary.update(json.loads(extra.read_text()))
  return summary


def flatten(prefix: str, value, out: dict) -> None:
  if isinstance(value, dict):
    for k, v in value.items():
      flatten(f'{prefix}/{k}' if prefix else str(k), v, out)
  elif isinstance(value, (int, float, np.number)) or (
    isinstance(value, np.ndarray) and value.ndim == 0
  ):
    out[prefix] = float(value)


async def load_latest_readable(manager, structure, released: int = 0):
  """`(state, version)` of the newest checkpoint that loads, or `(None, 0)`.

  A checkpoint that fails to load is logged and skipped for the one before
  it. One of a round after `released` (the last round the run folder has
  released: a checkpoint torn while written, before its release) is also
  renamed to `corrupt_<name>`, so its version can be written again. One of
  a released round is left as it is: the run then refuses to go on
  (`training`), and a rerun once a passing cause (memory, a file system)
  is gone loads it again.
  """
  versions = await manager.get_versions() or []
  for version in sorted(versions, reverse=True):
    try:
      return await manager.load(version, structure), version
    except Exception as e:  # pylint: disable=broad-except
      path = pathlib.Path(manager._get_path_for_version(version))  # pylint: disable=protected-access
      logging.warning(
        'Checkpoint %s is unreadable (%s: %s); trying the previous one.',
        path,
        type(e).__name__,
        e,
      )
      if version > released:
        path.rename(path.with_name(f'corrupt_{path.name}'))
  return None, 0


def truncate_diagnostics(path: pathlib.Path, last_round: int) -> None:
  """Drops histogram lines of rounds after the restored checkpoint."""
  if not path.exists():
    return
  keep = [
    line
    for line in path.read_text().splitlines()
    if line and json.loads(line)['round'] <= last_round
  ]
  atomic_write(path, ''.join(line + '\n' for line in keep))


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


@dataclasses.dataclass
class RunnerState:
  """What is checkpointed besides the learning state."""

  round_num: int
  rng_state: dict
  ledger_json: Optional[str]
  rows: list
  # With --release_non_private_metrics only: the rows' other columns.
  non_private_rows: list = dataclasses.field(default_factory=list)

  def all_rows(self) -> list:
    """`rows` with `non_private_rows` merged in by round."""
    extra = {r['round']: r for r in self.non_private_rows}
    return [{**extra.get(r['round'], {}), **r} for r in self.rows]

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self))

  @classmethod
  def from_json(cls, text) -> 'RunnerState':
    if isinstance(text, bytes):
      text = text.decode()
    return cls(**json.loads(text))


def save_checkpoint(manager, state, runner: RunnerState) -> float:
  """Saves `(state, runner)` as version `runner.round_num`, owner-only and
  synced to disk (`protect`); returns seconds.

  TFF's `FileProgramStateManager` writes a SavedModel whose objects form
  reference cycles that hold the saved tensors, freed only by a full
  collection, rare in a process holding TF's hundreds of thousands of
  objects: saving the state of Guo et al.'s (CMP-Fed) CNN in a loop kept
  5-12 MB a save. A full collection after the save frees them (about
  0.2 s; `processes.collect_garbage`, which keeps a stop signal during it
  from being lost). In `make run`'s job it lowered Python's memory by
  about 60 MB but not its growth of about 1.6 MB a round
  (docs/performance.md, "Memory over long runs").
  """
  start = time.perf_counter()
  asyncio.run(
    manager.save((state, np.str_(runner.to_json())), runner.round_num)
  )
  # Owner-only and on disk before the rounds it covers are released.
  path = pathlib.Path(manager._get_path_for_version(runner.round_num))  # pylint: disable=protected-access
  protect(path)
  path.parent.chmod(0o700)
  _fsync_dir(path.parent)
  processes.collect_garbage()
  return time.perf_counter() - start


# What the ledger does not cover: written to NON_PRIVATE_DIR only with
# --release_non_private_metrics.
NON_PRIVATE_OUTPUTS = (
  'sampled_clients and empty_clients_skipped (the realised cohort size)',
  'train_loss and every client_work/* metric (cohort means of client '
  'values, no noise)',
  'update diagnostics: update_norm_*, fraction_clipped, angles, '
  'diagnostics.jsonl histograms (pre-clip client norms)',
  'non_finite_clients (a count of clients)',
  'round_seconds, data_wait_seconds, train_seconds, eval_seconds and the '
  "run's wall time (they depend on the cohort's size and data)",
  'bytes_down_total and bytes_up_total (the realised cohorts times the '
  'bytes per client)',
  'test metrics of tasks whose test examples belong to training clients '
  "(EMNIST's writers' held-out examples)",
  'every raw TFF measurement (tff/*)',
  "DPSFL's num_clients and DDGauss's actual_num_clients and released "
  'measurements',
  "CMP-Fed/UV-Fed's client_norms (the cohort's mean pre-clip norms of "
  'U_i, V_i and the biases, and the fraction each clip cut)',
)


_MEDICAL_TASKS = ('physionet2012', 'heart_disease')


def tuning_outside_ledger(config: ExperimentConfig, method) -> list[str]:
  """The run's choices made from client data outside the privacy ledger."""
  steps = []
  if config.clip_source:
    if config.method == 'cmp_fed':
      c1, c2 = config.options.clips(config.clip)
      clips = f'clips C1 {c1:.6g}, C2 {c2:.6g}'
    else:
      clips = f'clip {config.clip:.6g}'
    steps.append(f'{clips}: {config.clip_source}')
  if config.task in _MEDICAL_TASKS:
    steps.append(
      'feature standardisation, imputation means and the loss pos_weight '
      "are fitted on the pooled training data of all clients (the task's "
      'preprocessing)'
    )
  if method.setup is not None and config.method.startswith('fl_top'):
    public_set = (
      'patients held out of every client when the task is loaded'
      if config.task in _MEDICAL_TASKS
      else 'EMNIST digits stand in for the public set'
    )
    steps.append(
      "FL-TOP's Top-K mask is chosen on a server-held public batch "
      f'(not client data; {public_set})'
    )
  if config.clip_from_public_round:
    subset = (
      ', the median over random K-subsets'
      if config.method == 'fl_basic_dp'
      else ''
    )
    steps.append(
      'the clip (summary "clip") is the update norm of one local round on '
      f"the server's public batch{subset} (Kerkouche et al.'s rule; not "
      'client data)'
    )
  return steps


def _release_section(config, task) -> dict:
  """What the run folder holds beyond the ledger's coverage, if anything."""
  released = config.release_non_private_metrics
  test = (
    'not covered: the test examples belong to training clients, so test '
    'metrics go to non_private/ (written only with '
    '--release_non_private_metrics)'
    if task.test_held_by_clients
    else 'covered: test data held by no client (post-processing of the '
    'released model)'
  )
  return {
    'non_private_metrics_released': released,
    'non_private_dir': NON_PRIVATE_DIR if released else None,
    # Released (in non_private/) or withheld.
    'non_private_outputs': list(NON_PRIVATE_OUTPUTS),
    'test_metrics': test,
    'checkpoints': f"{CHECKPOINT_DIR}/ holds the server's secret state "
    '(the learning state, the ledger, the noise and client-sampling RNG) '
    'while the run goes, owner-only, deleted when it finishes unless '
    '--keep_checkpoints: never publish it',
  }


def privacy_section(
  config, task, method, sampling, ledger, noise_seed_clash=None, noise=None
) -> dict:
  """The summary's account of what the run's guarantee covers.

  Args:
    config: The run's config.
    task: The run's task (whether its test data belongs to clients).
    method: The run's method.
    sampling: The run's client sampling.
    ledger: The run's `privacy.PrivacyLedger`, None for a non-private one.
    noise_seed_clash: The run folder that used this noise seed for another
      configuration (`noise_seeds.check_and_register` with
      --allow_noise_seed_reuse), if any.
    noise: The run's `noise_plan.NoisePlan` (`--bands=auto`'s candidates).
  """
  if ledger is None:
    return {
      'private': False,
      'non_private_outputs': ['everything: the method adds no noise'],
      'tuning_outside_ledger': tuning_outside_ledger(config, method),
    }
  eps_rdp, eps_pld = ledger.epsilon() if ledger.rounds else (0.0, 0.0)
  relation = sampling.neighbouring_relation
  caveats = guarantee_caveats(
    ledger.assumptions(), noise_seed_clash, config.noise_seed is not None
  )
  section = {
    'private': True,
    'unit': "client-level: all of one client's data",
    'neighbouring_relation': relation,
    'event_accounted': privacy.event_to_dict(ledger.composed_event()),
    'delta': ledger.delta,
    'epsilon_rdp': eps_rdp,
    'epsilon_pld': eps_pld,
    # Why epsilon_pld is NaN (None where it is computed).
    'pld_unavailable_reason': ledger.pld_unavailable_reason(),
    # What the epsilon assumes beyond the recorded events.
    'assumptions': ledger.assumptions(),
    'noise_seed': noise_seed_status(config.noise_seed),
    'noise_seed_secret': config.noise_seed is None,
    'research_run': config.noise_seed is not None,
    'noise_seed_reused_in': noise_seed_clash,
    # As far as this run can tell when it ends: its noise seed is secret
    # (drawn from OS entropy) and was not reused before it, and its epsilon
    # needs no assumption beyond the events (else `guarantee_caveats`).
    'guarantee_holds': not caveats,
    'guarantee_caveats': caveats,
    'released': 'the model after each round (final_model_weights.npz, '
    'test metrics of it), epsilon and the bytes per client',
    **_release_section(config, task),
    'tuning_outside_ledger': tuning_outside_ledger(config, method)
    + _client_test_tuning(config, task),
  }
  # Why the epsilon itself is not rigorous (tables and plots mark such
  # a point); `guarantee_caveats` adds a given noise seed.
  section['guarantee_caveat'] = guarantee_caveat(
    section['assumptions'], noise_seed_clash
  )
  if sampling.cyclic:
    section['noise_across_rounds'] = noise_across_rounds(ledger, noise)
  return section


def guarantee_caveat(
  assumptions: list[str], noise_seed_clash: Optional[str] = None
) -> Optional[str]:
  """Why the run's epsilon is not a rigorous guarantee, in a sentence or
  two (the privacy section's `guarantee_caveat`); None when nothing in the
  run's events or noise seed registry says so.

  Args:
    assumptions: What the epsilon assumes beyond the recorded events
      (`PrivacyLedger.assumptions`).
    noise_seed_clash: The run folder that used the same noise seed for
      another configuration, if any.
  """
  return ' '.join(_epsilon_caveats(assumptions, noise_seed_clash)) or None


def guarantee_caveats(
  assumptions: list[str],
  noise_seed_clash: Optional[str] = None,
  noise_seed_given: bool = False,
) -> list[str]:
  """Every reason the run's guarantee may not hold (the privacy section's
  `guarantee_caveats`; `guarantee_holds` when empty): `guarantee_caveat`'s,
  and a noise seed given with --noise_seed, which the run cannot know to be
  secret.

  Args:
    assumptions: What the epsilon assumes beyond the recorded events.
    noise_seed_clash: The run folder that used the same noise seed for
      another configuration, if any.
    noise_seed_given: Whether --noise_seed was given (config.json, which is
      released, says so).
  """
  caveats = _epsilon_caveats(assumptions, noise_seed_clash)
  if noise_seed_given:
    caveats.append(
      'The noise seed was given with --noise_seed (config.json says so): '
      'the epsilon holds only while that value stays secret and unique, '
      'which the run cannot check. Whoever knows it (a published command '
      'names it, as every row in benchmarks/results does; a small value '
      'can be guessed) can regenerate the noise and the cohorts.'
    )
  return caveats


def _epsilon_caveats(assumptions, noise_seed_clash) -> list[str]:
  words = []
  if privacy.POISSON_COUNT_ASSUMPTION in assumptions:
    words.append(
      'Not rigorous: DDGauss under Poisson sampling. The epsilon assumes '
      "that the round's participant count stays hidden, but secure "
      'aggregation and the noise variance reveal it (privacy.assumptions); '
      'fixed-size sampling (--clients_per_round) is the rigorous choice.'
    )
  elif assumptions:
    words.append(
      'Rests on an assumption the ledger does not charge (privacy.assumptions).'
    )
  if noise_seed_clash is not None:
    words.append(
      f'The noise seed was used for another configuration in '
      f'{noise_seed_clash}: the two runs share noise, and neither epsilon '
      'holds.'
    )
  return words


def noise_across_rounds(ledger, noise=None) -> dict:
  """The summary's account of a cyclic run's noise: the strategy the ledger
  recorded, its participation schema and the sensitivity its event divides
  by (`tff_dp.privacy.correlated`), and `--bands=auto`'s candidates."""
  sampling = ledger.sampling
  out = {
    'participation': sampling.participation().to_dict(),
    # How the groups were dealt (`privacy.Sampling.partition`), which sets
    # the neighbouring relation the epsilon holds for.
    'partition': sampling.partition,
    'rounds': ledger.rounds,
  }
  if ledger.rounds:
    strategy, z = privacy.correlated_round(ledger.events[0])
    out.update(
      {
        'noise': 'iid' if strategy == mf_strategy.identity() else 'correlated',
        'strategy': strategy.to_dict(),
        'noise_multiplier': z,
        'sensitivity': privacy.mf_sensitivity(
          strategy, ledger.rounds, sampling.participation()
        ),
      }
    )
  if noise is not None and noise.choices:
    out['auto_bands_candidates'] = noise.to_dict()['auto_bands_candidates']
  return out


def _client_test_tuning(config, task) -> list[str]:
  """Test metrics on client-held examples, once released, are client
  data: a round or setting picked by them is tuned outside the ledger."""
  if not (task.test_held_by_clients and config.release_non_private_metrics):
    return []
  return [
    "test metrics (non_private/) are computed on the training clients' "
    'own held-out examples; choosing a round or a setting by them uses '
    'client data outside the ledger'
  ]


# The libraries whose versions a summary records: (module, distribution).
_VERSIONED = (
  ('tensorflow', 'tensorflow'),
  ('tensorflow_federated', 'tensorflow-federated'),
  ('tensorflow_privacy', 'tensorflow-privacy'),
  ('dp_accounting', 'dp-accounting'),
  ('numpy', 'numpy'),
  ('tff_dp', 'tff-dp'),
)


def library_versions() -> dict[str, Optional[str]]:
  """Python's version and each `_VERSIONED` library's: the imported
  module's `__version__`, else its installed distribution's, else None."""
  out = {'python': platform.python_version()}
  for module, distribution in _VERSIONED:
    version = getattr(sys.modules.get(module), '__version__', None)
    if version is None:
      try:
        version = importlib.metadata.version(distribution)
      except importlib.metadata.PackageNotFoundError:
        version = None
    out[module] = version
  return out


def source_dirs() -> list[str]:
  """The folders of the tff_dp distribution's packages as imported here
  (tff_dp, tff_dp.aggregators, tff_dp.tasks)."""
  import tff_dp  # pylint: disable=g-import-not-at-top
  from tff_dp import aggregators  # pylint: disable=g-import-not-at-top
  from tff_dp import tasks  # pylint: disable=g-import-not-at-top

  return sorted(
    {
      str(pathlib.Path(m.__file__).resolve().parent)
      for m in (tff_dp, aggregators, tasks)
    }
  )


def code_provenance(dirs: Optional[list[str]] = None) -> dict[str, Any]:
  """The git commit of the tff_dp source tree and whether it was dirty.

  Asks git about the folders the packages were imported from (`dirs`,
  default `source_dirs()`): the commit checked out there, and the paths in
  them that differ from it (modified, staged or untracked). Where they are
  not files a git checkout tracks (an installed package, a Bazel runfiles
  tree) or git cannot say, commit and dirty are None and
  `git_unavailable_reason` says why.
  """
  dirs = source_dirs() if dirs is None else list(dirs)
  out = {
    'source_dirs': dirs,
    'git_commit': None,
    'git_dirty': None,
    'git_dirty_paths': [],
    'git_unavailable_reason': None,
  }

  def git(*args) -> str:
    return subprocess.run(
      ['git', '-C', dirs[0], *args],
      capture_output=True,
      text=True,
      timeout=60,
      check=True,
    ).stdout

  try:
    # Fails outside a checkout, and for folders it does not track (a
    # package installed into an ignored virtualenv inside one).
    git('ls-files', '--error-unmatch', '--', *dirs)
    commit = git('rev-parse', 'HEAD').strip()
    status = git('status', '--porcelain', '--', *dirs).splitlines()
  except FileNotFoundError:
    out['git_unavailable_reason'] = 'git is not installed here'
  except subprocess.CalledProcessError as e:
    out['git_unavailable_reason'] = (
      f'{dirs[0]} is not in a git checkout that tracks it (an installed '
      f'package?): git said {e.stderr.strip()[:300]!r}'
    )
  except (OSError, subprocess.TimeoutExpired) as e:
    out['git_unavailable_reason'] = f'git failed: {type(e).__name__}: {e}'
  else:
    out['git_commit'] = commit
    out['git_dirty'] = bool(status)
    # At most 50 (path, porcelain status); git_dirty says whether any.
    out['git_dirty_paths'] = [line.strip() for line in status[:50]]
  return out


def run_provenance(task) -> tuple[dict[str, Any], dict[str, Optional[str]]]:
  """What a rerun needs to know besides the config: `(provenance,
  data_files_sha256)`.

  `provenance` (summary.json, private part): the code (`code_provenance`),
  the library versions (`library_versions`) and the data sources the task
  read (`FederatedTask.data_sources`: their kind, files and any cache).
  `data_files_sha256` (non_private/summary.json: a function of the
  clients' data, `NON_PRIVATE_SUMMARY_KEYS`): each source file's SHA-256,
  None where it can no longer be read. Each file is hashed once per process
  (`tasks.data_dir.file_sha256`).
  """
  from tff_dp.tasks import data_dir  # pylint: disable=g-import-not-at-top

  sources = list(getattr(task, 'data_sources', ()))
  hashes = {}
  for source in sources:
    for path in source.files:
      try:
        hashes[path] = data_dir.file_sha256(path)
      except OSError as e:
        logging.warning('Cannot hash data file %s: %s', path, e)
        hashes[path] = None
  data = {
    'sources': [s.to_dict() for s in sources],
    'sha256': 'data_files_sha256 in non_private/summary.json (a hash of '
    "the clients' data is not covered by the ledger)",
  }
  if not sources:
    data['sources_unknown_reason'] = (
      'the task was not built by tff_dp.tasks.load_task, which records '
      'what its loader read'
    )
  provenance = {
    'scope': 'this invocation (a resumed run: the rounds from '
    'first_round_this_invocation on)',
    'code': code_provenance(),
    'versions': library_versions(),
    'data': data,
  }
  return provenance, hashes


def save_model_weights(path: pathlib.Path, model_weights) -> None:
  """Writes `tff.learning.models.ModelWeights` as an .npz (atomic)."""
  arrays = {
    f'trainable_{i}': np.asarray(w)
    for i, w in enumerate(model_weights.trainable)
  }
  arrays.update(
    {
      f'non_trainable_{i}': np.asarray(w)
      for i, w in enumerate(model_weights.non_trainable)
    }
  )
  with tempfile.NamedTemporaryFile(
    dir=path.parent, suffix='.npz', delete=False
  ) as f:
    np.savez(f, **arrays)
  os.replace(f.name, path)


# Settings that act only under cyclic --participation.
_CYCLIC_ONLY = ('participation_groups', 'participation_partition')


def check_same_config(
  output_dir: pathlib.Path, config: ExperimentConfig
) -> None:
  saved = output_dir / 'config.json'
  if not saved.exists():
    return
  old = json.loads(saved.read_text())
  new = json.loads(json.dumps(config.to_dict()))
  # A flag added after the run started: the run had its legacy value where
  # the new default changed the behaviour, else its default.
  old = with_settings_added_since(old)
  # Settings this method does not take (another method's options, which a
  # saved config may record for every method) do not change it.
  old = {k: v for k, v in old.items() if k in new}
  # Nor do the cyclic modes' settings under independent participation (a
  # config saved before one existed reads its legacy value).
  if old.get('participation') == 'independent' == new.get('participation'):
    for key in _CYCLIC_ONLY:
      old.pop(key, None)
      new.pop(key, None)
  # Where and how fast it runs does not change the results.
  for key in EXECUTION_ONLY:
    old.pop(key, None)
    new.pop(key, None)
  if old != new:
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    hint = (
      ' (a run started before --release_non_private_metrics existed wrote '
      'every output: add --release_non_private_metrics to resume it)'
      if diff == ['release_non_private_metrics']
      and old['release_non_private_metrics']
      else ''
    )
    values = '; '.join(
      f'--{k}: {old.get(k, "unset")!r} there, {new.get(k, "unset")!r} now'
      for k in diff
    )
    raise ConfigError(
      f'{output_dir} holds a run with different flags ({values}); rerun '
      'the same command to resume, or choose a new --root_output_dir'
      f'{hint}.'
    )


def move_legacy_non_private(output_dir: pathlib.Path) -> None:
  """A run folder from before `NON_PRIVATE_DIR` existed, resumed with
  --release_non_private_metrics: its histograms join the other non-private
  outputs (and are truncated there with them on resume)."""
  legacy = output_dir / DIAGNOSTICS_FILE
  if legacy.exists():
    (output_dir / NON_PRIVATE_DIR).mkdir(exist_ok=True)
    os.replace(legacy, output_dir / NON_PRIVATE_DIR / DIAGNOSTICS_FILE)
