"""A run's outputs: metrics.csv, progress lines, diagnostics, checkpoints
(with the runner state), summary.json's privacy section and final weights."""

import csv
import dataclasses
import json
import os
import pathlib
import tempfile
import time
from typing import Optional

import asyncio

from absl import logging
import numpy as np

from tff_dp import methods as methods_lib
from tff_dp import privacy
from tff_dp.experiment_config import ExperimentConfig
from tff_dp.experiment_config import noise_seed_status
from tff_dp import processes

CHECKPOINT_PREFIX = 'round_'


DIAGNOSTICS_FILE = 'diagnostics.jsonl'  # Per-round update histograms.


def flatten(prefix: str, value, out: dict) -> None:
  if isinstance(value, dict):
    for k, v in value.items():
      flatten(f'{prefix}/{k}' if prefix else str(k), v, out)
  elif isinstance(value, (int, float, np.number)) or (
    isinstance(value, np.ndarray) and value.ndim == 0
  ):
    out[prefix] = float(value)


async def load_latest_readable(manager, structure):
  """`(state, version)` of the newest checkpoint that loads, or `(None, 0)`.

  A checkpoint that fails to load (truncated or corrupt files) is logged,
  renamed to `corrupt_<name>` (so its version can be written again) and
  skipped for the one before it.
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
  parts = [
    f'round {row["round"]}/{rounds}',
    f'clients {row["sampled_clients"]}',
    f'train_loss {row.get("train_loss", float("nan")):.4f}',
  ]
  for k in ('test_accuracy', 'test_auroc', 'test_balanced_accuracy'):
    if k in row:
      parts.append(f'{k[5:]} {row[k]:.4f}')
  if 'epsilon_rdp' in row:
    parts.append(
      f'eps_rdp {row["epsilon_rdp"]:.3f} ' f'eps_pld {row["epsilon_pld"]:.3f}'
    )
  parts.append(f'up {row["bytes_up_total"] / 1e6:.1f} MB total')
  parts.append(f'{row["round_seconds"]:.1f}s')
  return ' | '.join(parts)


@dataclasses.dataclass
class RunnerState:
  """What is checkpointed besides the learning state."""

  round_num: int
  rng_state: dict
  ledger_json: Optional[str]
  rows: list

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self))

  @classmethod
  def from_json(cls, text) -> 'RunnerState':
    if isinstance(text, bytes):
      text = text.decode()
    return cls(**json.loads(text))


def save_checkpoint(manager, state, runner: RunnerState) -> float:
  """Saves `(state, runner)` as version `runner.round_num`; returns seconds.

  TFF's `FileProgramStateManager` writes a SavedModel whose objects form
  reference cycles that hold the saved tensors, freed only by a full
  collection, rare in a process holding TF's hundreds of thousands of
  objects: saving the seed 001 CNN's state in a loop kept 5-12 MB a save.
  A full collection after the save frees them (about 0.2 s;
  `processes.collect_garbage`, which keeps a stop signal during it from
  being lost). In `make run`'s job it lowered Python's memory by about
  60 MB but not its growth of about 1.6 MB a round (README, "Memory over
  long runs").
  """
  start = time.perf_counter()
  asyncio.run(
    manager.save((state, np.str_(runner.to_json())), runner.round_num)
  )
  processes.collect_garbage()
  return time.perf_counter() - start


# What a run writes that is not covered by the ledger's guarantee.
NON_PRIVATE_OUTPUTS = (
  'sampled_clients and empty_clients_skipped (the realised cohort size)',
  'train_loss and every client_work/* metric (cohort means of client '
  'values, no noise)',
  'update diagnostics: update_norm_*, fraction_clipped, angles, '
  'diagnostics.jsonl histograms (pre-clip client norms)',
  'non_finite_clients (a count of clients)',
  'round_seconds, data_wait_seconds, train_seconds, eval_seconds (they '
  "depend on the cohort's size and data)",
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
      f"the server's public batch{subset} (seed 004's rule; not client data)"
    )
  return steps


def privacy_section(config, task, method, sampling, ledger) -> dict:
  """The summary's account of what the run's guarantee covers."""
  del task
  if ledger is None:
    return {
      'private': False,
      'non_private_outputs': ['everything: the method adds no noise'],
      'tuning_outside_ledger': tuning_outside_ledger(config, method),
    }
  eps_rdp, eps_pld = ledger.epsilon() if ledger.rounds else (0.0, 0.0)
  relation = (
    'add/remove one client (Poisson sampling)'
    if sampling.mode == 'poisson'
    else 'replace one client (fixed-size sampling; sensitivity 2 x clip)'
  )
  return {
    'private': True,
    'unit': "client-level: all of one client's data",
    'neighbouring_relation': relation,
    'event_accounted': privacy.event_to_dict(ledger.composed_event()),
    'delta': ledger.delta,
    'epsilon_rdp': eps_rdp,
    'epsilon_pld': eps_pld,
    'noise_seed': noise_seed_status(config.noise_seed),
    'noise_seed_secret': config.noise_seed is None,
    'released': 'the model after each round (final_model_weights.npz, '
    'test metrics and checkpoints of it)',
    'non_private_outputs': list(NON_PRIVATE_OUTPUTS),
    'tuning_outside_ledger': tuning_outside_ledger(config, method),
  }


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


_EXECUTION_ONLY = (
  'fuse_client_work',
  'workers',
  'local_workers',
  'max_concurrent_computation_calls',
  'intra_op_threads',
  'inter_op_threads',
)


def check_same_config(
  output_dir: pathlib.Path, config: ExperimentConfig
) -> None:
  saved = output_dir / 'config.json'
  if not saved.exists():
    return
  old = json.loads(saved.read_text())
  new = json.loads(json.dumps(config.to_dict()))
  # A flag added after the run started: the run had its legacy value where
  # the new default changed the behaviour, else its default (see
  # methods.LEGACY_DEFAULTS).
  defaults = json.loads(
    json.dumps(ExperimentConfig(method=config.method).to_dict())
  )
  legacy = json.loads(json.dumps(methods_lib.LEGACY_DEFAULTS))
  for name, value in defaults.items():
    old.setdefault(name, legacy.get(name, value))
  # Settings this method does not take (another method's options, which
  # configs before issue #26 recorded for every run) do not change it.
  old = {k: v for k, v in old.items() if k in new}
  # Where and how fast it runs does not change the results.
  for key in _EXECUTION_ONLY:
    old.pop(key, None)
    new.pop(key, None)
  if old != new:
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    raise ValueError(
      f'{output_dir} holds a run with different flags ({", ".join(diff)}); '
      'rerun the same command to resume, or choose a new root_output_dir.'
    )
