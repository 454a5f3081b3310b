"""Bytes each participating client sends and receives per round.

Each method declares its payload; these helpers size the common ones. Sizes
are of the values that cross the network in the simulated protocol (model
broadcast down; the aggregator's client-side payload up), not of any
transport framing or secure-aggregation overhead.
"""

import dataclasses

import numpy as np

FLOAT32_BYTES = 4


@dataclasses.dataclass(frozen=True)
class CommunicationCost:
  """Bytes per participating client per round."""

  down: int
  up: int


def dense_float32_bytes(num_values: int) -> int:
  return FLOAT32_BYTES * int(num_values)


def packed_bits_bytes(num_values: int, bits: int) -> int:
  """Bytes of `num_values` integers of `bits` bits each, packed."""
  return int(np.ceil(int(num_values) * int(bits) / 8))
