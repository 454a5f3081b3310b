"""Without ../shared/data the data tests skip, and under CI=true they fail."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tff_dp.tasks import data_dir

_TESTS = pathlib.Path(__file__).absolute().parent

_USES_DATA = 'def test_reads(shared_data_dir):\n  assert shared_data_dir\n'


# pytest.fail in a fixture is an error of the test's setup: it fails the run.
@pytest.mark.parametrize(
  'ci, outcome', [(None, '1 skipped'), ('true', '1 error')]
)
def test_missing_real_data_skips_or_fails_under_ci(tmp_path, ci, outcome):
  (tmp_path / 'uses_data_test.py').write_text(_USES_DATA)
  env = {k: v for k, v in os.environ.items() if k != 'CI'}
  env[data_dir.DATA_DIR_ENV] = str(tmp_path / 'empty')
  # The suite's conftest as a plugin, from a folder of its own: on
  # PYTHONPATH, tests/ itself would shadow the installed tff_dp with its
  # tests/tff_dp/ folders (a namespace package whose `runtime` has no
  # modules).
  plugin = tmp_path / 'plugin'
  plugin.mkdir()
  shutil.copy(_TESTS / 'conftest.py', plugin / 'conftest.py')
  env['PYTHONPATH'] = os.pathsep.join(
    [str(plugin)] + env.get('PYTHONPATH', '').split(os.pathsep)
  )
  if ci is not None:
    env['CI'] = ci
  done = subprocess.run(
    [
      sys.executable,
      '-m',
      'pytest',
      '-p',
      'conftest',
      '-q',
      '-rsE',
      '--rootdir',
      str(tmp_path),
      '-c',
      os.devnull,
      str(tmp_path / 'uses_data_test.py'),
    ],
    env=env,
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert outcome in done.stdout, done.stdout + done.stderr
  assert 'real data not found at' in done.stdout
  assert 'fashion_mnist.npz, heart_disease_4sites.csv' in done.stdout
