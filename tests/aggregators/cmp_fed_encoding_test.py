"""CMP-Fed's factor encoding: kernels as matrices, encoded and decoded."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp.aggregators import cmp_fed


TYPE = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [6, 4]), tff.TensorType(np.float32, [4])], list
)
CONV = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [3, 3, 2, 5]), tff.TensorType(np.float32, [5])],
  list,
)


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


def _value(seed, scale=1.0):
  rng = np.random.default_rng(seed)
  return [
    (scale * rng.normal(size=(6, 4))).astype(np.float32),
    (scale * rng.normal(size=4)).astype(np.float32),
  ]


@pytest.mark.parametrize('private', [False, True])
def test_full_rank_reconstructs_a_single_update_exactly(private):
  kwargs = {}
  if private:
    kwargs = dict(
      noise_multiplier=0.0,
      clients_per_round=1,
      clip_u=1e4,
      clip_v=1e4,
      secure_sum=False,
    )
  process = cmp_fed.CMPFedFactory(4, **kwargs).create(TYPE)
  value = _value(0)
  out = process.next(process.initialize(), [value])
  np.testing.assert_allclose(out.result[0], value[0], atol=1e-4)
  np.testing.assert_allclose(out.result[1], value[1], atol=1e-5)


@pytest.mark.parametrize(
  'layout, vectors_phase, sizes',
  [
    # (3, 3, 2, 5) is the (in, out) = (18, 5) matrix K; rank 5 is full.
    ('out_in', 'v', (5 * 5, 18 * 5 + 5)),  # M = K^T: U 5 x 5, V 18 x 5.
    ('in_out', 'u', (18 * 5 + 5, 5 * 5)),  # M = K: U 18 x 5 (+ bias).
    ('min_side', 'u', (5 * 5 + 5, 18 * 5)),  # The smaller side: 5.
  ],
)
def test_conv_kernels_are_reshaped_and_reconstructed(
  layout, vectors_phase, sizes
):
  rng = np.random.default_rng(1)
  value = [rng.normal(size=(3, 3, 2, 5)).astype(np.float32), np.ones(5, 'f')]
  options = dict(layout=layout, vectors_phase=vectors_phase)
  process = cmp_fed.uv_fed(8, **options).create(CONV)
  out = process.next(process.initialize(), [value])
  np.testing.assert_allclose(out.result[0], value[0], atol=1e-4)
  np.testing.assert_allclose(out.result[1], value[1], atol=1e-6)
  assert cmp_fed.payload_sizes([(3, 3, 2, 5), (5,)], 8, **options) == sizes


def test_dense_below_must_leave_a_kernel_to_factorise():
  with pytest.raises(ValueError, match='dense_below=25 entries'):
    cmp_fed.uv_fed(1, dense_below=25).create(TYPE)


def test_repeated_rounds_converge_to_the_best_rank_r_approximation():
  value = _value(2)
  u, s, vt = np.linalg.svd(value[0].astype(np.float64))
  best = (u[:, :2] * s[:2]) @ vt[:2]
  process = cmp_fed.uv_fed(2, seed=3).create(TYPE)
  state = process.initialize()
  errors = []
  for _ in range(25):
    out = process.next(state, [value, value])
    state = out.state
    errors.append(np.abs(out.result[0] - best).max())
  assert errors[-1] < 1e-4 < errors[0]
  # Two clients: the mean of identical updates is the update.
  np.testing.assert_allclose(out.result[1], value[1], atol=1e-6)
