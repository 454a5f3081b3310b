"""Installs the distribution `tff-dp` (packages tff_dp, tff_dp.aggregators,
tff_dp.tasks).

Dependencies are pinned in requirements/*.txt and constraints.txt and
installed by the Makefile; tensorflow-federated 0.87.0 itself goes in with
--no-deps because it pins jaxlib 0.4.14, which is not on PyPI.
"""

import pathlib
import re

import setuptools


def _version() -> str:
  """`tff_dp.__version__`, read from tff_dp/__init__.py (not imported)."""
  init = pathlib.Path(__file__).parent / 'tff_dp' / '__init__.py'
  found = re.search(r"^__version__ = '([^']+)'$", init.read_text(), re.M)
  if found is None:
    raise RuntimeError(f"No __version__ = '...' line in {init}.")
  return found.group(1)


setuptools.setup(
  name='tff-dp',
  version=_version(),
  description=(
    'Client-level differentially private federated learning '
    'with compressed communication for TensorFlow Federated.'
  ),
  author='The tff-dp Authors',
  license='Apache-2.0',
  license_files=['LICENSE'],
  python_requires='>=3.11,<3.12',
  packages=(
    ['tff_dp']
    + ['tff_dp.' + p for p in setuptools.find_packages('tff_dp')]
    + ['tff_dp.aggregators', 'tff_dp.tasks']
  ),
  package_dir={
    'tff_dp': 'tff_dp',
    'tff_dp.aggregators': 'aggregators',
    'tff_dp.tasks': 'tasks',
  },
  install_requires=[],  # Pinned in requirements/; see the Makefile.
)
