"""Server-held public batches (FL-TOP's Top-K selection, seed 004).

Seed 004 selects the Top-K weights with a batch of 10 MNIST images for
Fashion-MNIST; we use 10 EMNIST digits (one of each class, the first in the
official EMNIST ByClass test split, `emnist_byclass_test.npz`), which no
Fashion-MNIST client holds. For the medical task seed 004 uses a server-held
batch of patients never given to clients; that split is not implemented
yet, so those tasks raise a clear error.
"""

from typing import Optional

import numpy as np

from tff_dp.tasks import data_dir as data_dir_lib

_EMNIST_SOURCE = (
  'EMNIST ByClass test split as emnist_byclass_test.npz '
  '(keys x_test, y_test; see the data README).'
)


def public_batch(
  task_name: str, data_dir: Optional[str] = None
) -> tuple[np.ndarray, np.ndarray]:
  """`(x, y)` of the public batch for `task_name`, model-ready float32.

  Raises:
    ValueError: If no public batch is defined for the task.
    DataNotFoundError: If the file is missing.
  """
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
