"""The README's and the docs' Python examples run as written (so they
cannot rot), and the README stays a README: short, and no diary."""

import pathlib
import re

import dp_accounting
from dp_accounting import rdp  # noqa: F401 (dp_accounting.rdp)
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

_ROOT = pathlib.Path(__file__).absolute().parents[1]
_README = _ROOT / 'README.md'
# The pages whose Python blocks run here (each block has a check below).
_RUN = (
  _README,
  _ROOT / 'docs' / 'aggregators.md',
  _ROOT / 'docs' / 'tasks.md',
  _ROOT / 'docs' / 'public_data.md',
)

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def _python_blocks(path: pathlib.Path) -> list[str]:
  return re.findall(r'```python\n(.*?)```', path.read_text(), re.S)


def _pages() -> list[pathlib.Path]:
  """README.md and every docs page present (under Bazel: those declared)."""
  return [_README] + sorted((_ROOT / 'docs').rglob('*.md'))


def _block_with(text: str) -> str:
  found = [b for p in _RUN for b in _python_blocks(p) if text in b]
  assert len(found) == 1, f'{len(found)} python blocks with {text!r}'
  return found[0]


_CHECKED = (
  'build_unweighted_fed_avg(\n    task.model_fn',
  'build_weighted_fed_avg',
  'uv = cmp_fed.uv_fed(4)',
  'mf_strategy.optimize_banded',
  "tasks.load_task('fashion_mnist_5labels')",
  'adapters.Adapters(',
)


def test_every_runnable_block_is_checked_here():
  # A block added to one of these pages needs a check below.
  blocks = [b for p in _RUN for b in _python_blocks(p)]
  assert len(blocks) == len(_CHECKED)
  for b in blocks:
    assert sum(text in b for text in _CHECKED) == 1, b


@pytest.mark.parametrize('page', _pages(), ids=lambda p: p.name)
def test_every_python_block_compiles(page):
  for block in _python_blocks(page):
    compile(block, str(page), 'exec')


def test_readme_is_short_and_no_diary():
  text = _README.read_text()
  assert len(text.splitlines()) <= 250
  # Dates, session times and commit hashes belong in benchmarks/results/.
  assert not re.search(r'\b20\d\d-\d\d-\d\d\b', text)
  assert not re.search(r'\b[0-9a-f]{7,40}\b(?![.,]\d)', text.replace('`', ' '))


@pytest.mark.parametrize('page', _pages()[1:], ids=lambda p: p.name)
def test_docs_carry_no_dates(page):
  # A link may name a dated results file; the prose may not carry a date.
  text = re.sub(r'\]\([^)]*\)', ']()', page.read_text())
  assert not re.search(r'\b20\d\d-\d\d-\d\d\b', text), page


def test_drop_in_example_builds_a_learning_process():
  namespace = {}
  exec(_block_with('build_unweighted_fed_avg(\n    task.model_fn'), namespace)  # pylint: disable=exec-used
  assert isinstance(
    namespace['process'], tff.learning.templates.LearningProcess
  )
  assert isinstance(
    namespace['aggregator'], tff.aggregators.UnweightedAggregationFactory
  )


def test_every_factory_example_builds():
  namespace = {}
  exec(_block_with('uv = cmp_fed.uv_fed(4)'), namespace)  # pylint: disable=exec-used
  names = (
    'fixed adaptive ddg randagg fl_top_dp fetch sketch sketch_ac low_rank uv'
  ).split()
  for name in names:
    assert isinstance(
      namespace[name], tff.aggregators.UnweightedAggregationFactory
    ), name
  # The FL-TOP-DP example releases the same 40 coordinates every round.
  assert namespace['fl_top_dp']._fixed_indices.tolist() == list(range(40))  # pylint: disable=protected-access


def test_correlated_noise_example_accounts_the_run():
  namespace = {}
  exec(_block_with('mf_strategy.optimize_banded'), namespace)  # pylint: disable=exec-used
  # Calibrated to epsilon 1 (RDP) over 180 rounds: the seed 001 rows'
  # multiplier (benchmarks/results/seed001_iid.md, banded_mf_clip0.5_180).
  assert namespace['epsilon_rdp'] == pytest.approx(1.0, abs=2e-3)
  assert namespace['z'] == pytest.approx(1.9345, abs=2e-3)
  assert namespace['epsilon_pld'] < namespace['epsilon_rdp']
  event = namespace['run_event']
  # optimize_banded's strategy has unit column norm, so the amplified
  # event's multiplier is z itself; 180 rounds visit a group 45 times.
  want = dp_accounting.SelfComposedDpEvent(
    dp_accounting.PoissonSampledDpEvent(
      namespace['participation'].rate,
      dp_accounting.GaussianDpEvent(namespace['z']),
    ),
    45,
  )
  assert namespace['participation'].rate == pytest.approx(4 / 60)
  assert event.count == want.count
  assert event.event.sampling_probability == want.event.sampling_probability
  assert event.event.event.noise_multiplier == pytest.approx(
    namespace['z'], rel=1e-12
  )
  accountant = dp_accounting.rdp.RdpAccountant()
  assert accountant.compose(want).get_epsilon(1e-4) == pytest.approx(
    namespace['epsilon_rdp'], rel=1e-9
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


def test_partial_training_example_trains_only_the_adapters_and_head():
  namespace = {}
  exec(_block_with('adapters.Adapters('), namespace)  # pylint: disable=exec-used
  # dense1's A (8 x 2) and B (2 x 16), then logits' kernel and bias.
  shapes = [tuple(w.shape) for w in namespace['trained']]
  assert shapes == [(8, 2), (2, 16), (16, 3), (3,)]
  state = namespace['state']
  frozen = namespace['process'].get_model_weights(state).non_trainable
  for got, want in zip(frozen, namespace['pretrained_weights'][:2]):
    np.testing.assert_array_equal(got, want)
