"""The DPSFL tests' shared value: a 40-parameter model of two tensors, and
a value of it with the given flat entries set."""

import numpy as np
import tensorflow_federated as tff

D = 40
TYPE = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [4, 5]), tff.TensorType(np.float32, [20])], list
)


def value(entries):
  flat = np.zeros(D, np.float32)
  for i, v in entries.items():
    flat[i] = v
  return [flat[:20].reshape(4, 5), flat[20:]]
