"""The README's Python examples run as written (so they cannot rot)."""

import pathlib
import re

import pytest
import tensorflow as tf
import tensorflow_federated as tff

_README = pathlib.Path(__file__).absolute().parents[1] / 'README.md'

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def _python_blocks() -> list[str]:
  return re.findall(r'```python\n(.*?)```', _README.read_text(), re.S)


def _block_with(text: str) -> str:
  found = [b for b in _python_blocks() if text in b]
  assert len(found) == 1, f'{len(found)} README python blocks with {text!r}'
  return found[0]


def test_every_block_is_checked_here():
  # A block added to the README needs a check below.
  assert len(_python_blocks()) == 2


def test_drop_in_example_builds_a_learning_process():
  namespace = {}
  exec(_block_with('build_unweighted_fed_avg'), namespace)  # pylint: disable=exec-used
  assert isinstance(
    namespace['process'], tff.learning.templates.LearningProcess
  )
  assert isinstance(
    namespace['aggregator'], tff.aggregators.UnweightedAggregationFactory
  )


def test_tasks_example_loads_a_task():
  namespace = {}
  exec(_block_with("tasks.load_task('fashion_mnist_5labels')"), namespace)  # pylint: disable=exec-used
  task = namespace['task']
  assert len(task.train_data.client_ids) == 6000
  assert isinstance(task.model_builder(), tf.keras.Model)
  assert len(task.test_x) == len(task.test_y) == 10000
