"""A user's program on tff-dp's DP-FedAvg aggregator, built by Bazel.

Three clients' vectors, clipped at 1 and averaged by the aggregator's TFF
process (noise multiplier 0, so the mean can be checked exactly).
Run: bazel/.bin/bazel test //bazel/example:dp_fedavg_example
"""

import numpy as np
import tensorflow_federated as tff

from tff_dp.aggregators import dp_fedavg


def main() -> None:
  factory = dp_fedavg.gaussian_fixed(
    noise_multiplier=0.0, clients_per_round=3, clip=1.0
  )
  process = factory.create(tff.TensorType(np.float32, [2]))
  state = process.initialize()
  # Norms 5, 0.5 and 1: the first is clipped to norm 1.
  clients = [np.array([3.0, 4.0]), np.array([0.3, 0.4]), np.array([0.0, 1.0])]
  output = process.next(state, [c.astype(np.float32) for c in clients])
  mean = (np.array([0.6, 0.8]) + clients[1] + clients[2]) / 3
  np.testing.assert_allclose(output.result, mean, rtol=1e-5)
  print('mean of the clipped updates:', output.result)


if __name__ == '__main__':
  main()
