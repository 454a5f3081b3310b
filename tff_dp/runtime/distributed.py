"""Running a round's clients across TFF `worker_binary` processes.

TFF's wheel ships the C++ `worker_binary` (a gRPC executor service). This
module starts local ones (`start_local_workers`, for one machine's core
groups or tests) and builds an execution context over any list of
`host:port` workers with TFF's own runtime: one remote C++ context per
worker (`RemoteExecutor` over gRPC) inside TFF's mergeable-computation
context (`tff.backends.native.create_mergeable_comp_execution_context`),
which splits each round's clients into one sub-round per worker and merges
the partial aggregates.

Secure sum: the computation is first lowered with TFF's test-backend
compiler (`replace_secure_intrinsics_with_bodies`), which simulates the
secure-sum intrinsics with their plain-sum bodies (as the single-process
test context does), and then compiled to mergeable form.

The mergeable form needs exactly one aggregation per round (it splits on
it). CMP-Fed's two dependent phases (a broadcast that depends on the first
aggregate) cannot be expressed that way. When compiling a computation
fails with TFF's ValueError, the computation runs whole on the first
worker instead (logged once per computation): correct, not parallel.
"""

import atexit
import os
import subprocess
import time
from typing import Sequence

from absl import logging
import grpc
import portpicker
from tensorflow_federated.python.core.backends.native import (
  execution_contexts as native_contexts,
)
from tensorflow_federated.python.core.backends.native import (
  mergeable_comp_compiler,
)
from tensorflow_federated.python.core.backends.test import (
  compiler as test_compiler,
)
from tensorflow_federated.python.core.environments.tensorflow_frontend import (
  tensorflow_computation,
)
from tensorflow_federated.python.core.impl.context_stack import (
  context_stack_impl,
)
from tensorflow_federated.python.core.impl.execution_contexts import (
  async_execution_context,
)
from tensorflow_federated.python.core.impl.execution_contexts import (
  mergeable_comp_execution_context,
)
from tensorflow_federated.python.core.impl.executors import (
  remote_executor_grpc_stub,
)
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_dp.runtime import contexts

from tff_dp.runtime import processes

_STARTED: list[subprocess.Popen] = []


def start_local_workers(
  count: int,
  *,
  max_concurrent_computation_calls: int = 1,
  intra_op_threads: int = 1,
  inter_op_threads: int = 0,
) -> list[tuple[subprocess.Popen, str]]:
  """Starts `count` worker_binary processes on 127.0.0.1.

  Returns `(process, 'host:port')` pairs; the processes are ended at exit
  (and by `stop_workers`).
  """
  if not isinstance(count, int) or count < 1:
    raise ValueError(f'count must be an integer >= 1. Found {count!r}.')
  env = dict(os.environ)
  env.update(contexts.thread_env(intra_op_threads, inter_op_threads))
  workers = []
  for _ in range(count):
    port = portpicker.pick_unused_port()
    # Own process group, killed by the kernel when this process ends.
    proc = processes.start_worker_binary(
      contexts.worker_binary_path(),
      port,
      max_concurrent_computation_calls=max_concurrent_computation_calls,
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
    )
    workers.append((proc, f'127.0.0.1:{port}'))
    _STARTED.append(proc)
  atexit.register(stop_workers, [p for p, _ in workers])
  return workers


def stop_local_workers() -> None:
  """Ends every worker this process started with `start_local_workers`.

  If it started any and the installed context is a distributed one (over
  them: the runner installs it with them), that context is replaced by
  TFF's default (the one `import tensorflow_federated` installs): a later
  computation in this process would otherwise wait on the ended workers
  forever. A context over workers started elsewhere is left alone.
  """
  started = bool(_STARTED)
  stop_workers(_STARTED)
  _STARTED.clear()
  current = context_stack_impl.context_stack.current
  if started and isinstance(current, _DistributedContext):
    _STUBS.clear()
    native_contexts.set_sync_local_cpp_execution_context()


def stop_workers(workers: Sequence[subprocess.Popen]) -> None:
  processes.stop_processes(workers)


_STUBS: dict[str, remote_executor_grpc_stub.RemoteExecutorGrpcStub] = {}


def unavailable_workers() -> list[str]:
  """Targets of the installed distributed context whose channel is down."""
  return [t for t, stub in _STUBS.items() if not stub.is_ready]


def call_watching_workers(fn, *args, poll_seconds: float = 0.5):
  """`fn(*args)` on a daemon thread; raises if a worker goes away meanwhile.

  TFF's remote executor waits for a lost worker to come back rather than
  failing, so a round would hang: this raises `RuntimeError` naming the lost
  worker instead (the blocked call is abandoned on its daemon thread).
  """
  import threading  # pylint: disable=g-import-not-at-top

  box = {}
  context = context_stack_impl.context_stack.current  # Thread-local stack.

  def target():
    try:
      with context_stack_impl.context_stack.install(context):
        box['result'] = fn(*args)
    except BaseException as e:  # pylint: disable=broad-except
      box['error'] = e

  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  while thread.is_alive():
    thread.join(poll_seconds)
    lost = unavailable_workers()
    if lost and thread.is_alive():
      raise RuntimeError(f'Lost TFF worker(s) {", ".join(lost)} mid-round.')
  if 'error' in box:
    raise box['error']
  return box['result']


def remote_async_context(
  target: str, *, wait_seconds: float = 60.0
) -> async_execution_context.AsyncExecutionContext:
  """An async C++ context on the worker at `host:port`.

  Raises:
    RuntimeError: If the worker does not answer within `wait_seconds`.
  """
  channel = grpc.insecure_channel(target, contexts.GRPC_OPTIONS)
  stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)
  deadline = time.time() + wait_seconds
  while not stub.is_ready:
    if time.time() > deadline:
      raise RuntimeError(
        f'TFF worker at {target} did not answer within {wait_seconds:g} s: '
        'is worker_binary running there (see docs/scale_out.md)?'
      )
    time.sleep(0.1)
  _STUBS[target] = stub

  return async_execution_context.AsyncExecutionContext(
    # Executors of cohort sizes no longer in use are disposed of on the
    # worker (see `contexts.BoundedExecutorFactory`).
    executor_fn=contexts.remote_executor_factory(lambda: stub),
    compiler_fn=contexts.compile_for_test_backend,
    transform_args=tensorflow_computation.transform_args,
    transform_result=tensorflow_computation.transform_result,
  )


class _SplittingOrWholeCompiler:
  """Mergeable form when TFF can express it; else the whole computation."""

  def __call__(self, comp):
    lowered_comp = test_compiler.replace_secure_intrinsics_with_bodies(comp)
    try:
      return mergeable_comp_compiler.compile_to_mergeable_comp_form(
        lowered_comp
      )
    except (ValueError, TypeError) as e:
      logging.info(
        'Computation %s is not of mergeable form (%s); it runs on the first '
        'worker.',
        comp.type_signature,
        e,
      )
      return comp


class _DistributedContext(
  mergeable_comp_execution_context.MergeableCompExecutionContext
):
  """Mergeable context that runs non-mergeable computations on worker 0."""

  def __init__(self, contexts):
    super().__init__(
      async_contexts=contexts, compiler_fn=_SplittingOrWholeCompiler()
    )
    self._first = contexts[0]

  def invoke(self, comp, arg=None):
    compiled = self._compiler_pipeline.compile(comp)  # Cached per comp.
    if isinstance(compiled, mergeable_comp_execution_context.MergeableCompForm):
      result = super().invoke(comp, arg)
      # The merged result comes back in plain containers; restore the
      # computation's own (e.g. LearningProcessOutput, ModelWeights).
      return type_conversions.type_to_py_container(
        structure.from_container(result, recursive=True),
        comp.type_signature.result,
      )
    return self._async_runner.run_coro_and_return_result(
      self._first.invoke(comp, arg)
    )


def set_distributed_context(targets: Sequence[str]) -> None:
  """Installs a context that spreads each round's clients over `targets`."""
  if not targets:
    raise ValueError('targets must name at least one host:port worker.')
  _STUBS.clear()
  contexts = [remote_async_context(t) for t in targets]
  context_stack_impl.context_stack.set_default_context(
    _DistributedContext(contexts)
  )
