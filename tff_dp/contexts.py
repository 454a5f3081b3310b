"""Execution contexts for simulation.

TFF's default context cannot run `tff.federated_secure_sum*` ("Cannot embed
a federated value"); `tff.backends.test.set_sync_test_cpp_execution_context`
lowers secure sum to a plain sum (simulation) and runs everything else on
TFF's C++ runtime, so every method here runs in it.
"""

import tensorflow_federated as tff


def set_simulation_context(max_concurrent_computation_calls: int = -1) -> None:
  """Installs TFF's C++ test context (secure sum simulated) as the default.

  Args:
    max_concurrent_computation_calls: Cap on concurrent client computations
      (-1: no cap).

  Raises:
    ValueError: If the cap is 0 or below -1.
  """
  if max_concurrent_computation_calls == 0 or (
    max_concurrent_computation_calls < -1
  ):
    raise ValueError(
      'max_concurrent_computation_calls must be -1 (no cap) or '
      f'>= 1. Found {max_concurrent_computation_calls!r}.'
    )
  tff.backends.test.set_sync_test_cpp_execution_context(
    max_concurrent_computation_calls=max_concurrent_computation_calls
  )
