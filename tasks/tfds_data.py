"""Reads a user's prepared TensorFlow Datasets copy, never downloading.

A user who ran `tfds.builder(name).download_and_prepare()` (or `tfds.load`)
holds the data in TFDS format: `<tfds dir>/<name>[/<config>]/<version>/` with
`dataset_info.json`, `features.json` and TFRecord shards. The loaders of
Fashion-MNIST (`fashion_mnist`), CIFAR-10 (`cifar10`) and the public EMNIST
batch (`emnist/byclass`, then `emnist/digits`, test split) read such a copy
when their own files are not found. Looked in, in order: the data directory
(see `data_dir`), then `$TFDS_DATA_DIR` (default `~/tensorflow_datasets`,
TFDS's own default). The newest prepared version there is read with
`tfds.builder_from_directory`: files only, no download, no
`download_and_prepare`, no network.

The arrays have exactly the form of the loaders' other sources: uint8 images
(Fashion-MNIST and EMNIST `(N, 28, 28)`, CIFAR-10 `(N, 32, 32, 3)`), uint8
labels, the official train and test splits. Order: CIFAR-10 is put back in
the official order (TFDS keeps it in the `id` feature, `train_00000`...), so
its seeded splits equal those from the Keras files; Fashion-MNIST and EMNIST
have no such feature and come in the order TFDS stored them (the same
examples, so a seeded split gives other clients than from the Keras files).
TFDS EMNIST images are stored transposed, as raw EMNIST; they are transposed
back upright (MNIST style, ink high).

Federated EMNIST (`load_emnist`, split='writers') cannot come from TFDS:
TFDS's `emnist` has no writer ids, and that task is one client per writer
(it needs TFF's `emnist_all.sqlite` or LEAF FEMNIST). Only
split='dominant_classes', which pools the examples and deals them out again,
can use a TFDS EMNIST (`emnist/digits` or `emnist/byclass`).
"""

import os
import pathlib
from typing import Optional, Sequence

from absl import logging
import numpy as np

from tff_dp.tasks import data_dir as data_dir_lib

TFDS_DATA_DIR_ENV = 'TFDS_DATA_DIR'

EMNIST_NO_WRITERS = (
  "TFDS's emnist cannot give federated EMNIST (split='writers'): it has no "
  'writer ids, and that task is one client per writer; only '
  "split='dominant_classes' (examples pooled) can use a TFDS EMNIST."
)


def default_tfds_dir() -> pathlib.Path:
  """TFDS's own default: `$TFDS_DATA_DIR`, else `~/tensorflow_datasets`."""
  env = os.environ.get(TFDS_DATA_DIR_ENV)
  if env:
    return pathlib.Path(env).expanduser()
  return pathlib.Path('~/tensorflow_datasets').expanduser()


def search_dirs(
  data_dir: Optional[data_dir_lib.PathLike] = None,
) -> tuple[pathlib.Path, ...]:
  """The directories looked in: the data directory, then TFDS's default."""
  dirs = []
  for d in (data_dir_lib.resolve_data_dir(data_dir), default_tfds_dir()):
    if d not in dirs:
      dirs.append(d)
  return tuple(dirs)


def _version(name: str) -> Optional[tuple[int, int, int]]:
  parts = name.split('.')
  if len(parts) != 3 or not all(p.isdigit() for p in parts):
    return None  # E.g. '3.0.1.incompleteXYZ', a preparation cut short.
  return tuple(int(p) for p in parts)


def find_prepared(
  name: str,
  data_dir: Optional[data_dir_lib.PathLike] = None,
  config: Optional[str] = None,
) -> tuple[Optional[pathlib.Path], list[str]]:
  """`(version folder or None, folders looked in)` of a prepared dataset.

  The first search directory holding a prepared version wins; within it, the
  newest version with a `dataset_info.json`.
  """
  tried = []
  for d in search_dirs(data_dir):
    folder = d / name / config if config else d / name
    tried.append(f'{folder}/<version> (TFDS)')
    if not folder.is_dir():
      continue
    versions = [
      (_version(v.name), v)
      for v in folder.iterdir()
      if _version(v.name) and (v / 'dataset_info.json').is_file()
    ]
    if versions:
      return max(versions)[1], tried
  return None, tried


def _read(
  path: pathlib.Path, splits: Sequence[str], image_shape: tuple[int, ...]
) -> dict[str, dict[str, np.ndarray]]:
  """Reads whole splits of the prepared dataset at `path` as NumPy."""
  # Imported here: TFDS is slow to import and only this source needs it.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  logging.info('Reading the prepared TFDS dataset %s', path)
  data_dir_lib.record_read(
    'prepared TFDS dataset', sorted(p for p in path.iterdir() if p.is_file())
  )
  builder = tfds.builder_from_directory(str(path))
  missing = [s for s in splits if s not in builder.info.splits]
  if missing:
    raise ValueError(
      f'The TFDS dataset at {path} has splits '
      f'{sorted(builder.info.splits)}; missing {missing}.'
    )
  out = {}
  for split in splits:
    arrays = tfds.as_numpy(
      builder.as_dataset(split=split, batch_size=-1, shuffle_files=False)
    )
    image = arrays['image']
    if image.dtype != np.uint8 or image.shape[1:] != image_shape:
      raise ValueError(
        f'The TFDS dataset at {path} has {split} images of shape '
        f'{image.shape[1:]} and dtype {image.dtype}; expected {image_shape} '
        'uint8.'
      )
    out[split] = arrays
  return out


def _not_found(tried: list[str], what: str) -> data_dir_lib.DataNotFoundError:
  return data_dir_lib.DataNotFoundError(
    f'No prepared TFDS {what} in: {", ".join(tried)}.', tried=tuple(tried)
  )


def fashion_mnist_arrays(data_dir: Optional[data_dir_lib.PathLike] = None):
  """`(x_train, y_train, x_test, y_test)` from TFDS `fashion_mnist`.

  As `fashion_mnist.load_arrays`: uint8 `(N, 28, 28)` images, uint8 labels.

  Raises:
    DataNotFoundError: If no prepared copy is found (`tried` lists where).
  """
  path, tried = find_prepared('fashion_mnist', data_dir)
  if path is None:
    raise _not_found(tried, 'fashion_mnist')
  splits = _read(path, ('train', 'test'), (28, 28, 1))
  return tuple(
    a
    for s in ('train', 'test')
    for a in (splits[s]['image'][..., 0], splits[s]['label'].astype(np.uint8))
  )


def cifar10_arrays(data_dir: Optional[data_dir_lib.PathLike] = None):
  """`(x_train, y_train, x_test, y_test)` from TFDS `cifar10`, official order.

  As `cifar10.load_arrays`: uint8 NHWC `(N, 32, 32, 3)`, uint8 labels.

  Raises:
    DataNotFoundError: If no prepared copy is found (`tried` lists where).
  """
  path, tried = find_prepared('cifar10', data_dir)
  if path is None:
    raise _not_found(tried, 'cifar10')
  splits = _read(path, ('train', 'test'), (32, 32, 3))
  out = []
  for s in ('train', 'test'):
    # 'train_00042' -> the 43rd image of the official batches.
    order = np.argsort(splits[s]['id'], kind='stable')
    out += [splits[s]['image'][order], splits[s]['label'][order]]
  return out[0], out[1].astype(np.uint8), out[2], out[3].astype(np.uint8)


def emnist_arrays(
  data_dir: Optional[data_dir_lib.PathLike] = None,
  configs: Sequence[str] = ('byclass', 'digits'),
  splits: Sequence[str] = ('train', 'test'),
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], str]:
  """`({split: (x, y)}, source)` from the first prepared `emnist/<config>`.

  Images uint8 `(N, 28, 28)`, upright, ink high (MNIST style); labels uint8
  as TFDS gives them (byclass: 0-9 digits, 10-35 'A'-'Z', 36-61 'a'-'z').
  No writer ids: see `EMNIST_NO_WRITERS`.

  Raises:
    DataNotFoundError: If no config is prepared (`tried` lists where).
  """
  tried = []
  for config in configs:
    path, config_tried = find_prepared('emnist', data_dir, config)
    tried += config_tried
    if path is None:
      continue
    arrays = _read(path, splits, (28, 28, 1))
    out = {
      s: (
        # Raw EMNIST layout (transposed) -> upright.
        np.ascontiguousarray(arrays[s]['image'][..., 0].transpose(0, 2, 1)),
        arrays[s]['label'].astype(np.uint8),
      )
      for s in splits
    }
    return out, f'TFDS emnist/{config} {path.name}'
  raise _not_found(tried, 'emnist/' + ' or emnist/'.join(configs))
