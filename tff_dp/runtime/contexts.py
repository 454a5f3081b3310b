"""Execution contexts for simulation.

TFF's default context cannot run `tff.federated_secure_sum*` ("Cannot embed
a federated value"); TFF's test context
(`tff.backends.test.set_sync_test_cpp_execution_context`) lowers secure sum
to a plain sum (simulation) and runs everything else on TFF's C++ runtime
(the `worker_binary` child), so every method runs in it.
`set_simulation_context` installs that context with two changes:

* Memory. TFF's executor factory keeps one executor per cohort size in a
  10-entry LRU cache and drops evicted ones without disposing of them on
  the worker, so every new cohort size (every round, under Poisson
  sampling) left an executor, with its compiled functions and values,
  alive in the worker: 150-250 MB a round for the Fashion-MNIST CNN at
  20 clients a round, without bound (measured here; tests/tff_dp/
  contexts_test.py shows it on a tiny model). `BoundedExecutorFactory`
  keeps at most `max_executors` (default 2: the round's cohort and the
  client-free calls such as `get_model_weights`) and disposes of each
  evicted one on the worker.
* Lifetime. The worker is started by `processes.start_worker_binary`: its
  own process group, killed by the kernel when Python ends however it
  ends, and reused by later calls with the same settings.

Threads: the worker runs up to `max_concurrent_computation_calls` client
computations at once. Their ops share the worker's TF inter-op thread pool
(TF's default: one thread per core) and each op runs on one intra-op thread.
On 2 cores, 2 concurrent calls on the default 2 inter-op threads kept the
worker at about 1.6 cores: a call's blocked ops hold inter-op threads the
other call could use. 3 concurrent calls on 4 inter-op threads (one intra-op
thread each) kept it at about 1.8 cores and cut the profiled round by
13% (benchmarks/results/profile_round.md, "Worker threads"); 3 calls on 2
inter-op threads, or 2 calls on 4, gained nothing. These are the defaults.
"""

import collections
import os
import threading
import time
from typing import Callable, Optional

import grpc
import portpicker
import tensorflow_federated as tff
from tensorflow_federated.python.core.backends.native import (
  compiler as native_compiler,
)
from tensorflow_federated.python.core.backends.test import (
  compiler as test_compiler,
)
from tensorflow_federated.python.core.environments.tensorflow_frontend import (
  tensorflow_computation,
)
from tensorflow_federated.python.core.impl.types import placements

from tff_dp.runtime import processes

INTRA_OP_ENV = 'TF_NUM_INTRAOP_THREADS'
INTER_OP_ENV = 'TF_NUM_INTEROP_THREADS'
# glibc malloc settings for the worker, each unless the user's environment
# sets it (performance notes, "Memory over long runs"):
# - 2 arenas: the default (8 per core) lets each TF/gRPC thread keep freed
#   pages in its own arena.
# - a fixed mmap threshold of 32 MiB, glibc's own ceiling: its dynamic
#   threshold climbs there anyway as large tensors are freed, so setting it
#   at the start only skips the climb, and fixing it stops the trim threshold
#   from moving with it. (A fixed 128 KiB, glibc's starting value, kept RSS
#   lower but made the round 1.75x slower: every activation was an mmap.)
# - a trim threshold of 1 GiB: the worker keeps up to that much freed heap
#   rather than returning and refaulting it every round with the cohort size,
#   so its RSS is its high-water mark instead of a swing of 100-600 MB.
# (With jemalloc preloaded, below, glibc's malloc is unused and these are
# inert.)
MALLOC_ARENA_ENV = 'MALLOC_ARENA_MAX'
WORKER_MALLOC_ENV = {
  MALLOC_ARENA_ENV: '2',
  'MALLOC_MMAP_THRESHOLD_': str(32 * 1024 * 1024),
  'MALLOC_TRIM_THRESHOLD_': str(1024 * 1024 * 1024),
}
# jemalloc for the worker (performance notes, "Memory over long runs"):
# under glibc's malloc the worker's heap fragments and holds its
# high-water mark, which climbs with the largest cohort so far (4.6 GB
# after 10 rounds of `make run`'s job, 5.8 GB after 200); under jemalloc (with
# `processes.JEMALLOC_CONF`) it returns freed pages and stayed flat between
# 1.0 and 3.5 GB after each of 200 rounds of the same job. Preloaded when
# found: TFF_DP_WORKER_JEMALLOC names the library ('none' turns it off);
# otherwise the first of `processes.JEMALLOC_PATHS` that exists. Without it
# the worker runs on glibc with the settings above.
WORKER_JEMALLOC_ENV = 'TFF_DP_WORKER_JEMALLOC'
JEMALLOC_CONF_ENV = processes.JEMALLOC_CONF_ENV
JEMALLOC_LIBRARY = processes.JEMALLOC_LIBRARY


def worker_jemalloc() -> Optional[str]:
  """The jemalloc library the local worker preloads (None: glibc malloc).

  Raises:
    ValueError: If TFF_DP_WORKER_JEMALLOC names a file that does not exist.
  """
  return processes.find_jemalloc(WORKER_JEMALLOC_ENV)


def thread_env(intra_op_threads: int, inter_op_threads: int) -> dict[str, str]:
  """The environment that sets a worker's TF thread pools (0: TF default)."""
  env = {}
  if intra_op_threads:
    env[INTRA_OP_ENV] = str(intra_op_threads)
  if inter_op_threads:
    env[INTER_OP_ENV] = str(inter_op_threads)
  return env


GRPC_OPTIONS = (
  ('grpc.max_message_length', 2 * 1000 * 1000 * 1000),
  ('grpc.max_send_message_length', 2 * 1000 * 1000 * 1000),
  ('grpc.max_receive_message_length', 2 * 1000 * 1000 * 1000),
)


def worker_binary_path() -> str:
  """The `worker_binary` shipped in TFF's wheel."""
  path = os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')
  if not os.path.isfile(path):
    raise RuntimeError(f'TFF worker_binary not found at {path}.')
  return path


def _normalised(cardinalities) -> dict:
  """A copy with CLIENTS set (0 if absent), as the executors are built."""
  out = dict(cardinalities)
  out.setdefault(placements.CLIENTS, 0)
  return out


def _cardinality_key(cardinalities) -> tuple:
  return tuple(
    sorted((str(k), v) for k, v in _normalised(cardinalities).items())
  )


class BoundedExecutorFactory(tff.framework.ExecutorFactory):
  """One executor per cardinality, at most `max_executors` alive at once.

  Like TFF's `ResourceManagingExecutorFactory`, except that an executor
  evicted from its LRU cache is closed (`close()`: disposed of on the
  worker with everything it holds) rather than dropped while its worker
  side lives on. Cardinalities without CLIENTS count as CLIENTS = 0 (the
  executor they get).

  Single-flight: eviction does not wait for calls still running on the
  evicted executor, so no more than `max_executors` distinct cardinalities
  may be in flight at once. The sync contexts here run one call at a time
  (per worker in the distributed context), which satisfies this.
  """

  def __init__(
    self,
    executor_stack_fn: Callable[[dict], tff.framework.RemoteExecutor],
    max_executors: int = 2,
  ):
    if not isinstance(max_executors, int) or max_executors < 1:
      raise ValueError(
        f'max_executors must be an integer >= 1. Found {max_executors!r}.'
      )
    self._stack_fn = executor_stack_fn
    self._max = max_executors
    self._executors: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  @property
  def num_executors(self) -> int:
    return len(self._executors)

  def create_executor(self, cardinalities):
    key = _cardinality_key(cardinalities)
    with self._lock:
      ex = self._executors.get(key)
      if ex is not None:
        self._executors.move_to_end(key)
        return ex
      evicted = []
      while len(self._executors) >= self._max:
        evicted.append(self._executors.popitem(last=False)[1])
    for old in evicted:
      old.close()
    ex = self._stack_fn(_normalised(cardinalities))
    with self._lock:
      self._executors[key] = ex
    return ex

  def clean_up_executor(self, cardinalities):
    with self._lock:
      ex = self._executors.pop(_cardinality_key(cardinalities), None)
    if ex is not None:
      ex.close()

  def close_all(self) -> None:
    with self._lock:
      executors = list(self._executors.values())
      self._executors.clear()
    for ex in executors:
      ex.close()


def remote_executor_factory(
  stub_fn: Callable[[], tff.framework.RemoteExecutorGrpcStub],
  max_executors: int = 2,
) -> BoundedExecutorFactory:
  """Executors on the worker that `stub_fn()` answers for."""

  def stack_fn(cardinalities):
    cardinalities.setdefault(placements.CLIENTS, 0)
    ex = tff.framework.RemoteExecutor(stub_fn())
    ex.set_cardinalities(cardinalities)
    return ex

  return BoundedExecutorFactory(stack_fn, max_executors)


def compile_for_test_backend(comp):
  """Secure sums lowered to plain sums (simulation), then native form."""
  comp = test_compiler.replace_secure_intrinsics_with_bodies(comp)
  return native_compiler.desugar_and_transform_to_native(comp)


class LocalWorker:
  """A `worker_binary` on this machine, (re)started on demand."""

  def __init__(self, max_concurrent_computation_calls: int, env: dict):
    self.settings = (
      max_concurrent_computation_calls,
      tuple(sorted(env.items())),
    )
    self._max_calls = max_concurrent_computation_calls
    self._env = env
    self._lock = threading.RLock()
    self.process = None
    self._stub = None
    self._channel = None

  def stub(self) -> tff.framework.RemoteExecutorGrpcStub:
    with self._lock:
      if self._stub is not None and self._stub.is_ready:
        return self._stub
      if processes.shutting_down():
        raise RuntimeError(
          'The process is exiting: its TFF worker is not restarted.'
        )
      self._stop_locked()
      port = portpicker.pick_unused_port()
      self.process = processes.start_worker_binary(
        worker_binary_path(),
        port,
        max_concurrent_computation_calls=self._max_calls,
        env=self._worker_env(),
      )
      channel = grpc.insecure_channel(f'localhost:{port}', GRPC_OPTIONS)
      self._channel = channel
      stub = tff.framework.RemoteExecutorGrpcStub(channel)
      while not stub.is_ready:
        if self.process.poll() is not None:
          raise RuntimeError(
            f'TFF worker_binary exited with code {self.process.returncode} '
            'before it answered.'
          )
        time.sleep(0.05)
      self._stub = stub
      return stub

  def _worker_env(self) -> dict:
    env = dict(os.environ)
    # A thread count of 0 means TF's default, not an inherited setting.
    for name in (INTRA_OP_ENV, INTER_OP_ENV):
      env.pop(name, None)
    env.update(self._env)
    for name, value in WORKER_MALLOC_ENV.items():
      env.setdefault(name, value)
    jemalloc = worker_jemalloc()
    preload = env.get('LD_PRELOAD', '').split()
    if jemalloc is None:
      # Not the library the job preloaded for itself (inherited).
      job_library = env.get(processes.JEMALLOC_RERUN_ENV)
      if job_library in preload:
        preload.remove(job_library)
        env['LD_PRELOAD'] = ' '.join(preload)
    else:
      if jemalloc not in preload:
        env['LD_PRELOAD'] = ' '.join([jemalloc] + preload)
      env.setdefault(JEMALLOC_CONF_ENV, processes.JEMALLOC_CONF)
    return env

  def stop(self) -> None:
    with self._lock:
      self._stop_locked()

  def _stop_locked(self) -> None:
    # The old channel is not closed: executors still holding its stub
    # must fail with a retryable gRPC error (TFF then rebuilds them on the
    # new worker), not "RPC on closed channel". It is freed with them.
    if self.process is not None:
      processes.stop_processes([self.process])
    self.process = None
    self._stub = None
    self._channel = None


# The simulation context's worker and executor factory (one at a time).
_LOCAL: dict = {'worker': None, 'factory': None}


def local_worker() -> Optional[LocalWorker]:
  """The worker of the installed simulation context (None before one)."""
  return _LOCAL['worker']


def set_simulation_context(
  max_concurrent_computation_calls: int = 3,
  intra_op_threads: int = 1,
  inter_op_threads: int = 4,
  max_executors: int = 2,
) -> None:
  """Installs TFF's C++ test context (secure sum simulated) as the default.

  Args:
    max_concurrent_computation_calls: Cap on concurrent client computations
      (-1: no cap).
    intra_op_threads: TF intra-op threads of the worker (0: TF's default).
    inter_op_threads: TF inter-op threads of the worker (0: TF's default,
      one per core). Both thread counts are read by the worker when it
      starts (the first computation after this call in a process that has
      no worker with these settings).
    max_executors: Executors (one per cohort size) kept alive on the
      worker, >= 1; the least recently used beyond it is disposed of.

  Raises:
    ValueError: If the cap is 0 or below -1, or a thread count is negative,
      or `max_executors` < 1.
  """
  if max_concurrent_computation_calls == 0 or (
    max_concurrent_computation_calls < -1
  ):
    raise ValueError(
      'max_concurrent_computation_calls must be -1 (no cap) or '
      f'>= 1. Found {max_concurrent_computation_calls!r}.'
    )
  for name, value in (
    ('intra_op_threads', intra_op_threads),
    ('inter_op_threads', inter_op_threads),
  ):
    if not isinstance(value, int) or value < 0:
      raise ValueError(f'{name} must be an integer >= 0. Found {value!r}.')
  if not isinstance(max_executors, int) or max_executors < 1:
    raise ValueError(
      f'max_executors must be an integer >= 1. Found {max_executors!r}.'
    )
  env = thread_env(intra_op_threads, inter_op_threads)
  worker, factory = _LOCAL['worker'], _LOCAL['factory']
  if factory is not None:
    factory.close_all()
  settings = (max_concurrent_computation_calls, tuple(sorted(env.items())))
  if worker is None or worker.settings != settings:
    if worker is not None:
      worker.stop()
    worker = LocalWorker(max_concurrent_computation_calls, env)
  factory = remote_executor_factory(worker.stub, max_executors)
  _LOCAL.update(worker=worker, factory=factory)
  tff.framework.set_default_context(
    tff.framework.SyncExecutionContext(
      executor_fn=factory,
      compiler_fn=compile_for_test_backend,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result,
    )
  )
