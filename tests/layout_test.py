"""The layers of tff_dp (docs/architecture.md, "Layers"), held here.

Each package imports only the packages below it: aggregators/ and tasks/
(installed as tff_dp.aggregators and tff_dp.tasks) nothing from tff_dp
outside themselves, so a TFF user can take either without the rest;
client_works only the aggregators; the binaries at the top (`run`, `plot`,
`settings_doc`) may import anything, and nothing imports them.
"""

import ast
import collections
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).absolute().parents[1]

# Package -> its folder and the tff_dp packages it may import (besides
# itself). Lowest first.
LAYERS = {
  'tff_dp.aggregators': ('aggregators', ()),
  'tff_dp.tasks': ('tasks', ()),
  'tff_dp.client_works': ('tff_dp/client_works', ('tff_dp.aggregators',)),
  'tff_dp.privacy': ('tff_dp/privacy', ('tff_dp.aggregators',)),
  'tff_dp.runtime': (
    'tff_dp/runtime',
    ('tff_dp.aggregators', 'tff_dp.tasks', 'tff_dp.client_works'),
  ),
  'tff_dp.methods': (
    'tff_dp/methods',
    (
      'tff_dp.aggregators',
      'tff_dp.tasks',
      'tff_dp.client_works',
      'tff_dp.privacy',
    ),
  ),
  'tff_dp.job': (
    'tff_dp/job',
    (
      'tff_dp.aggregators',
      'tff_dp.tasks',
      'tff_dp.client_works',
      'tff_dp.privacy',
      'tff_dp.runtime',
      'tff_dp.methods',
    ),
  ),
  'tff_dp.reporting': (
    'tff_dp/reporting',
    (
      'tff_dp.aggregators',
      'tff_dp.tasks',
      'tff_dp.client_works',
      'tff_dp.privacy',
      'tff_dp.runtime',
      'tff_dp.methods',
      'tff_dp.job',
    ),
  ),
}
# The modules at tff_dp's top level: the binaries (and the package's
# __init__, which imports only tff_dp.runtime.processes for its atexit
# cleanup).
BINARIES = ('plot.py', 'run.py', 'settings_doc.py')
MAX_TOP_LEVEL_MODULES = 8


def _tff_dp_imports(path: pathlib.Path) -> list[str]:
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found += [f'{node.module}.{a.name}' for a in node.names]
  # The bare package (`import tff_dp`, for its folder) is not a layer.
  return [n for n in found if n.split('.')[0] == 'tff_dp' and n != 'tff_dp']


def _within(name: str, packages) -> bool:
  return any(name == p or name.startswith(p + '.') for p in packages)


@pytest.mark.parametrize('package', sorted(LAYERS))
def test_a_package_imports_only_the_layers_below_it(package):
  folder, allowed = LAYERS[package]
  files = sorted((_ROOT / folder).glob('*.py'))
  assert files
  outside = {
    f'{path.name}: {name}'
    for path in files
    for name in _tff_dp_imports(path)
    if not _within(name, (package, *allowed))
  }
  assert not outside, sorted(outside)


def test_every_package_of_tff_dp_has_a_layer():
  packages = {
    f'tff_dp.{p.parent.name}' for p in (_ROOT / 'tff_dp').glob('*/__init__.py')
  }
  assert packages
  assert packages <= set(LAYERS), sorted(packages - set(LAYERS))


def test_the_top_level_holds_only_the_binaries():
  modules = sorted(
    p.name for p in (_ROOT / 'tff_dp').glob('*.py') if p.name != '__init__.py'
  )
  assert modules == sorted(BINARIES)
  assert len(modules) <= MAX_TOP_LEVEL_MODULES
  assert _tff_dp_imports(_ROOT / 'tff_dp' / '__init__.py') == [
    'tff_dp.runtime.processes'
  ]


def test_nothing_imports_a_binary():
  binaries = {f'tff_dp.{b.removesuffix(".py")}' for b in BINARIES}
  importers = {
    f'{path.relative_to(_ROOT)}: {name}'
    for folder, _ in LAYERS.values()
    for path in sorted((_ROOT / folder).glob('*.py'))
    for name in _tff_dp_imports(path)
    if _within(name, binaries)
  }
  assert not importers, sorted(importers)


def test_the_config_does_not_import_the_worker_module():
  names = _tff_dp_imports(_ROOT / 'tff_dp' / 'job' / 'experiment_config.py')
  assert 'tff_dp.runtime.distributed' not in names
  assert names  # The check reads the module's imports at all.


def test_the_check_sees_an_outside_import(tmp_path):
  module = tmp_path / 'm.py'
  module.write_text(
    'from tff_dp import selection\nfrom tff_dp.aggregators import x\n'
  )
  assert _tff_dp_imports(module) == [
    'tff_dp.selection',
    'tff_dp.aggregators.x',
  ]
  assert not _within('tff_dp.privacy_x', ('tff_dp.privacy',))
  assert _within('tff_dp.privacy.events', ('tff_dp.privacy',))


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# A module over MAX_MODULE_LINES says why in its docstring, after this.
LONG_MODULE_REASON = 'Over 600 lines because'


def _library_files() -> list[pathlib.Path]:
  folders = [_ROOT / 'tff_dp', _ROOT / 'aggregators', _ROOT / 'tasks']
  return sorted(p for f in folders for p in f.rglob('*.py'))


def test_no_module_is_long_without_a_reason_and_no_function_over_80():
  files = _library_files()
  assert len(files) > 50
  long_modules, long_functions = [], []
  for path in files:
    text = path.read_text()
    tree = ast.parse(text)
    lines = len(text.splitlines())
    doc = ast.get_docstring(tree) or ''
    if lines > MAX_MODULE_LINES and LONG_MODULE_REASON not in doc:
      long_modules.append(f'{path.relative_to(_ROOT)}: {lines}')
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        length = node.end_lineno - start + 1
        if length > MAX_FUNCTION_LINES:
          long_functions.append(
            f'{path.relative_to(_ROOT)}:{node.lineno} {node.name}: {length}'
          )
  assert not long_modules, long_modules
  assert not long_functions, long_functions


def test_no_test_file_is_over_600_lines():
  files = sorted((_ROOT / 'tests').rglob('*.py'))
  assert len(files) > 50
  long_files = [
    f'{p.relative_to(_ROOT)}: {n}'
    for p in files
    if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
  ]
  assert not long_files, long_files


def test_test_files_have_distinct_basenames():
  # pytest imports test files by basename (tests/ has no packages): two
  # files of one name break the collection of the whole suite.
  names = collections.Counter(
    p.name for p in _ROOT.joinpath('tests').rglob('*_test.py')
  )
  assert not [n for n, c in names.items() if c > 1]
