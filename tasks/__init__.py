"""tff_dp.tasks: real-data federated tasks, partitions and models.

`load_task(name, data_dir=None, **kwargs)` builds a registered task; the
loaders can also be called directly. A loader that finds no local copy
downloads its canonical source into the Keras cache (`download`), unless
`download=False` or `TFF_DP_NO_DOWNLOAD=1`.
"""

import dataclasses
import functools
from typing import Callable, Optional

from tff_dp.tasks.cifar10 import load_cifar10
from tff_dp.tasks.client_data import ArrayClientData
from tff_dp.tasks import data_dir as data_dir_lib
from tff_dp.tasks.data_dir import DataNotFoundError
from tff_dp.tasks.data_dir import DataSource
from tff_dp.tasks.data_dir import resolve_data_dir
from tff_dp.tasks import download as download_lib
from tff_dp.tasks.download import DownloadError
from tff_dp.tasks.emnist import load_emnist
from tff_dp.tasks.fashion_mnist import load_fashion_mnist
from tff_dp.tasks.medical import load_heart_disease
from tff_dp.tasks.medical import load_physionet2012
from tff_dp.tasks.task import client_preprocess_fn
from tff_dp.tasks.task import FederatedTask

__all__ = [
  'ArrayClientData',
  'DataNotFoundError',
  'DataSource',
  'DownloadError',
  'FederatedTask',
  'TASKS',
  'client_preprocess_fn',
  'load_cifar10',
  'load_emnist',
  'load_fashion_mnist',
  'load_heart_disease',
  'load_physionet2012',
  'load_task',
  'resolve_data_dir',
]

# Registry name -> loader with the papers' default setup.
TASKS: dict[str, Callable[..., FederatedTask]] = {
  'fashion_mnist_iid': load_fashion_mnist,
  'fashion_mnist_5labels': functools.partial(
    load_fashion_mnist, labels_per_client=5
  ),
  'emnist': load_emnist,
  'emnist_digits': functools.partial(load_emnist, only_digits=True),
  'cifar10_dirichlet': load_cifar10,
  'physionet2012': load_physionet2012,
  'heart_disease': load_heart_disease,
}


def load_task(
  name: str,
  data_dir: Optional[str] = None,
  *,
  download: Optional[bool] = None,
  **kwargs,
) -> FederatedTask:
  """Loads a registered task by name.

  The task's `data_sources` name what its loader read (files, any cache).

  Args:
    name: A key of `TASKS`.
    data_dir: The data directory (see `data_dir.resolve_data_dir`).
    download: Whether a loader that finds no local copy may download its
      source (None: allowed unless `TFF_DP_NO_DOWNLOAD=1`, which always
      forbids it).
    **kwargs: The loader's own arguments.

  Raises:
    ValueError: If `name` is not registered (the message lists the names).
    DataNotFoundError: If the data is neither found nor fetched
      (`DownloadError`, one line, when a download was forbidden or failed).
  """
  if name not in TASKS:
    raise ValueError(f'Unknown task {name!r}; choose one of {sorted(TASKS)}.')
  with data_dir_lib.recording() as read, download_lib.allowed(download):
    task = TASKS[name](data_dir, **kwargs)
  return dataclasses.replace(task, data_sources=tuple(read))
