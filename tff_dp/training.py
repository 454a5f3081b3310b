"""The federated training loop behind `python -m tff_dp.run` (flag-free).

`run_experiment(config)` loads a task, builds the learning process of the
method, samples clients each round from a seeded generator, trains, evaluates
centrally on the task's test data, and writes `metrics.csv` and
`summary.json` under `config.output_dir`.
"""

import csv
import dataclasses
import json
import pathlib
import time
from typing import Any, Callable, Optional

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import tasks as tasks_lib

ProcessBuilder = Callable[
  ['ExperimentConfig', tasks_lib.FederatedTask],
  tff.learning.templates.LearningProcess,
]


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """Everything a run depends on; recorded in `summary.json`."""

  task: str = 'fashion_mnist_iid'
  method: str = 'fedavg'
  rounds: int = 10
  clients_per_round: int = 10
  batch_size: int = 10
  local_epochs: int = 1
  local_steps: Optional[int] = None
  client_lr: float = 0.05
  client_momentum: float = 0.0
  server_lr: float = 1.0
  seed: int = 0
  eval_every: int = 1
  data_dir: Optional[str] = None
  output_dir: Optional[str] = None
  task_kwargs: tuple[tuple[str, Any], ...] = ()

  def validate(self) -> None:
    """Raises ValueError naming the bad value and its allowed range."""

    def positive_int(name):
      v = getattr(self, name)
      if not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f'{name} must be an integer >= 1. Found {v!r}.')

    for name in (
      'rounds',
      'clients_per_round',
      'batch_size',
      'local_epochs',
      'eval_every',
    ):
      positive_int(name)
    if self.local_steps is not None:
      positive_int('local_steps')
    for name in ('client_lr', 'server_lr'):
      v = getattr(self, name)
      if not np.isfinite(v) or v <= 0:
        raise ValueError(f'{name} must be a finite number > 0. Found {v!r}.')
    if not 0 <= self.client_momentum < 1:
      raise ValueError(
        'client_momentum must be in [0, 1). Found ' f'{self.client_momentum!r}.'
      )
    if self.task not in tasks_lib.TASKS:
      raise ValueError(
        f'Unknown task {self.task!r}; choose one of '
        f'{sorted(tasks_lib.TASKS)}.'
      )
    if self.method not in METHODS:
      raise ValueError(
        f'Unknown method {self.method!r}; choose one of ' f'{sorted(METHODS)}.'
      )


def _client_optimizer(config: ExperimentConfig):
  return tff.learning.optimizers.build_sgdm(
    learning_rate=config.client_lr, momentum=config.client_momentum or None
  )


def _server_optimizer(config: ExperimentConfig):
  return tff.learning.optimizers.build_sgdm(learning_rate=config.server_lr)


def build_fedavg(config: ExperimentConfig, task: tasks_lib.FederatedTask):
  """Non-private FedAvg (McMahan et al. 2017), example-weighted."""
  return tff.learning.algorithms.build_weighted_fed_avg(
    task.model_fn,
    client_optimizer_fn=_client_optimizer(config),
    server_optimizer_fn=_server_optimizer(config),
    loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )


METHODS: dict[str, ProcessBuilder] = {
  'fedavg': build_fedavg,
}


def evaluate(
  task: tasks_lib.FederatedTask, model_weights, keras_model: tf.keras.Model
) -> dict[str, float]:
  """Centralized test metrics of `model_weights` (loss and task metrics)."""
  model_weights.assign_weights_to(keras_model)
  results = keras_model.evaluate(
    task.test_x, task.test_y, batch_size=1000, verbose=0, return_dict=True
  )
  return {f'test_{k}': float(v) for k, v in results.items()}


def _flatten(prefix: str, value, out: dict) -> None:
  if isinstance(value, dict):
    for k, v in value.items():
      _flatten(f'{prefix}/{k}' if prefix else str(k), v, out)
  elif np.ndim(value) == 0:
    out[prefix] = float(value)


def run_experiment(config: ExperimentConfig) -> dict[str, Any]:
  """Runs a federated training job; returns the summary dict.

  Raises:
    ValueError: On an invalid config (before any data is loaded).
  """
  config.validate()
  output_dir = pathlib.Path(config.output_dir) if config.output_dir else None
  if output_dir is not None:
    output_dir.mkdir(parents=True, exist_ok=True)
  task = tasks_lib.load_task(
    config.task, config.data_dir, **dict(config.task_kwargs)
  )
  logging.info('Task: %s', task.description)
  cd = task.train_data
  if config.clients_per_round > len(cd.client_ids):
    raise ValueError(
      f'clients_per_round must be at most the number of clients '
      f'({len(cd.client_ids)}). Found {config.clients_per_round}.'
    )
  tf.keras.utils.set_random_seed(config.seed)
  process = METHODS[config.method](config, task)
  state = process.initialize()
  keras_model = task.model_builder()
  keras_model.compile(loss=task.loss_builder(), metrics=task.metrics_builder())
  rng = np.random.default_rng(config.seed)
  rows = []
  start = time.perf_counter()
  for round_num in range(1, config.rounds + 1):
    t0 = time.perf_counter()
    ids = rng.choice(cd.client_ids, config.clients_per_round, replace=False)
    preprocess = tasks_lib.client_preprocess_fn(
      config.batch_size,
      num_epochs=config.local_epochs,
      max_steps=config.local_steps,
      seed=int(rng.integers(2**31 - 1)),
    )
    data = [preprocess(cd.create_tf_dataset_for_client(c)) for c in ids]
    output = process.next(state, data)
    state = output.state
    row = {'round': round_num}
    _flatten('', output.metrics, row)
    if round_num % config.eval_every == 0 or round_num == config.rounds:
      row.update(evaluate(task, process.get_model_weights(state), keras_model))
    row['round_seconds'] = time.perf_counter() - t0
    rows.append(row)
    logging.info(
      'round %d/%d  train_loss %.4f  %s  %.1fs',
      round_num,
      config.rounds,
      row.get('client_work/train/loss', float('nan')),
      '  '.join(
        f'{k} {v:.4f}' for k, v in row.items() if k.startswith('test_')
      ),
      row['round_seconds'],
    )
  summary = {
    'config': dataclasses.asdict(config),
    'task_description': task.description,
    'final': {k: v for k, v in rows[-1].items() if k.startswith('test_')},
    'rounds': len(rows),
    'wall_seconds': time.perf_counter() - start,
  }
  if output_dir is not None:
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k != 'round', k))
    with open(output_dir / 'metrics.csv', 'w', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=keys)
      writer.writeheader()
      writer.writerows(rows)
    (output_dir / 'summary.json').write_text(json.dumps(summary, indent=2))
  return summary
