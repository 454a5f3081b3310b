"""The evaluator: a child process's metrics equal inline evaluation's."""

import os
import signal

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp.runtime import evaluation
from tff_dp import tasks

pytestmark = pytest.mark.usefixtures('shared_data_dir')


@pytest.fixture(scope='module')
def task():
  return tasks.load_task('heart_disease', model_seed=0)


def _weights(task, scale):
  """The task's initial weights times `scale`: distinct metrics per scale."""
  w = tff.learning.models.ModelWeights.from_model(task.model_builder())
  return tff.learning.models.ModelWeights(
    [np.asarray(v) * scale for v in w.trainable],
    [np.asarray(v) for v in w.non_trainable],
  )


def _metrics(results):
  return {k: v for k, v in results.items() if k != 'eval_seconds'}


def test_child_metrics_equal_inline_to_the_bit_in_submission_order(task):
  scales = (1.0, 0.5, 2.0, -1.0)
  inline = evaluation.Evaluator(task, in_process=True)
  expected = [
    _metrics(inline.submit(_weights(task, s)).result()) for s in scales
  ]
  # Distinct weights give distinct metrics, so the order is checked.
  assert len({r['test_loss'] for r in expected}) == len(scales)
  with evaluation.Evaluator(task) as child:
    futures = [child.submit(_weights(task, s)) for s in scales]
    got = [f.result(timeout=120) for f in futures]
  assert [_metrics(r) for r in got] == expected
  assert all(r['eval_seconds'] > 0 for r in got)
  assert set(expected[0]) >= {'test_loss'}


def test_close_ends_the_child(task):
  child = evaluation.Evaluator(task)
  child.submit(_weights(task, 1.0)).result(timeout=120)
  process = child._child  # pylint: disable=protected-access
  child.close()
  assert process.poll() is not None
  child.close()  # A second close is a no-op.


def test_a_failed_evaluation_names_its_error_and_the_child_goes_on(task):
  good = _weights(task, 1.0)
  bad = tff.learning.models.ModelWeights(
    [np.zeros((3, 3), np.float32)], list(good.non_trainable)
  )
  with evaluation.Evaluator(task) as child:
    with pytest.raises(RuntimeError, match='The evaluation process failed'):
      child.submit(bad).result(timeout=120)
    assert child.submit(good).result(timeout=120)['test_loss'] > 0


def test_a_dead_child_fails_pending_and_later_evaluations(task):
  child = evaluation.Evaluator(task)
  try:
    child.submit(_weights(task, 1.0)).result(timeout=120)
    process = child._child  # pylint: disable=protected-access
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    with pytest.raises(RuntimeError, match='exit code -9'):
      child.submit(_weights(task, 1.0)).result(timeout=60)
  finally:
    child.close()
