"""A trained round's finishing, after `process.next`: its DP event recorded in
the ledger and handed off (`hand_off`, on the main thread), its row made
(epsilon, bytes, test metrics, diagnostics) and its non-private files
written on one background thread while the next round trains
(`Finisher`, `finish_round`), then, on the main thread, its checkpoint
when due and only after it the release of the rounds that checkpoint
covers (`checkpoint_and_release`, `release`).
"""

import dataclasses
from typing import Any, Optional

import concurrent.futures

from absl import logging
import numpy as np

from tff_dp.aggregators import dp_events
from tff_dp.client_works import diagnostics
from tff_dp import privacy
from tff_dp.runtime import processes
from tff_dp.job import checkpoints
from tff_dp.job import metrics_log
from tff_dp.job.experiment_config import ExperimentConfig


@dataclasses.dataclass
class _Finished:
  """What a round hands to its finishing step (`finish_round`): its
  output, and what the main thread read before the next round started."""

  round_num: int
  output: Any
  row: dict
  totals: dict
  rng_state_after_round: Any
  # The ledger's composed event and JSON after this round (private runs).
  event: Optional[Any]
  ledger_json: Optional[str]
  # On evaluation rounds, the future of the test metrics and their seconds.
  evaluation: Optional[concurrent.futures.Future]


# Finish rounds (epsilon, diagnostics, the row) on one background thread
# while the next round trains. What runs there is Python and NumPy only
# (dp_accounting, and waiting for the evaluator's result); checkpoints,
# which run TF, and the release of the rounds they cover stay on the main
# thread, and evaluation runs in the evaluator (a child process by
# default). With Keras' evaluation and TFF's checkpoint on the finishing
# thread, a fresh-clone CI run saw one `python -m tff_dp.run` segfault
# (exit -11).
BACKGROUND_FINISH = True


class Finisher:
  """Finishes each round (epsilon, its row) on one background thread while
  the next round trains, one round deep; the main thread's part (the
  checkpoint when due, then the release of the rounds it covers) runs once
  the round's row is made.

  The TF and TFF calls (the round, reading the weights to evaluate, the
  checkpoint) stay on the main thread; what the finishing step reads is
  handed to it, so the numbers and files are those of finishing each round
  before the next.
  `round_callback(t)` runs once round t is finished (its row made, and
  when due its checkpoint written and its rounds released).
  """

  def __init__(self, round_callback):
    self._pool = concurrent.futures.ThreadPoolExecutor(1)
    self._pending = None
    self._callback = round_callback

  def submit(self, fn, round_num: int, then=None) -> None:
    """Runs `fn` (in the background) and then `then` (on this thread)."""
    self.wait()
    if BACKGROUND_FINISH:
      self._pending = (self._pool.submit(fn), round_num, then)
      return
    fn()
    self._pending = (None, round_num, then)
    self.wait()

  def wait(self) -> None:
    """Blocks until the round in flight is finished (re-raising its error)."""
    if self._pending is None:
      return
    future, round_num, then = self._pending
    self._pending = None
    if future is not None:
      future.result()
    if then is not None:
      then()
    # Freed native buffers back to the OS (processes.release_free_memory;
    # the performance notes' "Memory over long runs" say what it did and
    # did not fix).
    processes.release_free_memory()
    if self._callback is not None:
      self._callback(round_num)

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._pool.shutdown(wait=True)


def hand_off(config, prepared, progress, output, row, totals) -> _Finished:
  """The main thread's part of a round's results: the DP event recorded in
  the ledger (and its JSON when a checkpoint is due)."""
  round_num = row['round']
  event = ledger_json = None
  if prepared.method.private:
    progress.ledger.record(
      dp_events.released_event(
        prepared.aggregator,
        output.state.aggregator,
        output.metrics['aggregator'],
      )
    )
    event = progress.ledger.composed_event()
    if checkpoint_due(config, round_num) and progress.manager is not None:
      ledger_json = progress.ledger.to_json()
  return _Finished(
    round_num, output, row, dict(totals), None, event, ledger_json, None
  )


def checkpoint_due(config, round_num: int) -> bool:
  return round_num % config.checkpoint_every == 0 or round_num == config.rounds


def finish_round(config, prepared, progress, job, timings):
  """A round's results in its row, held for release; its non-private
  files written (on the finishing thread)."""
  hists = _round_results(config, prepared, progress, job)
  job.row.update(timings)
  progress.rows.append(job.row)
  progress.pending.append(job.row)
  progress.files.write_non_private(progress.rows, hists)
  if (
    not progress.pld_reason_logged
    and 'epsilon_pld' in job.row
    and np.isnan(job.row['epsilon_pld'])
  ):
    progress.pld_reason_logged = True
    logging.info(
      'No PLD epsilon for this run (the progress lines show eps_rdp only): '
      '%s',
      privacy.pld_unavailable_reason(job.event, progress.ledger.sampling),
    )


def _round_results(config, prepared, progress, job):
  """Adds the round's results to its row (in the columns' order); returns
  the diagnostics' histograms."""
  round_num, cost, method = job.round_num, prepared.cost, prepared.method
  output, row, totals = job.output, job.row, job.totals
  metrics: dict = {}
  metrics_log.flatten('', output.metrics, metrics)
  row.update(
    {
      'train_loss': metrics.get('client_work/train/loss', float('nan')),
      'bytes_down_per_client': cost.down,
      'bytes_up_per_client': cost.up,
      'bytes_down_total': totals['down'],
      'bytes_up_total': totals['up'],
    }
  )
  if config.client_lr_decay != 1.0:
    row['client_lr'] = client_lr_at(config, round_num)
  if method.private:
    # The ledger's epsilon after this round (`PrivacyLedger.epsilon`).
    ledger = progress.ledger
    row['epsilon_rdp'], row['epsilon_pld'] = privacy.epsilon_of(
      job.event, ledger.sampling, ledger.delta
    )
    row['noise_multiplier'] = prepared.params.noise_multiplier
  released = dp_events.released_values(output.metrics['aggregator'])
  if released.clip is not None or method.private:
    row['clip'] = (
      released.clip if released.clip is not None else prepared.params.clip
    )
  # DP (charged to the round's event): --fraction_clipped_stddev.
  if released.dp_fraction_clipped is not None:
    row['dp_fraction_clipped'] = released.dp_fraction_clipped
  if job.evaluation is not None:
    row.update(job.evaluation.result())
  extra = output.metrics.get('client_work', {}).get('extra', {})
  vectors = {diagnostics.PREFIX + k: np.asarray(v) for k, v in extra.items()}
  row.update(diagnostics.summarize({**metrics, **vectors}))
  if 'aggregator/non_finite_clients' in metrics:
    row['non_finite_clients'] = metrics['aggregator/non_finite_clients']
  row.update({f'tff/{k}': v for k, v in metrics.items()})
  return diagnostics.histograms(vectors)


def release(config, progress) -> None:
  """The pending rounds released: their progress lines logged, their rows
  written to the run folder."""
  files = progress.files
  for row in progress.pending:
    logging.info(
      '%s', metrics_log.progress_line(files.shown(row), config.rounds)
    )
  files.write_released(progress.rows, progress.pending)
  progress.pending = []


def checkpoint_and_release(config, progress, job) -> None:
  """When due, the checkpoint of `job`'s round, then the release of the
  rounds it covers (on the main thread, after the round's row is made);
  without an output directory, each round is released at once."""
  due = checkpoint_due(config, job.round_num)
  if progress.manager is not None and not due:
    logging.info(
      'Round %d/%d trained; released with the checkpoint of round %d.',
      job.round_num,
      config.rounds,
      min(
        config.rounds,
        (job.round_num // config.checkpoint_every + 1)
        * config.checkpoint_every,
      ),
    )
    return
  if progress.manager is not None:
    files = progress.files
    runner = files.runner_state(
      job.round_num, job.rng_state_after_round, job.ledger_json, progress.rows
    )
    seconds = checkpoints.save_checkpoint(
      progress.manager, job.output.state, runner
    )
    logging.info(
      'Checkpoint of round %d written%s',
      job.round_num,
      f' in {seconds:.1f} s' if files.release else '',
    )
  release(config, progress)


def client_lr_at(config: ExperimentConfig, round_num: int) -> float:
  """Round `round_num`'s (1-based) client lr: client_lr x decay^(t - 1)."""
  return config.client_lr * config.client_lr_decay ** (round_num - 1)
