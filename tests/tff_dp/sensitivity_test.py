"""Bounded sensitivity under any client input (property-based).

For every DP aggregator, one client's contribution to the pre-noise sum
must have L2 norm at most the clip the ledger assumes, whatever it sends:
random, huge, zero, one hot coordinate, NaN or Inf. Each aggregator runs
as the runner runs it (behind the finite guard), with zero noise and one
expected client, so what comes out is exactly that contribution (or a
norm of it the aggregator measures).
"""

import functools

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp import contexts
from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import finite_guard

CLIP = 0.7
SHAPES = ((6, 4), (4,))
D = 28
TYPE = tff.StructWithPythonType(
  [tff.TensorType(np.float32, s) for s in SHAPES], list
)

finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
anything = st.floats(width=32, allow_nan=True, allow_infinity=True)
vectors = st.one_of(
  hnp.arrays(np.float32, D, elements=finite),
  hnp.arrays(np.float32, D, elements=anything),
  st.just(np.zeros(D, np.float32)),
  st.integers(0, D - 1).map(lambda i: np.eye(D, dtype=np.float32)[i] * 1e20),
  st.just(np.full(D, 3.4e38, np.float32)),
)


def _split(flat):
  return [flat[:24].reshape(6, 4), flat[24:]]


def _norm(result):
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(r))) for r in result)))


@functools.cache
def _process(name):
  contexts.set_simulation_context()
  factories = {
    'dp_fedavg': dp_fedavg.gaussian_fixed(0.0, 1, CLIP),
    'dp_randagg': dp_randagg.DPRandAggFactory(
      0.0, 1, CLIP, num_coordinates=9, seed=1
    ),
    'fl_top': dp_randagg.DPRandAggFactory(
      0.0, 1, CLIP, num_coordinates=3, fixed_indices=np.array([0, 5, 27])
    ),
    'dpsfl': dpsfl.dpsfl(
      3, 16, 4, noise_multiplier=0.0, clients_per_round=1, clip=CLIP
    ),
    'dpsfl_ac': dpsfl.dpsfl_ac(
      3,
      16,
      4,
      noise_multiplier=0.0,
      clients_per_round=1,
      initial_clip=CLIP,
      adaptive=dpsfl.AdaptiveClip(bit_noise_multiplier=0.0),
    ),
    'cmp_fed': cmp_fed.cmp_fed(
      2, noise_multiplier=0.0, clients_per_round=1, clip_u=CLIP, clip_v=0.3
    ),
  }
  process = finite_guard.FiniteGuardFactory(factories[name]).create(TYPE)
  return process, process.initialize()


def _run(name, flat):
  process, state = _process(name)
  return process.next(state, [_split(flat)])


SETTINGS = settings(max_examples=12, deadline=None, derandomize=True)


@pytest.mark.parametrize('name', ['dp_fedavg', 'dp_randagg', 'fl_top'])
@SETTINGS
@given(flat=vectors)
def test_clipped_update_contribution(name, flat):
  out = _run(name, flat)
  assert np.all(
    np.isfinite(_flat := np.concatenate([np.ravel(r) for r in out.result]))
  ), _flat
  # Secure sum quantizes within the clip: a hair of slack.
  assert _norm(out.result) <= CLIP * (1 + 1e-4)


@pytest.mark.parametrize('name', ['dpsfl', 'dpsfl_ac'])
@SETTINGS
@given(flat=vectors)
def test_sketch_counters_within_sqrt_rows_clip(name, flat):
  out = _run(name, flat)
  # The mean sketch over 1 expected client is the clipped sketch itself.
  assert out.measurements['sketch_norm'] <= np.sqrt(3) * CLIP * (1 + 1e-4)
  if name == 'dpsfl_ac':
    assert out.measurements['unclipped_probability'] in (0.0, 1.0)


@SETTINGS
@given(flat=vectors)
def test_cmp_both_phases_clipped(flat):
  out = _run('cmp_fed', flat)
  norms = out.measurements['mean_norms']
  assert norms['u_norm'] <= CLIP * (1 + 1e-4)
  assert norms['v_norm'] <= 0.3 * (1 + 1e-4)
  assert np.all(np.isfinite(np.concatenate([np.ravel(r) for r in out.result])))


def test_non_finite_input_is_counted():
  flat = np.zeros(D, np.float32)
  flat[3] = np.nan
  out = _run('dp_fedavg', flat)
  assert out.measurements['non_finite_clients'] == 1
  assert _norm(out.result) == 0.0
