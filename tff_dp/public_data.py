"""Server-held public batches (FL-TOP's Top-K selection, seed 004).

Seed 004 selects the Top-K weights with a batch of 10 MNIST images for
Fashion-MNIST; we use 10 EMNIST digits (one of each class, the first in the
official EMNIST ByClass test split, `emnist_byclass_test.npz`), which no
Fashion-MNIST client holds. For the medical task seed 004 uses a server-held
batch of patients never given to clients: the tabular tasks hold one out
when loaded with `server_batch_size` > 0 (`--task_option=server_batch_size=N`
in the runner), and it is returned here.
"""

from typing import Optional

import numpy as np

from tff_dp.tasks import data_dir as data_dir_lib

_EMNIST_SOURCE = (
  'EMNIST ByClass test split as emnist_byclass_test.npz '
  '(keys x_test, y_test; see the data README).'
)


def public_batch(
  task, data_dir: Optional[str] = None
) -> tuple[np.ndarray, np.ndarray]:
  """`(x, y)` of the public batch for a `FederatedTask`, model-ready.

  Raises:
    ValueError: If no public batch is defined for the task.
    DataNotFoundError: If the file is missing.
  """
  task_name = task.name
  if task.public_x is not None:
    return task.public_x, task.public_y
  if task_name in ('physionet2012', 'heart_disease'):
    raise ValueError(
      f'Task {task_name!r} has no server-held batch: load it with '
      'server_batch_size > 0 (runner: --task_option=server_batch_size=356).'
    )
  if task_name.startswith('fashion_mnist'):
    path = data_dir_lib.find_file(
      data_dir, ['emnist_byclass_test.npz'], source_hint=_EMNIST_SOURCE
    )
    with np.load(path) as d:
      x, y = d['x_test'], d['y_test']
    first = [int(np.flatnonzero(y == c)[0]) for c in range(10)]
    return (
      x[first][..., None].astype(np.float32) / 255.0,
      y[first].astype(np.int32),
    )
  raise ValueError(
    f'No public batch is defined for task {task_name!r}; FL-TOP needs one '
    '(available: fashion_mnist_iid, fashion_mnist_5labels).'
  )
