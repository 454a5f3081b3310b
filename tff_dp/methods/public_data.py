"""Server-held public batches (FL-TOP's Top-K selection, Kerkouche et al.).

Kerkouche et al. 2021 (FL-TOP) select the Top-K weights with a batch of 10
MNIST images for Fashion-MNIST ("we randomly select a batch with size 10
from MNIST dataset", in its evaluation). We have no MNIST file, so EMNIST
digits stand in: by default (`mode='random'`) 10 digits drawn uniformly at
random, without replacement and with no class balancing, from the digits
(labels 0-9) of the official EMNIST ByClass test split
(`emnist_byclass_test.npz`), which no Fashion-MNIST client holds. Without
that file, the test split of a prepared TFDS `emnist/byclass` (else
`emnist/digits`) serves (`tasks.tfds_data`: the data directory, then
`~/tensorflow_datasets` or `$TFDS_DATA_DIR`); TFDS stores the examples in
its own order, so the same seed draws other digits. The draw is public
randomness from the run's `seed`. `mode='first_per_class'` (the first
digit of each class) is what the FL-TOP rows of
benchmarks/results/seed004_fashion.md recorded with
`--public_batch=first_per_class` need. For the medical task Kerkouche et
al. use a server-held batch of patients never given to clients: the
tabular tasks hold one out when loaded with `server_batch_size` > 0
(`--task_option=server_batch_size=N` in the runner), and it is returned
here.
"""

from typing import Optional

import numpy as np

from tff_dp.tasks import public as public_sets

MODES = ('random', 'first_per_class')
BATCH_SIZE = 10


def check_mode(mode: str) -> None:
  """Raises ValueError unless `mode` is one of `MODES`."""
  if mode not in MODES:
    raise ValueError(f'public_batch must be one of {MODES}. Found {mode!r}.')


def _emnist_test_split(data_dir) -> tuple[np.ndarray, np.ndarray]:
  """EMNIST test images (uint8, upright, ink high) and labels (0-9: digits)."""
  x, y, _ = public_sets.load_emnist_byclass_test(data_dir, digits_only=True)
  return x, y


def public_batch(
  task,
  data_dir: Optional[str] = None,
  *,
  mode: str = 'random',
  seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
  """`(x, y)` of the public batch for a `FederatedTask`, model-ready.

  Args:
    task: The `FederatedTask`.
    data_dir: Where to look for the EMNIST file (image tasks).
    mode: Image tasks: 'random' (10 random EMNIST digits drawn from `seed`)
      or 'first_per_class' (the first digit of each class). The tabular
      tasks' server-held batch is fixed when the task is loaded.
    seed: The draw's seed (public randomness), for `mode='random'`.

  Returns:
    `(x, y)`: images as float32 in [0, 1] with a channel axis and int32
    labels, or the tabular task's held-out `(public_x, public_y)`.

  Raises:
    ValueError: If no public batch is defined for the task, or on a bad
      mode.
    DataNotFoundError: If neither the file nor a TFDS EMNIST is found.
  """
  check_mode(mode)
  task_name = task.name
  if task.public_x is not None:
    return task.public_x, task.public_y
  if task_name in ('physionet2012', 'heart_disease'):
    raise ValueError(
      f'Task {task_name!r} has no server-held batch: load it with '
      'server_batch_size > 0 (runner: --task_option=server_batch_size=356).'
    )
  if task_name.startswith('fashion_mnist'):
    x, y = _emnist_test_split(data_dir)
    if mode == 'first_per_class':
      chosen = [int(np.flatnonzero(y == c)[0]) for c in range(10)]
    else:
      digits = np.flatnonzero(y < 10)
      rng = np.random.default_rng(seed)
      chosen = np.sort(rng.choice(digits, size=BATCH_SIZE, replace=False))
    return (
      x[chosen][..., None].astype(np.float32) / 255.0,
      y[chosen].astype(np.int32),
    )
  raise ValueError(
    f'No public batch is defined for task {task_name!r}; FL-TOP needs one '
    '(available: fashion_mnist_iid, fashion_mnist_5labels).'
  )
