"""CIFAR-10 with a seeded Dirichlet(alpha) label partition (Cheng et al.).

Sources, in order:
  1. The Keras cache `cifar-10-batches-py/` (the official pickled batches), in
     the data directory or `~/.keras/datasets`;
  2. `cifar10_jpeg.npz` in the data directory (the JPEG copy described in the
     data README), decoded once with Pillow into
     `$TFF_DP_CACHE_DIR/cifar10_decoded.npz` (default `~/.cache/tff_dp`);
  3. A prepared TFDS `cifar10` (see `tfds_data`), put back in the official
     order;
  4. Failing all, the official `cifar-10-python.tar.gz` (170.5 MB), fetched
     from where `keras.datasets.cifar10` fetches it, checked against the
     SHA-256 Keras pins, and unpacked into the Keras cache's
     `cifar-10-batches-py/` (`download`).
"""

import hashlib
import io
import os
import pathlib
import pickle
import tempfile
from typing import Optional

from absl import logging
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
  'CIFAR-10 (Krizhevsky 2009) comes from keras.datasets.cifar10 '
  '(~/.keras/datasets/cifar-10-batches-py) or as cifar10_jpeg.npz '
  '(keys jpeg_train, offsets_train, y_train, jpeg_test, offsets_test, '
  'y_test), or as a prepared TFDS cifar10 '
  "(tfds.builder('cifar10').download_and_prepare(), in "
  '~/tensorflow_datasets or $TFDS_DATA_DIR).'
)

# What `keras.datasets.cifar10.load_data()` fetches, with the SHA-256 it pins.
REMOTE = download.Source(
  dataset='CIFAR-10',
  files=(
    download.RemoteFile(
      'cifar-10-python.tar.gz',
      'https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz',
      '6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce',
      'sha256',
      170498071,
    ),
  ),
  folder='cifar-10-batches-py',
  untar='cifar-10-batches-py',
)


def _load_pickled_batches(folder: pathlib.Path):
  def read(name):
    with open(folder / name, 'rb') as f:
      batch = pickle.load(f, encoding='bytes')
    x = np.asarray(batch[b'data'], np.uint8).reshape(-1, 3, 32, 32)
    return x.transpose(0, 2, 3, 1), np.asarray(batch[b'labels'], np.uint8)

  names = [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']
  data_dir_lib.record_read(
    'Keras CIFAR-10 batches (cifar-10-batches-py)', [folder / n for n in names]
  )
  parts = [read(name) for name in names[:-1]]
  x_te, y_te = read('test_batch')
  return (
    np.concatenate([p[0] for p in parts]),
    np.concatenate([p[1] for p in parts]),
    x_te,
    y_te,
  )


def _decode_jpegs(buf: np.ndarray, offsets: np.ndarray) -> np.ndarray:
  from PIL import Image  # pylint: disable=g-import-not-at-top

  out = np.empty((len(offsets) - 1, 32, 32, 3), np.uint8)
  for i in range(len(offsets) - 1):
    raw = buf[offsets[i] : offsets[i + 1]].tobytes()
    out[i] = np.asarray(Image.open(io.BytesIO(raw)).convert('RGB'))
  return out


def _load_jpeg_npz(path: pathlib.Path):
  """Decodes the JPEG npz once; later calls read the decoded cache."""
  digest = hashlib.sha256(
    f'{path.resolve()}:{path.stat().st_size}:{path.stat().st_mtime_ns}'.encode()
  ).hexdigest()[:16]
  cache_dir = data_dir_lib.resolve_cache_dir()
  cache = cache_dir / f'cifar10_decoded_{digest}.npz'
  if cache.exists():
    try:
      with np.load(cache) as d:
        arrays = d['x_train'], d['y_train'], d['x_test'], d['y_test']
      data_dir_lib.record_read('cifar10_jpeg.npz', [path], cache=cache)
      return arrays
    except (OSError, ValueError, KeyError) as e:
      logging.warning('Ignoring unreadable CIFAR-10 cache %s: %s', cache, e)
  logging.info('Decoding %s (once; cached in %s)', path, cache)
  data_dir_lib.record_read('cifar10_jpeg.npz', [path])
  with np.load(path) as d:
    x_tr = _decode_jpegs(d['jpeg_train'], d['offsets_train'])
    x_te = _decode_jpegs(d['jpeg_test'], d['offsets_test'])
    y_tr, y_te = d['y_train'], d['y_test']
  try:
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Atomic: write to a temporary file, then rename.
    with tempfile.NamedTemporaryFile(
      dir=cache_dir, suffix='.npz', delete=False
    ) as f:
      np.savez(f, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te)
    os.replace(f.name, cache)
  except OSError as e:
    logging.warning('Could not write CIFAR-10 cache %s: %s', cache, e)
  return x_tr, y_tr, x_te, y_te


def load_arrays(data_dir: Optional[data_dir_lib.PathLike] = None):
  """Returns `(x_train, y_train, x_test, y_test)`, uint8, NHWC.

  Images `(N, 32, 32, 3)`, labels 0-9; 50,000 train and 10,000 test in the
  real data.
  """
  root = data_dir_lib.resolve_data_dir(data_dir)
  tried = []
  for folder in (
    root / 'cifar-10-batches-py',
    data_dir_lib.keras_cache_dir() / 'cifar-10-batches-py',
  ):
    tried.append(str(folder / 'test_batch'))
    if (folder / 'test_batch').exists():
      return _load_pickled_batches(folder)
  try:
    path = data_dir_lib.find_file(
      data_dir, ['cifar10_jpeg.npz'], source_hint=_SOURCE
    )
  except data_dir_lib.DataNotFoundError as npz_error:
    tried += npz_error.tried
  else:
    return _load_jpeg_npz(path)
  try:
    return tfds_data.cifar10_arrays(data_dir)
  except data_dir_lib.DataNotFoundError as tfds_error:
    tried += tfds_error.tried
  return _load_pickled_batches(download.fetch(REMOTE, tried))


SPLITS = ('dirichlet', 'class_balanced_overlap')


def load_cifar10(
  data_dir: Optional[data_dir_lib.PathLike] = None,
  *,
  num_clients: int = 100,
  alpha: float = 1.0,
  partition_seed: int = 0,
  model: str = 'cnn_2layers',
  min_examples_per_client: int = 10,
  model_seed: int = 0,
  split: str = 'dirichlet',
  per_class: int = 50,
) -> task_lib.FederatedTask:
  """CIFAR-10 split over `num_clients` with per-class Dirichlet(alpha).

  Args:
    data_dir: Data directory (see `tff_dp.tasks.data_dir`).
    num_clients: Number of clients, >= 1 (Cheng et al. 2022 do not state
      their N; Zhang et al. 2022 have 1,920).
    alpha: Dirichlet concentration, > 0 (Cheng et al.: 0.1, 1, 10, 100).
    partition_seed: Seed of the split.
    split: 'dirichlet' (the default, above) or 'class_balanced_overlap'
      (Zhang et al.: every client draws `per_class` examples of each class,
      overlapping with other clients; `partition.
      class_balanced_overlapping_partition`; `alpha` unused).
    per_class: Examples of each class per client for
      'class_balanced_overlap' (Zhang et al.: 50, or 5 in their "non-IID"
      case).
    model: 'cnn_2layers', 'resnet18_gn', 'cnn' or 'mlp' (Zhang et al.'s
      MLP).
    min_examples_per_client: Redraw splits that leave a smaller client.
    model_seed: Seed of the initial weights.
  """
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}. Found {split!r}.')
  x_tr, y_tr, x_te, y_te = load_arrays(data_dir)
  if split == 'dirichlet':
    parts = partition.dirichlet_partition(
      y_tr,
      num_clients,
      alpha,
      partition_seed,
      min_examples_per_client=min_examples_per_client,
    )
    split_words = f'Dirichlet(alpha={alpha})'
  else:
    parts = partition.class_balanced_overlapping_partition(
      y_tr, num_clients, per_class, partition_seed
    )
    split_words = f'{per_class} per class each, overlapping'
  shape = (32, 32, 3)
  builders = {
    'cnn_2layers': lambda: models.create_cnn_2layers(shape, 10, model_seed),
    'resnet18_gn': lambda: models.create_resnet18_gn(
      shape, 10, seed=model_seed
    ),
    'cnn': lambda: models.create_cnn_mcmahan(shape, 10, model_seed),
    'mlp': lambda: models.create_image_mlp(shape, 10, (200,), model_seed),
  }
  if model not in builders:
    raise ValueError(
      f'model must be one of {sorted(builders)}. ' f'Found {model!r}.'
    )
  return task_lib.FederatedTask(
    name='cifar10',
    train_data=client_data_lib.ArrayClientData(x_tr, y_tr, parts),
    test_x=x_te.astype(np.float32) / 255.0,
    test_y=y_te.astype(np.int32),
    model_builder=builders[model],
    loss_builder=lambda: tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True
    ),
    metrics_builder=metrics_lib.classification_metrics,
    num_classes=10,
    description=(
      f'CIFAR-10, {num_clients} clients, {split_words}'
      f' (seed {partition_seed}); model {model}'
    ),
  )
