"""Under `bazel test` only: tff_dp is imported from the runfiles tree.

bazel/pytest_main.py runs this file in the test's own process and puts
this directory on the PYTHONPATH of its subprocesses (`python -m
tff_dp.run`, ...). Python imports `sitecustomize` after the venv's .pth
files ran, so the hook of `pip install -e .` is installed by then;
removing it means a module the test's targets do not declare fails to
import instead of coming from the source tree.
"""

import sys

sys.meta_path[:] = [
  finder
  for finder in sys.meta_path
  if not getattr(finder, '__module__', '').startswith('__editable__')
]
