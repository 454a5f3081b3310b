"""The library's packages stand alone: aggregators/ and tasks/ (installed as
tff_dp.aggregators and tff_dp.tasks) import nothing from tff_dp outside
their own package, and tff_dp/client_works nothing but itself and
tff_dp.aggregators, so a TFF user can take either without the rest."""

import ast
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).absolute().parents[1]


def _tff_dp_imports(path: pathlib.Path) -> list[str]:
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found += [f'{node.module}.{a.name}' for a in node.names]
  return [name for name in found if name.split('.')[0] == 'tff_dp']


@pytest.mark.parametrize('package', ['aggregators', 'tasks'])
def test_package_imports_only_itself_from_tff_dp(package):
  files = sorted((_ROOT / package).glob('*.py'))
  assert files
  outside = {
    f'{path.name}: {name}'
    for path in files
    for name in _tff_dp_imports(path)
    if not name.startswith(f'tff_dp.{package}.')
  }
  assert not outside, sorted(outside)


def test_client_works_import_only_themselves_and_the_aggregators():
  files = sorted((_ROOT / 'tff_dp' / 'client_works').glob('*.py'))
  assert files
  allowed = ('tff_dp.client_works.', 'tff_dp.aggregators.')
  outside = {
    f'{path.name}: {name}'
    for path in files
    for name in _tff_dp_imports(path)
    if not name.startswith(allowed)
  }
  assert not outside, sorted(outside)


def test_the_config_does_not_import_the_worker_module():
  names = _tff_dp_imports(_ROOT / 'tff_dp' / 'experiment_config.py')
  assert 'tff_dp.distributed' not in names
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
