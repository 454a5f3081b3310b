"""The finite guard zeroes and counts non-finite client values."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import finite_guard


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
def test_non_finite_clients_are_zeroed_and_counted(bad):
  factory = finite_guard.FiniteGuardFactory(
    dp_fedavg.gaussian_fixed(0.0, 2, 1.0)
  )
  process = factory.create(tff.TensorType(np.float32, [3]))
  out = process.next(
    process.initialize(),
    [np.array([bad, 1, 1], np.float32), np.array([0, 3, 4], np.float32)],
  )
  # The healthy client, clipped to norm 1, over the expected 2 clients.
  np.testing.assert_allclose(out.result, [0, 0.3, 0.4], atol=1e-6)
  assert out.measurements['non_finite_clients'] == 1
  assert 'dp_query_metrics' in out.measurements  # Inner names kept.


def test_rejects_a_weighted_inner():
  with pytest.raises(TypeError, match='UnweightedAggregationFactory'):
    finite_guard.FiniteGuardFactory(tff.aggregators.MeanFactory())


def test_overflowing_norm_is_bounded_not_nan():
  # ||(1e20, 0, 0)|| overflows float32: TF's clip_by_global_norm alone
  # would return NaNs. Behind the guard the client counts as clipped.
  factory = finite_guard.FiniteGuardFactory(
    dp_fedavg.gaussian_fixed(0.0, 1, 1.0)
  )
  process = factory.create(tff.TensorType(np.float32, [3]))
  out = process.next(process.initialize(), [np.array([1e20, 0, 0], 'f')])
  np.testing.assert_allclose(out.result, [1.0, 0, 0], atol=1e-6)
  assert out.measurements['non_finite_clients'] == 0
