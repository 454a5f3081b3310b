"""Test-wide setup: quiet TF logs, the real data, no leftover worker_binary,
no download but from a local server."""

import dataclasses
import functools
import hashlib
import http.server
import os
import threading

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# The suite never downloads (tests/tasks/download_test.py allows it against
# a local server only); the binaries it starts inherit this.
os.environ['TFF_DP_NO_DOWNLOAD'] = '1'

import pytest  # noqa: E402

from tff_dp.runtime import processes  # noqa: E402

# tff_dp.job.noise_seeds.TREE_TOP_ENV.
NOISE_SEED_TREE_TOP_ENV = 'TFF_DP_NOISE_SEED_TREE_TOP'


@pytest.fixture(scope='session', autouse=True)
def _noise_seed_registries_of_this_session_only(tmp_path_factory):
  """A noise-seed registry left in /tmp by another job is not read (the
  binaries the tests start inherit the bound). Named here, not imported:
  Bazel's runfiles tests see no more of tff_dp than they declare;
  noise_seeds_test checks the name."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(NOISE_SEED_TREE_TOP_ENV, str(tmp_path_factory.getbasetemp()))
    yield


@pytest.fixture(scope='session', autouse=True)
def _end_worker_binaries():
  yield
  processes.end_worker_binaries()


# Files of ../shared/data that the tests read.
REAL_DATA_FILES = ('fashion_mnist.npz', 'heart_disease_4sites.csv')


def skip_or_fail(reason: str) -> None:
  """Skips the test, or fails it under CI=true (CI has the data)."""
  if os.environ.get('CI', '').strip().lower() in ('true', '1'):
    pytest.fail(f'{reason} (CI=true: CI runs with ../shared/data)', False)
  pytest.skip(reason)


@pytest.fixture(scope='session')
def shared_data_root():
  """The real data directory; without it skip, or fail under CI=true."""
  from tff_dp.tasks import data_dir  # pylint: disable=g-import-not-at-top

  path = data_dir.resolve_data_dir()
  missing = [name for name in REAL_DATA_FILES if not (path / name).exists()]
  if missing:
    skip_or_fail(f'real data not found at {path}: {", ".join(missing)}')
  return path


@pytest.fixture
def shared_data_dir(shared_data_root):
  return shared_data_root


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args):  # pylint: disable=arguments-differ
    pass


@pytest.fixture
def local_server(tmp_path):
  """`(folder served, base URL)` of an HTTP server on 127.0.0.1 (the
  download tests' stand-in for a dataset's public source)."""
  root = tmp_path / 'served'
  root.mkdir()
  handler = functools.partial(_QuietHandler, directory=str(root))
  httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield root, f'http://127.0.0.1:{httpd.server_address[1]}/'
  httpd.shutdown()
  httpd.server_close()


@pytest.fixture
def serve_source(local_server):
  """`serve(source, payloads, served=None)`: serves `payloads` (file name
  -> bytes) on `local_server` and returns `source` (a
  `tff_dp.tasks.download.Source`) pointed there, each file's digest and
  size those of its payload; `served` (name -> bytes) serves other bytes
  under a name, with the payload's digest still pinned (a corrupted copy)."""
  folder, base = local_server

  def serve(source, payloads, served=None):
    files = []
    for remote in source.files:
      data = payloads[remote.name]
      (folder / remote.name).write_bytes((served or {}).get(remote.name, data))
      files.append(
        dataclasses.replace(
          remote,
          url=base + remote.name,
          digest=hashlib.new(remote.algorithm, data).hexdigest(),
          size=len(data),
        )
      )
    return dataclasses.replace(source, files=tuple(files))

  return serve
