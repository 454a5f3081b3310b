"""The runner's flag parsing."""

import pytest

from tff_dp import run


def test_parse_task_options():
  assert run.parse_task_options(
    ['clients_per_unit=100', 'alpha=0.5', 'model=resnet18_gn']
  ) == (('clients_per_unit', 100), ('alpha', 0.5), ('model', 'resnet18_gn'))


@pytest.mark.parametrize('bad', ['novalue', '=3'])
def test_parse_task_options_rejects(bad):
  with pytest.raises(ValueError, match='--task_option must be NAME=VALUE'):
    run.parse_task_options([bad])
