"""The federated training loop behind `python -m tff_dp.run` (flag-free).

`run_experiment(config)`:
  1. validates the config and the output directory (before any data loads);
  2. loads the task, samples clients (Poisson or fixed-size, seeded),
     calibrates the noise to a target epsilon if asked;
  3. builds the method's learning process and runs it in TFF's C++ test
     context (secure sum simulated);
  4. after every round records the DP event that ran in the privacy ledger,
     evaluates, counts bytes, and appends a row to `metrics.csv` and
     TensorBoard; every `checkpoint_every` rounds saves the learning state
     with the ledger, the sampler's RNG state and the rows
     (`tff.program.FileProgramStateManager`);
  5. writes `summary.json` with every setting the run used (the method's
     options included) and the final results, and the
     final model weights to `final_model_weights.npz`.

What is written is only what the ledger covers (`outputs.RunFiles`):
settings, epsilon, bytes per client, the model and test metrics on data no
client holds. Cohort sizes, train loss, update diagnostics, timings, byte
totals and raw TFF measurements go to `non_private/` only with
`release_non_private_metrics` (the summary's privacy section says which).
A `noise_seed` used for another configuration in the same output tree is
refused before any work (`noise_seeds`).

A rerun of the same command in the same output directory resumes from the
last checkpoint, ledger and RNG included, so epsilon never resets and the
result equals an uninterrupted run.

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
import json
import time
from typing import Any, Callable, Optional

import asyncio
import concurrent.futures

from absl import logging
import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import composition
from tff_dp.aggregators import dp_events
from tff_dp.client_works import diagnostics
from tff_dp import distributed
from tff_dp import methods as methods_lib
from tff_dp import noise_seeds
from tff_dp import privacy
from tff_dp import processes
from tff_dp import tasks as tasks_lib
from tff_dp import experiment_config
from tff_dp import outputs

# run_experiment's config, as `training.ExperimentConfig` for its callers.
from tff_dp.experiment_config import ExperimentConfig  # noqa: F401 (API)

# By name: the round loop's local `sampling` is the run's Sampling.
from tff_dp.sampling import sample_clients

# The run's process, as `training.prepare` for its callers.
from tff_dp.preparation import prepare  # noqa: F401 (API)
from tff_dp.preparation import Prepared  # noqa: F401 (API)


# The events of the TFF DP states nested in an aggregator state (the
# public reader, `tff_dp.aggregators.dp_events`).
find_dp_events = dp_events.events_in_state


def released_event(
  method: methods_lib.Method, params: methods_lib.MethodParams, state, metrics
) -> dp_accounting.DpEvent:
  """The DP event a round released: from the aggregator state, from its
  measurements, or as declared by the method, in that order."""
  if method.event_from_state:
    return dp_events.round_event(state.aggregator)
  if method.event_from_measurements is not None:
    return method.event_from_measurements(metrics['aggregator'])
  return method.round_event(params.noise_multiplier, params)


EVAL_BATCH_SIZE = 1000


def test_batches(task: tasks_lib.FederatedTask) -> tf.data.Dataset:
  """The test set in batches of `EVAL_BATCH_SIZE`, built once per run.

  Keras' `evaluate(x, y)` on NumPy arrays copies them into a new dataset
  each call and kept about 30 MB of Python memory per call here (15 calls
  on Fashion-MNIST's test set: 945 -> 1,360 MB); on one dataset reused
  it stays flat (896 -> 909 MB). Same batches, same order, same metrics.
  """
  return tf.data.Dataset.from_tensor_slices((task.test_x, task.test_y)).batch(
    EVAL_BATCH_SIZE
  )


def evaluate(
  task: tasks_lib.FederatedTask,
  model_weights,
  keras_model: tf.keras.Model,
  batches: Optional[tf.data.Dataset] = None,
) -> dict[str, float]:
  """Centralized test metrics of `model_weights` (loss and task metrics).

  Args:
    task: The task (its test set is used unless `batches` is given).
    model_weights: The `tff.learning.models.ModelWeights` to evaluate.
    keras_model: A compiled Keras model of the task's architecture.
    batches: `test_batches(task)`; pass it when evaluating repeatedly.
  """
  model_weights.assign_weights_to(keras_model)
  if batches is None:
    batches = test_batches(task)
  results = keras_model.evaluate(batches, verbose=0, return_dict=True)
  return {f'test_{k}': float(v) for k, v in results.items()}


def run_experiment(
  config: ExperimentConfig,
  *,
  round_callback: Optional[Callable[[int], None]] = None,
  rows_out: Optional[list] = None,
) -> dict[str, Any]:
  """Runs (or resumes) a federated training job; returns the summary.

  Args:
    config: The run's configuration.
    round_callback: Called with the round number after each round's results
      and checkpoint are written (tests use it to interrupt a run).
    rows_out: If given, the per-round result rows are appended to it, every
      column (non-private ones included: an in-process caller's choice).

  Returns:
    What `summary.json` holds (`outputs.RunFiles.returned_summary`): with
    `release_non_private_metrics`, the non-private part merged in.

  Raises:
    ValueError: On an invalid config or output directory, or a noise seed
      used for another configuration in the same output tree, before
      training.
  """
  config.validate()
  output_dir = experiment_config.check_output_dir(config.output_dir)
  method = methods_lib.METHODS[config.method]
  if output_dir is not None:
    outputs.check_same_config(output_dir, config)
  # Before any work: a seed used for another configuration is refused.
  seed_clash = noise_seeds.check_and_register(
    output_dir,
    config.noise_seed,
    config.to_dict(),
    allow_reuse=config.allow_noise_seed_reuse,
  )

  prepared = prepare(config)
  task, method, params = prepared.task, prepared.method, prepared.params
  sampling, delta, cost = prepared.sampling, prepared.delta, prepared.cost
  process = prepared.process
  cd = task.train_data
  client_ids = cd.client_ids
  num_params = params.num_model_params

  state = process.initialize()
  # Privacy-relevant: the cohort (and the local shuffles). OS entropy
  # unless --noise_seed; its state is checkpointed, never logged.
  rng = np.random.default_rng(config.noise_seed)
  ledger = privacy.PrivacyLedger(sampling, delta) if method.private else None
  rows: list[dict] = []
  files = outputs.RunFiles(
    output_dir,
    config.release_non_private_metrics,
    test_private=not task.test_held_by_clients,
  )
  start_round = 1
  manager = None
  if output_dir is not None:
    # The two latest checkpoints: if the newest is unreadable (a crash while
    # writing it), the previous one is used.
    manager = tff.program.FileProgramStateManager(
      str(output_dir / 'checkpoints'),
      prefix=outputs.CHECKPOINT_PREFIX,
      keep_total=2,
      keep_first=False,
    )
    restored, version = asyncio.run(
      outputs.load_latest_readable(manager, (state, np.str_('')))
    )
    if restored is not None and version > 0:
      state, runner_json = restored
      runner = outputs.RunnerState.from_json(runner_json)
      rng.bit_generator.state = runner.rng_state
      rows = runner.all_rows()
      if ledger is not None:
        ledger = privacy.PrivacyLedger.from_json(runner.ledger_json)
      start_round = runner.round_num + 1
      if files.diagnostics_path is not None:
        outputs.move_legacy_non_private(output_dir)
        outputs.truncate_diagnostics(files.diagnostics_path, runner.round_num)
      logging.info(
        'Resumed from checkpoint of round %d in %s', version, output_dir
      )
    outputs.atomic_write(
      output_dir / 'config.json', json.dumps(config.to_dict(), indent=2)
    )
  keras_model = task.model_builder()
  keras_model.compile(loss=task.loss_builder(), metrics=task.metrics_builder())
  eval_batches = test_batches(task)
  # Non-private (the realised cohorts): checkpointed only when released.
  totals = {'down': 0, 'up': 0}
  if rows:
    totals = {
      'down': rows[-1].get('bytes_down_total', 0),
      'up': rows[-1].get('bytes_up_total', 0),
    }
  start = time.perf_counter()
  # The next round's cohort is drawn, and its datasets built on a background
  # thread, while the current round runs; the RNG state saved with a
  # checkpoint is the one before that draw, so a resumed run draws the same.
  prefetcher = concurrent.futures.ThreadPoolExecutor(1)

  empty = {c for c, n in zip(client_ids, cd.client_sizes()) if int(n) == 0}

  def draw():
    rng_state = rng.bit_generator.state
    sampled = sample_clients(sampling, client_ids, rng)
    seed = int(rng.integers(2**31 - 1))
    # A sampled client without data contributes nothing: skipped, counted.
    ids = [c for c in sampled if c not in empty]
    return (
      rng_state,
      ids,
      prefetcher.submit(prepared.round_data, config, ids, seed),
      len(sampled) - len(ids),
    )

  upcoming = draw() if start_round <= config.rounds else None
  for round_num in range(start_round, config.rounds + 1):
    t0 = time.perf_counter()
    _, ids, data_future, num_empty = upcoming
    data = data_future.result()
    data_wait = time.perf_counter() - t0
    upcoming = draw() if round_num < config.rounds else None
    rng_state_after_round = upcoming[0] if upcoming else rng.bit_generator.state
    t_train = time.perf_counter()
    if config.client_lr_decay != 1.0:
      # A function of the round only, so a resumed run is exact.
      state = composition.with_client_learning_rate(
        process, state, client_lr_at(config, round_num)
      )
    try:
      if config.workers or config.local_workers:
        output = distributed.call_watching_workers(process.next, state, data)
      else:
        output = process.next(state, data)
    except Exception as e:  # pylint: disable=broad-except
      if not (config.workers or config.local_workers):
        raise
      done = rows[-1]['round'] if rows else 0
      raise RuntimeError(
        f'Round {round_num} failed on the TFF workers ({type(e).__name__}: '
        f'{str(e)[:300]}). A worker may have died. Checkpoints up to round '
        f'{done - done % config.checkpoint_every if done else 0} are intact '
        'in the output directory: restart the workers and rerun the same '
        'command to resume.'
      ) from e
    train_seconds = time.perf_counter() - t_train
    state = output.state
    metrics: dict = {}
    outputs.flatten('', output.metrics, metrics)
    totals['down'] += cost.down * len(ids)
    totals['up'] += cost.up * len(ids)
    row = {
      'round': round_num,
      'sampled_clients': len(ids),
      'empty_clients_skipped': num_empty,
      'train_loss': metrics.get('client_work/train/loss', float('nan')),
      'bytes_down_per_client': cost.down,
      'bytes_up_per_client': cost.up,
      'bytes_down_total': totals['down'],
      'bytes_up_total': totals['up'],
    }
    if config.client_lr_decay != 1.0:
      row['client_lr'] = client_lr_at(config, round_num)
    if method.private:
      event = released_event(method, params, state, output.metrics)
      ledger.record(event)
      row['epsilon_rdp'], row['epsilon_pld'] = ledger.epsilon()
      row['noise_multiplier'] = params.noise_multiplier
    clip = metrics.get(
      'aggregator/dp_query_metrics/clip', metrics.get('aggregator/clip')
    )
    if clip is not None or method.private:
      row['clip'] = clip if clip is not None else params.clip
    # DP (charged to the round's event): --fraction_clipped_stddev.
    fraction = metrics.get('aggregator/dp_query_metrics/dp_fraction_clipped')
    if fraction is not None:
      row['dp_fraction_clipped'] = fraction
    if round_num % config.eval_every == 0 or round_num == config.rounds:
      t_eval = time.perf_counter()
      row.update(
        evaluate(
          task, process.get_model_weights(state), keras_model, eval_batches
        )
      )
      row['eval_seconds'] = time.perf_counter() - t_eval
    extra = output.metrics.get('client_work', {}).get('extra', {})
    vectors = {diagnostics.PREFIX + k: np.asarray(v) for k, v in extra.items()}
    row.update(diagnostics.summarize({**metrics, **vectors}))
    if 'aggregator/non_finite_clients' in metrics:
      row['non_finite_clients'] = metrics['aggregator/non_finite_clients']
    hists = diagnostics.histograms(vectors)
    row.update({f'tff/{k}': v for k, v in metrics.items()})
    # Where the round's time went: waiting for the prefetched datasets, the
    # TFF round (process.next), evaluation (eval_seconds, when it ran).
    row['data_wait_seconds'] = data_wait
    row['train_seconds'] = train_seconds
    row['round_seconds'] = time.perf_counter() - t0
    rows.append(row)
    logging.info('%s', outputs.progress_line(files.shown(row), config.rounds))
    files.write_round(rows, hists)
    if output_dir is not None:
      if round_num % config.checkpoint_every == 0 or round_num == config.rounds:
        runner = files.runner_state(
          round_num,
          rng_state_after_round,
          ledger.to_json() if ledger else None,
          rows,
        )
        seconds = outputs.save_checkpoint(manager, state, runner)
        logging.info(
          'Checkpoint of round %d written%s',
          round_num,
          f' in {seconds:.1f} s' if files.release else '',
        )
    # Freed native buffers back to the OS (processes.release_free_memory;
    # README "Memory over long runs" says what it did and did not fix).
    processes.release_free_memory()
    if round_callback is not None:
      round_callback(round_num)

  prefetcher.shutdown(wait=True)
  if rows_out is not None:
    rows_out.extend(rows)
  final = rows[-1] if rows else {}
  summary = {
    'config': config.to_dict(),
    'task_description': task.description,
    'method_description': method.description,
    'num_clients': len(client_ids),
    'num_model_params': num_params,
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
    'delta': delta,
    'dp_events': [privacy.event_to_dict(e) for e in ledger.events[-1:]]
    if ledger
    else [],
    'privacy': outputs.privacy_section(
      config, task, method, sampling, ledger, noise_seed_clash=seed_clash
    ),
    'epsilon_rdp': final.get('epsilon_rdp'),
    'epsilon_pld': final.get('epsilon_pld'),
    'bytes_per_client_per_round': dataclasses.asdict(cost),
    'bytes_down_total': totals['down'],
    'bytes_up_total': totals['up'],
    'final': {k: v for k, v in final.items() if k.startswith('test_')},
    'rounds_completed': len(rows),
    # Above 1 when this invocation resumed from a checkpoint: its wall time
    # then covers only the rounds from here on.
    'first_round_this_invocation': start_round,
    'wall_seconds_this_invocation': time.perf_counter() - start,
  }
  if output_dir is not None:
    outputs.save_model_weights(
      output_dir / 'final_model_weights.npz', process.get_model_weights(state)
    )
    files.write_summary(summary)
  if config.local_workers:
    distributed.stop_local_workers()
  return files.returned_summary(summary)


def client_lr_at(config: ExperimentConfig, round_num: int) -> float:
  """Round `round_num`'s (1-based) client lr: client_lr x decay^(t - 1)."""
  return config.client_lr * config.client_lr_decay ** (round_num - 1)


def clip_from_fedavg(
  config: ExperimentConfig, rounds: int = 3, fraction: float = 0.5
) -> float:
  """Seed 003's clip: `fraction` of FedAvg's average unclipped update norm.

  Runs `rounds` rounds of non-private FedAvg with `config`'s task, data,
  sampling and local training (no output directory) and returns `fraction`
  times the mean over rounds of the cohort's mean update norm. Like the
  paper's choice it looks at the clients' data outside the privacy ledger:
  a tuning step, not a private one.

  Raises:
    ValueError: If rounds < 1 or fraction is not in (0, 1].
  """
  experiment_config.check_int('rounds', rounds, 1)
  if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
    raise ValueError(f'fraction must be in (0, 1]. Found {fraction!r}.')
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
  run_experiment(probe, rows_out=rows)
  norms = [r['update_norm_mean'] for r in rows if 'update_norm_mean' in r]
  if not norms:
    raise RuntimeError('The FedAvg probe reported no update norms.')
  return float(fraction * np.mean(norms))
