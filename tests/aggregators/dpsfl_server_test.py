"""DPSFL's server: the sketch's and the bit's noise, iid or correlated."""

import numpy as np
import pytest
import tensorflow as tf

import dpsfl_testing
from dpsfl_testing import TYPE

from tff_dp.runtime import contexts
from tff_dp import privacy
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import dpsfl_adaptive_clip
from tff_dp.aggregators import mf_strategy


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


def test_dpsfl_noise_stddev_per_counter():
  rows, cols, z, clip, n = 3, 2000, 1.5, 0.4, 10
  process = dpsfl.dpsfl(
    rows,
    cols,
    1,
    noise_multiplier=z,
    clients_per_round=n,
    clip=clip,
    noise_seed=3,
  ).create(TYPE)
  state = process.initialize()
  norms = []
  for _ in range(3):
    out = process.next(
      state, [dpsfl_testing.value({}), dpsfl_testing.value({})]
    )
    state = out.state
    norms.append(out.measurements['sketch_norm'])
  # The mean sketch is N(0, (z sqrt(rows) clip / n)^2) per counter.
  per_counter = np.array(norms) / np.sqrt(rows * cols)
  np.testing.assert_allclose(
    per_counter, z * np.sqrt(rows) * clip / n, rtol=0.05
  )
  # An int noise seed: a fresh process draws the same noise; the default
  # (a secret seed) draws other noise.
  for noise_seed, same in ((3, True), (None, False)):
    again = dpsfl.dpsfl(
      rows,
      cols,
      1,
      noise_multiplier=z,
      clients_per_round=n,
      clip=clip,
      noise_seed=noise_seed,
    ).create(TYPE)
    first = again.next(
      again.initialize(), [dpsfl_testing.value({}), dpsfl_testing.value({})]
    )
    assert (first.measurements['sketch_norm'] == norms[0]) == same


def test_dpsfl_ac_bit_noise_is_sigma_b_normal_over_expected_clients():
  # Zero updates: every bit is 1 (no clipping impact), so p_hat - 1 is the
  # bit sum's noise over the expected clients. The noise is a stateless
  # draw from the round's seed (the second of three split from the
  # state's), so its exact value is known: sigma_b x N(0, 1) / n. An exact
  # check catches a wrong sigma_b, n or seed stream where a sample std over
  # a few dozen rounds could not.
  sigma_b, n = 3.0, 5
  process = dpsfl.dpsfl_ac(
    3,
    20,
    2,
    noise_multiplier=0.0,
    clients_per_round=n,
    initial_clip=1.0,
    adaptive=dpsfl_adaptive_clip.AdaptiveClip(
      bit_noise_multiplier=sigma_b, learning_rate=1e-9
    ),
  ).create(TYPE)
  state = process.initialize()
  draws, expected = [], []
  for _ in range(8):
    seeds = tf.random.experimental.stateless_split(
      state['server']['seed'], num=3
    )
    expected.append(
      float(tf.random.stateless_normal([], seed=seeds[1])) * sigma_b / n
    )
    out = process.next(state, [dpsfl_testing.value({})] * n)
    state = out.state
    draws.append(out.measurements['unclipped_probability'] - 1.0)
  # The bits' secure sum is exact for 0/1 (quantisation at 2^-20 scale).
  np.testing.assert_allclose(draws, expected, rtol=0, atol=1e-5)
  assert len(set(np.round(draws, 6))) == len(draws)  # A fresh draw a round.


def _ac_run(noise, rounds=6, z=1.5, sigma_b=3.0, n=5, rows=3, cols=20):
  """DPSFL-AC on zero updates: each round's (unit draws of the sketch and
  the bit, measurements), the draws read from the state's seed as
  `_unit_noise` draws them."""
  process = dpsfl.dpsfl_ac(
    rows,
    cols,
    2,
    noise_multiplier=z,
    clients_per_round=n,
    initial_clip=1.0,
    adaptive=dpsfl_adaptive_clip.AdaptiveClip(
      bit_noise_multiplier=sigma_b, learning_rate=1e-9
    ),
    noise_seed=4,
    noise=noise,
  ).create(TYPE)
  state = process.initialize()
  out_rounds = []
  for _ in range(rounds):
    seeds = tf.random.experimental.stateless_split(
      state['server']['seed'], num=3
    )
    table = np.asarray(
      tf.random.stateless_normal([rows, cols], seed=seeds[0]), np.float64
    )
    bit = float(tf.random.stateless_normal([], seed=seeds[1]))
    out = process.next(state, [dpsfl_testing.value({})] * n)
    state = out.state
    out_rounds.append((table, bit, out.measurements))
  return out_rounds, state


def test_correlated_noise_of_one_unit_band_releases_iid_bits():
  iid, _ = _ac_run(None)
  one_band, state = _ac_run(mf_strategy.identity())
  for (_, _, a), (_, _, b) in zip(iid, one_band):
    assert a['sketch_norm'] == b['sketch_norm']
    assert a['unclipped_probability'] == b['unclipped_probability']
  assert state['server']['noise_memory']['table'] == ()


@pytest.mark.parametrize(
  'strategy',
  [mf_strategy.banded([1.0, 0.5, 0.25]), mf_strategy.blt([0.9], [0.4])],
  ids=['banded3', 'blt'],
)
def test_correlated_sketch_and_bit_noise_are_c_inverse_of_the_unit_draws(
  strategy,
):
  # Zero updates: the mean sketch is z sqrt(rows) C_t y_t / n and p_hat - 1
  # is sigma_b v_t / n, with y = C^-1 (the sketch's unit draws) and v = C^-1
  # (the bit's), each its own stream; the state keeps y_t and v_t.
  z, sigma_b, n, rows = 1.5, 3.0, 5, 3
  runs, state = _ac_run(strategy, z=z, sigma_b=sigma_b, n=n, rows=rows)
  y = strategy.noise(np.stack([t for t, _, _ in runs]))
  v = strategy.noise(np.array([b for _, b, _ in runs]))
  for t, (_, _, m) in enumerate(runs):
    scale = z * np.sqrt(rows) * float(m['clip']) / n
    assert float(m['sketch_norm']) == pytest.approx(
      scale * np.linalg.norm(y[t]), rel=1e-5
    )
    # The bits' secure sum is exact for 0/1 (quantisation at 2^-20 scale).
    assert float(m['unclipped_probability']) - 1.0 == pytest.approx(
      sigma_b * v[t] / n, abs=1e-5
    )
  if strategy.kind == mf_strategy.BANDED:
    np.testing.assert_allclose(
      state['server']['noise_memory']['table'][-1], y[-1], rtol=1e-5
    )
  event = dpsfl.round_event(
    z, dpsfl_adaptive_clip.AdaptiveClip(bit_noise_multiplier=sigma_b), strategy
  )
  merged = privacy.merge_gaussians(event)
  assert merged == correlated_noise.MatrixFactorizationDpEvent(
    pytest.approx((z**-2 + sigma_b**-2) ** -0.5),
    correlated_noise.strategy_json(strategy),
  )
