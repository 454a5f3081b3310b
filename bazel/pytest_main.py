"""Runs pytest on one test file for `bazel test` (see bazel/README.md).

Bazel starts this in the test's runfiles tree, with the file's runfiles
path as the argument. Everything is read from there: tff_dp (at its
installed paths, bazel/defs.bzl), the test, conftest.py, pyproject.toml and
the data (`@shared_data`, bazel/data.bzl), so a test sees exactly what its
target declares. The hook of the editable install (`pip install -e .`) is
removed here and, through bazel/strict_imports, in the test's
subprocesses: a module the target does not declare fails to import instead
of coming from the source tree. pytest writes its JUnit XML where Bazel
collects it ($XML_OUTPUT_FILE).
"""

import os
import runpy
import sys


def _runfiles_root() -> str:
  runfiles = os.environ.get('RUNFILES_DIR') or os.environ.get('TEST_SRCDIR')
  if not runfiles:
    raise SystemExit('bazel/pytest_main.py runs under `bazel test` only.')
  return runfiles


def main() -> int:
  if len(sys.argv) != 2:
    raise SystemExit(f'usage: {sys.argv[0]} TEST_FILE (got {sys.argv[1:]})')
  runfiles = _runfiles_root()
  root = os.path.join(runfiles, os.environ.get('TEST_WORKSPACE', 'tff_dp'))
  strict = os.path.join(root, 'bazel', 'strict_imports')
  # The hook goes here as in the subprocesses: one filter, in one file.
  runpy.run_path(os.path.join(strict, 'sitecustomize.py'))
  if root not in sys.path:
    sys.path.insert(0, root)
  os.environ['PYTHONPATH'] = os.pathsep.join(
    [strict, root] + [p for p in [os.environ.get('PYTHONPATH')] if p]
  )
  # The declared data (bazel/data.bzl's @shared_data).
  os.environ['TFF_DP_DATA_DIR'] = os.path.join(runfiles, 'shared_data')
  os.chdir(root)
  import pytest  # pylint: disable=g-import-not-at-top

  test = os.path.join(root, sys.argv[1])
  args = [test, '-q', '-p', 'no:cacheprovider', '--rootdir', root]
  if os.environ.get('XML_OUTPUT_FILE'):
    args.append('--junitxml=' + os.environ['XML_OUTPUT_FILE'])
  return int(pytest.main(args))


if __name__ == '__main__':
  sys.exit(main())
