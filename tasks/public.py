"""Public data: a declared input the server may train on without privacy cost.

A public set is data no client holds and no test example repeats: the
server may pretrain on it (`--public_data`, `--public_pretrain_steps`) and
the run's epsilon does not change. Each set names its source files, size
and content hash, and `check_overlap` removes any example whose pixels are
also a client's or a test example (exact content match, reported).

Sets:
  emnist_byclass_test: EMNIST ByClass's official test split (116,323
    images, the 62 classes of federated EMNIST, upright, ink high) at half
    size (`half_size`: FEMNIST's glyphs are half EMNIST's), for the
    `emnist` task. Both it and LEAF's FEMNIST derive from NIST Special
    Database 19, and no image matches exactly (FEMNIST's are re-cropped):
    the writers are kept apart by SD19's partition instead. EMNIST's test
    split is SD19's test partition hsf_4 (writers f2100-f2599), so the set
    is refused unless the task drops those writers
    (`--task_option=drop_nist_test_writers=1`).
  fashion_mnist_opt_in: for the Fashion-MNIST tasks, the examples of the
    clients who opt in to share their data (`--task_option=public_clients=N`
    holds N clients out of training; the opt-in users of the public-data FL
    literature).
"""

import dataclasses
import gzip
import hashlib
import io
import pathlib
import string
from typing import Callable, Optional
import zipfile

from absl import logging

import numpy as np
import tensorflow as tf

from tff_dp.tasks import data_dir as data_dir_lib
from tff_dp.tasks import download
from tff_dp.tasks import task as task_lib
from tff_dp.tasks import tfds_data

_EMNIST_SOURCE = (
  'emnist_byclass_test.npz (EMNIST ByClass test split; x_test uint8 '
  '[n, 28, 28], upright with ink high, y_test int in [0, 62)), else '
  "NIST's EMNIST archive gzip.zip (downloaded, 562 MB)"
)
EMNIST_BYCLASS_NPZ = 'emnist_byclass_test.npz'
# NIST's EMNIST release (Cohen, Afshar, Tapson, van Schaik 2017), the
# archive torchvision's EMNIST fetches; NIST publishes no digest: the
# SHA-256 and size are those TFDS pins for it (its url_checksums/emnist.txt).
EMNIST_REMOTE = download.Source(
  dataset='EMNIST (NIST)',
  files=(
    download.RemoteFile(
      'gzip.zip',
      'https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip',
      'fb9bb67e33772a9cc0b895e4ecf36d2cf35be8b709693c3564cea2a019fcda8e',
      'sha256',
      561753746,
    ),
  ),
  folder='emnist-nist',
  root='tff_dp',
)
_BYCLASS_MEMBERS = (
  'gzip/emnist-byclass-test-images-idx3-ubyte.gz',
  'gzip/emnist-byclass-test-labels-idx1-ubyte.gz',
)
# The split's published size and its digits / upper / lower case counts
# (order-free; the data README's copy has them).
EMNIST_BYCLASS_TEST_COUNTS = (116323, 57918, 31346, 27059)
_BYCLASS_CLASSES = (
  string.digits + string.ascii_uppercase + string.ascii_lowercase
)


@dataclasses.dataclass(frozen=True)
class PublicData:
  """A public set, model-ready.

  Attributes:
    name: Its name (`--public_data`).
    x: Inputs, float32 in [0, 1] with a channel axis.
    y: Labels, int32, in the task's label space.
    files: The source files read (absolute paths).
    file_sha256: SHA-256 of each file, in `files`' order.
    content_sha256: SHA-256 over the examples kept (uint8 pixels, then
      labels), so two runs can tell they pretrained on the same examples.
    removed: Examples dropped because a client or test example had the
      same pixels.
    caveat: What the overlap check cannot show.
  """

  name: str
  x: np.ndarray
  y: np.ndarray
  files: tuple[str, ...]
  file_sha256: tuple[str, ...]
  content_sha256: str
  removed: int
  caveat: str = ''

  def summary(self) -> dict:
    """What a run's summary says about the set."""
    return {
      'name': self.name,
      'examples': int(len(self.y)),
      'files': list(self.files),
      'file_sha256': list(self.file_sha256),
      'content_sha256': self.content_sha256,
      'removed_as_overlapping': int(self.removed),
      'caveat': self.caveat,
    }


def example_digests(images: np.ndarray) -> np.ndarray:
  """One 16-byte BLAKE2b digest of each uint8 image's pixels."""
  images = np.ascontiguousarray(images, dtype=np.uint8)
  return np.array(
    [hashlib.blake2b(im.tobytes(), digest_size=16).digest() for im in images],
    dtype='S16',
  )


def to_uint8(x: np.ndarray) -> np.ndarray:
  """Model-ready [0, 1] floats (or uint8) as uint8 pixels, channel dropped."""
  if x.dtype != np.uint8:
    x = np.rint(np.asarray(x, np.float64) * 255.0).astype(np.uint8)
  if x.ndim == 4 and x.shape[-1] == 1:
    x = x[..., 0]
  return x


def overlap_mask(public: np.ndarray, *others: np.ndarray) -> np.ndarray:
  """True for each public image whose pixels equal one of `others`'."""
  seen = np.concatenate([example_digests(to_uint8(o)) for o in others])
  return np.isin(example_digests(to_uint8(public)), seen)


def content_sha256(x_uint8: np.ndarray, y: np.ndarray) -> str:
  h = hashlib.sha256()
  h.update(np.ascontiguousarray(x_uint8, np.uint8).tobytes())
  h.update(np.ascontiguousarray(y, np.int64).tobytes())
  return h.hexdigest()


# More overlap than this share means the set is the task's own data (e.g.
# EMNIST's test split as the public set of a task whose test set it is).
MAX_OVERLAP = 0.01


def from_arrays(
  name: str,
  x_uint8: np.ndarray,
  y: np.ndarray,
  task: task_lib.FederatedTask,
  *,
  files: tuple[str, ...] = (),
  caveat: str = '',
  transform: Optional[Callable[[np.ndarray], np.ndarray]] = None,
) -> PublicData:
  """A `PublicData` of uint8 images less those a client or test example of
  `task` also has, compared as loaded (before `transform`, which then maps
  the kept images to the clients' style).

  Raises:
    ValueError: If more than `MAX_OVERLAP` of the set is the task's data.
  """
  clients_x, _ = task.train_data.all_arrays()
  overlap = overlap_mask(x_uint8, clients_x, task.test_x)
  if overlap.mean() > MAX_OVERLAP:
    raise ValueError(
      f'public_data {name!r} shares {int(overlap.sum()):,} of its '
      f"{len(overlap):,} examples with task {task.name!r}'s clients or test "
      'set: it is not public data for this task.'
    )
  x_uint8, y = x_uint8[~overlap], np.asarray(y)[~overlap]
  if transform is not None:
    x_uint8 = transform(x_uint8)
  return PublicData(
    name=name,
    x=(x_uint8[..., None] / 255.0).astype(np.float32),
    y=y.astype(np.int32),
    files=files,
    file_sha256=tuple(data_dir_lib.file_sha256(f) for f in files),
    content_sha256=content_sha256(x_uint8, y),
    removed=int(overlap.sum()),
    caveat=caveat,
  )


def load_emnist_byclass_test(
  data_dir: Optional[data_dir_lib.PathLike] = None,
  *,
  digits_only: bool = False,
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
  """`(x uint8 [n, 28, 28], y, files)` of the EMNIST ByClass test split,
  as stored (full size): `emnist_byclass_test.npz` in the data directory or
  our cache, else a prepared TFDS `emnist/byclass` (no files named), else
  built in our cache from NIST's archive (`EMNIST_REMOTE`, downloaded when
  downloads are allowed; the archive is deleted once the split is kept).
  Each source's size and class counts are checked
  (`EMNIST_BYCLASS_TEST_COUNTS`), unless `digits_only`: a caller who needs
  only its digits (FL-TOP's public batch) takes any such file, or else
  TFDS `emnist/digits`' test split, another set.

  Raises:
    DataNotFoundError: None is found and the archive cannot be fetched
      (one line naming every path tried and where to put the file).
    ValueError: The file or TFDS split found is not the ByClass test split
      (its size and class counts are not `EMNIST_BYCLASS_TEST_COUNTS`).
  """
  cache = data_dir_lib.resolve_cache_dir()
  try:
    path = data_dir_lib.find_file(
      data_dir,
      [EMNIST_BYCLASS_NPZ],
      source_hint=_EMNIST_SOURCE,
      extra_dirs=(cache,),
    )
  except data_dir_lib.DataNotFoundError as npz_error:
    try:
      splits, source = tfds_data.emnist_arrays(
        data_dir,
        ('byclass', 'digits') if digits_only else ('byclass',),
        splits=('test',),
      )
    except data_dir_lib.DataNotFoundError as tfds_error:
      path = _byclass_from_nist(cache, npz_error.tried + tfds_error.tried)
    else:
      if digits_only:
        return (*splits['test'], ())
      return (*_checked_byclass(*splits['test'], source), ())
  data_dir_lib.record_read('EMNIST ByClass test split (public)', [path])
  with np.load(path) as d:
    x, y = d['x_test'], d['y_test']
  if not digits_only:
    x, y = _checked_byclass(x, y, str(path))
  return x, y, (str(path),)


def byclass_counts(y: np.ndarray) -> tuple[int, int, int, int]:
  """(examples, digits, upper, lower case) of ByClass labels (0-61)."""
  return (
    len(y),
    int(np.sum(y < 10)),
    int(np.sum((y >= 10) & (y < 36))),
    int(np.sum(y >= 36)),
  )


def _checked_byclass(
  x: np.ndarray, y: np.ndarray, source: str
) -> tuple[np.ndarray, np.ndarray]:
  """`(x, y)` if they are the ByClass test split by size and class counts.

  Raises:
    ValueError: naming the source, its counts and the split's.
  """
  counts = byclass_counts(y)
  if len(x) != len(y) or counts != EMNIST_BYCLASS_TEST_COUNTS:
    raise ValueError(
      f"public_data 'emnist_byclass_test': {source} gives {len(x)} images "
      f'and (examples, digits, upper, lower case) = {counts}, not the '
      f"ByClass test split's {EMNIST_BYCLASS_TEST_COUNTS}."
    )
  return x, y


def _byclass_from_nist(cache: pathlib.Path, tried) -> pathlib.Path:
  """`cache/emnist_byclass_test.npz`, built from NIST's archive (fetched)."""
  archive = download.fetch(EMNIST_REMOTE, tried) / EMNIST_REMOTE.files[0].name
  arrays = emnist_byclass_from_archive(archive)
  buffer = io.BytesIO()
  np.savez_compressed(buffer, **arrays)
  path = download.write_derived(
    cache / EMNIST_BYCLASS_NPZ,
    buffer.getvalue(),
    None,  # The archive is pinned; the split is checked by its counts.
    EMNIST_REMOTE.dataset,
    str(archive),
  )
  archive.unlink()
  logging.info('Deleted %s (only its ByClass test split is used).', archive)
  return path


def _idx(data: bytes, ndim: int, name: str) -> np.ndarray:
  """The uint8 array of an IDX file (MNIST's and EMNIST's format)."""
  header = 4 + 4 * ndim
  if len(data) < header or data[:4] != bytes([0, 0, 8, ndim]):
    raise download.DownloadError(
      f'{name} is not a {ndim}-d uint8 IDX file (header {data[:4]!r}).'
    )
  shape = tuple(
    int.from_bytes(data[4 + 4 * i : 8 + 4 * i], 'big') for i in range(ndim)
  )
  body = np.frombuffer(data, np.uint8, offset=header)
  if body.size != int(np.prod(shape)):
    raise download.DownloadError(
      f'{name} holds {body.size} bytes after its header, not the '
      f'{int(np.prod(shape))} of its shape {shape}.'
    )
  return body.reshape(shape)


def emnist_byclass_from_archive(archive: pathlib.Path) -> dict:
  """The arrays of `emnist_byclass_test.npz` from NIST's `gzip.zip`.

  `x_test` is the ByClass test images transposed upright (raw EMNIST
  stores each image transposed; the data README's copy and TFDS's loader
  here are upright), `y_test` the labels (0-61), `mapping` each class's
  ASCII code (`0-9A-Za-z`).

  Raises:
    DownloadError: The archive lacks the split's two files, or the split's
      size and class counts are not `EMNIST_BYCLASS_TEST_COUNTS`.
  """
  images, labels = _BYCLASS_MEMBERS
  with zipfile.ZipFile(archive) as z:
    missing = [m for m in _BYCLASS_MEMBERS if m not in z.namelist()]
    if missing:
      raise download.DownloadError(
        f'{EMNIST_REMOTE.dataset}: {archive} holds no {", ".join(missing)}.'
      )
    x = _idx(gzip.decompress(z.read(images)), 3, images)
    y = _idx(gzip.decompress(z.read(labels)), 1, labels)
  counts = byclass_counts(y)
  if len(x) != len(y) or counts != EMNIST_BYCLASS_TEST_COUNTS:
    raise download.DownloadError(
      f'{EMNIST_REMOTE.dataset}: {archive} gives {len(x)} images and '
      f'(examples, digits, upper, lower case) = {counts}, not the ByClass '
      f"test split's {EMNIST_BYCLASS_TEST_COUNTS}."
    )
  return dict(
    x_test=np.ascontiguousarray(x.transpose(0, 2, 1)),
    y_test=y.copy(),
    mapping=np.frombuffer(_BYCLASS_CLASSES.encode('ascii'), np.uint8),
  )


def half_size(images: np.ndarray) -> np.ndarray:
  """28x28 uint8 glyphs at half size (2x2 means), centred on 28x28.

  FEMNIST's glyphs are half EMNIST's (median height 11 px against 22 px,
  and ink on 5% of the pixels against 22%, measured on 3,000 of each):
  at half size EMNIST looks like the clients' data.
  """
  n, h, w = images.shape
  small = images.reshape(n, h // 2, 2, w // 2, 2).mean(axis=(2, 4))
  out = np.zeros_like(images)
  top, left = h // 4, w // 4
  out[:, top : top + h // 2, left : left + w // 2] = np.rint(small)
  return out


@dataclasses.dataclass(frozen=True)
class PublicSet:
  """A declared public set.

  Attributes:
    tasks: The tasks it may warm-start.
    loader: `(data_dir, task) -> (x uint8 [n, H, W], y, files read)`, the
      images as the source stores them (the overlap check compares these).
    caveat: What the exact-match overlap check cannot show.
    transform: Maps the kept images to the clients' style, or None.
    writers: The writer partition whose data the set is, which the task
      must have dropped (`FederatedTask.writers_dropped`), and the task
      option that drops it; empty if none.
  """

  tasks: tuple[str, ...]
  loader: Callable[
    [Optional[data_dir_lib.PathLike], task_lib.FederatedTask], tuple
  ]
  caveat: str = ''
  transform: Optional[Callable[[np.ndarray], np.ndarray]] = None
  writers: tuple[str, str] = ('', '')


def opted_in(
  data_dir: Optional[data_dir_lib.PathLike], task: task_lib.FederatedTask
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
  """The examples of the task's opt-in clients (`task.opt_in_x`, held out
  of training by the task option `public_clients`), as uint8 images.

  Raises:
    ValueError: If the task holds none out.
  """
  del data_dir  # Read with the task.
  if task.opt_in_x is None:
    raise ValueError(
      f'public_data needs clients who opt in: --task_option=public_clients=N '
      f"with N > 0 holds N of task {task.name!r}'s clients out of training "
      'as public data. Found none held out.'
    )
  return to_uint8(task.opt_in_x), task.opt_in_y, ()


SETS = {
  'emnist_byclass_test': PublicSet(
    tasks=('emnist',),
    loader=lambda data_dir, task: load_emnist_byclass_test(data_dir),
    caveat=(
      'EMNIST ByClass and LEAF FEMNIST are both renderings of NIST SD19. '
      "EMNIST's test split is SD19's test partition hsf_4 (writers "
      'f2100-f2599), which the task drops (drop_nist_test_writers=1); '
      "the other writers' characters are in EMNIST's training split, not "
      'in this set. That the set holds no client character rests on this '
      'partition, which no exact-match check can see (the renderings '
      'differ).'
    ),
    transform=half_size,
    writers=('hsf_4', 'drop_nist_test_writers=1'),
  ),
  'fashion_mnist_opt_in': PublicSet(
    tasks=('fashion_mnist',),
    loader=opted_in,
    caveat=(
      "The opt-in clients' own examples, held out of training "
      '(--task_option=public_clients): public because those users chose to '
      'share them, an assumption about them no check can make; their share '
      'of the population is a setting of the run.'
    ),
  ),
}


def load(
  name: str,
  task: task_lib.FederatedTask,
  data_dir: Optional[data_dir_lib.PathLike] = None,
) -> PublicData:
  """The public set `name` for `task`, overlaps removed.

  Raises:
    ValueError: If `name` is not a set, or not one for `task`, or `task`
      still holds the writers whose data it is.
    DataNotFoundError: If its file is not found.
  """
  if name not in SETS:
    raise ValueError(
      f'public_data must be one of {sorted(SETS)}. Found {name!r}.'
    )
  declared = SETS[name]
  if task.name not in declared.tasks:
    raise ValueError(
      f'public_data {name!r} is for task(s) {list(declared.tasks)}, not '
      f'{task.name!r}. No public set is declared for {task.name!r} yet.'
    )
  partition, option = declared.writers
  if partition and partition not in task.writers_dropped:
    raise ValueError(
      f'public_data {name!r} is the data of writer partition {partition!r}, '
      f'which task {task.name!r} still holds as clients and test examples: '
      f'pass --task_option={option} to drop them.'
    )
  x, y, files = declared.loader(data_dir, task)
  return from_arrays(
    name,
    x,
    y,
    task,
    files=files,
    caveat=declared.caveat,
    transform=declared.transform,
  )


class _Value(tf.keras.initializers.Initializer):
  """Initializes a weight to a given array (a warm start's weights)."""

  def __init__(self, value: np.ndarray):
    self.value = value

  def __call__(self, shape, dtype=None, **kwargs):
    if tuple(shape) != self.value.shape:
      raise ValueError(
        f'A warm-start weight of shape {self.value.shape} cannot initialize '
        f'a weight of shape {tuple(shape)}.'
      )
    return tf.constant(self.value, dtype=dtype or tf.float32)

  def get_config(self):
    # Not serialisable: models built by `WarmStart` are rebuilt from it.
    return {}


@dataclasses.dataclass(frozen=True, eq=False)
class WarmStart:
  """A model builder whose models start at `weights` (picklable).

  The weights become the layers' initializers, not an assignment after
  the build, so they hold where TFF traces the builder in a graph (its
  initial-weights computation). Layers must keep each weight `w` under
  a `<w>_initializer` attribute, as Keras's Dense, Conv and normalization
  layers do.

  Attributes:
    builder: Returns a fresh Keras model.
    weights: One array per weight of the model, in `model.weights` order.
  """

  builder: Callable[[], tf.keras.Model]
  weights: tuple[np.ndarray, ...]

  def __call__(self) -> tf.keras.Model:
    model = self.builder()
    if [tuple(w.shape) for w in model.weights] != [
      v.shape for v in self.weights
    ]:
      raise ValueError(
        'WarmStart weights must match the model weights in number and '
        f'shape: {[tuple(w.shape) for w in model.weights]}. Found '
        f'{[v.shape for v in self.weights]}.'
      )
    values = {id(w): v for w, v in zip(model.weights, self.weights)}

    def clone(layer):
      new = layer.__class__.from_config(layer.get_config())
      for w in layer.weights:
        key = w.name.rsplit('/', 1)[-1].split(':')[0] + '_initializer'
        if not hasattr(new, key):
          raise ValueError(
            f'Layer {layer.name!r} keeps no {key} for its weight {w.name}: '
            'WarmStart cannot set it.'
          )
        setattr(new, key, _Value(values[id(w)]))
      return new

    return tf.keras.models.clone_model(model, clone_function=clone)
