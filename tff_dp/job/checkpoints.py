"""A run's checkpoints and what a resume checks.

The checkpoints hold the learning state with the runner's state
(`RunnerState`: the ledger, the sampler's RNG, the rows) in the run
folder's owner-only secret folder (`SECRET_DIR`, `checkpoint_dir`), each
synced to disk before the rounds it covers are released
(`save_checkpoint`), and deleted once the run finishes (`delete_secret`).
A resume loads the newest readable one (`load_latest_readable`), checks it
covers every round the folder has released (`released_rounds`) and that
the folder holds the same run (`check_same_config`); a finished run is not
run again (`finished_summary`).
"""

import csv
import dataclasses
import json
import os
import pathlib
import shutil
import time
from typing import Optional
import asyncio

from absl import logging
import numpy as np

from tff_dp.job.experiment_config import ConfigError
from tff_dp.job.experiment_config import EXECUTION_ONLY
from tff_dp.job.experiment_config import ExperimentConfig
from tff_dp.job.experiment_config import with_settings_added_since
from tff_dp.methods import linear_compression
from tff_dp.runtime import processes
from tff_dp.job import events_file
from tff_dp.job import metrics_log


CHECKPOINT_PREFIX = 'round_'
# The run folder's secret state, never released: owner-only (0700, its
# files 0600), deleted when the run finishes unless --keep_checkpoints.
SECRET_DIR = 'secret'
CHECKPOINT_DIR = f'{SECRET_DIR}/checkpoints'
# Where runs kept their checkpoints before SECRET_DIR (moved on resume).
LEGACY_CHECKPOINT_DIR = 'checkpoints'


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
  steps = events_file.tensorboard_steps(output_dir / 'tensorboard')
  if steps:
    last = max(last, max(steps))
    files.append(str(output_dir / 'tensorboard'))
  summary = output_dir / 'summary.json'
  if summary.exists():
    last = max(last, int(json.loads(summary.read_text())['rounds_completed']))
    files.append(str(summary))
  return last, files


def check_released(output_dir, restored: int) -> None:
  """Raises ConfigError if the folder holds rounds after `restored`, the
  round of the checkpoint the run resumes from (0: none)."""
  released, files = released_rounds(output_dir)
  if released <= restored:
    return
  rounds = (
    f'round {released}'
    if released == restored + 1
    else f'rounds {restored + 1}-{released}'
  )
  found = (
    f'the newest readable checkpoint is of round {restored}'
    if restored
    else 'it has no readable checkpoint'
  )
  raise ConfigError(
    f'{output_dir} holds released results of {rounds} ({", ".join(files)}), '
    f'but {found} ({output_dir / CHECKPOINT_DIR}). Training '
    f'{"it" if released == restored + 1 else "them"} again would release '
    'new results of the same rounds with fresh noise, which the privacy '
    "ledger would not charge. Keep this folder's files as that run's "
    'results, and start the run again in a new --root_output_dir.'
  )


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
  extra = output_dir / metrics_log.NON_PRIVATE_DIR / 'summary.json'
  if release_non_private and extra.exists():
    summary.update(json.loads(extra.read_text()))
  return summary


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
  # Nor do the compression settings without --compression (a config
  # saved before a default changed records the old one).
  off = linear_compression.NONE
  if old.get('compression', off) == off == new.get('compression', off):
    for key in linear_compression.SETTINGS_WITH_COMPRESSION:
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
