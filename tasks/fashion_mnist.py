"""Fashion-MNIST federated as in Guo et al. (CMP-Fed): 6,000 clients, IID
or 5 labels each.

Sources, in order: `fashion_mnist.npz` in the data directory (keys x_train,
y_train, x_test, y_test, as in `keras.datasets.fashion_mnist`), then the Keras
cache's IDX files (`fashion-mnist/*-idx?-ubyte.gz`, in the data directory or
`~/.keras/datasets`), then a prepared TFDS `fashion_mnist` (see `tfds_data`;
same examples, in TFDS's order). Failing all, the four IDX files (30.1 MB)
are downloaded from where `keras.datasets.fashion_mnist` fetches them into
the Keras cache, each checked against Zalando's published MD5 (`download`).
"""

import gzip
import pathlib
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_dp.tasks import client_data as client_data_lib
from tff_dp.tasks import data_dir as data_dir_lib
from tff_dp.tasks import download
from tff_dp.tasks import metrics as metrics_lib
from tff_dp.tasks import models
from tff_dp.tasks import partition
from tff_dp.tasks import task as task_lib
from tff_dp.tasks import tfds_data

_SOURCE = (
  'Fashion-MNIST (Xiao et al. 2017) comes from '
  'keras.datasets.fashion_mnist (IDX files in ~/.keras/datasets/'
  'fashion-mnist) or as fashion_mnist.npz with keys x_train, y_train, '
  'x_test, y_test, or as a prepared TFDS fashion_mnist '
  "(tfds.builder('fashion_mnist').download_and_prepare(), in "
  '~/tensorflow_datasets or $TFDS_DATA_DIR).'
)
_IDX = (
  'train-images-idx3-ubyte.gz',
  'train-labels-idx1-ubyte.gz',
  't10k-images-idx3-ubyte.gz',
  't10k-labels-idx1-ubyte.gz',
)
# Where `keras.datasets.fashion_mnist.load_data()` downloads from; the MD5s
# and sizes are those Zalando Research publishes for the official files
# (github.com/zalandoresearch/fashion-mnist, README).
_ORIGIN = 'https://storage.googleapis.com/tensorflow/tf-keras-datasets/'
REMOTE = download.Source(
  dataset='Fashion-MNIST',
  files=tuple(
    download.RemoteFile(name, _ORIGIN + name, md5, 'md5', size)
    for name, md5, size in (
      (_IDX[0], '8d4fb7e6c68d591d4c3dfef9ec88bf0d', 26421880),
      (_IDX[1], '25c81989df183df01b3e8a0aad5dffbe', 29515),
      (_IDX[2], 'bef4ecab320f06d8554ea6380940ec79', 4422102),
      (_IDX[3], 'bb300cfdad3c16e7a12a480ee83cd310', 5148),
    )
  ),
  folder='fashion-mnist',
)


def _read_idx(path: pathlib.Path) -> np.ndarray:
  with gzip.open(path, 'rb') as f:
    data = f.read()
  ndim = data[3]
  shape = tuple(
    int.from_bytes(data[4 + 4 * i : 8 + 4 * i], 'big') for i in range(ndim)
  )
  return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _read_idx_files(folder: pathlib.Path):
  data_dir_lib.record_read(
    'Keras Fashion-MNIST IDX files', [folder / f for f in _IDX]
  )
  return tuple(_read_idx(folder / f) for f in _IDX)


def load_arrays(data_dir: Optional[data_dir_lib.PathLike] = None):
  """Returns `(x_train, y_train, x_test, y_test)` as uint8 arrays.

  Images `(N, 28, 28)` (0 = background), labels 0-9; 60,000 train and 10,000
  test in the real data.
  """
  try:
    path = data_dir_lib.find_file(
      data_dir, ['fashion_mnist.npz'], source_hint=_SOURCE
    )
  except data_dir_lib.DataNotFoundError as npz_error:
    tried = list(npz_error.tried)
    root = data_dir_lib.resolve_data_dir(data_dir)
    for d in (
      root / 'fashion-mnist',
      data_dir_lib.keras_cache_dir() / 'fashion-mnist',
    ):
      tried.append(f'{d}/*-idx?-ubyte.gz')
      if all((d / f).exists() for f in _IDX):
        return _read_idx_files(d)
    try:
      return tfds_data.fashion_mnist_arrays(data_dir)
    except data_dir_lib.DataNotFoundError as tfds_error:
      tried += tfds_error.tried
    return _read_idx_files(download.fetch(REMOTE, tried))
  data_dir_lib.record_read('fashion_mnist.npz', [path])
  with np.load(path) as d:
    return d['x_train'], d['y_train'], d['x_test'], d['y_test']


def hold_out_clients(
  parts: list[np.ndarray], count: int, seed: int
) -> tuple[list[np.ndarray], np.ndarray]:
  """`(the other clients' parts, the held-out clients' example rows)`:
  `count` of the clients, drawn by `seed` (public randomness, apart from
  the split's own draws), opt in and leave the population.

  Raises:
    ValueError: Unless `count` is an integer in [1, len(parts) - 1].
  """
  num_clients = len(parts)
  if not (isinstance(count, (int, np.integer)) and 0 < count < num_clients):
    raise ValueError(
      f'public_clients must be an integer in [0, {num_clients - 1}] (the '
      f'clients who opt in, of num_clients). Found {count!r}.'
    )
  opted = np.zeros(num_clients, bool)
  opted[
    np.random.default_rng([seed, 1]).choice(num_clients, count, replace=False)
  ] = True
  rows = np.sort(np.concatenate([parts[i] for i in np.flatnonzero(opted)]))
  return [p for p, o in zip(parts, opted) if not o], rows


def load_fashion_mnist(
  data_dir: Optional[data_dir_lib.PathLike] = None,
  *,
  num_clients: int = 6000,
  labels_per_client: Optional[int] = None,
  partition_seed: int = 0,
  model: str = 'cnn',
  model_seed: int = 0,
  public_clients: int = 0,
) -> task_lib.FederatedTask:
  """Federated Fashion-MNIST.

  Args:
    data_dir: Data directory (see `tff_dp.tasks.data_dir`).
    num_clients: Number of clients (Guo et al.: 6,000, 10 examples each).
    labels_per_client: None for an IID split; else each client holds exactly
      this many labels (Guo et al.'s non-IID: 5).
    partition_seed: Seed of the split.
    model: 'cnn' (McMahan et al., 1,663,370 params) or 'mlp' (200 hidden).
    model_seed: Seed of the initial weights.
    public_clients: Clients who opt in to share their data (the public-data
      FL literature's opt-in users): that many of the `num_clients`, drawn
      by `partition_seed`, are held out of training and their examples
      kept as the task's `opt_in_x` / `opt_in_y` (the public set
      `fashion_mnist_opt_in`); 0 for none.

  Raises:
    DataNotFoundError: If no source is found.
    ValueError: On bad split arguments.
  """
  x_train, y_train, x_test, y_test = load_arrays(data_dir)
  if labels_per_client is None:
    parts = partition.iid_partition(len(y_train), num_clients, partition_seed)
    split = 'IID'
  else:
    parts = partition.labels_per_client_partition(
      y_train, num_clients, labels_per_client, partition_seed
    )
    split = f'{labels_per_client} labels per client'
  x_train = x_train[..., None]
  opt_in_x = opt_in_y = None
  if public_clients:
    parts, rows = hold_out_clients(parts, public_clients, partition_seed)
    opt_in_x = x_train[rows].astype(np.float32) / 255.0
    opt_in_y = y_train[rows].astype(np.int32)
    split += (
      f', {public_clients} opt-in clients ({len(rows):,} examples) held '
      'out as public data'
    )
  train = client_data_lib.ArrayClientData(x_train, y_train, parts)
  builders = {
    'cnn': lambda: models.create_cnn_mcmahan((28, 28, 1), 10, model_seed),
    'mlp': lambda: models.create_image_mlp((28, 28, 1), 10, (200,), model_seed),
  }
  if model not in builders:
    raise ValueError(
      f'model must be one of {sorted(builders)}. ' f'Found {model!r}.'
    )
  return task_lib.FederatedTask(
    name='fashion_mnist',
    train_data=train,
    test_x=(x_test[..., None].astype(np.float32) / 255.0),
    test_y=y_test.astype(np.int32),
    model_builder=builders[model],
    loss_builder=lambda: tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True
    ),
    metrics_builder=metrics_lib.classification_metrics,
    num_classes=10,
    opt_in_x=opt_in_x,
    opt_in_y=opt_in_y,
    description=(
      f'Fashion-MNIST, {num_clients} clients, {split} '
      f'(seed {partition_seed}); model {model}'
    ),
  )
