"""DDGauss's gated secure sum: a withheld round's sum is zero."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import ddgauss_secure_sum


@pytest.fixture(scope='module')
def context():
  contexts.set_simulation_context()


def test_withheld_round_secure_sum_sees_only_zeros(context):
  # The threshold-abort secure sum: below min_clients = 3 every client
  # contributes zeros, so what the server sees (the secure sum's result)
  # is exactly zero; at 3 it is the sum.
  values = [
    np.array([5, 0, 7, 1], np.int32),
    np.array([2, 9, 0, 4], np.int32),
    np.array([1, 1, 1, 1], np.int32),
  ]
  process = ddgauss_secure_sum.ThresholdSecureSumFactory(
    3, 2**20 - 1, 0
  ).create(tff.TensorType(np.int32, [4]))
  state = process.initialize()
  withheld = process.next(state, values[:2])
  np.testing.assert_array_equal(withheld.result, [0, 0, 0, 0])
  released = process.next(withheld.state, values)
  np.testing.assert_array_equal(released.result, [8, 10, 8, 6])
  # The whole noised pipeline below the mean (clip, rotate, round, noise,
  # modular clips, gated secure sum): with noise z = 1 and 2 < 3
  # participants, the unscaled, unrotated secure sum is exactly zero.
  factory = ddgauss.ddgauss_mean(1.0, 3, 1.0, min_clients=3, bits=20)
  p = factory._parameters(4)
  assert p.local_stddev > 1000  # Noise that would show.
  inner = factory._sum_factory(p).create(tff.TensorType(np.float32, [4]))
  floats = [v.astype(np.float32) / 10 for v in values]
  out = inner.next(inner.initialize(), floats[:2])
  np.testing.assert_array_equal(out.result, np.zeros(4, np.float32))
  out = inner.next(out.state, floats)
  assert np.all(out.result != 0)
  # And the factory's mean of a withheld round is exactly zero.
  process = factory.create(tff.TensorType(np.float32, [4]))
  out = process.next(process.initialize(), floats[:2])
  np.testing.assert_array_equal(out.result, np.zeros(4, np.float32))
  assert out.measurements['released'] == 0
