"""summary.json's provenance of a run (`run_provenance`): the git commit of
the source tree and whether it was dirty (`code_provenance`), the library
versions (`library_versions`) and the data files the task read, with
their hashes.
"""

import importlib.metadata
import pathlib
import platform
import subprocess
import sys
from typing import Any, Optional

from absl import logging


# The libraries whose versions a summary records: (module, distribution).
_VERSIONED = (
  ('tensorflow', 'tensorflow'),
  ('tensorflow_federated', 'tensorflow-federated'),
  ('tensorflow_privacy', 'tensorflow-privacy'),
  ('dp_accounting', 'dp-accounting'),
  ('numpy', 'numpy'),
  ('tff_dp', 'tff-dp'),
)


def library_versions() -> dict[str, Optional[str]]:
  """Python's version and each `_VERSIONED` library's: the imported
  module's `__version__`, else its installed distribution's, else None."""
  out = {'python': platform.python_version()}
  for module, distribution in _VERSIONED:
    version = getattr(sys.modules.get(module), '__version__', None)
    if version is None:
      try:
        version = importlib.metadata.version(distribution)
      except importlib.metadata.PackageNotFoundError:
        version = None
    out[module] = version
  return out


def source_dirs() -> list[str]:
  """The folders of the tff_dp distribution's packages as imported here
  (tff_dp, tff_dp.aggregators, tff_dp.tasks)."""
  import tff_dp  # pylint: disable=g-import-not-at-top
  from tff_dp import aggregators  # pylint: disable=g-import-not-at-top
  from tff_dp import tasks  # pylint: disable=g-import-not-at-top

  return sorted(
    {
      str(pathlib.Path(m.__file__).resolve().parent)
      for m in (tff_dp, aggregators, tasks)
    }
  )


def code_provenance(dirs: Optional[list[str]] = None) -> dict[str, Any]:
  """The git commit of the tff_dp source tree and whether it was dirty.

  Asks git about the folders the packages were imported from (`dirs`,
  default `source_dirs()`): the commit checked out there, and the paths in
  them that differ from it (modified, staged or untracked). Where they are
  not files a git checkout tracks (an installed package, a Bazel runfiles
  tree) or git cannot say, commit and dirty are None and
  `git_unavailable_reason` says why.
  """
  dirs = source_dirs() if dirs is None else list(dirs)
  out = {
    'source_dirs': dirs,
    'git_commit': None,
    'git_dirty': None,
    'git_dirty_paths': [],
    'git_unavailable_reason': None,
  }

  def git(*args) -> str:
    return subprocess.run(
      ['git', '-C', dirs[0], *args],
      capture_output=True,
      text=True,
      timeout=60,
      check=True,
    ).stdout

  try:
    # Fails outside a checkout, and for folders it does not track (a
    # package installed into an ignored virtualenv inside one).
    git('ls-files', '--error-unmatch', '--', *dirs)
    commit = git('rev-parse', 'HEAD').strip()
    status = git('status', '--porcelain', '--', *dirs).splitlines()
  except FileNotFoundError:
    out['git_unavailable_reason'] = 'git is not installed here'
  except subprocess.CalledProcessError as e:
    out['git_unavailable_reason'] = (
      f'{dirs[0]} is not in a git checkout that tracks it (an installed '
      f'package?): git said {e.stderr.strip()[:300]!r}'
    )
  except (OSError, subprocess.TimeoutExpired) as e:
    out['git_unavailable_reason'] = f'git failed: {type(e).__name__}: {e}'
  else:
    out['git_commit'] = commit
    out['git_dirty'] = bool(status)
    # At most 50 (path, porcelain status); git_dirty says whether any.
    out['git_dirty_paths'] = [line.strip() for line in status[:50]]
  return out


def run_provenance(task) -> tuple[dict[str, Any], dict[str, Optional[str]]]:
  """What a rerun needs to know besides the config: `(provenance,
  data_files_sha256)`.

  `provenance` (summary.json, private part): the code (`code_provenance`),
  the library versions (`library_versions`) and the data sources the task
  read (`FederatedTask.data_sources`: their kind, files and any cache).
  `data_files_sha256` (non_private/summary.json: a function of the
  clients' data, `run_files.NON_PRIVATE_SUMMARY_KEYS`): each source file's
  SHA-256, None where it can no longer be read. Each file is hashed once
  per process (`tasks.data_dir.file_sha256`).
  """
  from tff_dp.tasks import data_dir  # pylint: disable=g-import-not-at-top

  sources = list(getattr(task, 'data_sources', ()))
  hashes = {}
  for source in sources:
    for path in source.files:
      try:
        hashes[path] = data_dir.file_sha256(path)
      except OSError as e:
        logging.warning('Cannot hash data file %s: %s', path, e)
        hashes[path] = None
  data = {
    'sources': [s.to_dict() for s in sources],
    'sha256': 'data_files_sha256 in non_private/summary.json (a hash of '
    "the clients' data is not covered by the ledger)",
  }
  if not sources:
    data['sources_unknown_reason'] = (
      'the task was not built by tff_dp.tasks.load_task, which records '
      'what its loader read'
    )
  provenance = {
    'scope': 'this invocation (a resumed run: the rounds from '
    'first_round_this_invocation on)',
    'code': code_provenance(),
    'versions': library_versions(),
    'data': data,
  }
  return provenance, hashes
