"""Tests of summary.json's provenance: the code, libraries and data a run
ran."""

import json
import pathlib
import subprocess
import sys

import pytest

from tff_dp.job import training
from tff_dp.job import metrics_log
from tff_dp.job import provenance as provenance_lib

import job_testing

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def test_the_summary_records_the_code_libraries_and_data_it_ran(tmp_path):
  import hashlib
  import importlib.metadata

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  import tensorflow_privacy as tfp  # pylint: disable=g-import-not-at-top
  from tff_dp.tasks import data_dir  # pylint: disable=g-import-not-at-top

  training.run_experiment(job_testing.config(tmp_path, 'provenance', rounds=1))
  run_dir = tmp_path / 'provenance'
  saved = json.loads((run_dir / 'summary.json').read_text())
  extra = json.loads(
    (run_dir / metrics_log.NON_PRIVATE_DIR / 'summary.json').read_text()
  )
  provenance = saved['provenance']
  versions = provenance['versions']
  assert versions['tensorflow'] == tf.__version__
  assert versions['tensorflow_federated'] == tff.__version__
  assert versions['tensorflow_privacy'] == tfp.__version__
  # dp_accounting has no __version__: its distribution's.
  assert versions['dp_accounting'] == importlib.metadata.version(
    'dp-accounting'
  )
  assert versions['python'] == '.'.join(map(str, sys.version_info[:3]))
  # The one file heart disease reads, by its absolute path; its hash only
  # in the non-private part (a function of the clients' data).
  csv_path = (
    data_dir.resolve_data_dir() / 'heart_disease_4sites.csv'
  ).resolve()
  assert provenance['data']['sources'] == [
    {'kind': 'UCI heart disease', 'files': [str(csv_path)], 'cache': None}
  ]
  assert 'data_files_sha256' not in saved
  assert extra['data_files_sha256'] == {
    str(csv_path): hashlib.sha256(csv_path.read_bytes()).hexdigest()
  }
  # The commit of the source tree this test imported, and its state.
  code = provenance['code']
  repo = pathlib.Path(provenance_lib.__file__).resolve().parents[2]
  head = subprocess.run(
    ['git', '-C', str(repo), 'rev-parse', 'HEAD'],
    capture_output=True,
    text=True,
  )
  if head.returncode == 0:  # A git checkout (not a Bazel runfiles tree).
    assert code['git_commit'] == head.stdout.strip()
    assert isinstance(code['git_dirty'], bool)
    assert code['git_unavailable_reason'] is None
  else:
    assert code['git_commit'] is None and code['git_unavailable_reason']
  assert str(repo / 'tff_dp') in code['source_dirs']


def test_code_outside_a_git_checkout_records_no_commit_and_says_why(
  tmp_path,
):
  code = provenance_lib.code_provenance([str(tmp_path)])
  assert code['git_commit'] is None and code['git_dirty'] is None
  assert 'not in a git checkout' in code['git_unavailable_reason']
