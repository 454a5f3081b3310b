"""The noise seed is secret by default, and public randomness is separate.

Whoever knows the noise seed can regenerate the noise and subtract it from
the release (the review reproduced the exact clipped sum to 4e-7 from
`--seed` alone). These tests check that every noised aggregator draws a
fresh 128-bit secret unless given a seed, that an int seed reproduces,
that the public randomness (coordinates, V_0, hashes) comes from its own
`seed` whatever the noise seed is, and that the guarded clip holds.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl


@pytest.fixture(autouse=True, scope='module')
def _secure_sum_context():
  contexts.set_simulation_context()  # Simulates secure sum.


VEC = tff.TensorType(np.float32, [64])
MAT = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [8, 6]), tff.TensorType(np.float32, [6])], list
)


def _first_release(factory, value_type, value):
  process = factory.create(value_type)
  state = process.initialize()
  return process.next(state, [value]), state


def test_default_noise_seed_is_fresh_and_not_the_public_seed():
  zeros = np.zeros(64, np.float32)
  a, _ = _first_release(dp_fedavg.gaussian_fixed(1.0, 1, 1.0), VEC, zeros)
  b, _ = _first_release(dp_fedavg.gaussian_fixed(1.0, 1, 1.0), VEC, zeros)
  # The noise the old code drew for --seed=0, regenerable by anyone.
  public, _ = _first_release(
    dp_fedavg.gaussian_fixed(1.0, 1, 1.0, noise_seed=0), VEC, zeros
  )
  assert np.std(a.result) > 0.5  # Noise was added ...
  assert not np.allclose(a.result, b.result)  # ... fresh per factory,
  assert not np.allclose(a.result, public.result)  # not the --seed one.


def test_int_noise_seed_reproduces_and_adaptive_streams_differ():
  zeros = np.zeros(64, np.float32)
  runs = [
    _first_release(
      dp_fedavg.gaussian_adaptive(1.0, 100, noise_seed=5), VEC, zeros
    )[0].result
    for _ in range(2)
  ]
  np.testing.assert_array_equal(runs[0], runs[1])
  secret = _first_release(dp_fedavg.gaussian_adaptive(1.0, 100), VEC, zeros)
  assert not np.allclose(secret[0].result, runs[0])


@pytest.mark.parametrize(
  'seed, match',
  [
    ('x', 'an int or a pair of ints'),
    ((1, 2, 3), 'an int or a pair of ints'),
    (2**64, 'in int64'),
    (True, 'an int or a pair of ints'),
  ],
)
def test_bad_seed_is_rejected(seed, match):
  with pytest.raises(ValueError, match=match):
    dp_queries.resolve_seed(seed)


def test_secret_seeds_are_distinct_128_bit_pairs():
  seeds = {dp_queries.secret_seed() for _ in range(1000)}
  assert len(seeds) == 1000
  assert all(-(2**63) <= s < 2**63 for pair in seeds for s in pair)


def test_randagg_coordinates_public_noise_secret():
  zeros = np.zeros(64, np.float32)

  def release():
    factory = dp_randagg.DPRandAggFactory(
      1.0, 1, 1.0, num_coordinates=8, seed=3
    )
    return _first_release(factory, VEC, zeros)[0].result

  a, b = release(), release()
  # The same 8 public coordinates carry noise, and the noise differs.
  np.testing.assert_array_equal(np.flatnonzero(a), np.flatnonzero(b))
  assert np.count_nonzero(a) == 8
  assert not np.allclose(a, b)


def test_cmp_fed_v0_public_noise_secret():
  value = [np.zeros((8, 6), np.float32), np.zeros(6, np.float32)]

  def release():
    factory = cmp_fed.cmp_fed(
      2, noise_multiplier=1.0, clients_per_round=1, clip_u=1.0, clip_v=1.0
    )
    return _first_release(factory, MAT, value)

  (a, state_a), (b, state_b) = release(), release()
  for va, vb in zip(state_a['v'], state_b['v']):
    np.testing.assert_array_equal(va, vb)  # V_0 from the public seed.
  assert not np.allclose(a.result[0], b.result[0])
  # An int noise seed reproduces the phases' noise.
  seeded = [
    _first_release(
      cmp_fed.cmp_fed(
        2,
        noise_multiplier=1.0,
        clients_per_round=1,
        clip_u=1.0,
        clip_v=1.0,
        noise_seed=4,
      ),
      MAT,
      value,
    )[0].result[0]
    for _ in range(2)
  ]
  np.testing.assert_array_equal(seeded[0], seeded[1])


def test_sketch_noise_seed_secret_hashes_public():
  def state(**kw):
    factory = dpsfl.dpsfl(
      3, 16, 4, noise_multiplier=1.0, clients_per_round=1, clip=1.0, **kw
    )
    return factory.create(VEC).initialize()

  a, b = state(seed=2), state(seed=2)
  assert not np.array_equal(a['server']['seed'], b['server']['seed'])
  np.testing.assert_array_equal(state(noise_seed=9)['server']['seed'], [9, 7])


@pytest.mark.parametrize(
  'record',
  [
    np.full(64, 1e20, np.float32),  # Finite, float32 norm overflows.
    np.where(np.arange(64) == 3, np.nan, 1.0).astype(np.float32),
    np.where(np.arange(64) == 3, np.inf, 1.0).astype(np.float32),
    np.linspace(-2.0, 2.0, 64).astype(np.float32),
  ],
)
def test_guarded_clip_never_exceeds_the_clip(record):
  query = dp_queries.SeededGaussianSumQuery(0.7, 0.0, seed=0)
  clipped = query.preprocess_record(tf.constant(0.7), tf.constant(record))
  clipped = np.asarray(clipped, np.float64)
  assert np.all(np.isfinite(clipped))
  assert np.linalg.norm(clipped) <= 0.7 * (1 + 1e-6)
  if np.all(np.isfinite(record)):
    # Direction kept: the clipped record is a non-negative multiple.
    cos = (
      clipped
      @ record.astype(np.float64)
      / (np.linalg.norm(clipped) * np.linalg.norm(record.astype(np.float64)))
    )
    assert cos == pytest.approx(1.0, abs=1e-6)
  else:
    assert np.all(clipped == 0.0)


def test_guarded_clip_fast_path_is_tensorflow_privacys():
  record = [tf.constant(np.linspace(-3, 3, 10), tf.float32)]
  ours, norm = dp_queries.SeededGaussianSumQuery(
    1.0, 0.0, seed=0
  ).preprocess_record_impl(tf.constant(1.0), record)
  want, want_norm = tf.clip_by_global_norm(record, 1.0)
  np.testing.assert_array_equal(ours[0], want[0])
  assert float(norm) == float(want_norm)
