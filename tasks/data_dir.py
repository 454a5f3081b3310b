"""Resolution of the directory that holds the real datasets.

Every loader takes a `data_dir`. When it is `None`, the directory is taken from
the environment variable `TFF_DP_DATA_DIR`, and failing that from
`../shared/data` next to the repository (the layout of a development checkout).
Decoded caches (e.g. CIFAR-10 pixels) go to `TFF_DP_CACHE_DIR`, default
`~/.cache/tff_dp`. Downloads (`download`) go to the Keras cache,
`$KERAS_HOME/datasets` (default `~/.keras/datasets`), as
`tf.keras.datasets` puts them.

What a loader read is recorded where it reads (`record_read`) and collected
by `recording()` (`tasks.load_task` puts it on the task as
`FederatedTask.data_sources`), so a run's summary can say which source it
read (EMNIST's TFF cache, when present, is read before the data directory's
file) and hash it (`file_sha256`, once per file and process).
"""

import contextlib
import contextvars
import dataclasses
import hashlib
import os
import pathlib
import threading
from typing import Iterator, Optional, Sequence, Union

PathLike = Union[str, os.PathLike]

DATA_DIR_ENV = 'TFF_DP_DATA_DIR'
CACHE_DIR_ENV = 'TFF_DP_CACHE_DIR'

# tasks/ -> repository root -> ../shared/data
_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = _REPO_ROOT.parent / 'shared' / 'data'

# Where Keras's `get_file` caches datasets: `$KERAS_HOME/datasets`, default
# `~/.keras/datasets` (read through `keras_cache_dir()`).
KERAS_CACHE_DIR = (
  pathlib.Path(os.environ.get('KERAS_HOME', '~/.keras')).expanduser()
  / 'datasets'
)


def keras_cache_dir() -> pathlib.Path:
  """The Keras dataset cache, where downloads land (`download`)."""
  return KERAS_CACHE_DIR


# Where `tff.simulation.datasets.*.load_data` caches (its `download`
# module's default, `~/.tff`); read through `tff_cache_dir()`.
TFF_CACHE_DIR = pathlib.Path('~/.tff').expanduser()


def tff_cache_dir() -> pathlib.Path:
  """TFF's dataset cache (federated EMNIST's `emnist_all.sqlite`)."""
  return TFF_CACHE_DIR


class DataNotFoundError(FileNotFoundError):
  """A dataset file is missing; the message says where such data comes from.

  `tried` holds the paths looked at (a loader with several sources joins
  them into one error, see `not_found`).
  """

  def __init__(self, message: str = '', tried: tuple[str, ...] = ()):
    super().__init__(message)
    self.tried = tuple(tried)


def resolve_data_dir(data_dir: Optional[PathLike] = None) -> pathlib.Path:
  """Returns the data directory: argument, then env variable, then default."""
  if data_dir is not None and str(data_dir):
    return pathlib.Path(data_dir).expanduser()
  env = os.environ.get(DATA_DIR_ENV)
  if env:
    return pathlib.Path(env).expanduser()
  return DEFAULT_DATA_DIR


def resolve_cache_dir() -> pathlib.Path:
  env = os.environ.get(CACHE_DIR_ENV)
  path = (
    pathlib.Path(env).expanduser()
    if env
    else (pathlib.Path('~/.cache/tff_dp').expanduser())
  )
  return path


def find_file(
  data_dir: Optional[PathLike],
  candidates: list[str],
  *,
  source_hint: str,
  extra_dirs: tuple[pathlib.Path, ...] = (),
) -> pathlib.Path:
  """Returns the first existing `data_dir/candidate` (or in `extra_dirs`).

  Args:
    data_dir: The data directory (see `resolve_data_dir`).
    candidates: File names relative to a directory, tried in order.
    source_hint: Where such data comes from, for the error message.
    extra_dirs: Further directories searched after `data_dir` (e.g. the Keras
      cache).

  Raises:
    DataNotFoundError: If none exists. The message names every path tried.
  """
  root = resolve_data_dir(data_dir)
  tried = []
  for directory in (root,) + tuple(extra_dirs):
    for name in candidates:
      path = directory / name
      tried.append(str(path))
      if path.exists():
        return path
  raise not_found(tried, source_hint)


def not_found(
  tried: Sequence[str], source_hint: str, note: str = ''
) -> DataNotFoundError:
  """The error of a loader that tried the paths `tried` (in order).

  Args:
    tried: Every path looked at, across all of the loader's sources.
    source_hint: Where such data comes from.
    note: Further words for the user (e.g. why a source cannot serve).
  """
  note = f'{note} ' if note else ''
  return DataNotFoundError(
    f'Dataset file not found. Tried: {", ".join(tried)}. {source_hint} '
    f'{note}Pass --data_dir (or set {DATA_DIR_ENV}) to the folder that '
    'holds it.',
    tried=tuple(tried),
  )


@dataclasses.dataclass(frozen=True)
class DataSource:
  """One source a loader read: its kind, its files and any cache.

  Attributes:
    kind: Which of the loader's sources, in words (e.g. 'TFF federated
      EMNIST (emnist_all.sqlite)').
    files: The files that source consists of, as absolute paths.
    cache: A cache derived from `files` that was read instead of decoding
      them again (CIFAR-10's decoded JPEGs), else None.
  """

  kind: str
  files: tuple[str, ...]
  cache: Optional[str] = None

  def to_dict(self) -> dict:
    return {'kind': self.kind, 'files': list(self.files), 'cache': self.cache}


_READS: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar(
  'tff_dp_data_reads', default=None
)


def record_read(
  kind: str,
  files: Sequence[PathLike],
  cache: Optional[PathLike] = None,
) -> None:
  """Notes that a loader read `files` (inside `recording()`; else nothing)."""
  reads = _READS.get()
  if reads is None:
    return
  source = DataSource(
    kind,
    tuple(str(pathlib.Path(f).resolve()) for f in files),
    None if cache is None else str(pathlib.Path(cache).resolve()),
  )
  if source not in reads:
    reads.append(source)


@contextlib.contextmanager
def recording() -> Iterator[list[DataSource]]:
  """Collects the `DataSource`s read inside the block, in reading order."""
  reads: list[DataSource] = []
  token = _READS.set(reads)
  try:
    yield reads
  finally:
    _READS.reset(token)


# (resolved path, size, mtime_ns) -> hex SHA-256: each file hashed once.
_SHA256: dict[tuple[str, int, int], str] = {}
_SHA256_LOCK = threading.Lock()


def file_sha256(path: PathLike) -> str:
  """The file's SHA-256 (hex), cached while its size and mtime stay."""
  resolved = pathlib.Path(path).resolve()
  stat = resolved.stat()
  key = (str(resolved), stat.st_size, stat.st_mtime_ns)
  with _SHA256_LOCK:
    if key in _SHA256:
      return _SHA256[key]
  digest = hashlib.sha256()
  with open(resolved, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  with _SHA256_LOCK:
    _SHA256[key] = digest.hexdigest()
  return _SHA256[key]
