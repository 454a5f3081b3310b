"""A run's process from its config: `prepare` loads the task, resolves the
sampling, the method's params and the noise, and builds the learning
process (used by the round loop and by the speed benchmarks alike)."""

import dataclasses
import pathlib
from typing import Any, Optional

from absl import logging
import tensorflow_federated as tff

from tff_dp.runtime import composition
from tff_dp.runtime import contexts
from tff_dp.runtime import distributed
from tff_dp.runtime import fusion
from tff_dp import methods as methods_lib
from tff_dp.job import noise_plan
from tff_dp import privacy
from tff_dp import tasks as tasks_lib
from tff_dp.tasks import adapters
from tff_dp.tasks import download
from tff_dp.tasks import partial_training
from tff_dp.tasks import public as public_sets
from tff_dp.job import public_pretrain
from tff_dp.aggregators import finite_guard
from tff_dp.job.experiment_config import ConfigError
from tff_dp.job.experiment_config import ExperimentConfig
from tff_dp.methods import settings
from tff_dp.job.cohorts import sampling_for


@dataclasses.dataclass
class Prepared:
  """A run's task, method, sampling, privacy parameters and process."""

  task: tasks_lib.FederatedTask
  method: methods_lib.Method
  params: methods_lib.MethodParams
  sampling: privacy.Sampling
  delta: Optional[float]
  cost: Any
  process: tff.learning.templates.LearningProcess
  # The model aggregator the process was built with: the round's DP event
  # is read through it (`dp_events.released_event`).
  aggregator: Any = None
  # The strategy and groups of --noise / --participation.
  noise: noise_plan.NoisePlan = noise_plan.NoisePlan()
  # The warm start's report (--public_pretrain_steps), else None.
  public_pretrain: Optional[dict] = None

  def round_data(
    self, config: 'ExperimentConfig', client_ids: list[str], shuffle_seed: int
  ) -> list:
    """The round's client datasets, preprocessed for local training."""
    preprocess = tasks_lib.client_preprocess_fn(
      config.batch_size,
      num_epochs=config.local_epochs,
      max_steps=config.local_steps,
      seed=shuffle_seed,
    )
    cd = self.task.train_data
    return [preprocess(cd.create_tf_dataset_for_client(c)) for c in client_ids]


def prepare(config: ExperimentConfig) -> Prepared:
  """Loads the task, resolves sampling and noise, builds the process.

  Also installs the execution context. Used by `run_experiment` and by the
  speed benchmark, so both time the same process.
  """
  method = methods_lib.METHODS[config.method]
  task = tasks_lib.load_task(
    config.task,
    config.data_dir,
    download=config.download,
    model_seed=config.seed,
    **dict(config.task_kwargs),
  )
  public_report = None
  if config.public_pretrain_steps or config.initial_weights:
    trained_part(config, task)  # Bad names fail before training.
    with download.allowed(config.download):  # The public set's files too.
      task, public_report = warm_start(config, task)
  task = trained_part(config, task)
  num_clients = len(task.train_data.client_ids)
  delta = None
  if method.private:
    delta = (
      config.delta if config.delta is not None else min(1e-5, 1.0 / num_clients)
    )
  plan = noise_plan.resolve_in(
    config,
    num_clients,
    delta,
    pathlib.Path(config.output_dir) if config.output_dir else None,
  )
  sampling = sampling_for(config, num_clients, method.private, plan.groups)
  with download.allowed(config.download):  # FL-TOP's public batch too.
    params = method_params(config, method, task, sampling, delta, plan)
  cost = method.cost(params)
  logging.info(
    'Task: %s | method: %s | sampling: %s | %d params | '
    'bytes/client/round down %d up %d',
    # Derived from the data (e.g. patient counts): only when released.
    task.description if config.release_non_private_metrics else task.name,
    config.method,
    sampling,
    params.num_model_params,
    cost.down,
    cost.up,
  )
  set_context(config)
  aggregator, process = build_process(config, method, task, params)
  return Prepared(
    task,
    method,
    params,
    sampling,
    delta,
    cost,
    process,
    aggregator,
    plan,
    public_report,
  )


def warm_start(
  config: ExperimentConfig, task: tasks_lib.FederatedTask
) -> tuple[tasks_lib.FederatedTask, dict]:
  """`task` starting from its pretraining on --public_data (or from
  --initial_weights), and the report.

  Raises:
    ConfigError: If the public set is not one for the task, or the weights
      file is missing or does not fit the model.
  """
  run_dir = pathlib.Path(config.output_dir) if config.output_dir else None
  if config.initial_weights:
    path = pathlib.Path(config.initial_weights).expanduser()
    try:
      return public_pretrain.from_file(task, path, run_dir)
    except public_pretrain.OtherPublicData as e:
      raise ConfigError(str(e)) from None
    except (ValueError, FileNotFoundError) as e:
      raise ConfigError(f'--{e}') from None
  try:
    public = public_sets.load(config.public_data, task, config.data_dir)
  except ValueError as e:
    raise ConfigError(f'--{e}') from None
  how = public_pretrain.Pretraining(
    steps=config.public_pretrain_steps,
    batch_size=config.public_pretrain_batch_size,
    learning_rate=config.public_pretrain_lr,
    seed=config.seed,
  )
  try:
    return public_pretrain.warm_started(task, public, how, run_dir)
  except public_pretrain.OtherPublicData as e:
    raise ConfigError(str(e)) from None


def trained_part(
  config: ExperimentConfig, task: tasks_lib.FederatedTask
) -> tasks_lib.FederatedTask:
  """`task` with its model training only what the config names: adapters
  on `--adapter_layers` and the `--train_layers` (`adapted`), else the
  `--train_layers` (`train_only`), else everything.

  Raises:
    ConfigError: naming the bad layer names or rank.
  """
  if config.adapter_layers:
    return adapted(
      task,
      config.adapter_layers,
      config.adapter_rank,
      config.train_layers,
      config.seed,
    )
  return train_only(task, config.train_layers)


def adapted(
  task: tasks_lib.FederatedTask,
  layers: tuple[str, ...],
  rank: int,
  also_train: tuple[str, ...],
  seed: Optional[int],
) -> tasks_lib.FederatedTask:
  """`task` whose model trains rank-`rank` adapters on `layers` and, in
  full, `also_train`; the rest frozen (`--adapter_layers`).

  Raises:
    ConfigError: naming the bad layer names or rank, and what is allowed.
  """
  builder = adapters.Adapters(
    task.model_builder, layers, rank, also_train=also_train, seed=seed
  )
  try:
    builder()
  except ValueError as e:
    raise ConfigError(f'--{e}') from None
  return dataclasses.replace(task, model_builder=builder)


def train_only(
  task: tasks_lib.FederatedTask, layers: tuple[str, ...]
) -> tasks_lib.FederatedTask:
  """`task` with its model's layers but `layers` frozen (`--train_layers`;
  all trained if empty).

  Raises:
    ConfigError: naming the layers the model lacks and the ones it has.
  """
  if not layers:
    return task
  builder = partial_training.TrainOnly(task.model_builder, layers)
  try:
    builder()
  except ValueError as e:
    raise ConfigError(f'--{e}') from None
  return dataclasses.replace(task, model_builder=builder)


def method_params(
  config: ExperimentConfig,
  method: methods_lib.Method,
  task: tasks_lib.FederatedTask,
  sampling: privacy.Sampling,
  delta: Optional[float],
  plan: Optional[noise_plan.NoisePlan] = None,
) -> methods_lib.MethodParams:
  """The builders' params: the config's, then what the method resolves
  from the sampling, the noise multiplier (calibrated to the target
  epsilon if asked), then what its setup computes from the task."""
  trained = task.num_trainable_parameters()
  params = methods_lib.MethodParams.from_config(
    config.flat(),
    num_model_params=trained,
    num_frozen_params=task.num_parameters() - trained,
    expected_clients_per_round=sampling.expected_clients_per_round,
    noise_strategy=None if plan is None else plan.strategy,
  )
  if method.resolve is not None:
    params = method.resolve(params, sampling)
  if method.private:
    params = dataclasses.replace(
      params,
      noise_multiplier=float(
        noise_multiplier(config, method, params, sampling, delta)
      ),
    )
  if method.setup is not None:
    params = method.setup(params, task, config.data_dir)
  return params


def noise_multiplier(config, method, params, sampling, delta) -> float:
  """`config.noise_multiplier`, or the one calibrated to its target
  epsilon through the method's round event."""
  if config.noise_multiplier is not None:
    return config.noise_multiplier
  noise = privacy.calibrate_noise_multiplier(
    config.target_epsilon,
    delta,
    config.rounds,
    sampling,
    round_event_fn=lambda z: method.round_event(z, params),
    accountant=config.accountant,
  )
  logging.info(
    'Calibrated noise multiplier %.4f for (%.3g, %.3g)-DP '
    'over %d rounds (%s accountant)',
    noise,
    config.target_epsilon,
    delta,
    config.rounds,
    config.accountant,
  )
  return noise


def set_context(config: ExperimentConfig) -> None:
  """TFF's execution context: the local simulation, or the workers."""
  if not (config.workers or config.local_workers):
    contexts.set_simulation_context(
      config.max_concurrent_computation_calls,
      config.intra_op_threads,
      config.inter_op_threads,
    )
    return
  targets = settings.parse_workers(config.workers)
  if config.local_workers:
    targets += [
      target
      for _, target in distributed.start_local_workers(
        config.local_workers,
        max_concurrent_computation_calls=max(
          1, config.max_concurrent_computation_calls
        ),
        intra_op_threads=config.intra_op_threads,
        inter_op_threads=config.inter_op_threads,
      )
    ]
  distributed.set_distributed_context(targets)
  logging.info('Clients of each round split over workers %s', targets)


def build_process(config, method, task, params):
  """`(aggregator, process)`: the method's aggregator (non-finite client
  updates zeroed and counted) and the learning process around it."""
  client_optimizer = tff.learning.optimizers.build_sgdm(
    config.client_lr, momentum=config.client_momentum or None
  )
  client_model_fn = task.client_model_fn(config.device or None)
  aggregator = method.build_aggregator(params)
  if isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory):
    # NaN/Inf client updates become zeros (norm 0) and are counted.
    aggregator = finite_guard.FiniteGuardFactory(aggregator)
  client_work = None
  if method.build_client_work is not None:
    client_work = method.build_client_work(
      params, client_model_fn, client_optimizer
    )
  process = composition.build_learning_process(
    task.model_fn,
    client_optimizer=client_optimizer,
    server_optimizer=tff.learning.optimizers.build_sgdm(
      config.server_lr, momentum=config.server_momentum or None
    ),
    model_aggregator=aggregator,
    client_model_fn=client_model_fn,
    client_work=client_work,
    client_metrics_fn=methods_lib.client_angle_metrics_fn(params),
    track_global_update=params.builds_diagnostics,
  )
  if config.fuse_client_work:
    process, reason = fusion.fuse(process)
    logging.info(
      'Client work %s',
      'fused: one TensorFlow call per client a round'
      if reason is None
      else f'not fused ({reason})',
    )
  return aggregator, process
