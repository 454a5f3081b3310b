"""The distribution's version is stated once (`tff_dp.__version__`) and
agrees everywhere it is read; its license is the Apache License 2.0."""

import hashlib
import pathlib
import re
import subprocess
import sys

import yaml

import tff_dp

_ROOT = pathlib.Path(__file__).absolute().parents[1]
# SHA-256 of the Apache License 2.0 as the Apache Software Foundation
# publishes it (https://www.apache.org/licenses/LICENSE-2.0.txt), byte for
# byte: TFF's wheel ships the same file.
_APACHE_2_SHA256 = (
  'cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30'
)


def _setup_py(*options: str) -> list[str]:
  """What `python setup.py <options>` prints, a line per option."""
  done = subprocess.run(
    [sys.executable, 'setup.py', *options],
    cwd=_ROOT,
    capture_output=True,
    text=True,
    check=True,
    timeout=120,
  )
  return done.stdout.splitlines()


def _newest_changelog_entry() -> tuple[str, str]:
  """(version, date) of CHANGELOG.md's first `## [x.y.z] - date` entry."""
  text = (_ROOT / 'CHANGELOG.md').read_text()
  found = re.search(r'^## \[([^\]]+)\] - (\d{4}-\d\d-\d\d)$', text, re.M)
  assert found, 'CHANGELOG.md has no "## [version] - YYYY-MM-DD" entry'
  # Nothing newer above it (an undated entry, say).
  first = re.search(r'^## ', text, re.M)
  assert first.start() == found.start(), 'the first entry has no date'
  return found.group(1), found.group(2)


def test_the_version_agrees_everywhere():
  version = tff_dp.__version__
  assert re.fullmatch(r'\d+\.\d+\.\d+', version), version
  assert _setup_py('--version') == [version]
  citation = yaml.safe_load((_ROOT / 'CITATION.cff').read_text())
  assert str(citation['version']) == version
  changelog_version, changelog_date = _newest_changelog_entry()
  assert changelog_version == version
  assert str(citation['date-released']) == changelog_date


def test_the_license_is_apache_2():
  text = (_ROOT / 'LICENSE').read_bytes()
  assert hashlib.sha256(text).hexdigest() == _APACHE_2_SHA256
  assert _setup_py('--license') == ['Apache-2.0']
  citation = yaml.safe_load((_ROOT / 'CITATION.cff').read_text())
  assert citation['license'] == 'Apache-2.0'


def test_the_citation_has_the_required_keys():
  citation = yaml.safe_load((_ROOT / 'CITATION.cff').read_text())
  # CFF 1.2.0's required keys.
  assert citation['cff-version'] == '1.2.0'
  assert citation['title'] == 'tff-dp'
  assert citation['message']
  assert citation['authors'] == [{'name': 'The tff-dp Authors'}]
