"""Fetches a dataset's canonical public files into the user's cache.

When a loader finds no local copy (see `data_dir`), it fetches the files its
source publishes, the way `tf.keras.datasets.<name>.load_data()` or
`tff.simulation.datasets.emnist.load_data()` does, into the same cache
(`$KERAS_HOME/datasets`, default `~/.keras/datasets`; TFF's `~/.tff`), so a
Keras or TFF user's copy is found and a copy fetched here serves them too.

Each file is fetched with Keras's own downloader (`tf.keras.utils.get_file`)
into a staging folder beside the cache, checked against the digest pinned
here (the source's published MD5 or SHA-256), and only then moved into place
with `os.replace`: the cache never holds half a file or a file that failed
its check, and a file already there is used only if it passes the same
check.

Downloads are forbidden by `allowed(False)` (the run setting `--nodownload`,
see `tff_dp.tasks.load_task`) or by the environment variable
`TFF_DP_NO_DOWNLOAD=1` (jobs, CI and the test suite). A forbidden, refused or
failed download raises `DownloadError`: one line naming the dataset, what
was tried, the size, and where to place the files by hand.
"""

import contextlib
import contextvars
import dataclasses
import hashlib
import lzma
import os
import pathlib
import shutil
import socket
import tarfile
import tempfile
from typing import Iterator, Optional, Sequence

from absl import logging

from tff_dp.tasks import data_dir as data_dir_lib

NO_DOWNLOAD_ENV = 'TFF_DP_NO_DOWNLOAD'
# Seconds a connection may stay silent before the download is given up.
TIMEOUT_SECONDS = 60.0

_ALLOWED: contextvars.ContextVar[Optional[bool]] = contextvars.ContextVar(
  'tff_dp_download_allowed', default=None
)


class DownloadError(data_dir_lib.DataNotFoundError):
  """A dataset could not be fetched; the message is one line for the user."""


@dataclasses.dataclass(frozen=True)
class RemoteFile:
  """One published file.

  Attributes:
    name: Its name in the cache folder.
    url: Where it is published.
    digest: Its published checksum, hex.
    algorithm: 'md5' or 'sha256' (the one the source publishes).
    size: Its size in bytes (for the messages), None if not published.
  """

  name: str
  url: str
  digest: str
  algorithm: str
  size: Optional[int]

  def __post_init__(self):
    if self.algorithm not in ('md5', 'sha256'):
      raise ValueError(
        f"algorithm must be 'md5' or 'sha256'. Found {self.algorithm!r}."
      )


@dataclasses.dataclass(frozen=True)
class Source:
  """A dataset's published files and the cache folder they go to.

  Attributes:
    dataset: Its name, for the messages (e.g. 'Fashion-MNIST').
    files: The files to fetch.
    folder: The folder under the Keras cache that holds them, as Keras's
      own loader names it (e.g. 'fashion-mnist').
    untar: If set, the name of the folder the (single) `.tar.gz` file
      unpacks to, which is put in the cache instead of the archive, as
      `get_file(untar=True)` leaves it for CIFAR-10 (`folder` is then
      unused).
    unlzma: If set, the file the (single) `.lzma` file decompresses to,
      put in `folder` instead of the archive after its own check, as
      TFF's `download.get_compressed_file` leaves it.
    root: The cache: 'keras' (`$KERAS_HOME/datasets`), 'tff' (`~/.tff`,
      where `tff.simulation.datasets` caches) or, for sources no library
      fetches, 'tff_dp' (`$TFF_DP_CACHE_DIR`, default `~/.cache/tff_dp`).
    sums_url: If set, the source's published `SHA256SUMS`-style file: each
      file's digest is read from it at download time (its `digest` here is
      then unused).
  """

  dataset: str
  files: tuple[RemoteFile, ...]
  folder: str
  untar: Optional[str] = None
  unlzma: Optional['Unpacked'] = None
  root: str = 'keras'
  sums_url: Optional[str] = None

  def __post_init__(self):
    if self.root not in _ROOTS:
      raise ValueError(
        f'root must be one of {sorted(_ROOTS)}. Found {self.root!r}.'
      )
    if (self.untar or self.unlzma) and len(self.files) != 1:
      raise ValueError(
        f'{self.dataset}: an archive source has one file. Found '
        f'{len(self.files)}.'
      )

  @property
  def size(self) -> Optional[int]:
    sizes = [f.size for f in self.files]
    return None if None in sizes else sum(sizes)

  @property
  def cache_root(self) -> pathlib.Path:
    return _ROOTS[self.root]()


@dataclasses.dataclass(frozen=True)
class Unpacked:
  """The file an `.lzma` source decompresses to, with its pinned SHA-256."""

  name: str
  sha256: str
  size: int


_ROOTS = {
  'keras': data_dir_lib.keras_cache_dir,
  'tff': data_dir_lib.tff_cache_dir,
  # Sources no library caches: ours (`$TFF_DP_CACHE_DIR`).
  'tff_dp': data_dir_lib.resolve_cache_dir,
}


def env_forbids() -> bool:
  """Whether `TFF_DP_NO_DOWNLOAD` is set to a true value."""
  value = os.environ.get(NO_DOWNLOAD_ENV, '').strip().lower()
  return value not in ('', '0', 'false', 'no')


def is_allowed() -> bool:
  """Whether a loader may download now (`allowed`, then the environment)."""
  if env_forbids():
    return False
  allowed_now = _ALLOWED.get()
  return True if allowed_now is None else allowed_now


@contextlib.contextmanager
def allowed(value: Optional[bool]) -> Iterator[None]:
  """Inside the block downloads are allowed iff `value` (None: unchanged).

  `TFF_DP_NO_DOWNLOAD=1` forbids them whatever `value` is.
  """
  token = _ALLOWED.set(_ALLOWED.get() if value is None else bool(value))
  try:
    yield
  finally:
    _ALLOWED.reset(token)


def _megabytes(size: Optional[int]) -> str:
  return 'size not published' if size is None else f'{size / 1e6:.1f} MB'


def _digest(path: pathlib.Path, algorithm: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, algorithm).hexdigest()


def _verified(path: pathlib.Path, remote: RemoteFile) -> bool:
  return path.is_file() and _digest(path, remote.algorithm) == remote.digest


def _by_hand(source: Source, tried: Sequence[str]) -> str:
  names = ', '.join(f.name for f in source.files)
  if source.unlzma is not None:
    names = f'{source.unlzma.name} (decompressed {names})'
  where = source.cache_root / source.folder
  tried_text = f' Looked in: {", ".join(tried)}.' if tried else ''
  return (
    f'{tried_text} To place it by hand, put {names} (from '
    f'{source.files[0].url.rsplit("/", 1)[0]}/) in {where}, or pass '
    f'--data_dir (or set {data_dir_lib.DATA_DIR_ENV}) to a folder that '
    'holds the dataset.'
  )


def _reason(error: BaseException) -> str:
  # Keras's get_file raises a bare Exception that already names the URL.
  if type(error) is Exception:  # pylint: disable=unidiomatic-typecheck
    return str(error)
  return f'{type(error).__name__}: {error}'


def _line(text: str) -> str:
  return ' '.join(str(text).split())


def fetch(source: Source, tried: Sequence[str] = ()) -> pathlib.Path:
  """Fetches `source` into its cache; returns its cache folder.

  Files already in the cache that pass their check are kept (and need no
  download, so they serve offline and under `--nodownload`); the others are
  fetched, checked and moved into place.

  Args:
    source: What to fetch.
    tried: The local paths the loader looked at, for the error message.

  Returns:
    `<cache>/<source.folder>`; with `untar`, the unpacked folder; with
    `unlzma`, the decompressed file.

  Raises:
    DownloadError: If downloads are forbidden, the source cannot be reached
      or refuses, or a file fails its checksum (nothing is then cached).
  """
  cache = source.cache_root
  target = cache / (source.untar or source.folder)
  folder = cache / source.folder
  if _in_cache(source, folder):
    return folder
  if not is_allowed():
    raise DownloadError(
      _line(
        f'{source.dataset} is not on this machine and downloads are off '
        f'(--nodownload or {NO_DOWNLOAD_ENV}); it would fetch '
        f'{_megabytes(source.size)}.' + _by_hand(source, tried)
      ),
      tried=tuple(tried),
    )
  cache.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(
    tempfile.mkdtemp(dir=cache, prefix=f'.{source.folder}.partial-')
  )
  previous_timeout = socket.getdefaulttimeout()
  socket.setdefaulttimeout(TIMEOUT_SECONDS)
  try:
    if source.sums_url is not None:
      source = _with_published_sums(source, staging, tried)
    if source.untar is None and source.unlzma is None:
      missing = [f for f in source.files if not _verified(folder / f.name, f)]
    else:  # The archive is not kept: asked for only when unpacked is not.
      missing = list(source.files)
    for remote in missing:
      path = _get(source, remote.name, remote.url, staging, tried)
      got = _digest(path, remote.algorithm)
      if got != remote.digest:
        raise DownloadError(
          _line(
            f'{source.dataset}: the downloaded {remote.name} from '
            f'{remote.url} fails its {remote.algorithm} check (got {got}, '
            f'published {remote.digest}; {path.stat().st_size} bytes of '
            f'{_megabytes(remote.size)}): a truncated or corrupted file, '
            'not cached.' + _by_hand(source, tried)
          ),
          tried=tuple(tried),
        )
    if source.untar is not None:
      return _unpack(source, staging, target)
    if source.unlzma is not None:
      return _decompress(source, staging, folder, tried)
    folder.mkdir(parents=True, exist_ok=True)
    for remote in missing:
      os.replace(staging / 'files' / remote.name, folder / remote.name)
    logging.info('%s cached in %s', source.dataset, folder)
    return folder
  finally:
    socket.setdefaulttimeout(previous_timeout)
    shutil.rmtree(staging, ignore_errors=True)


def _in_cache(source: Source, folder: pathlib.Path) -> bool:
  """Whether `folder` holds the source's files already (placed by hand or
  fetched before): each passing its pinned digest, or merely present for a
  source whose digests are published in a sums file, which cannot be read
  offline (its loader then pins what it builds from them)."""
  if source.untar is not None or source.unlzma is not None:
    return False  # Their loaders look for the unpacked result themselves.
  if source.sums_url is not None:
    return all((folder / f.name).is_file() for f in source.files)
  return all(_verified(folder / f.name, f) for f in source.files)


def _get(
  source: Source,
  name: str,
  url: str,
  staging: pathlib.Path,
  tried: Sequence[str],
) -> pathlib.Path:
  """Downloads `url` into `staging/files/name` with Keras's `get_file`."""
  # Imported here: TensorFlow is slow to import and only a download needs it.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  size = next((f.size for f in source.files if f.name == name), None)
  logging.info('Downloading %s (%s) from %s', name, _megabytes(size), url)
  try:
    return pathlib.Path(
      tf.keras.utils.get_file(
        name, origin=url, cache_dir=str(staging), cache_subdir='files'
      )
    )
  except Exception as e:  # pylint: disable=broad-except
    raise DownloadError(
      _line(
        f'{source.dataset}: could not download {name} ({_megabytes(size)} '
        f'of {_megabytes(source.size)}) from {url}: {_reason(e)}.'
        + _by_hand(source, tried)
      ),
      tried=tuple(tried),
    ) from None


def _with_published_sums(
  source: Source, staging: pathlib.Path, tried: Sequence[str]
) -> Source:
  """`source` with each file's SHA-256 from the source's own sums file
  (`<sha256>  <name>` lines, as `sha256sum` writes and PhysioNet
  publishes)."""
  name = source.sums_url.rsplit('/', 1)[-1]
  sums = {}
  for line in (
    _get(source, name, source.sums_url, staging, tried)
    .read_text(errors='replace')
    .splitlines()
  ):
    parts = line.split()
    if len(parts) == 2:
      sums[parts[1].lstrip('*')] = parts[0].lower()
  unlisted = [f.name for f in source.files if f.name not in sums]
  if unlisted:
    raise DownloadError(
      _line(
        f'{source.dataset}: {source.sums_url} lists no SHA-256 for '
        f'{", ".join(unlisted)}; nothing downloaded.' + _by_hand(source, tried)
      ),
      tried=tuple(tried),
    )
  return dataclasses.replace(
    source,
    files=tuple(
      dataclasses.replace(f, digest=sums[f.name], algorithm='sha256')
      for f in source.files
    ),
    sums_url=None,
  )


def _unpack(
  source: Source, staging: pathlib.Path, target: pathlib.Path
) -> pathlib.Path:
  """Unpacks the source's one archive into `target` (atomically)."""
  (remote,) = source.files
  archive = staging / 'files' / remote.name
  with tarfile.open(archive, 'r:gz') as tar:
    tar.extractall(staging / 'unpacked', filter='data')
  unpacked = staging / 'unpacked' / source.untar
  if not unpacked.is_dir():
    raise DownloadError(
      f'{source.dataset}: {remote.name} holds no folder {source.untar!r}.'
    )
  if target.exists():
    shutil.rmtree(target)
  os.replace(unpacked, target)
  logging.info('%s unpacked into %s', source.dataset, target)
  return target


def _decompress(
  source: Source,
  staging: pathlib.Path,
  folder: pathlib.Path,
  tried: Sequence[str],
) -> pathlib.Path:
  """Decompresses the source's `.lzma` file, checks it, moves it in place."""
  (remote,) = source.files
  out = staging / source.unlzma.name
  logging.info(
    'Decompressing %s to %s (%s)',
    remote.name,
    source.unlzma.name,
    _megabytes(source.unlzma.size),
  )
  digest = hashlib.sha256()
  decompressor = lzma.LZMADecompressor()
  with open(staging / 'files' / remote.name, 'rb') as f, open(out, 'wb') as o:
    for block in iter(lambda: f.read(1 << 20), b''):
      data = decompressor.decompress(block)
      digest.update(data)
      o.write(data)
  if digest.hexdigest() != source.unlzma.sha256:
    raise DownloadError(
      _line(
        f'{source.dataset}: {remote.name} decompresses to a '
        f'{source.unlzma.name} that fails its sha256 check (got '
        f'{digest.hexdigest()}, pinned {source.unlzma.sha256}): not cached.'
        + _by_hand(source, tried)
      ),
      tried=tuple(tried),
    )
  folder.mkdir(parents=True, exist_ok=True)
  os.replace(out, folder / source.unlzma.name)
  logging.info('%s cached in %s', source.dataset, folder)
  return folder / source.unlzma.name


def write_derived(
  path: pathlib.Path,
  data: bytes,
  sha256: Optional[str],
  dataset: str,
  made_from: str,
) -> pathlib.Path:
  """Writes a file built from downloaded ones, atomically, if it has `sha256`.

  The loaders that convert a source's own files into the form they read
  (e.g. UCI's four heart-disease files into one CSV) pin the result's
  digest: a conversion that does not give exactly the pinned file is
  refused, and nothing is written.

  Raises:
    DownloadError: If `data` does not have the pinned digest.
  """
  got = hashlib.sha256(data).hexdigest()
  if sha256 is not None and got != sha256:
    raise DownloadError(
      _line(
        f'{dataset}: {path.name} built from {made_from} has SHA-256 {got}, '
        f'not the pinned {sha256}: not cached.'
      )
    )
  path.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.NamedTemporaryFile(
    'wb', dir=path.parent, delete=False, prefix=f'.{path.name}.'
  ) as f:
    f.write(data)
  os.replace(f.name, path)
  logging.info('%s: %s written from %s', dataset, path, made_from)
  return path
