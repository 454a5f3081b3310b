"""A run's process from its config: `prepare` loads the task, resolves the
sampling, the method's params and the noise, and builds the learning
process (used by the round loop and by the speed benchmarks alike)."""

import dataclasses
from typing import Any, Optional

from absl import logging
import tensorflow_federated as tff

from tff_dp import composition
from tff_dp import contexts
from tff_dp import distributed
from tff_dp import fusion
from tff_dp import methods as methods_lib
from tff_dp import privacy
from tff_dp import tasks as tasks_lib
from tff_dp.aggregators import finite_guard
from tff_dp import experiment_config
from tff_dp.experiment_config import ExperimentConfig
from tff_dp.sampling import sampling_for


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
    model_seed=config.seed,
    **dict(config.task_kwargs),
  )
  client_ids = task.train_data.client_ids
  sampling = sampling_for(config, len(client_ids), method.private)
  num_params = task.num_parameters()
  # The run's settings and the method's options, by their flag names.
  params = methods_lib.MethodParams.from_config(
    config.flat(),
    num_model_params=num_params,
    expected_clients_per_round=sampling.expected_clients_per_round,
  )
  if method.resolve is not None:
    params = method.resolve(params, sampling)
  delta = None
  if method.private:
    delta = (
      config.delta
      if config.delta is not None
      else min(1e-5, 1.0 / len(client_ids))
    )
    noise = config.noise_multiplier
    if noise is None:
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
    params = dataclasses.replace(params, noise_multiplier=float(noise))
  if method.setup is not None:
    params = method.setup(params, task, config.data_dir)
  cost = method.cost(params)
  logging.info(
    'Task: %s | method: %s | sampling: %s | %d params | '
    'bytes/client/round down %d up %d',
    # Derived from the data (e.g. patient counts): only when released.
    task.description if config.release_non_private_metrics else task.name,
    config.method,
    sampling,
    num_params,
    cost.down,
    cost.up,
  )

  if config.workers or config.local_workers:
    targets = experiment_config.parse_workers(config.workers)
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
  else:
    contexts.set_simulation_context(
      config.max_concurrent_computation_calls,
      config.intra_op_threads,
      config.inter_op_threads,
    )
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
    track_global_update=params.update_diagnostics,
  )
  if config.fuse_client_work:
    process, reason = fusion.fuse(process)
    logging.info(
      'Client work %s',
      'fused: one TensorFlow call per client a round'
      if reason is None
      else f'not fused ({reason})',
    )

  return Prepared(task, method, params, sampling, delta, cost, process)
