"""Under `bazel test` a test sees only what its target declares: tff_dp
from the runfiles tree (at its installed paths), in the test and in its
subprocesses, and the data from @shared_data (bazel/pytest_main.py).

This file's target deliberately depends on dp_fedavg alone; outside Bazel
its checks skip.
"""

import importlib
import os
import subprocess
import sys

import pytest

from tff_dp.aggregators import dp_fedavg

_UNDER_BAZEL = bool(os.environ.get('TEST_SRCDIR'))

pytestmark = pytest.mark.skipif(
  not _UNDER_BAZEL, reason='checks the runfiles of `bazel test`'
)


def test_tff_dp_comes_from_runfiles():
  import tff_dp  # pylint: disable=g-import-not-at-top

  for module in (tff_dp, dp_fedavg):
    assert module.__file__.startswith(
      os.environ['TEST_SRCDIR']
    ), module.__file__
  assert os.path.realpath(dp_fedavg.__file__).endswith(
    'aggregators/dp_fedavg.py'
  )


def test_an_undeclared_module_does_not_import():
  # tff_dp.reporting.frontier_plot is in the source tree but no dependency
  # of this test.
  with pytest.raises(ModuleNotFoundError):
    importlib.import_module('tff_dp.reporting.frontier_plot')


def test_subprocesses_import_from_runfiles_only():
  code = (
    'import importlib, tff_dp.aggregators.dp_fedavg as m; print(m.__file__)\n'
    'try:\n  importlib.import_module("tff_dp.reporting.frontier_plot")\n'
    'except ModuleNotFoundError:\n  print("no plot")\n'
  )
  out = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, check=True
  ).stdout.split('\n')
  assert out[0].startswith(os.environ['TEST_SRCDIR']), out
  assert out[1] == 'no plot', out


def test_data_is_the_declared_copy(shared_data_dir):
  # bazel/pytest_main.py points the tests at @shared_data's runfiles.
  assert str(shared_data_dir).startswith(os.environ['TEST_SRCDIR'])
  assert (shared_data_dir / 'fashion_mnist.npz').is_symlink()
