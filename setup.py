"""Installs the distribution `tff-dp` (packages tff_dp, tff_dp.aggregators,
tff_dp.tasks).

Dependencies are pinned in requirements/*.txt and constraints.txt and
installed by the Makefile; tensorflow-federated 0.87.0 itself goes in with
--no-deps because it pins jaxlib 0.4.14, which is not on PyPI.
"""

import setuptools

setuptools.setup(
  name='tff-dp',
  version='0.1.0',
  description=(
    'Client-level differentially private federated learning '
    'with compressed communication for TensorFlow Federated.'
  ),
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
