"""Test-wide setup: quiet TF logs, the real data, no leftover worker_binary."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# The suite never downloads (tests/tasks/download_test.py allows it against
# a local server only); the binaries it starts inherit this.
os.environ['TFF_DP_NO_DOWNLOAD'] = '1'

import pytest  # noqa: E402

from tff_dp import processes  # noqa: E402


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
