"""Federated EMNIST by writer (Cheng et al. 2022, Zhang et al. 2022).

Sources, in order:
  1. TFF's own federated EMNIST, `emnist_all.sqlite` (what
     `tff.simulation.datasets.emnist.load_data` caches: 3,383 writers), in the
     data directory or `~/.keras/datasets`;
  2. `emnist_federated.npz` in the data directory: LEAF FEMNIST, 300 writers
     (a documented subset, see the data README);
  3. for split='dominant_classes' only, a prepared TFDS EMNIST (see
     `tfds_data`): `emnist/byclass` (62 classes), or with only_digits
     `emnist/digits`, else the digits of `emnist/byclass`. TFDS's EMNIST has
     no writer ids, so it cannot give the default split='writers' (one
     client per writer): that split raises `DataNotFoundError` saying so.
Images are stored uint8 with ink = 255 and background = 0 (MNIST style); the
first two sources store ink dark on white, so they are inverted once at load
time.
Labels: 0-9 digits, 10-35 'A'-'Z', 36-61 'a'-'z' (62 classes), or digits only.
"""

import sqlite3
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_dp.tasks import client_data as client_data_lib
from tff_dp.tasks import data_dir as data_dir_lib
from tff_dp.tasks import metrics as metrics_lib
from tff_dp.tasks import models
from tff_dp.tasks import partition
from tff_dp.tasks import task as task_lib
from tff_dp.tasks import tfds_data

_SOURCE = (
  'Federated EMNIST comes from TFF (tff.simulation.datasets.emnist.'
  'load_data caches emnist_all.sqlite in ~/.keras/datasets) or as LEAF '
  'FEMNIST in emnist_federated.npz (keys x_train, y_train, '
  'client_train, x_test, y_test, client_test, writer_ids).'
)
_TFDS_SOURCE = (
  "For split='dominant_classes', a prepared TFDS emnist (digits or byclass; "
  "tfds.builder('emnist/digits').download_and_prepare(), in "
  '~/tensorflow_datasets or $TFDS_DATA_DIR) also serves.'
)


def _load_sqlite(path, split: str):
  """Reads one split of TFF's EMNIST SQLite file into arrays."""
  with sqlite3.connect(str(path)) as conn:
    rows = conn.execute(
      'SELECT client_id, serialized_example_proto FROM examples '
      'WHERE split_name = ? ORDER BY client_id',
      (split,),
    ).fetchall()
  if not rows:
    raise ValueError(f'No examples of split {split!r} in {path}.')
  ids = np.array([r[0] for r in rows])
  parsed = tf.io.parse_example(
    tf.constant([r[1] for r in rows]),
    {
      'pixels': tf.io.FixedLenFeature((28, 28), tf.float32),
      'label': tf.io.FixedLenFeature((), tf.int64),
    },
  )
  x = np.rint(parsed['pixels'].numpy() * 255).astype(np.uint8)
  y = parsed['label'].numpy().astype(np.uint8)
  return x, y, ids


def _load_tfds(data_dir, only_digits: bool, need_writers: bool, tried):
  """The TFDS source (writers None), else the error naming every path tried."""
  configs = ('digits', 'byclass') if only_digits else ('byclass',)
  if need_writers:
    note = tfds_data.EMNIST_NO_WRITERS
    for config in configs:
      path, _ = tfds_data.find_prepared('emnist', data_dir, config)
      if path is not None:
        note += f' (A prepared TFDS emnist/{config} is at {path}.)'
        break
    raise data_dir_lib.not_found(tried, _SOURCE, note=note)
  try:
    splits, source = tfds_data.emnist_arrays(data_dir, configs)
  except data_dir_lib.DataNotFoundError as tfds_error:
    raise data_dir_lib.not_found(
      tried + list(tfds_error.tried), f'{_SOURCE} {_TFDS_SOURCE}'
    ) from None
  (x_tr, y_tr), (x_te, y_te) = splits['train'], splits['test']
  if only_digits:  # byclass: keep the digits (emnist/digits has only them).
    x_tr, y_tr = x_tr[y_tr < 10], y_tr[y_tr < 10]
    x_te, y_te = x_te[y_te < 10], y_te[y_te < 10]
  return x_tr, y_tr, None, x_te, y_te, None, source


def load_emnist_arrays(
  data_dir: Optional[data_dir_lib.PathLike] = None,
  only_digits: bool = False,
  *,
  need_writers: bool = True,
):
  """Returns `(x_tr, y_tr, writer_tr, x_te, y_te, writer_te, source)`.

  Images are uint8, ink high. `writer_*` are string writer ids, or None
  from TFDS EMNIST, which is read only when `need_writers` is False.

  Raises:
    DataNotFoundError: If no source is found; with `need_writers`, the
      message says why TFDS EMNIST cannot serve.
  """
  tried = []
  for name, extra_dirs in (
    ('emnist_all.sqlite', (data_dir_lib.keras_cache_dir(),)),
    ('emnist_federated.npz', ()),
  ):
    try:
      path = data_dir_lib.find_file(
        data_dir, [name], source_hint=_SOURCE, extra_dirs=extra_dirs
      )
      break
    except data_dir_lib.DataNotFoundError as error:
      tried += error.tried
  else:  # Neither: TFDS EMNIST, already MNIST style, or the error.
    return _load_tfds(data_dir, only_digits, need_writers, tried)
  data_dir_lib.record_read(
    'TFF federated EMNIST (emnist_all.sqlite)'
    if path.suffix == '.sqlite'
    else 'LEAF FEMNIST (emnist_federated.npz)',
    [path],
  )
  if path.suffix == '.sqlite':
    prefix = 'digits_only' if only_digits else 'all'
    x_tr, y_tr, w_tr = _load_sqlite(path, f'{prefix}_train')
    x_te, y_te, w_te = _load_sqlite(path, f'{prefix}_test')
    source = f'TFF federated EMNIST ({path.name})'
  else:
    with np.load(path) as d:
      writers = d['writer_ids']
      x_tr, y_tr = d['x_train'], d['y_train']
      w_tr = writers[d['client_train']]
      x_te, y_te = d['x_test'], d['y_test']
      w_te = writers[d['client_test']]
    source = f'LEAF FEMNIST ({path.name})'
    if only_digits:
      keep_tr, keep_te = y_tr < 10, y_te < 10
      x_tr, y_tr, w_tr = x_tr[keep_tr], y_tr[keep_tr], w_tr[keep_tr]
      x_te, y_te, w_te = x_te[keep_te], y_te[keep_te], w_te[keep_te]
  # Ink dark on white -> MNIST style.
  return (255 - x_tr, y_tr, w_tr, 255 - x_te, y_te, w_te, source)


SPLITS = ('writers', 'dominant_classes')


def load_emnist(
  data_dir: Optional[data_dir_lib.PathLike] = None,
  *,
  only_digits: bool = False,
  model: str = 'cnn_2layers',
  max_clients: Optional[int] = None,
  model_seed: int = 0,
  split: str = 'writers',
  num_clients: Optional[int] = None,
  partition_seed: int = 0,
  dominant_count: int = 230,
  other_count: int = 5,
) -> task_lib.FederatedTask:
  """Federated EMNIST, one client per writer (or Zhang et al.'s label skew).

  Args:
    data_dir: Data directory (see `tff_dp.tasks.data_dir`).
    only_digits: Keep the 10 digit classes only (writers left with no
      example are dropped).
    model: 'cnn_2layers' (Reddi et al.), 'resnet18_gn', 'cnn' (McMahan et
      al.) or 'mlp' (Zhang et al. 2022's 2-layer MLP, 200 hidden units).
    max_clients: If set, keep the first this-many writers (sorted ids).
    model_seed: Seed of the initial weights.
    split: 'writers' (one client per writer) or 'dominant_classes': the
      writers' examples pooled and dealt to `num_clients` clients with 2
      dominant classes of `dominant_count` examples each and
      `other_count` of every other class, no example on two clients
      (Zhang et al. 2022's non-IID EMNIST digits,
      `partition.dominant_classes_partition`). Zhang et al. have 1,920
      clients of 500, more than EMNIST's 240,000 digits hold; the 29,289
      FEMNIST digits here hold 55 (partition seed 0), so its N needs
      smaller counts.
    num_clients: Clients of the 'dominant_classes' split (required there).
    partition_seed: Seed of the 'dominant_classes' split.
    dominant_count: Examples of each dominant class per client (230).
    other_count: Examples of each other class per client (5).

  Raises:
    DataNotFoundError: If no source is found (a TFDS EMNIST serves
      split='dominant_classes' only: it has no writer ids).
    ValueError: On bad arguments.
  """
  _check_emnist_args(max_clients, split, num_clients)
  x_tr, y_tr, w_tr, x_te, y_te, _, source = load_emnist_arrays(
    data_dir, only_digits, need_writers=(split == 'writers')
  )
  if split == 'writers':
    writers, parts = _writer_parts(w_tr, max_clients)
    clients_words = f'{len(writers)} writers'
  else:
    writers, parts, clients_words = _dominant_clients(
      y_tr, num_clients, partition_seed, dominant_count, other_count
    )
  num_classes = 10 if only_digits else 62
  builders = _model_builders((28, 28, 1), num_classes, model_seed)
  if model not in builders:
    raise ValueError(
      f'model must be one of {sorted(builders)}. ' f'Found {model!r}.'
    )
  train = client_data_lib.ArrayClientData(
    x_tr[..., None], y_tr, parts, client_ids=list(writers)
  )
  return task_lib.FederatedTask(
    name='emnist_digits' if only_digits else 'emnist',
    train_data=train,
    test_x=x_te[..., None].astype(np.float32) / 255.0,
    test_y=y_te.astype(np.int32),
    model_builder=builders[model],
    loss_builder=lambda: tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True
    ),
    metrics_builder=metrics_lib.classification_metrics,
    num_classes=num_classes,
    description=(
      f'{source}: {clients_words}, {num_classes} classes; model {model}'
    ),
    # One client per writer: the test examples are the writers' own.
    test_held_by_clients=(split == 'writers'),
  )


def _check_emnist_args(max_clients, split: str, num_clients) -> None:
  """`load_emnist`'s argument checks, before any data is read (ValueError)."""
  if max_clients is not None and max_clients < 1:
    raise ValueError(
      f'max_clients must be None or >= 1. Found {max_clients!r}.'
    )
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}. Found {split!r}.')
  if (split == 'dominant_classes') != (num_clients is not None):
    raise ValueError(
      "num_clients is for split='dominant_classes' (and required there). "
      f'Found split={split!r}, num_clients={num_clients!r}.'
    )


def _writer_parts(
  w_tr: np.ndarray, max_clients: Optional[int]
) -> tuple[np.ndarray, list[np.ndarray]]:
  """Sorted writer ids and each one's example indices (first `max_clients`)."""
  writers, inverse = np.unique(w_tr, return_inverse=True)
  order = np.argsort(inverse, kind='stable')
  bounds = np.searchsorted(inverse[order], np.arange(len(writers) + 1))
  parts = [order[bounds[i] : bounds[i + 1]] for i in range(len(writers))]
  if max_clients is not None:
    writers, parts = writers[:max_clients], parts[:max_clients]
  return writers, parts


def _dominant_clients(
  y_tr: np.ndarray,
  num_clients: int,
  partition_seed: int,
  dominant_count: int,
  other_count: int,
) -> tuple[list[str], list[np.ndarray], str]:
  """Client ids, index arrays and description of the 'dominant_classes'
  split (`partition.dominant_classes_partition`)."""
  parts = partition.dominant_classes_partition(
    y_tr,
    num_clients,
    partition_seed,
    dominant_count=dominant_count,
    other_count=other_count,
  )
  writers = [f'client_{i:04d}' for i in range(num_clients)]
  clients_words = (
    f'{num_clients} clients with 2 dominant classes of {dominant_count} '
    f'and {other_count} of each other (seed {partition_seed})'
  )
  return writers, parts, clients_words


def _model_builders(shape, num_classes: int, model_seed: int) -> dict:
  """No-arg Keras model builders by `load_emnist`'s model name."""
  return {
    'cnn_2layers': lambda: models.create_cnn_2layers(
      shape, num_classes, model_seed
    ),
    'resnet18_gn': lambda: models.create_resnet18_gn(
      shape, num_classes, seed=model_seed
    ),
    'cnn': lambda: models.create_cnn_mcmahan(shape, num_classes, model_seed),
    'mlp': lambda: models.create_image_mlp(
      shape, num_classes, (200,), model_seed
    ),
  }
