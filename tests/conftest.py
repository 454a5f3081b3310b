"""Test-wide setup: quiet TF logs, the real data, no leftover worker_binary."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # noqa: E402

from tff_dp import processes  # noqa: E402


@pytest.fixture(scope='session', autouse=True)
def _end_worker_binaries():
  yield
  processes.end_worker_binaries()


@pytest.fixture
def shared_data_dir():
  """The real data directory, or skip when it is not beside the repo."""
  from tff_dp.tasks import data_dir  # pylint: disable=g-import-not-at-top

  path = data_dir.resolve_data_dir()
  if not (path / 'fashion_mnist.npz').exists():
    pytest.skip(f'real data not found at {path}')
  return path
