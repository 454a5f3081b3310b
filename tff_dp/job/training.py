"""The federated training loop behind `python -m tff_dp.run` (flag-free).

`run_experiment(config)`:
  1. validates the config and the output directory (before any data loads);
  2. loads the task, samples clients (Poisson or fixed-size, seeded),
     calibrates the noise to a target epsilon if asked;
  3. builds the method's learning process and runs it in TFF's C++ test
     context (secure sum simulated);
  4. after every round records the DP event that ran in the privacy ledger,
     evaluates (by default in a child process beside training,
     `evaluation.Evaluator`), counts bytes and computes the round's row;
     every `checkpoint_every` rounds (and the last) saves the learning
     state with the ledger, the sampler's RNG state and the rows
     (`tff.program.FileProgramStateManager`, in the run folder's
     owner-only `secret/checkpoints/`), and only once that checkpoint is
     on disk releases its rounds: their rows in `metrics.csv`, TensorBoard
     and the progress log (`round_finishing`);
  5. writes `summary.json` with every setting the run used (the method's
     options included), the final results and the run's provenance (the
     git commit of the source tree and whether it was dirty, the library
     versions, the data files read; `provenance.run_provenance`), and the
     final model weights to `final_model_weights.npz`, and deletes the
     secret folder unless `keep_checkpoints`.

What is written is only what the ledger covers (`run_files.RunFiles`):
settings, epsilon, bytes per client, the model and test metrics on data no
client holds. Cohort sizes, train loss, update diagnostics, timings, byte
totals and raw TFF measurements go to `non_private/` only with
`release_non_private_metrics` (the summary's privacy section says which).
A `noise_seed` used for another configuration in the same output tree is
refused before any work (`noise_seeds`).

A rerun of the same command in the same output directory resumes from the
last checkpoint, ledger and RNG included, so epsilon never resets and the
result equals an uninterrupted run. No round is released twice: a folder
whose released rounds no readable checkpoint covers (a corrupt or deleted
checkpoint) is refused, and a finished run whose secret folder was deleted
is not run again (its summary is returned).

Randomness: `seed` drives only public randomness (model initialisation,
sketch hashes, DP-RandAgg and FL-BASIC coordinates, CMP-Fed's V_0). The
privacy-relevant randomness, the DP noise and the client sampler (with the
local shuffles it seeds), comes from `noise_seed`: None (the default) draws
it from OS entropy, and it then lives only in the checkpointed server state,
never in config.json, summary.json, metrics.csv, TensorBoard or the logs.
An int `noise_seed` makes the run reproducible; the guarantee then assumes
that seed is kept secret (the summary says so).
"""

import dataclasses
import functools
import json
import time
from typing import Any, Callable, Optional

import asyncio
import concurrent.futures

from absl import logging
import numpy as np
import tensorflow_federated as tff

from tff_dp.runtime import composition
from tff_dp.aggregators import dp_events
from tff_dp.runtime import distributed
from tff_dp.runtime import evaluation
from tff_dp.methods import options as options_lib
from tff_dp.job import noise_seeds
from tff_dp import privacy
from tff_dp.job import experiment_config
from tff_dp.job import checkpoints
from tff_dp.job import events_file
from tff_dp.job import metrics_log
from tff_dp.job import privacy_summary
from tff_dp.job import public_pretrain
from tff_dp.job import provenance as provenance_lib
from tff_dp.job import round_finishing
from tff_dp.job import run_files

# run_experiment's config, as `training.ExperimentConfig` for its callers.
from tff_dp.job.experiment_config import ExperimentConfig  # noqa: F401 (API)

# By name: the round loop's local `sampling` is the run's Sampling.
from tff_dp.job.cohorts import sample_clients

# The run's process, as `training.prepare` for its callers.
from tff_dp.job.preparation import prepare  # noqa: F401 (API)
from tff_dp.job.preparation import Prepared  # noqa: F401 (API)


# The events of the TFF DP states nested in an aggregator state (the
# public reader, `tff_dp.aggregators.dp_events`).
find_dp_events = dp_events.events_in_state


# A run refused before training (`experiment_config.ConfigError`).
ConfigError = experiment_config.ConfigError


@dataclasses.dataclass(frozen=True)
class ClipProbe:
  """The runner's clip tuning step (Zhang et al.'s choice of the clip).

  With `clip_from_fedavg_rounds` > 0, the clip is replaced by
  `clip_fraction` of the mean update norm of that many rounds of
  non-private FedAvg, run first (`clip_from_fedavg`; outside the ledger).
  """

  clip_from_fedavg_rounds: int = options_lib.option(
    0,
    'If > 0: set --clip to --clip_fraction of the average update norm of '
    'this many rounds of non-private FedAvg first (Zhang et al. 2022; a '
    'tuning step outside the privacy ledger).',
    check=options_lib.integer(0),
  )
  clip_fraction: float = options_lib.option(
    0.5,
    'Fraction of the FedAvg update norm, in (0, 1].',
    check=options_lib.interval(0, 1, '(]'),
  )

  def __post_init__(self):
    options_lib.check_fields(self)


@dataclasses.dataclass
class _Progress:
  """A run's state between rounds: what a checkpoint restores."""

  state: Any
  rng: np.random.Generator
  ledger: Optional[privacy.PrivacyLedger]
  rows: list
  start_round: int
  files: run_files.RunFiles
  manager: Any
  # Rows of rounds finished but not yet released: written to the run
  # folder once the checkpoint that covers them is on disk.
  pending: list = dataclasses.field(default_factory=list)
  # Whether the reason for a NaN epsilon_pld has been logged.
  pld_reason_logged: bool = False


def run_experiment(
  config: ExperimentConfig,
  *,
  clip_probe: Optional[ClipProbe] = None,
  round_callback: Optional[Callable[[int], None]] = None,
  rows_out: Optional[list] = None,
) -> dict[str, Any]:
  """Runs (or resumes) a federated training job; returns the summary.

  Args:
    config: The run's configuration.
    clip_probe: If it asks for rounds, the clip is first tuned on
      non-private FedAvg (`ClipProbe`, `clip_from_fedavg`).
    round_callback: Called with the round number after each round is
      finished (when due, its checkpoint written and its rounds released;
      tests use it to interrupt a run).
    rows_out: If given, the per-round result rows are appended to it, every
      column (non-private ones included: an in-process caller's choice).

  Returns:
    What `summary.json` holds (`run_files.RunFiles.returned_summary`): with
    `release_non_private_metrics`, the non-private part merged in.

  Raises:
    ConfigError: (a ValueError) On an invalid config or output directory,
      before any data loads; on an output directory holding released
      rounds that no readable checkpoint covers, before training.
    ValueError: On a noise seed used for another configuration in the
      same output tree, or an output directory holding another run, before
      training.
  """
  config, output_dir = _checked(config, clip_probe)
  if output_dir is not None:
    checkpoints.check_same_config(output_dir, config)
    finished = checkpoints.finished_summary(
      output_dir, config.release_non_private_metrics
    )
    if finished is not None:
      logging.info(
        '%s holds this run, finished (its summary.json; its secret state '
        'deleted): nothing to run. Choose a new --root_output_dir to run '
        'it again.',
        output_dir,
      )
      return finished
  # Before any work: a seed used for another configuration is refused.
  seed_clash = noise_seeds.check_and_register(
    output_dir,
    config.noise_seed,
    config.to_dict(),
    allow_reuse=config.allow_noise_seed_reuse,
  )
  prepared = prepare(config)
  # What this invocation runs and reads, taken before it trains (the
  # summary's `provenance` and `data_files_sha256`).
  provenance = provenance_lib.run_provenance(prepared.task)
  progress = _restore(config, prepared, output_dir)
  start = time.perf_counter()
  totals = _train(config, prepared, progress, round_callback)
  if rows_out is not None:
    rows_out.extend(progress.rows)
  summary = _summary(config, prepared, progress, seed_clash, totals)
  summary['provenance'], summary['data_files_sha256'] = provenance
  summary['wall_seconds_this_invocation'] = time.perf_counter() - start
  if output_dir is not None:
    run_files.save_model_weights(
      output_dir / 'final_model_weights.npz',
      model_weights(prepared.process, progress.state),
    )
    progress.files.write_summary(summary)
    if not config.keep_checkpoints:
      checkpoints.delete_secret(output_dir)
  if config.local_workers:
    distributed.stop_local_workers()
  return progress.files.returned_summary(summary)


def _checked(config: ExperimentConfig, clip_probe: Optional[ClipProbe]):
  """The config to run (the clip tuned if `clip_probe` asks) and its
  output directory, checked once; raises ConfigError."""
  try:
    config.validate()
    output_dir = experiment_config.check_output_dir(config.output_dir)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  if clip_probe is not None and clip_probe.clip_from_fedavg_rounds:
    rounds = clip_probe.clip_from_fedavg_rounds
    fraction = clip_probe.clip_fraction
    try:
      clip = clip_from_fedavg(config, rounds, fraction)
    except ValueError as e:
      raise ConfigError(str(e)) from e
    logging.info(
      'clip = %g x FedAvg mean update norm over %d rounds = %.6g',
      fraction,
      rounds,
      clip,
    )
    config = dataclasses.replace(
      config,
      clip=clip,
      clip_source=(
        f'{fraction:g} x the mean update norm of {rounds} rounds of '
        'non-private FedAvg on client data (--clip_from_fedavg_rounds; '
        'outside the privacy ledger)'
      ),
    )
  return config, output_dir


def _restore(config, prepared, output_dir) -> _Progress:
  """The run's starting point: its last readable checkpoint, or round 1."""
  task, method = prepared.task, prepared.method
  progress = _Progress(
    state=prepared.process.initialize(),
    # Privacy-relevant: the cohort (and the local shuffles). OS entropy
    # unless --noise_seed; its state is checkpointed, never logged.
    rng=np.random.default_rng(config.noise_seed),
    ledger=privacy.PrivacyLedger(prepared.sampling, prepared.delta)
    if method.private
    else None,
    rows=[],
    start_round=1,
    files=run_files.RunFiles(
      output_dir,
      config.release_non_private_metrics,
      test_private=not task.test_held_by_clients,
    ),
    manager=None,
  )
  if output_dir is None:
    return progress
  # The two latest checkpoints: if the newest is unreadable (a crash while
  # writing it, before its rounds were released), the previous one is used.
  progress.manager = tff.program.FileProgramStateManager(
    str(checkpoints.checkpoint_dir(output_dir)),
    prefix=checkpoints.CHECKPOINT_PREFIX,
    keep_total=2,
    keep_first=False,
  )
  released, _ = checkpoints.released_rounds(output_dir)
  restored, version = asyncio.run(
    checkpoints.load_latest_readable(
      progress.manager, (progress.state, np.str_('')), released
    )
  )
  # Before anything in the folder changes.
  checkpoints.check_released(output_dir, version)
  if restored is not None and version > 0:
    progress.state, runner_json = restored
    runner = checkpoints.RunnerState.from_json(runner_json)
    progress.rng.bit_generator.state = runner.rng_state
    progress.rows = runner.all_rows()
    if progress.ledger is not None:
      progress.ledger = privacy.PrivacyLedger.from_json(runner.ledger_json)
      if progress.ledger.sampling != prepared.sampling:
        raise ValueError(
          f'{output_dir} holds a run accounted under sampling '
          f'{progress.ledger.sampling.to_dict()}, not '
          f'{prepared.sampling.to_dict()}: rerun the same command to '
          'resume, or choose a new root_output_dir.'
        )
    progress.start_round = runner.round_num + 1
    if progress.files.diagnostics_path is not None:
      run_files.move_legacy_non_private(output_dir)
      run_files.truncate_diagnostics(
        progress.files.diagnostics_path, runner.round_num
      )
    logging.info(
      'Resumed from checkpoint of round %d in %s', version, output_dir
    )
  metrics_log.atomic_write(
    output_dir / 'config.json', json.dumps(config.to_dict(), indent=2)
  )
  # Rounds checkpointed but not yet released (a stop between the two, or
  # inside the release, after the events and before metrics.csv): the
  # events the folder lacks, and metrics.csv rewritten with every row.
  events_last = events_file.last_event_round(output_dir)
  progress.pending = [r for r in progress.rows if r['round'] > events_last]
  round_finishing.release(config, progress)
  return progress


class _Cohorts:
  """Draws each round's cohort and builds its datasets one round ahead.

  The next round's cohort is drawn, and its datasets built on a background
  thread, while the current round runs; the RNG state saved with a
  checkpoint is the one before that draw, so a resumed run draws the same.
  """

  def __init__(
    self, config, prepared, rng: np.random.Generator, start_round: int
  ):
    self._config, self._prepared, self._rng = config, prepared, rng
    # The round the next draw is for (the cyclic modes' group).
    self._round = start_round
    cd = prepared.task.train_data
    self._client_ids = cd.client_ids
    self._empty = {
      c for c, n in zip(cd.client_ids, cd.client_sizes()) if int(n) == 0
    }
    self._pool = concurrent.futures.ThreadPoolExecutor(1)

  def draw(self):
    """`(rng_state_before, ids, datasets_future, num_empty_skipped)`."""
    rng_state = self._rng.bit_generator.state
    sampled = sample_clients(
      self._prepared.sampling,
      self._client_ids,
      self._rng,
      round_num=self._round,
      partition_seed=self._config.seed,
    )
    self._round += 1
    seed = int(self._rng.integers(2**31 - 1))
    # A sampled client without data contributes nothing: skipped, counted.
    ids = [c for c in sampled if c not in self._empty]
    return (
      rng_state,
      ids,
      self._pool.submit(self._prepared.round_data, self._config, ids, seed),
      len(sampled) - len(ids),
    )

  def close(self):
    self._pool.shutdown(wait=True)


def _train(config, prepared, progress, round_callback) -> dict:
  """Runs the rounds from `progress.start_round`; returns the byte totals."""
  rows = progress.rows
  # Non-private (the realised cohorts): checkpointed only when released.
  totals = {'down': 0, 'up': 0}
  if rows:
    totals = {
      'down': rows[-1].get('bytes_down_total', 0),
      'up': rows[-1].get('bytes_up_total', 0),
    }
  evaluator = evaluation.Evaluator(
    prepared.task, in_process=not config.background_evaluation
  )
  cohorts = _Cohorts(config, prepared, progress.rng, progress.start_round)
  finisher = round_finishing.Finisher(round_callback)
  upcoming = cohorts.draw() if progress.start_round <= config.rounds else None
  try:
    for round_num in range(progress.start_round, config.rounds + 1):
      t0 = time.perf_counter()
      _, ids, data_future, num_empty = upcoming
      data = data_future.result()
      data_wait = time.perf_counter() - t0
      upcoming = cohorts.draw() if round_num < config.rounds else None
      rng_state = upcoming[0] if upcoming else progress.rng.bit_generator.state
      t_train = time.perf_counter()
      output = _next_round(config, prepared, progress, round_num, data)
      train_seconds = time.perf_counter() - t_train
      progress.state = output.state
      totals['down'] += prepared.cost.down * len(ids)
      totals['up'] += prepared.cost.up * len(ids)
      row = {
        'round': round_num,
        'sampled_clients': len(ids),
        'empty_clients_skipped': num_empty,
      }
      job = round_finishing.hand_off(
        config, prepared, progress, output, row, totals
      )
      job.rng_state_after_round = rng_state
      job.evaluation = _evaluation(
        config, prepared, round_num, output, evaluator
      )
      # Where the round's time went: waiting for the prefetched datasets,
      # the TFF round (process.next), the main thread in all (evaluation
      # included where --nobackground_evaluation; eval_seconds is the
      # evaluation's own time wherever it ran).
      timings = {
        'data_wait_seconds': data_wait,
        'train_seconds': train_seconds,
        'round_seconds': time.perf_counter() - t0,
      }
      finisher.submit(
        functools.partial(
          round_finishing.finish_round, config, prepared, progress, job, timings
        ),
        round_num,
        then=functools.partial(
          round_finishing.checkpoint_and_release, config, progress, job
        ),
      )
      if round_finishing.checkpoint_due(config, round_num):
        finisher.wait()  # The checkpoint holds this round's row.
  finally:
    try:
      finisher.close()
    finally:
      cohorts.close()
      evaluator.close()
  return totals


def _evaluation(config, prepared, round_num, output, evaluator):
  """On evaluation rounds, the future of the test metrics and their
  seconds (`evaluation.Evaluator`), else None; the evaluation runs in the
  evaluator."""
  if round_num % config.eval_every and round_num != config.rounds:
    return None
  return evaluator.submit(model_weights(prepared.process, output.state))


def model_weights(process, state):
  """`process.get_model_weights(state)`, read from the state in Python
  where it holds them (a `tff.learning` algorithm's state): the same
  values, without the TFF call that sends the whole state to the worker
  and back (0.47-0.48 s a call for the Fashion-MNIST CNN in one ad hoc
  4-round job here)."""
  weights = getattr(state, 'global_model_weights', None)
  if isinstance(weights, tff.learning.models.ModelWeights):
    return weights
  return process.get_model_weights(state)


def _next_round(config, prepared, progress, round_num, data):
  """One `process.next`; on TFF workers, a failure says how to resume."""
  process, state = prepared.process, progress.state
  if config.client_lr_decay != 1.0:
    # A function of the round only, so a resumed run is exact.
    state = composition.with_client_learning_rate(
      process, state, round_finishing.client_lr_at(config, round_num)
    )
  if not (config.workers or config.local_workers):
    return process.next(state, data)
  try:
    return distributed.call_watching_workers(process.next, state, data)
  except Exception as e:  # pylint: disable=broad-except
    rows = progress.rows
    done = rows[-1]['round'] if rows else 0
    raise RuntimeError(
      f'Round {round_num} failed on the TFF workers ({type(e).__name__}: '
      f'{str(e)[:300]}). A worker may have died. Checkpoints up to round '
      f'{done - done % config.checkpoint_every if done else 0} are intact '
      'in the output directory: restart the workers and rerun the same '
      'command to resume.'
    ) from e


def _summary(config, prepared, progress, seed_clash, totals) -> dict:
  """What `summary.json` holds (the wall time is added by the caller)."""
  task, method, params = prepared.task, prepared.method, prepared.params
  sampling, ledger, rows = prepared.sampling, progress.ledger, progress.rows
  final = rows[-1] if rows else {}
  return {
    'config': config.to_dict(),
    'task_description': task.description,
    'method_description': method.description,
    'num_clients': len(task.train_data.client_ids),
    # The weights trained privately (d) and those of frozen layers.
    'num_model_params': params.num_model_params,
    'num_frozen_params': params.num_frozen_params,
    # The warm start on public data (no privacy cost), if any.
    'public_pretrain': prepared.public_pretrain,
    'sampling': sampling.to_dict(),
    'noise_multiplier': params.noise_multiplier if method.private else None,
    # --clip, or what replaced it (--clip_from_public_round).
    'clip': params.clip,
    # A round that composes several Gaussians on one cohort (DPSFL-AC's
    # sketch and clip bit): each one's share of the merged 1/z^2.
    'round_event_shares': privacy.gaussian_shares(
      method.round_event(params.noise_multiplier, params)
    )
    if method.private and method.round_event is not None
    else None,
    'delta': prepared.delta,
    'dp_events': [privacy.event_to_dict(e) for e in ledger.events[-1:]]
    if ledger
    else [],
    'privacy': privacy_summary.privacy_section(
      config,
      task,
      method,
      sampling,
      ledger,
      noise_seed_clash=seed_clash,
      noise=prepared.noise,
    ),
    'epsilon_rdp': final.get('epsilon_rdp'),
    'epsilon_pld': final.get('epsilon_pld'),
    'bytes_per_client_per_round': dataclasses.asdict(prepared.cost),
    'bytes_down_total': totals['down'],
    'bytes_up_total': totals['up'],
    'final': {k: v for k, v in final.items() if k.startswith('test_')},
    'rounds_completed': len(rows),
    # Above 1 when this invocation resumed from a checkpoint: its wall time
    # then covers only the rounds from here on.
    'first_round_this_invocation': progress.start_round,
    # What the method's setup planned (e.g. --compression's plan).
    **params.options.summary(),
  }


def clip_from_fedavg(
  config: ExperimentConfig, rounds: int = 3, fraction: float = 0.5
) -> float:
  """Zhang et al. 2022's clip: `fraction` of FedAvg's mean unclipped
  update norm.

  Runs `rounds` rounds of non-private FedAvg with `config`'s task, data,
  sampling and local training (no output directory) and returns `fraction`
  times the mean over rounds of the cohort's mean update norm. Like the
  paper's choice it looks at the clients' data outside the privacy ledger:
  a tuning step, not a private one.

  Raises:
    ValueError: If rounds < 1 or fraction is not in (0, 1].
  """
  options_lib.integer(1)('rounds', rounds)
  options_lib.interval(0, 1, '(]')('fraction', fraction)
  probe = config.replace(
    method='fedavg',
    rounds=rounds,
    eval_every=rounds,
    output_dir=None,
    release_non_private_metrics=True,
    update_diagnostics=True,
    noise_multiplier=None,
    target_epsilon=None,
    clip_source=None,
    # Non-private and outside the ledger anyway: a cohort from the public
    # seed, so that a rerun (resume) finds the same clip.
    noise_seed=config.noise_seed
    if config.noise_seed is not None
    else (config.seed),
  )
  rows = []
  # From the run's warm start: on a resume, the one its folder keeps.
  with public_pretrain.reading_kept(config.output_dir):
    run_experiment(probe, rows_out=rows)
  norms = [r['update_norm_mean'] for r in rows if 'update_norm_mean' in r]
  if not norms:
    raise RuntimeError('The FedAvg probe reported no update norms.')
  return float(fraction * np.mean(norms))
