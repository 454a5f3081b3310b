r"""Where a round's time goes: one knob at a time.

Times `process.next` for 100 Fashion-MNIST clients as `tff_dp.job.training`
builds it, with knobs to isolate the fixed per-client cost of TFF's runtime
from training compute:

  python -m benchmarks.profile_round --local_steps=1 --model=mlp
  python -m benchmarks.profile_round --local_steps=1 --no_zero_init

Prints the seconds of each timed round (after one warm-up round) and the
worker's CPU seconds per round (and so the cores it kept busy). The defaults
are the first profile's settings (2 concurrent calls, TF's default inter-op
pool), not the runner's. Findings are summarised in the README.
"""

import os
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import rss  # noqa: E402
from tff_dp import tasks  # noqa: E402
from tff_dp.job import training  # noqa: E402

_STEPS = flags.DEFINE_integer('local_steps', 10, 'Local steps (batch 10).')
_MODEL = flags.DEFINE_string('model', 'cnn', 'Fashion-MNIST model.')
_METHOD = flags.DEFINE_string('method', 'dp_fedavg', 'Method.')
_ZERO = flags.DEFINE_bool(
  'zero_init', True, 'Client models with zero initializers.'
)
_CONC = flags.DEFINE_integer('concurrency', 2, 'Concurrent computations.')
_INTRA = flags.DEFINE_integer('intra_op_threads', 1, 'Worker intra threads.')
_INTER = flags.DEFINE_integer(
  'inter_op_threads', 0, 'Worker inter-op threads (0: TF default, 1/core).'
)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds.')
_CLIENTS = flags.DEFINE_integer('clients', 100, 'Clients per round.')


def _cpu_seconds(pid: int) -> float:
  with open(f'/proc/{pid}/stat') as f:
    parts = f.read().rsplit(')', 1)[1].split()
  return (int(parts[11]) + int(parts[12])) / os.sysconf('SC_CLK_TCK')


def main(argv):
  del argv
  config = training.ExperimentConfig.create(
    task='fashion_mnist_iid',
    method=_METHOD.value,
    rounds=_ROUNDS.value + 1,
    clients_per_round=_CLIENTS.value,
    noise_multiplier=1.185,
    delta=1e-4,
    clip=1.0,
    batch_size=10,
    local_epochs=_STEPS.value,
    local_steps=_STEPS.value,
    client_lr=0.05,
    max_concurrent_computation_calls=_CONC.value,
    intra_op_threads=_INTRA.value,
    inter_op_threads=_INTER.value,
    task_kwargs=(('model', _MODEL.value),),
  )
  config.validate()
  if not _ZERO.value:
    # The same process with client models built by the seeded builder.
    task_cls = tasks.FederatedTask
    task_cls.client_model_fn = lambda self, device=None: self.model_fn
  prepared = training.prepare(config)
  ids = list(
    np.random.default_rng(0).choice(
      prepared.task.train_data.client_ids, _CLIENTS.value, replace=False
    )
  )
  process = prepared.process
  state = process.initialize()
  for r in range(_ROUNDS.value + 1):
    data = prepared.round_data(config, ids, r)
    workers = rss.children(os.getpid())
    cpu0 = sum(_cpu_seconds(w) for w in workers)
    t0 = time.perf_counter()
    state = process.next(state, data).state
    wall = time.perf_counter() - t0
    workers = rss.children(os.getpid())
    cpu = sum(_cpu_seconds(w) for w in workers) - cpu0
    label = 'warm-up' if r == 0 else f'round {r}'
    print(
      f'{label}: {wall:.2f} s wall, worker {cpu:.2f} CPU s '
      f'({cpu / wall:.2f} cores)',
      flush=True,
    )


if __name__ == '__main__':
  app.run(main)
