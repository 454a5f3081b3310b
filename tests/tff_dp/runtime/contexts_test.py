"""Tests of the simulation context: bounded executors, flat worker memory."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp.runtime import processes


def _rss_bytes(pid: int) -> int:
  with open(f'/proc/{pid}/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) * 1024
  raise AssertionError(f'no VmRSS for pid {pid}')


class _FakeExecutor:
  def __init__(self, cardinalities):
    self.cardinalities = cardinalities
    self.closed = False

  def close(self):
    self.closed = True


def test_bounded_factory_reuses_and_closes_the_least_recently_used():
  made = []

  def stack_fn(cardinalities):
    made.append(_FakeExecutor(cardinalities))
    return made[-1]

  factory = contexts.BoundedExecutorFactory(stack_fn, max_executors=2)
  a = factory.create_executor({tff.CLIENTS: 3})
  b = factory.create_executor({})
  assert factory.create_executor({tff.CLIENTS: 3}) is a  # Reused.
  c = factory.create_executor({tff.CLIENTS: 4})  # Evicts b, the LRU.
  assert (a.closed, b.closed, c.closed) == (False, True, False)
  assert factory.num_executors == 2
  factory.clean_up_executor({tff.CLIENTS: 3})
  assert a.closed and factory.num_executors == 1
  factory.close_all()
  assert c.closed and factory.num_executors == 0
  assert len(made) == 3


@pytest.mark.parametrize('bad', [0, -1, 1.5])
def test_bad_max_executors(bad):
  with pytest.raises(ValueError, match='max_executors must be an integer'):
    contexts.BoundedExecutorFactory(lambda c: None, max_executors=bad)
  with pytest.raises(ValueError, match='max_executors must be an integer'):
    contexts.set_simulation_context(max_executors=bad)


def test_same_settings_reuse_the_worker_new_settings_replace_it():
  contexts.set_simulation_context()
  tff.tensorflow.computation(lambda: tf.constant(1))()
  first = contexts.local_worker().process
  contexts.set_simulation_context()
  tff.tensorflow.computation(lambda: tf.constant(2))()
  assert contexts.local_worker().process is first
  contexts.set_simulation_context(inter_op_threads=2)
  assert tff.tensorflow.computation(lambda: tf.constant(3))() == 3
  second = contexts.local_worker().process
  assert second is not first
  assert first.poll() is not None  # The replaced worker was ended.
  contexts.set_simulation_context()


def _environ(pid: int) -> dict[str, str]:
  with open(f'/proc/{pid}/environ', 'rb') as f:
    entries = f.read().split(b'\0')
  return dict(e.decode().split('=', 1) for e in entries if b'=' in e)


def test_worker_gets_the_malloc_settings_unless_the_user_sets_them(
  monkeypatch,
):
  for name in contexts.WORKER_MALLOC_ENV:
    monkeypatch.delenv(name, raising=False)
  contexts.set_simulation_context(inter_op_threads=3)
  tff.tensorflow.computation(lambda: tf.constant(1))()
  env = _environ(contexts.local_worker().process.pid)
  assert {k: env.get(k) for k in contexts.WORKER_MALLOC_ENV} == {
    'MALLOC_ARENA_MAX': '2',
    'MALLOC_MMAP_THRESHOLD_': '33554432',
    'MALLOC_TRIM_THRESHOLD_': '1073741824',
  }
  # A user's own setting is passed on (a fresh worker: new settings).
  monkeypatch.setenv(contexts.MALLOC_ARENA_ENV, '4')
  monkeypatch.setenv('MALLOC_TRIM_THRESHOLD_', '131072')
  contexts.set_simulation_context(inter_op_threads=2)
  tff.tensorflow.computation(lambda: tf.constant(2))()
  env = _environ(contexts.local_worker().process.pid)
  assert env[contexts.MALLOC_ARENA_ENV] == '4'
  assert env['MALLOC_TRIM_THRESHOLD_'] == '131072'
  assert env['MALLOC_MMAP_THRESHOLD_'] == '33554432'
  contexts.set_simulation_context()


def _maps(pid: int) -> str:
  with open(f'/proc/{pid}/maps') as f:
    return f.read()


def test_worker_preloads_jemalloc_when_found_unless_turned_off(monkeypatch):
  monkeypatch.delenv(contexts.WORKER_JEMALLOC_ENV, raising=False)
  monkeypatch.delenv(contexts.JEMALLOC_CONF_ENV, raising=False)
  path = contexts.worker_jemalloc()
  if path is None:
    pytest.skip(f'no {contexts.JEMALLOC_LIBRARY} here (make install adds one)')
  contexts.set_simulation_context(inter_op_threads=3)
  tff.tensorflow.computation(lambda: tf.constant(1))()
  pid = contexts.local_worker().process.pid
  assert os.path.realpath(path) in _maps(pid)
  env = _environ(pid)
  assert env['LD_PRELOAD'].split()[0] == path
  assert env[contexts.JEMALLOC_CONF_ENV] == 'oversize_threshold:0'
  monkeypatch.setenv(contexts.WORKER_JEMALLOC_ENV, 'none')
  # Dropped too when the job preloaded it for itself and the worker would
  # inherit it (`processes.rerun_under_jemalloc`).
  monkeypatch.setenv('LD_PRELOAD', path)
  monkeypatch.setenv(processes.JEMALLOC_RERUN_ENV, path)
  contexts.set_simulation_context(inter_op_threads=2)
  tff.tensorflow.computation(lambda: tf.constant(2))()
  assert 'jemalloc' not in _maps(contexts.local_worker().process.pid)
  contexts.set_simulation_context()


def test_a_missing_jemalloc_path_is_named(monkeypatch):
  monkeypatch.setenv(contexts.WORKER_JEMALLOC_ENV, '/no/such/libjemalloc.so.2')
  with pytest.raises(ValueError, match="'/no/such/libjemalloc.so.2' is not"):
    contexts.worker_jemalloc()


def _tiny_process():
  def model_fn():
    model = tf.keras.Sequential(
      [tf.keras.layers.InputLayer(input_shape=(20,)), tf.keras.layers.Dense(4)]
    )
    return tff.learning.models.from_keras_model(
      model,
      input_spec=(
        tf.TensorSpec([None, 20], tf.float32),
        tf.TensorSpec([None], tf.int32),
      ),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

  return tff.learning.algorithms.build_unweighted_fed_avg(
    model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.01)
  )


# A long run's worker memory: `make test-slow`.
@pytest.mark.slow
def test_worker_memory_stays_flat_when_every_round_has_a_new_cohort_size():
  # Poisson sampling gives most rounds a cohort size not seen before. TFF's
  # own test context kept one executor per size alive on the worker: this
  # loop grew its worker by 288 MB from round 10 to the last 10 rounds
  # (about 7 MB a round for this 84-parameter model), against 16 MB with
  # the bounded factory (measured here, 2026-11-23).
  contexts.set_simulation_context()
  process = _tiny_process()
  x = np.ones((8, 20), np.float32)
  y = np.zeros(8, np.int32)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
  state = process.initialize()
  # Every size 1..50 once, in a scrambled order: 50 new cohort sizes.
  sizes = [(7 * r) % 50 + 1 for r in range(50)]
  assert sorted(sizes) == list(range(1, 51))
  worker_rss = []
  for size in sizes:
    state = process.next(state, [dataset] * size).state
    worker_rss.append(_rss_bytes(contexts.local_worker().process.pid))
  growth_mb = (max(worker_rss[-10:]) - worker_rss[9]) / 2**20
  assert growth_mb < 60, f'worker grew {growth_mb:.0f} MB over 40 rounds'
