"""The BUILD files' dependencies are the code's imports
(bazel/gen_build.py; tests/bazel_runfiles_test.py checks that a test sees
only what its target declares)."""

import importlib.util
import pathlib


_ROOT = pathlib.Path(__file__).absolute().parents[1]


def _gen_build():
  spec = importlib.util.spec_from_file_location(
    'gen_build', _ROOT / 'bazel' / 'gen_build.py'
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_committed_build_files_are_what_the_imports_say():
  gen = _gen_build()
  stale = [
    rel
    for rel, text in gen.build_files().items()
    if (_ROOT / rel).read_text() != text
  ]
  assert not stale, f'run python bazel/gen_build.py: {stale}'


def test_generator_follows_a_new_import(tmp_path, monkeypatch):
  gen = _gen_build()
  for directory in list(gen.PACKAGE_DIRS.values()) + list(gen.TEST_DIRS):
    (tmp_path / directory).mkdir(parents=True, exist_ok=True)
  for directory in gen.PACKAGE_DIRS.values():
    (tmp_path / directory / '__init__.py').write_text('')
  (tmp_path / 'aggregators' / 'a.py').write_text('import numpy\n')
  # An import inside a function counts; a third-party one is no target.
  (tmp_path / 'aggregators' / 'b.py').write_text(
    'def f():\n  from tff_dp.aggregators import a\n  import tensorflow\n'
  )
  (tmp_path / 'tests' / 'conftest.py').write_text('')
  (tmp_path / 'tests' / 'b_test.py').write_text(
    'from tff_dp.aggregators.b import f\n'
  )
  monkeypatch.setattr(gen, 'ROOT', tmp_path)
  monkeypatch.setattr(gen, 'MODULES', gen._module_files())
  files = gen.build_files()
  build = files['aggregators/BUILD']
  b = build[build.index('name = "b"') :].split(')')[0]
  assert '":a"' in b and '":__init__"' in b and 'tensorflow' not in b
  a = build[build.index('name = "a"') :].split(')')[0]
  assert '":b"' not in a
  assert '"//tff_dp:__init__"' in build  # __init__ needs its parent's.
  test = files['tests/BUILD']
  assert '"//aggregators:b"' in test[test.index('name = "b_test"') :]
