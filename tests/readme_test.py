"""The README's Python examples run as written (so they cannot rot)."""

import pathlib
import re

import dp_accounting
from dp_accounting import rdp  # noqa: F401 (dp_accounting.rdp)
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
  assert len(_python_blocks()) == 3


def test_drop_in_example_builds_a_learning_process():
  namespace = {}
  exec(_block_with('build_unweighted_fed_avg'), namespace)  # pylint: disable=exec-used
  assert isinstance(
    namespace['process'], tff.learning.templates.LearningProcess
  )
  assert isinstance(
    namespace['aggregator'], tff.aggregators.UnweightedAggregationFactory
  )


def test_weighted_example_trains_a_round_and_reads_its_event():
  # As in a fresh Python process: TFF's default context (not one an earlier
  # test in this worker left behind).
  tff.backends.native.set_sync_local_cpp_execution_context()
  namespace = {}
  exec(_block_with('build_weighted_fed_avg'), namespace)  # pylint: disable=exec-used
  assert isinstance(
    namespace['aggregator'], tff.aggregators.UnweightedAggregationFactory
  )
  event = namespace['dp_events'].round_event(namespace['state'].aggregator)
  assert isinstance(event, dp_accounting.GaussianDpEvent)
  # The state holds it as float32.
  assert event.noise_multiplier == pytest.approx(1.185, rel=1e-6)
  # One fixed-size round of 3 of 6,000 clients: replace-one moves the sum
  # by twice the clip, so the sampled Gaussian's multiplier is z / 2.
  (recorded,) = namespace['ledger'].events
  assert isinstance(recorded, dp_accounting.SampledWithoutReplacementDpEvent)
  assert (recorded.source_dataset_size, recorded.sample_size) == (6000, 3)
  assert recorded.event.noise_multiplier == pytest.approx(
    event.noise_multiplier / 2, rel=1e-12
  )
  assert len(set(namespace['cohort'])) == 3
  sampled = dp_accounting.SampledWithoutReplacementDpEvent(
    6000, 3, dp_accounting.GaussianDpEvent(event.noise_multiplier / 2)
  )
  want = (
    dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    .compose(sampled)
    .get_epsilon(1e-4)
  )
  assert namespace['epsilon_rdp'] == pytest.approx(want, rel=1e-9)


def test_tasks_example_loads_a_task():
  namespace = {}
  exec(_block_with("tasks.load_task('fashion_mnist_5labels')"), namespace)  # pylint: disable=exec-used
  task = namespace['task']
  assert len(task.train_data.client_ids) == 6000
  assert isinstance(task.model_builder(), tf.keras.Model)
  assert len(task.test_x) == len(task.test_y) == 10000
