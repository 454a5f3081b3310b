r"""Runs a federated training job.

Example:
  python -m tff_dp.run --task=fashion_mnist_iid --method=fedavg --rounds=20 \
      --clients_per_round=20 --root_output_dir=runs/fedavg
"""

from absl import app
from absl import flags

from tff_dp import tasks
from tff_dp import training

_TASK = flags.DEFINE_enum(
  'task', 'fashion_mnist_iid', sorted(tasks.TASKS), 'Federated task.'
)
_METHOD = flags.DEFINE_enum(
  'method', 'fedavg', sorted(training.METHODS), 'Training method.'
)
_ROUNDS = flags.DEFINE_integer('rounds', 10, 'Federated rounds (>= 1).')
_CLIENTS = flags.DEFINE_integer(
  'clients_per_round', 10, 'Clients sampled per round (>= 1).'
)
_BATCH = flags.DEFINE_integer('batch_size', 10, 'Local batch size.')
_EPOCHS = flags.DEFINE_integer('local_epochs', 1, 'Local passes over data.')
_STEPS = flags.DEFINE_integer(
  'local_steps', None, 'Cap on local steps per round (default: none).'
)
_CLIENT_LR = flags.DEFINE_float('client_lr', 0.05, 'Client learning rate.')
_MOMENTUM = flags.DEFINE_float('client_momentum', 0.0, 'Client momentum.')
_SERVER_LR = flags.DEFINE_float('server_lr', 1.0, 'Server learning rate.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of sampling and training.')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 1, 'Evaluate every N rounds.')
_DATA_DIR = flags.DEFINE_string(
  'data_dir',
  None,
  'Data directory (default: $TFF_DP_DATA_DIR, then '
  '../shared/data next to the repository).',
)
_OUTPUT = flags.DEFINE_string(
  'root_output_dir', None, 'Where metrics.csv and summary.json go.'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = training.ExperimentConfig(
    task=_TASK.value,
    method=_METHOD.value,
    rounds=_ROUNDS.value,
    clients_per_round=_CLIENTS.value,
    batch_size=_BATCH.value,
    local_epochs=_EPOCHS.value,
    local_steps=_STEPS.value,
    client_lr=_CLIENT_LR.value,
    client_momentum=_MOMENTUM.value,
    server_lr=_SERVER_LR.value,
    seed=_SEED.value,
    eval_every=_EVAL_EVERY.value,
    data_dir=_DATA_DIR.value,
    output_dir=_OUTPUT.value,
  )
  summary = training.run_experiment(config)
  print(
    'final: ' + '  '.join(f'{k} {v:.4f}' for k, v in summary['final'].items())
  )


if __name__ == '__main__':
  app.run(main)
