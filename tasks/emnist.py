"""Federated EMNIST by writer (Cheng et al. 2022, Zhang et al. 2022).

Which data is an explicit option of the task, `source` (never a consequence
of which file happens to be found), recorded in the task's description:
  * 'leaf_300' (the default, and what every committed result ran):
    `emnist_federated.npz` in the data directory, a documented 300-writer
    subset of LEAF FEMNIST (see the data README). It is not published
    anywhere to download: place it by hand.
  * 'tff': TFF's own federated EMNIST, `emnist_all.sqlite` (what
    `tff.simulation.datasets.emnist.load_data` reads: 3,400 writers), from
    the data directory, TFF's cache `~/.tff` or the Keras cache. When none
    holds it, `emnist_all.sqlite.lzma` (170.5 MB) is downloaded from TFF's
    public bucket into `~/.tff`, where TFF itself caches it, checked against
    its pinned SHA-256 and decompressed (4.7 GB, checked again; see
    `download`).
  * 'tfds': a prepared TFDS EMNIST (see `tfds_data`), for
    split='dominant_classes' only: `emnist/byclass` (62 classes), or with
    only_digits `emnist/digits`, else the digits of `emnist/byclass`.
    TFDS's EMNIST has no writer ids, so it cannot give split='writers'.
Images are stored uint8 with ink = 255 and background = 0 (MNIST style); the
first two sources store ink dark on white, so they are inverted once at load
time.
Labels: 0-9 digits, 10-35 'A'-'Z', 36-61 'a'-'z' (62 classes), or digits only.
"""

import pathlib
import re
import sqlite3
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

SOURCES = ('leaf_300', 'tff', 'tfds')

# NIST SD19's writers are numbered by form id (f0000-f4099) in partitions
# hsf_0-hsf_7; hsf_4, the 500 writers f2100-f2599, is SD19's standard test
# partition (its training files hold hsf_0-3, 6 and 7), and EMNIST keeps
# that split: EMNIST's test split is these writers' characters. The public
# set `emnist_byclass_test` therefore needs them out of the task
# (`drop_nist_test_writers`).
NIST_TEST_PARTITION = 'hsf_4'
_NIST_TEST_FORMS = (2100, 2600)
_WRITER_ID = re.compile(r'^f(\d{4})_\d+$')


def in_nist_test_partition(writer_ids) -> np.ndarray:
  """Whether each NIST writer id (e.g. 'f2104_52') is in SD19's test
  partition hsf_4 (forms f2100-f2599).

  Raises:
    ValueError: naming an id that is not of that form.
  """
  forms = []
  for writer in writer_ids:
    found = _WRITER_ID.match(str(writer))
    if found is None:
      raise ValueError(
        f"EMNIST writer id {str(writer)!r} is not a NIST id 'fNNNN_NN'."
      )
    forms.append(int(found.group(1)))
  forms = np.asarray(forms, np.int64)
  return (forms >= _NIST_TEST_FORMS[0]) & (forms < _NIST_TEST_FORMS[1])


_LEAF_SOURCE = (
  "EMNIST source='leaf_300' is emnist_federated.npz (keys x_train, "
  'y_train, client_train, x_test, y_test, client_test, writer_ids): a '
  '300-writer subset of LEAF FEMNIST built for this project (the data '
  "README gives its provenance); it is not downloadable. source='tff' "
  "downloads TFF's federated EMNIST (3,400 writers) instead."
)
_TFF_SOURCE = (
  "EMNIST source='tff' is TFF's emnist_all.sqlite "
  '(tff.simulation.datasets.emnist.load_data caches it in ~/.tff).'
)
_TFDS_SOURCE = (
  "EMNIST source='tfds' is a prepared TFDS emnist (digits or byclass; "
  "tfds.builder('emnist/digits').download_and_prepare(), in "
  '~/tensorflow_datasets or $TFDS_DATA_DIR).'
)
# What tff.simulation.datasets.emnist.load_data() fetches. TFF publishes no
# digest: the SHA-256s and sizes are of the file as served (the same values
# recorded independently in two public dataset manifests).
REMOTE = download.Source(
  dataset='TFF federated EMNIST',
  files=(
    download.RemoteFile(
      'emnist_all.sqlite.lzma',
      'https://storage.googleapis.com/tff-datasets-public/'
      'emnist_all.sqlite.lzma',
      'c3aaf91b4cf4e69d53d81627ad119eccdc878ff906f68e66063ff10f67faad48',
      'sha256',
      170507172,
    ),
  ),
  folder='',
  unlzma=download.Unpacked(
    'emnist_all.sqlite',
    '239b48fb3b3d69e70406d18a0605c821d4db3c803443c64788736bcb9f79ac56',
    4708990976,
  ),
  root='tff',
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


def _load_tfds(data_dir, only_digits: bool):
  """The TFDS source (writers None), else the error naming every path tried."""
  configs = ('digits', 'byclass') if only_digits else ('byclass',)
  try:
    splits, source = tfds_data.emnist_arrays(data_dir, configs)
  except data_dir_lib.DataNotFoundError as tfds_error:
    raise data_dir_lib.not_found(tfds_error.tried, _TFDS_SOURCE) from None
  (x_tr, y_tr), (x_te, y_te) = splits['train'], splits['test']
  if only_digits:  # byclass: keep the digits (emnist/digits has only them).
    x_tr, y_tr = x_tr[y_tr < 10], y_tr[y_tr < 10]
    x_te, y_te = x_te[y_te < 10], y_te[y_te < 10]
  return x_tr, y_tr, None, x_te, y_te, None, source


def _tff_sqlite(data_dir) -> pathlib.Path:
  """TFF's `emnist_all.sqlite`: found, else downloaded (`REMOTE`)."""
  try:
    return data_dir_lib.find_file(
      data_dir,
      ['emnist_all.sqlite'],
      source_hint=_TFF_SOURCE,
      extra_dirs=(data_dir_lib.tff_cache_dir(), data_dir_lib.keras_cache_dir()),
    )
  except data_dir_lib.DataNotFoundError as error:
    return download.fetch(REMOTE, error.tried)


def load_emnist_arrays(
  data_dir: Optional[data_dir_lib.PathLike] = None,
  only_digits: bool = False,
  *,
  source: str = 'leaf_300',
):
  """Returns `(x_tr, y_tr, writer_tr, x_te, y_te, writer_te, source)`.

  Images are uint8, ink high. `writer_*` are string writer ids, or None
  from source='tfds'. The last item names the source read.

  Raises:
    DataNotFoundError: If the source's files are neither found nor fetched.
    ValueError: If `source` is not one of `SOURCES`.
  """
  if source not in SOURCES:
    raise ValueError(f'source must be one of {SOURCES}. Found {source!r}.')
  if source == 'tfds':
    return _load_tfds(data_dir, only_digits)
  if source == 'tff':
    path = _tff_sqlite(data_dir)
    data_dir_lib.record_read('TFF federated EMNIST (emnist_all.sqlite)', [path])
    prefix = 'digits_only' if only_digits else 'all'
    x_tr, y_tr, w_tr = _load_sqlite(path, f'{prefix}_train')
    x_te, y_te, w_te = _load_sqlite(path, f'{prefix}_test')
    name = f'TFF federated EMNIST ({path.name})'
  else:
    path = data_dir_lib.find_file(
      data_dir, ['emnist_federated.npz'], source_hint=_LEAF_SOURCE
    )
    data_dir_lib.record_read('LEAF FEMNIST (emnist_federated.npz)', [path])
    with np.load(path) as d:
      writers = d['writer_ids']
      x_tr, y_tr = d['x_train'], d['y_train']
      w_tr = writers[d['client_train']]
      x_te, y_te = d['x_test'], d['y_test']
      w_te = writers[d['client_test']]
    name = f'LEAF FEMNIST ({path.name})'
    if only_digits:
      keep_tr, keep_te = y_tr < 10, y_te < 10
      x_tr, y_tr, w_tr = x_tr[keep_tr], y_tr[keep_tr], w_tr[keep_tr]
      x_te, y_te, w_te = x_te[keep_te], y_te[keep_te], w_te[keep_te]
  # Ink dark on white -> MNIST style.
  return (255 - x_tr, y_tr, w_tr, 255 - x_te, y_te, w_te, name)


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
  source: str = 'leaf_300',
  drop_nist_test_writers: int = 0,
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
      `partition.dominant_classes_partition`); their 1,920 clients of 500
      exceed the 29,289 digits here (55 at partition seed 0).
    num_clients: Clients of the 'dominant_classes' split (required there).
    partition_seed: Seed of the 'dominant_classes' split.
    dominant_count: Examples of each dominant class per client (230).
    other_count: Examples of each other class per client (5).
    source: Which data: 'leaf_300' (300 LEAF FEMNIST writers, the default),
      'tff' (TFF's federated EMNIST, 3,400 writers, downloaded when
      missing) or 'tfds' (a prepared TFDS EMNIST, no writer ids:
      split='dominant_classes' only). See the module docstring.
    drop_nist_test_writers: 1 drops NIST SD19's test partition hsf_4,
      EMNIST's test split (public set `emnist_byclass_test`); 75 of leaf_300.

  Raises:
    DataNotFoundError: If the source's files are neither found nor fetched.
    ValueError: On bad arguments.
  """
  _check_emnist_args(max_clients, split, num_clients, source)
  arrays, dropped_words = _emnist_arrays(
    data_dir, only_digits, source, drop_nist_test_writers
  )
  x_tr, y_tr, w_tr, x_te, y_te, _, source_name = arrays
  if split == 'writers':
    writers, parts = _writer_parts(w_tr, max_clients)
    clients_words = f'{len(writers)} writers'
  else:
    writers, parts, clients_words = _dominant_clients(
      y_tr, num_clients, partition_seed, dominant_count, other_count
    )
  num_classes = 10 if only_digits else 62
  train = client_data_lib.ArrayClientData(
    x_tr[..., None], y_tr, parts, client_ids=list(writers)
  )
  return task_lib.FederatedTask(
    name='emnist_digits' if only_digits else 'emnist',
    train_data=train,
    test_x=x_te[..., None].astype(np.float32) / 255.0,
    test_y=y_te.astype(np.int32),
    model_builder=_model_builder(model, num_classes, model_seed),
    loss_builder=_loss,
    metrics_builder=metrics_lib.classification_metrics,
    num_classes=num_classes,
    description=(
      f'{source_name}: {clients_words}, {num_classes} classes; model {model}'
      f'{dropped_words}'
    ),
    # One client per writer: the test examples are the writers' own.
    test_held_by_clients=(split == 'writers'),
    writers_dropped=(NIST_TEST_PARTITION,) if drop_nist_test_writers else (),
  )


def _loss() -> tf.keras.losses.Loss:
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _emnist_arrays(
  data_dir, only_digits: bool, source: str, drop_nist_test_writers: int
) -> tuple[tuple, str]:
  """`load_emnist_arrays`' arrays, less the writers of NIST's test
  partition hsf_4 (training and test examples) if asked, and words saying
  what was dropped ('' if nothing).

  Raises:
    ValueError: If `drop_nist_test_writers` is not 0 or 1, or is 1 for a
      source without writer ids.
  """
  if drop_nist_test_writers not in (0, 1) or (
    drop_nist_test_writers and source == 'tfds'
  ):
    raise ValueError(
      'drop_nist_test_writers must be 0 or 1, and 1 needs writer ids '
      f"(source 'leaf_300' or 'tff'). Found {drop_nist_test_writers!r} with "
      f'source {source!r}.'
    )
  arrays = load_emnist_arrays(data_dir, only_digits, source=source)
  if not drop_nist_test_writers:
    return arrays, ''
  x_tr, y_tr, w_tr, x_te, y_te, w_te, source_name = arrays
  out_tr, out_te = in_nist_test_partition(w_tr), in_nist_test_partition(w_te)
  words = (
    f'; {len(np.unique(w_tr[out_tr]))} writers of NIST partition '
    f"{NIST_TEST_PARTITION} (EMNIST's test split) dropped "
    f'({int(out_tr.sum()):,} training, {int(out_te.sum()):,} test examples)'
  )
  kept = (
    x_tr[~out_tr],
    y_tr[~out_tr],
    w_tr[~out_tr],
    x_te[~out_te],
    y_te[~out_te],
    w_te[~out_te],
    source_name,
  )
  return kept, words


def _check_emnist_args(
  max_clients, split: str, num_clients, source: str
) -> None:
  """`load_emnist`'s argument checks, before any data is read (ValueError)."""
  if source not in SOURCES:
    raise ValueError(f'source must be one of {SOURCES}. Found {source!r}.')
  if source == 'tfds' and split != 'dominant_classes':
    raise ValueError(
      f"source='tfds' serves split='dominant_classes' only. Found "
      f'split={split!r}. {tfds_data.EMNIST_NO_WRITERS}'
    )
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


def _model_builder(model: str, num_classes: int, model_seed: int):
  """`load_emnist`'s builder of `model` for 28 x 28 images.

  Raises:
    ValueError: If `model` is not one of them.
  """
  builders = _model_builders((28, 28, 1), num_classes, model_seed)
  if model not in builders:
    raise ValueError(
      f'model must be one of {sorted(builders)}. ' f'Found {model!r}.'
    )
  return builders[model]


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
