"""Where a run's results go (`RunFiles`): what the privacy ledger covers in
the run folder, the rest in `metrics_log.NON_PRIVATE_DIR` with
--release_non_private_metrics only, the update diagnostics' histograms
there (`DIAGNOSTICS_FILE`); and the final model weights
(`save_model_weights`).

Beside it in tff_dp.job: a round's row and metrics.csv (`metrics_log`),
the TensorBoard events (`events_file`), the checkpoints (`checkpoints`),
and summary.json's privacy section (`privacy_summary`) and provenance
(`provenance`).
"""

import json
import os
import pathlib
import tempfile
from typing import Optional

import numpy as np

from tff_dp.job import checkpoints
from tff_dp.job import events_file
from tff_dp.job import metrics_log


DIAGNOSTICS_FILE = 'diagnostics.jsonl'  # Per-round update histograms.


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
  # private part (`provenance`, `provenance.run_provenance`).
  'data_files_sha256',
)


class RunFiles:
  """Where a run's results go: what the ledger covers in the run folder,
  the rest in `metrics_log.NON_PRIVATE_DIR` with
  --release_non_private_metrics only.

  The run folder gets `metrics.csv`, `tensorboard/` and `summary.json` with
  `metrics_log.PRIVATE_COLUMNS` (and test metrics when no client holds the
  test data); `non_private/` gets the same three files with every other
  column, and `diagnostics.jsonl`. Without the flag nothing else is written
  anywhere. The run folder's rows are written once the checkpoint that
  covers them is on disk (`write_released`), `non_private/`'s every round.
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
      output_dir / metrics_log.NON_PRIVATE_DIR
      if output_dir is not None and self.release
      else None
    )
    # Taken now, before any round trains: the events' times.
    self._writers = {
      d: events_file.EventFile(d / 'tensorboard') for d in self._dirs()
    }

  def split(self, row: dict) -> tuple[dict, dict]:
    return metrics_log.split_row(row, self.test_private)

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
    """`metrics_log.NON_PRIVATE_DIR`'s files, each round: metrics.csv
    (rewritten), TensorBoard and histograms of `rows[-1]`. No epsilon
    covers them, so they are written before the round's checkpoint (a
    resumed run writes the rounds it trains again over them)."""
    d = self.non_private_dir
    if d is None:
      return
    metrics_log.write_csv(d / 'metrics.csv', [self.split(r)[1] for r in rows])
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
    metrics_log.write_csv(d / 'metrics.csv', [self.split(r)[0] for r in rows])

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
  ) -> 'checkpoints.RunnerState':
    """The checkpoint's runner state: the rows' non-private columns only
    when they are released, so the run folder holds none otherwise."""
    parts = [self.split(r) for r in rows]
    return checkpoints.RunnerState(
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
      metrics_log.atomic_write(d / 'summary.json', json.dumps(part, indent=2))


def truncate_diagnostics(path: pathlib.Path, last_round: int) -> None:
  """Drops histogram lines of rounds after the restored checkpoint."""
  if not path.exists():
    return
  keep = [
    line
    for line in path.read_text().splitlines()
    if line and json.loads(line)['round'] <= last_round
  ]
  metrics_log.atomic_write(path, ''.join(line + '\n' for line in keep))


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


def move_legacy_non_private(output_dir: pathlib.Path) -> None:
  """A run folder from before `metrics_log.NON_PRIVATE_DIR` existed,
  resumed with --release_non_private_metrics: its histograms join the other
  non-private outputs (and are truncated there with them on resume)."""
  legacy = output_dir / DIAGNOSTICS_FILE
  if legacy.exists():
    (output_dir / metrics_log.NON_PRIVATE_DIR).mkdir(exist_ok=True)
    os.replace(
      legacy, output_dir / metrics_log.NON_PRIVATE_DIR / DIAGNOSTICS_FILE
    )
