"""Bytes each participating client sends and receives per round.

Each method declares its payload; these helpers size the common ones. Sizes
are of the values that cross the network in the simulated protocol (model
broadcast down; the aggregator's client-side payload up), not of any
transport framing or secure-aggregation overhead.
"""

import dataclasses

import numpy as np
import tensorflow_federated as tff

FLOAT32_BYTES = 4


@dataclasses.dataclass(frozen=True)
class CommunicationCost:
  """Bytes per participating client per round."""

  down: int
  up: int


def num_elements(type_spec) -> int:
  """Number of scalars in a (nested) TFF or TF tensor type."""
  if isinstance(type_spec, tff.TensorType):
    return int(np.prod(type_spec.shape, dtype=np.int64))
  if isinstance(type_spec, tff.StructType):
    return sum(num_elements(t) for t in type_spec)
  raise TypeError(f'Expected a tensor or struct type. Found {type_spec!r}.')


def dense_float32_bytes(num_values: int) -> int:
  return FLOAT32_BYTES * int(num_values)


def packed_bits_bytes(num_values: int, bits: int) -> int:
  """Bytes of `num_values` integers of `bits` bits each, packed."""
  return int(np.ceil(int(num_values) * int(bits) / 8))
