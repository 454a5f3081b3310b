import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import composition
from tff_dp.runtime import contexts
from tff_dp.tasks import medical
from tff_dp.tasks import task as task_lib

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def _process_and_data(task, **kwargs):
  """A learning process (client SGD 0.1, server SGD 1) and every client's
  batched data."""
  contexts.set_simulation_context()
  process = composition.build_learning_process(
    task.model_fn,
    client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
    **kwargs,
  )
  preprocess = task_lib.client_preprocess_fn(16, seed=0)
  data = [
    preprocess(task.train_data.create_tf_dataset_for_client(c))
    for c in task.train_data.client_ids
  ]
  return process, data


def _round(task, **kwargs):
  process, data = _process_and_data(task, **kwargs)
  state = process.next(process.initialize(), data).state
  return process.get_model_weights(state).trainable


def test_zero_initialized_client_model_gives_identical_results(shared_data_dir):
  task = medical.load_heart_disease(shared_data_dir)
  plain = _round(task)
  fast = _round(task, client_model_fn=task.client_model_fn())
  on_cpu = _round(task, client_model_fn=task.client_model_fn('/CPU:0'))
  for a, b, c in zip(plain, fast, on_cpu):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_zero_initialized_builder_has_zero_weights(shared_data_dir):
  task = medical.load_heart_disease(shared_data_dir)
  model = task_lib.zero_initialized_builder(task.model_builder)()
  assert all(not np.any(w) for w in model.get_weights())
  assert [w.shape for w in model.get_weights()] == [
    w.shape for w in task.model_builder().get_weights()
  ]


def _cohort_and_singles(task, **kwargs):
  """The round's new weights from every client together and from each
  client alone (same process, same starting state), and the clients'
  example counts."""
  process, data = _process_and_data(task, **kwargs)
  counts = [sum(len(tf.nest.flatten(b)[0]) for b in d) for d in data]
  state = process.initialize()

  def weights(cohort):
    new = process.next(state, cohort).state
    return [np.asarray(w) for w in process.get_model_weights(new).trainable]

  return weights(data), [weights([d]) for d in data], counts


def test_aggregators_mean_as_they_say(shared_data_dir):
  # With server SGD at lr 1 the round's new model is the start plus the
  # aggregated update, so it is the aggregator's mean of the models each
  # client alone would give: the plain mean for the unweighted aggregator,
  # the example-weighted mean for TFF's MeanFactory.
  task = medical.load_heart_disease(shared_data_dir)
  for factory, weighted in (
    (tff.aggregators.UnweightedMeanFactory(), False),
    (tff.aggregators.MeanFactory(), True),
  ):
    together, singles, counts = _cohort_and_singles(
      task, model_aggregator=factory
    )
    assert len(set(counts)) > 1  # Else both means would agree.
    w = np.asarray(counts, np.float64) if weighted else np.ones(len(counts))
    for i, layer in enumerate(together):
      expected = sum(wj * s[i] for wj, s in zip(w, singles)) / w.sum()
      np.testing.assert_allclose(layer, expected, rtol=1e-5, atol=1e-6)


def test_rejects_non_factory():
  with pytest.raises(TypeError, match='model_aggregator must be'):
    composition.build_learning_process(
      lambda: None,
      client_optimizer=None,
      server_optimizer=None,
      model_aggregator=object(),
    )


@pytest.mark.parametrize('diagnostics', [False, True])
def test_client_learning_rate_set_through_hparams(shared_data_dir, diagnostics):
  # One plain-SGD step per client from the same weights: the update is
  # -lr x gradient, so setting lr 0.1 -> 0.025 scales the round's model
  # change by exactly 1/4 (TFF's client work and ours, with diagnostics).
  from tff_dp.client_works import diagnostics as diag  # pylint: disable=g-import-not-at-top

  task = medical.load_heart_disease(shared_data_dir)
  contexts.set_simulation_context()
  process = composition.build_learning_process(
    task.model_fn,
    client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
    client_metrics_fn=diag.update_norm_metrics(1.0) if diagnostics else None,
  )
  preprocess = task_lib.client_preprocess_fn(16, max_steps=1, seed=0)
  data = [
    preprocess(task.train_data.create_tf_dataset_for_client(c))
    for c in task.train_data.client_ids
  ]
  state = process.initialize()
  start = process.get_model_weights(state).trainable
  slow = composition.with_client_learning_rate(process, state, 0.025)
  lr = process.get_hparams(slow)['client_work']['learning_rate']
  assert lr == pytest.approx(0.025)
  full = process.next(state, data).state
  quarter = process.next(slow, data).state
  for w0, a, b in zip(
    start,
    process.get_model_weights(full).trainable,
    process.get_model_weights(quarter).trainable,
  ):
    np.testing.assert_allclose(b - w0, (a - w0) / 4, rtol=1e-4, atol=1e-7)
