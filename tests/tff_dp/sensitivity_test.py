"""Bounded sensitivity under any client input (property-based).

For every DP aggregator, one client's contribution to the pre-noise sum
must have L2 norm at most the clip the ledger assumes, whatever it sends:
random, huge, zero, one hot coordinate, NaN or Inf. Each aggregator runs
as the runner runs it (behind the finite guard), with zero noise and one
expected client, so what comes out is exactly that contribution (or a
norm of it the aggregator measures).
"""

import functools
import os
import subprocess
import sys

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import dpsfl_adaptive_clip
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
    # With the DP fraction clipped (its count's noise is not zero; the sum's
    # is, so the result is still the client's contribution).
    'dp_fedavg_fraction': dp_fedavg.gaussian_fixed(
      0.0, 1, CLIP, clipped_fraction_stddev=1.0
    ),
    'dp_randagg': dp_randagg.DPRandAggFactory(
      0.0, 1, CLIP, num_coordinates=9, seed=1
    ),
    'dp_randagg_payload': dp_randagg.DPRandAggFactory(
      0.0, 1, CLIP, num_coordinates=9, seed=1, clip_scope='payload'
    ),
    # As FL-TOP-DP builds it (seed 004 clips the compressed update).
    'fl_top': dp_randagg.DPRandAggFactory(
      0.0,
      1,
      CLIP,
      num_coordinates=3,
      fixed_indices=np.array([0, 5, 27]),
      clip_scope='payload',
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
      adaptive=dpsfl_adaptive_clip.AdaptiveClip(bit_noise_multiplier=0.0),
    ),
    'cmp_fed': cmp_fed.cmp_fed(
      2, noise_multiplier=0.0, clients_per_round=1, clip_u=CLIP, clip_v=0.3
    ),
    # Two clients (DDGauss releases no round below min_clients >= 2): the
    # adversarial one and a zero update.
    'ddgauss': ddgauss.ddgauss_mean(0.0, 2, CLIP, bits=20, min_clients=2),
  }
  process = finite_guard.FiniteGuardFactory(factories[name]).create(TYPE)
  return process, process.initialize()


def _run(name, flat):
  process, state = _process(name)
  clients = [_split(flat)]
  if name == 'ddgauss':
    clients.append(_split(np.zeros(D, np.float32)))
  return process.next(state, clients)


SETTINGS = settings(max_examples=12, deadline=None, derandomize=True)


@pytest.mark.parametrize(
  'name',
  [
    'dp_fedavg',
    'dp_fedavg_fraction',
    'dp_randagg',
    'dp_randagg_payload',
    'fl_top',
  ],
)
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


@pytest.mark.skipif(
  not ddgauss.protobuf_supports_ddgauss(),
  reason='runs in a subprocess (test_ddgauss_sensitivity_in_subprocess)',
)
@SETTINGS
@given(flat=vectors)
def test_ddgauss_integer_vector_within_ledger_sensitivity(flat):
  # DDGauss clips, rotates (DFT, norm-preserving), scales and rounds; the
  # ledger's Delta_2 is TFF's `scaled_inflated_l2`, the bound conditional
  # rounding enforces on the client's integer vector. With zero noise and
  # one client the result is that vector unscaled and unrotated (the
  # padding coordinate dropped can only lower its norm).
  _check_ddgauss_release(_run('ddgauss', flat))


def _check_ddgauss_release(out):
  """One released round of the adversarial client and a zero client: the
  integer vector is within the ledger's Delta_2, which is the clip up to
  rounding slack."""
  meas = out.measurements
  flat_out = np.concatenate([np.ravel(r) for r in out.result])
  assert np.all(np.isfinite(flat_out)), flat_out
  scale = float(meas['scale_factor'])
  assert meas['released'] == 1
  # The mean divides by the 2 expected clients; the zero client adds 0.
  assert _norm(out.result) * 2 * scale <= float(meas['scaled_inflated_l2']) * (
    1 + 1e-4
  )
  # The inflated bound is the clip up to rounding slack.
  assert float(meas['scaled_inflated_l2']) / scale <= CLIP * 1.01


@pytest.mark.parametrize(
  'flat',
  [
    np.eye(D, dtype=np.float32)[3] * 1e6,
    np.linspace(-500, 500, D).astype(np.float32),
    np.random.default_rng(0).normal(size=D).astype(np.float32),
  ],
)
def test_ddgauss_sensitivity_smoke_in_process(flat):
  # The fast smoke of the property test below (which needs a child with
  # pure-Python protobuf for the guarded pipeline): DDGauss without the
  # finite guard, which upb can hold, on three updates far outside the
  # clip. (Unguarded, an update whose squared norm overflows float32, such
  # as one coordinate of 1e20, stops at TFF's own norm assertion; the guard
  # the runner adds is what the property test covers there.)
  contexts.set_simulation_context()
  process = ddgauss.ddgauss_mean(0.0, 2, CLIP, bits=20, min_clients=2).create(
    TYPE
  )
  _check_ddgauss_release(
    process.next(
      process.initialize(), [_split(flat), _split(np.zeros(D, np.float32))]
    )
  )


# pytest-timeout's 600 s default would cut the subprocess's own guard.
# Slow (pure-Python protobuf: 3 minutes whatever the number of examples):
# `make test-slow`; its fast smoke is the test above.
@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_ddgauss_sensitivity_in_subprocess():
  """Runs the DDGauss property test under protobuf's pure-Python backend.

  The guarded DDGauss computation nests deeper than protobuf's default
  (upb) parser allows (see `ddgauss.protobuf_supports_ddgauss`), and the
  backend is fixed when TensorFlow is first imported, so the property
  test runs in a child pytest with the backend set.
  """
  if ddgauss.protobuf_supports_ddgauss():
    pytest.skip('this process runs the property test itself')
  env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION='python')
  test = f'{__file__}::test_ddgauss_integer_vector_within_ledger_sensitivity'
  proc = subprocess.run(
    [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', test],
    env=env,
    capture_output=True,
    text=True,
    # A hang guard, not a speed target: pure-Python protobuf makes this run
    # take 5-10 minutes on 2 busy cores.
    timeout=1200,
  )
  assert proc.returncode == 0 and '1 passed' in proc.stdout, (
    proc.stdout[-3000:] + proc.stderr[-3000:]
  )


def test_non_finite_input_is_counted():
  flat = np.zeros(D, np.float32)
  flat[3] = np.nan
  out = _run('dp_fedavg', flat)
  assert out.measurements['non_finite_clients'] == 1
  assert _norm(out.result) == 0.0


@functools.cache
def _bare_process(name):
  """The factory as a user plugs it in: without the runner's finite guard."""
  contexts.set_simulation_context()
  factories = {
    # Secure sum maps a NaN coordinate to +-clip: the payload must be
    # guarded before it, in the query's clip.
    'dp_fedavg': dp_fedavg.gaussian_fixed(
      0.0,
      1,
      CLIP,
      record_aggregation_factory=tff.aggregators.SecureSumFactory(CLIP, -CLIP),
    ),
    'dp_randagg': dp_randagg.DPRandAggFactory(
      0.0, 1, CLIP, num_coordinates=9, seed=1
    ),
    'dpsfl': dpsfl.dpsfl(
      3, 16, 4, noise_multiplier=0.0, clients_per_round=1, clip=CLIP
    ),
    'cmp_fed': cmp_fed.cmp_fed(
      2, noise_multiplier=0.0, clients_per_round=1, clip_u=CLIP, clip_v=0.3
    ),
  }
  process = factories[name].create(TYPE)
  return process, process.initialize()


@pytest.mark.parametrize('name', ['dp_fedavg', 'dp_randagg', 'cmp_fed'])
@SETTINGS
@given(flat=vectors)
def test_released_payload_guarded_without_the_runner_guard(name, flat):
  process, state = _bare_process(name)
  out = process.next(state, [_split(flat)])
  if name == 'cmp_fed':
    norms = out.measurements['mean_norms']
    assert norms['u_norm'] <= CLIP * (1 + 1e-4)
    assert norms['v_norm'] <= 0.3 * (1 + 1e-4)
  else:
    assert _norm(out.result) <= CLIP * (1 + 1e-4)


@SETTINGS
@given(flat=vectors)
def test_sketch_guarded_without_the_runner_guard(flat):
  process, state = _bare_process('dpsfl')
  out = process.next(state, [_split(flat)])
  assert out.measurements['sketch_norm'] <= np.sqrt(3) * CLIP * (1 + 1e-4)


@pytest.mark.parametrize('layout', ['in_out', 'out_in'])
def test_cmp_fed_u_overflow_aligned_with_v0_at_the_cnn_dense_size(layout):
  # The McMahan CNN's dense kernel (3136 x 512) and bias. An update of norm
  # 1e18 (what the runner's guard lets through) aligned with the broadcast
  # V_0's first column puts one row of U = Delta V_0 at ~1e18 x ||v_1||
  # (about 2e19): its float32 square overflows, tf.clip_by_global_norm
  # returned NaN and secure sum turned each NaN into +-C1, so this one
  # client contributed C1 sqrt(3136 x 2 + 512) ~ 82 C1. It must stay
  # within C1 (and V within C2).
  value_type = tff.StructWithPythonType(
    [
      tff.TensorType(np.float32, [3136, 512]),
      tff.TensorType(np.float32, [512]),
    ],
    list,
  )
  contexts.set_simulation_context()
  factory = finite_guard.FiniteGuardFactory(
    cmp_fed.cmp_fed(
      2,
      noise_multiplier=0.0,
      clients_per_round=1,
      clip_u=0.01,
      clip_v=0.3,
      layout=layout,
    )
  )
  process = factory.create(value_type)
  state = process.initialize()
  v1 = np.asarray(state['v'][0], np.float64)[:, 0]
  # One row of M (M = K for in_out, K^T for out_in) along v_1.
  matrix = np.zeros((3136, 512) if layout == 'in_out' else (512, 3136))
  matrix[0] = 1e18 * v1 / np.linalg.norm(v1)
  kernel = matrix if layout == 'in_out' else matrix.T
  update = [kernel.astype(np.float32), np.zeros(512, np.float32)]
  u_row = matrix[0].astype(np.float32).astype(np.float64) @ np.asarray(
    state['v'][0]
  )
  assert np.sum(u_row**2) > np.finfo(np.float32).max  # It does overflow.
  out = process.next(state, [update])
  assert out.measurements['non_finite_clients'] == 0  # Finite input.
  norms = out.measurements['mean_norms']
  assert 0.01 * (1 - 1e-3) <= norms['u_norm'] <= 0.01 * (1 + 1e-4)
  assert norms['v_norm'] <= 0.3 * (1 + 1e-4)
  result = np.concatenate([np.ravel(r) for r in out.result])
  assert np.all(np.isfinite(result))


@SETTINGS
@given(flat=vectors)
def test_clipped_fraction_count_moves_by_at_most_half(flat):
  # The count's ledger event is GaussianDpEvent(stddev / 0.5): one client's
  # indicator record must be -0.5 or +0.5 whatever it sends, and its sum
  # record within the clip.
  query = dp_queries.ClippedFractionSumQuery(CLIP, 0.0, 0.0, 1.0, seed=0)
  params = query.derive_sample_params(query.initial_global_state())
  record = query.preprocess_record(params, _split(flat))
  assert float(record.count_state) in (-0.5, 0.5)
  clipped = [np.asarray(r) for r in record.sum_state]
  assert all(np.all(np.isfinite(r)) for r in clipped)
  assert _norm(clipped) <= CLIP * (1 + 1e-6)
  big = np.isfinite(flat).all() and np.linalg.norm(flat.astype(np.float64))
  if big and big > CLIP * 1.01:
    assert float(record.count_state) == 0.5
