"""Execution contexts for simulation.

TFF's default context cannot run `tff.federated_secure_sum*` ("Cannot embed
a federated value"); `tff.backends.test.set_sync_test_cpp_execution_context`
lowers secure sum to a plain sum (simulation) and runs everything else on
TFF's C++ runtime (the `worker_binary` child), so every method runs in it.

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

import os

import tensorflow_federated as tff

INTRA_OP_ENV = 'TF_NUM_INTRAOP_THREADS'
INTER_OP_ENV = 'TF_NUM_INTEROP_THREADS'


def thread_env(intra_op_threads: int, inter_op_threads: int) -> dict[str, str]:
  """The environment that sets a worker's TF thread pools (0: TF default)."""
  env = {}
  if intra_op_threads:
    env[INTRA_OP_ENV] = str(intra_op_threads)
  if inter_op_threads:
    env[INTER_OP_ENV] = str(inter_op_threads)
  return env


def set_simulation_context(
  max_concurrent_computation_calls: int = 3,
  intra_op_threads: int = 1,
  inter_op_threads: int = 4,
) -> None:
  """Installs TFF's C++ test context (secure sum simulated) as the default.

  Args:
    max_concurrent_computation_calls: Cap on concurrent client computations
      (-1: no cap).
    intra_op_threads: TF intra-op threads of the worker (0: TF's default).
    inter_op_threads: TF inter-op threads of the worker (0: TF's default,
      one per core). Both thread counts are read by the worker when it
      starts (the first computation after this call in a process that has
      no worker yet).

  Raises:
    ValueError: If the cap is 0 or below -1, or a thread count is negative.
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
  os.environ.update(thread_env(intra_op_threads, inter_op_threads))
  tff.backends.test.set_sync_test_cpp_execution_context(
    max_concurrent_computation_calls=max_concurrent_computation_calls
  )
