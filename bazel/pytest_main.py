"""Runs pytest on one test file for `bazel test` (see bazel/README.md).

Bazel passes the test file's runfiles path. The run is what
`pytest <file>` from the repository root does: imports come from the source
tree (tff-dp is installed editable in .venv), not from runfiles copies, and
pytest writes its JUnit XML where Bazel collects it ($XML_OUTPUT_FILE).
"""

import os
import sys


def _repository_root(path: str) -> str:
  """The nearest directory above `path` that holds the WORKSPACE file."""
  directory = os.path.dirname(path)
  while not os.path.exists(os.path.join(directory, 'WORKSPACE')):
    parent = os.path.dirname(directory)
    if parent == directory:
      raise FileNotFoundError(f'No WORKSPACE above {path}')
    directory = parent
  return directory


def main() -> int:
  if len(sys.argv) != 2:
    raise SystemExit(f'usage: {sys.argv[0]} TEST_FILE (got {sys.argv[1:]})')
  test = os.path.realpath(sys.argv[1])  # The source file behind the link.
  root = _repository_root(test)
  runfiles = os.environ.get('RUNFILES_DIR') or os.environ.get('TEST_SRCDIR')
  if runfiles:
    runfiles = os.path.realpath(runfiles)
    sys.path[:] = [
      p for p in sys.path if not os.path.realpath(p).startswith(runfiles)
    ]
  sys.path.insert(0, root)
  os.chdir(root)
  import pytest  # pylint: disable=g-import-not-at-top

  args = [test, '-q', '-p', 'no:cacheprovider']
  if os.environ.get('XML_OUTPUT_FILE'):
    args.append('--junitxml=' + os.environ['XML_OUTPUT_FILE'])
  return int(pytest.main(args))


if __name__ == '__main__':
  sys.exit(main())
