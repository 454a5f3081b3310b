"""Downloads against a local HTTP server on 127.0.0.1 (never the internet).

The server (`local_server` and `serve_source`, tests/conftest.py) serves
tiny files in each
source's own format (gzipped IDX for Fashion-MNIST, the pickled-batch
tarball for CIFAR-10; TFF's EMNIST SQLite in tests/tasks/emnist_test.py);
the loaders' sources are pointed at it with the tiny files' digests.
"""

import dataclasses
import gzip
import io
import pickle
import socket
import tarfile

import numpy as np
import pytest

from tff_dp import tasks
from tff_dp.tasks import cifar10
from tff_dp.tasks import data_dir
from tff_dp.tasks import download
from tff_dp.tasks import fashion_mnist


@pytest.fixture
def isolated(tmp_path, monkeypatch):
  """No local copy anywhere, downloads allowed, the Keras cache in tmp."""
  monkeypatch.setattr(data_dir, 'KERAS_CACHE_DIR', tmp_path / 'keras')
  monkeypatch.setenv(data_dir.CACHE_DIR_ENV, str(tmp_path / 'cache'))
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path / 'no_tfds'))
  monkeypatch.delenv(download.NO_DOWNLOAD_ENV, raising=False)
  monkeypatch.setenv('no_proxy', '127.0.0.1,localhost')
  (tmp_path / 'empty').mkdir()
  return tmp_path


def _idx_gz(array) -> bytes:
  header = bytes([0, 0, 8, array.ndim]) + b''.join(
    int(d).to_bytes(4, 'big') for d in array.shape
  )
  return gzip.compress(header + array.astype(np.uint8).tobytes(), mtime=0)


def _fashion(serve_source, monkeypatch, corrupt=None):
  """Serves a tiny Fashion-MNIST; points the loader at it. Returns arrays.

  `corrupt`: a file name and a function of its bytes, served instead of
  them (with the digest of the good bytes pinned, as the real source's).
  """
  rng = np.random.default_rng(0)
  arrays = (
    rng.integers(0, 256, (12, 28, 28)),
    rng.integers(0, 10, 12),
    rng.integers(0, 256, (5, 28, 28)),
    rng.integers(0, 10, 5),
  )
  payloads = {
    f.name: _idx_gz(a) for f, a in zip(fashion_mnist.REMOTE.files, arrays)
  }
  served = None
  if corrupt is not None:
    served = {corrupt[0]: corrupt[1](payloads[corrupt[0]])}
  monkeypatch.setattr(
    fashion_mnist,
    'REMOTE',
    serve_source(fashion_mnist.REMOTE, payloads, served),
  )
  return arrays


def _cache_entries(isolated):
  keras = isolated / 'keras'
  return sorted(str(p.relative_to(keras)) for p in keras.rglob('*'))


def test_fashion_mnist_download_lands_in_the_cache_and_loads(
  isolated, local_server, serve_source, monkeypatch
):
  served, _ = local_server
  expected = _fashion(serve_source, monkeypatch)
  got = fashion_mnist.load_arrays(isolated / 'empty')
  for g, e in zip(got, expected):
    np.testing.assert_array_equal(g, e)
  # Exactly the four files, where keras.datasets.fashion_mnist keeps them;
  # no staging folder left.
  assert _cache_entries(isolated) == ['fashion-mnist'] + sorted(
    f'fashion-mnist/{f.name}' for f in fashion_mnist.REMOTE.files
  )
  # The cached copy is read next time, with the server's files gone.
  for f in served.iterdir():
    f.unlink()
  with data_dir.recording() as read:
    again = fashion_mnist.load_arrays(isolated / 'empty')
  np.testing.assert_array_equal(again[0], expected[0])
  assert read[0].kind == 'Keras Fashion-MNIST IDX files'


@pytest.mark.parametrize(
  'corrupt',
  [
    lambda b: b[: len(b) // 2],  # Truncated.
    lambda b: b[:-1] + bytes([b[-1] ^ 1]),  # One bit flipped.
  ],
  ids=['truncated', 'corrupted'],
)
def test_a_bad_file_is_refused_by_its_checksum_and_nothing_is_cached(
  isolated, local_server, serve_source, monkeypatch, corrupt
):
  _, base = local_server
  name = 'train-images-idx3-ubyte.gz'
  _fashion(serve_source, monkeypatch, corrupt=(name, corrupt))
  with pytest.raises(download.DownloadError) as e:
    fashion_mnist.load_arrays(isolated / 'empty')
  message = str(e.value)
  assert '\n' not in message
  assert f'the downloaded {name} from {base}{name} fails its md5' in message
  assert 'not cached' in message
  # Nothing of the attempt stays: no file (not even the good ones fetched
  # before it), no staging folder.
  assert _cache_entries(isolated) == []


def test_a_refused_connection_gives_one_line(isolated, monkeypatch):
  with socket.socket() as s:  # A port nothing listens on.
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  files = tuple(
    dataclasses.replace(f, url=f'http://127.0.0.1:{port}/{f.name}')
    for f in fashion_mnist.REMOTE.files
  )
  monkeypatch.setattr(
    fashion_mnist,
    'REMOTE',
    dataclasses.replace(fashion_mnist.REMOTE, files=files),
  )
  with pytest.raises(download.DownloadError) as e:
    fashion_mnist.load_arrays(isolated / 'empty')
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(
    'Fashion-MNIST: could not download train-images-idx3-ubyte.gz '
    '(26.4 MB of 30.9 MB)'
  )
  assert 'Connection refused' in message
  assert f'Looked in: {isolated / "empty" / "fashion_mnist.npz"}' in message
  assert f'in {isolated / "keras" / "fashion-mnist"}' in message
  assert '--data_dir' in message
  assert _cache_entries(isolated) == []


def test_nodownload_and_the_environment_forbid_it(isolated, monkeypatch):
  # No server at all: a download would fail another way.
  with pytest.raises(download.DownloadError) as e:
    tasks.load_task(
      'fashion_mnist_iid', str(isolated / 'empty'), download=False
    )
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(
    'Fashion-MNIST is not on this machine and downloads are off '
    '(--nodownload or TFF_DP_NO_DOWNLOAD); it would fetch 30.9 MB.'
  )
  monkeypatch.setenv(download.NO_DOWNLOAD_ENV, '1')
  with pytest.raises(download.DownloadError, match='downloads are off'):
    tasks.load_task('fashion_mnist_iid', str(isolated / 'empty'), download=True)
  assert _cache_entries(isolated) == []


def test_a_verified_file_in_the_cache_is_not_fetched_again(
  isolated, local_server, serve_source, monkeypatch
):
  served, _ = local_server
  _fashion(serve_source, monkeypatch)
  folder = isolated / 'keras' / 'fashion-mnist'
  folder.mkdir(parents=True)
  kept = fashion_mnist.REMOTE.files[0]
  (folder / kept.name).write_bytes((served / kept.name).read_bytes())
  (served / kept.name).unlink()  # It would fail if fetched.
  fetched = download.fetch(fashion_mnist.REMOTE)
  assert fetched == folder
  assert sorted(p.name for p in folder.iterdir()) == sorted(
    f.name for f in fashion_mnist.REMOTE.files
  )


def test_cifar10_download_unpacks_the_batches_into_the_cache(
  isolated, serve_source, monkeypatch
):
  rng = np.random.default_rng(1)
  buf = io.BytesIO()
  batches = {}
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    for name in [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']:
      data = rng.integers(0, 256, (4, 3072)).astype(np.uint8)
      labels = rng.integers(0, 10, 4).tolist()
      batches[name] = (data, labels)
      blob = pickle.dumps({b'data': data, b'labels': labels})
      info = tarfile.TarInfo(f'cifar-10-batches-py/{name}')
      info.size = len(blob)
      tar.addfile(info, io.BytesIO(blob))
  monkeypatch.setattr(
    cifar10,
    'REMOTE',
    serve_source(cifar10.REMOTE, {'cifar-10-python.tar.gz': buf.getvalue()}),
  )
  x_tr, y_tr, x_te, y_te = cifar10.load_arrays(isolated / 'empty')
  assert x_tr.shape == (20, 32, 32, 3) and x_te.shape == (4, 32, 32, 3)
  assert y_te.tolist() == batches['test_batch'][1]
  first = batches['data_batch_1'][0][0].reshape(3, 32, 32).transpose(1, 2, 0)
  np.testing.assert_array_equal(x_tr[0], first)
  # The unpacked folder only, as keras.datasets.cifar10 reads it.
  entries = _cache_entries(isolated)
  assert entries[0] == 'cifar-10-batches-py'
  assert all(e.startswith('cifar-10-batches-py') for e in entries)
  assert 'cifar-10-batches-py/test_batch' in entries


def test_bad_algorithm_is_named():
  with pytest.raises(ValueError, match="Found 'sha1'"):
    download.RemoteFile('f', 'http://127.0.0.1/f', 'ab', 'sha1', 1)
