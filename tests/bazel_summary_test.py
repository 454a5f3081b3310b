"""bazel/summary.py counts the test files that exist now, and only those."""

import importlib.util
import pathlib

_SUMMARY = pathlib.Path(__file__).absolute().parents[1] / 'bazel' / 'summary.py'


def _summary():
  spec = importlib.util.spec_from_file_location('bazel_summary', _SUMMARY)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _xml(path, tests, failures=0, skipped=0):
  path.mkdir(parents=True)
  (path / 'test.xml').write_text(
    f'<testsuites><testsuite tests="{tests}" failures="{failures}" '
    f'errors="0" skipped="{skipped}"/></testsuites>'
  )


def _tree(tmp_path, names):
  for name in names:
    path = tmp_path / 'tests' / f'{name}.py'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('')
  return str(tmp_path / 'logs'), str(tmp_path / 'tests')


def test_counts_the_current_test_files(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  logs, tests = _tree(tmp_path, ['a_test', 'sub/b_test'])
  _xml(tmp_path / 'logs/tests/a_test', 5, skipped=1)
  _xml(tmp_path / 'logs/tests/sub/b_test', 3)
  # A test file since moved away: its old XML (failing) must not count.
  _xml(tmp_path / 'logs/tests/old/c_test', 4, failures=4)
  assert _summary().main('logs', 'tests') == 0
  out = capsys.readouterr().out
  assert out.splitlines()[-1] == '7 passed, 0 failed, 1 skipped'
  assert 'tests/old/c_test: stale test.xml' in out
  del logs, tests


def test_counts_the_user_example(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  _tree(tmp_path, ['a_test'])
  (tmp_path / 'example').mkdir()
  (tmp_path / 'example' / 'use_it.py').write_text('')
  _xml(tmp_path / 'logs/tests/a_test', 2)
  # Bazel's own XML for a test that is not pytest: one test case.
  _xml(tmp_path / 'logs/example/use_it', 1, failures=1)
  assert _summary().main('logs', 'tests', 'example') == 1
  out = capsys.readouterr().out
  assert out.splitlines()[-1] == '2 passed, 1 failed, 0 skipped'


def test_a_test_file_that_did_not_run_fails(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  _tree(tmp_path, ['a_test', 'b_test'])
  _xml(tmp_path / 'logs/tests/a_test', 5)
  assert _summary().main('logs', 'tests') == 1
  out = capsys.readouterr().out
  assert 'tests/b_test: no test.xml (did not run)' in out
  assert out.splitlines()[-1] == '5 passed, 1 failed, 0 skipped'


def test_a_failure_fails(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  _tree(tmp_path, ['a_test'])
  _xml(tmp_path / 'logs/tests/a_test', 5, failures=1)
  assert _summary().main('logs', 'tests') == 1
  assert capsys.readouterr().out.splitlines()[-1] == (
    '4 passed, 1 failed, 0 skipped'
  )
