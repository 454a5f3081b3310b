"""Execution contexts for simulation.

TFF's default context cannot run `tff.federated_secure_sum*` ("Cannot embed
a federated value"); `tff.backends.test.set_sync_test_cpp_execution_context`
lowers secure sum to a plain sum (simulation) and runs everything else on
TFF's C++ runtime (the `worker_binary` child), so every method runs in it.

Threads: the worker runs up to `max_concurrent_computation_calls` client
computations at once, each on TF's intra-op thread pool. On 2 cores, 2
concurrent calls with one intra-op thread each measured fastest among the
settings tried (see benchmarks/results/round_speed.md); more threads than
cores oversubscribe.
"""

import os

import tensorflow_federated as tff

INTRA_OP_ENV = 'TF_NUM_INTRAOP_THREADS'


def set_simulation_context(
  max_concurrent_computation_calls: int = 2, intra_op_threads: int = 1
) -> None:
  """Installs TFF's C++ test context (secure sum simulated) as the default.

  Args:
    max_concurrent_computation_calls: Cap on concurrent client computations
      (-1: no cap).
    intra_op_threads: TF intra-op threads of the worker (0: TF's default).
      Read by the worker when it starts (the first computation after this
      call in a process that has no worker yet).

  Raises:
    ValueError: If the cap is 0 or below -1, or threads is negative.
  """
  if max_concurrent_computation_calls == 0 or (
    max_concurrent_computation_calls < -1
  ):
    raise ValueError(
      'max_concurrent_computation_calls must be -1 (no cap) or '
      f'>= 1. Found {max_concurrent_computation_calls!r}.'
    )
  if intra_op_threads < 0:
    raise ValueError(
      f'intra_op_threads must be >= 0. Found {intra_op_threads!r}.'
    )
  if intra_op_threads:
    os.environ[INTRA_OP_ENV] = str(intra_op_threads)
  tff.backends.test.set_sync_test_cpp_execution_context(
    max_concurrent_computation_calls=max_concurrent_computation_calls
  )
