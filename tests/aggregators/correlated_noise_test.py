"""The correlated-noise sum query: DP-FedAvg's draws, correlated by C^-1."""

import numpy as np
import pytest
import tensorflow as tf

from tff_dp.aggregators import correlated_noise as cn
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import mf_strategy as mf

SPECS = [tf.TensorSpec([3], tf.float32), tf.TensorSpec([2, 2], tf.float32)]
CLIP, STDDEV, SEED = 1.0, 0.7, 11


def _record(scale):
  return [
    tf.constant([3.0, 0.0, 4.0]) * scale,
    tf.constant([[0.0, 0.0], [0.0, 0.0]]),
  ]


def _rounds(query, records_per_round, rounds):
  """The query's releases over `rounds` rounds (each a list of NumPy)."""
  state = query.initial_global_state()
  out, events = [], []
  for _ in range(rounds):
    params = query.derive_sample_params(state)
    sample = query.initial_sample_state(_record(0.0))
    for r in records_per_round:
      sample = query.accumulate_record(params, sample, r)
    result, state, event = query.get_noised_result(sample, state)
    out.append([np.asarray(v) for v in result])
    events.append(event)
  return out, events


def _draws(rounds):
  """DP-FedAvg's query's noise for the same seed: the w stream."""
  query = dp_queries.SeededGaussianSumQuery(CLIP, STDDEV, SEED)
  noise, _ = _rounds(query, [], rounds)
  return noise


def test_one_band_releases_dp_fedavgs_bits_for_the_same_seed():
  records = [_record(1.0), _record(0.1)]
  base = dp_queries.SeededGaussianSumQuery(CLIP, STDDEV, SEED)
  ours = cn.CorrelatedGaussianSumQuery(CLIP, STDDEV, mf.identity(), SPECS, SEED)
  want, _ = _rounds(base, records, 4)
  got, events = _rounds(ours, records, 4)
  for a, b in zip(got, want):
    for x, y in zip(a, b):
      assert np.array_equal(x, y)
  assert float(events[0].noise_multiplier) == pytest.approx(STDDEV / CLIP)
  assert events[0].strategy == cn.strategy_json(mf.identity())


@pytest.mark.parametrize(
  'strategy',
  [
    mf.banded([1.0, 0.6, 0.3]),
    mf.banded([2.0, -0.5]),
    mf.blt([0.9, 0.5], [0.3, 0.2]),
  ],
  ids=['banded3', 'banded_scaled', 'blt'],
)
def test_noise_is_the_strategys_inverse_applied_to_the_draws(strategy):
  rounds = 7
  query = cn.CorrelatedGaussianSumQuery(CLIP, STDDEV, strategy, SPECS, SEED)
  noise, events = _rounds(query, [], rounds)
  w = _draws(rounds)
  for part in range(len(SPECS)):
    draws = np.stack([w[t][part] for t in range(rounds)]).astype(np.float64)
    want = strategy.noise(draws)
    got = np.stack([noise[t][part] for t in range(rounds)])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  assert cn.strategy_from_json(events[-1].strategy) == strategy


def test_records_are_clipped_before_the_noise():
  strategy = mf.banded([1.0, 0.5])
  query = cn.CorrelatedGaussianSumQuery(CLIP, 0.0, strategy, SPECS, SEED)
  got, _ = _rounds(query, [_record(10.0)], 2)
  # |(30, 0, 40)| = 50 -> clipped to (0.6, 0, 0.8); zero noise.
  np.testing.assert_allclose(got[0][0], [0.6, 0.0, 0.8], rtol=1e-6)
  np.testing.assert_allclose(got[1][0], [0.6, 0.0, 0.8], rtol=1e-6)


def test_a_non_float32_record_is_refused():
  with pytest.raises(ValueError, match='float32 records'):
    cn.CorrelatedGaussianSumQuery(
      CLIP, STDDEV, mf.identity(), [tf.TensorSpec([2], tf.float64)], SEED
    )


def test_tffs_dp_factory_carries_the_query_and_its_event():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from tff_dp.aggregators import dp_events  # pylint: disable=g-import-not-at-top

  strategy = mf.banded([1.0, 0.5])
  specs = [tf.TensorSpec([3], tf.float32)]
  query = cn.CorrelatedGaussianSumQuery(CLIP, 0.0, strategy, specs, SEED)
  process = tff.aggregators.DifferentiallyPrivateFactory(query).create(
    tff.to_type([(np.float32, [3])])
  )
  state = process.initialize()
  out = process.next(state, [[np.full(3, 0.1, np.float32)]] * 2)
  # Zero noise: the clipped sum itself.
  np.testing.assert_allclose(out.result[0], [0.2, 0.2, 0.2], rtol=1e-6)
  event = dp_events.round_event(out.state)
  assert event == cn.MatrixFactorizationDpEvent(0.0, cn.strategy_json(strategy))


def _release(query, records):
  """One round's release of `records` from the initial state."""
  state = query.initial_global_state()
  params = query.derive_sample_params(state)
  sample = query.initial_sample_state(
    tf.nest.map_structure(tf.zeros_like, records[0])
  )
  for r in records:
    sample = query.accumulate_record(params, sample, r)
  result, _, _ = query.get_noised_result(sample, state)
  return tf.nest.map_structure(np.asarray, result)


@pytest.mark.parametrize('bad', [1e6, float('nan'), float('inf')])
def test_one_adversarial_client_moves_the_release_by_at_most_the_clip(bad):
  # The McMahan CNN's size; the sensitivity the ledger assumes is the clip.
  d = 1_663_370
  specs = [tf.TensorSpec([d], tf.float32)]
  strategy = mf.banded([1.0, 0.5, 0.25])
  query = cn.CorrelatedGaussianSumQuery(0.5, 0.0, strategy, specs, SEED)
  rng = np.random.default_rng(4)
  honest = [[tf.constant(rng.normal(size=d) * 1e-3, tf.float32)]]
  attacker = np.full(d, bad, np.float32)
  attacker[::2] = -1e6  # Large entries of both signs.
  without = _release(query, honest)[0]
  with_it = _release(query, honest + [[tf.constant(attacker)]])[0]
  moved = np.linalg.norm(with_it.astype(np.float64) - without)
  assert np.all(np.isfinite(with_it))
  assert moved <= 0.5 * (1 + 1e-5)


def test_the_first_rounds_noise_has_the_stated_stddev():
  # y_0 = w_0 / c_0: with a unit c_0, stddev per coordinate as stated.
  d = 200_000
  specs = [tf.TensorSpec([d], tf.float32)]
  query = cn.CorrelatedGaussianSumQuery(
    CLIP, STDDEV, mf.banded([1.0, 0.5]), specs, SEED
  )
  noise = _release(query, [[tf.zeros([d])]])[0].astype(np.float64)
  # Sample stddev's standard error: stddev / sqrt(2 d).
  assert abs(noise.std() - STDDEV) <= 4 * STDDEV / np.sqrt(2 * d)
  assert abs(noise.mean()) <= 4 * STDDEV / np.sqrt(d)


@pytest.mark.parametrize(
  'strategy',
  [mf.banded([0.8, 0.5, 0.33]), mf.blt([0.9, 0.5], [0.4, 0.2])],
  ids=['banded', 'blt'],
)
def test_noise_covariance_over_rounds_is_sigma2_cinv_cinv_t(strategy):
  # 40,000 coordinates are 40,000 independent draws of the 5-round noise
  # vector; its empirical covariance must be STDDEV^2 C^-1 C^-T entry by
  # entry, within 4 standard errors.
  rounds, n = 5, 40_000
  query = cn.CorrelatedGaussianSumQuery(
    CLIP, STDDEV, strategy, [tf.TensorSpec([n], tf.float32)], SEED
  )
  state = query.initial_global_state()
  noise = []
  for _ in range(rounds):
    sample = query.initial_sample_state([tf.zeros([n])])
    result, state, _ = query.get_noised_result(sample, state)
    noise.append(np.asarray(result[0], np.float64))
  y = np.stack(noise)  # (rounds, n)
  cinv = np.linalg.inv(strategy.matrix(rounds))
  want = STDDEV**2 * cinv @ cinv.T
  got = y @ y.T / n
  se = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want**2) / n)
  assert np.all(np.abs(got - want) <= 4 * se), np.max(np.abs(got - want) / se)
  # And it is correlated: a test of independence would see it.
  assert np.max(np.abs(want - np.diag(np.diag(want)))) > 10 * np.max(se)


def _projected(strategy, dim, k, stddev=STDDEV):
  from tff_dp.aggregators import dp_randagg  # pylint: disable=g-import-not-at-top

  return cn.ProjectedCorrelatedGaussianSumQuery(
    CLIP,
    stddev,
    strategy,
    dim=dim,
    coordinate_seed=dp_randagg.initial_coordinate_seed(3),
    draw_coordinates=lambda s: dp_randagg.draw_random_coordinates(s, dim, k),
    seed=SEED,
  )


@pytest.mark.parametrize(
  'strategy',
  [mf.banded([1.0, 0.6, 0.3]), mf.blt([0.9, 0.5], [0.3, 0.2])],
  ids=['banded3', 'blt'],
)
def test_projected_noise_is_the_full_space_stream_at_each_rounds_coordinates(
  strategy,
):
  # DP-RandAgg's random k of d: round t releases y_t[I_t], y = C^-1 w over
  # all d coordinates (w DP-FedAvg's d-dim draws for the same seed), I_t the
  # aggregator's coordinate chain from the same public seed.
  from tff_dp.aggregators import dp_randagg  # pylint: disable=g-import-not-at-top

  dim, k, rounds = 12, 4, 6
  query = _projected(strategy, dim, k)
  state = query.initial_global_state()
  base = dp_queries.SeededGaussianSumQuery(CLIP, STDDEV, SEED)
  base_state = base.initial_global_state()
  coordinate_seed = tf.constant(dp_randagg.initial_coordinate_seed(3))
  record = tf.constant([3.0, 0.0, 4.0, 0.0])  # Clipped to (0.6, 0, 0.8, 0).
  draws, releases, indices = [], [], []
  for _ in range(rounds):
    w, base_state, _ = base.get_noised_result(tf.zeros([dim]), base_state)
    draws.append(np.asarray(w, np.float64))
    params = query.derive_sample_params(state)
    sample = query.accumulate_record(
      params, query.initial_sample_state(record), record
    )
    result, state, event = query.get_noised_result(sample, state)
    releases.append(np.asarray(result, np.float64))
    idx, coordinate_seed = dp_randagg.draw_random_coordinates(
      coordinate_seed, dim, k
    )
    indices.append(np.asarray(idx))
  y = strategy.noise(np.stack(draws))  # (rounds, dim)
  signal = np.array([0.6, 0.0, 0.8, 0.0])
  assert len({tuple(i) for i in indices}) > 1  # The coordinates moved.
  for t in range(rounds):
    np.testing.assert_allclose(
      releases[t], signal + y[t, indices[t]], rtol=2e-5, atol=2e-6
    )
  assert float(event.noise_multiplier) == pytest.approx(STDDEV / CLIP)
  assert event.strategy == cn.strategy_json(strategy)


def test_projected_query_moves_the_release_by_at_most_the_clip():
  # The CNN's d and DP-RandAgg's rank-16 k (0.047459 d).
  d, k = 1_663_370, 78_941
  query = _projected(mf.banded([1.0, 0.5]), d, k, stddev=0.0)
  honest = [tf.constant(np.linspace(-1e-3, 1e-3, k), tf.float32)]
  attacker = np.full(k, 1e6, np.float32)
  attacker[::2] = -1e6
  attacker = tf.constant(attacker)
  without = _release(query, honest)
  with_it = _release(query, honest + [attacker])
  assert np.linalg.norm(with_it - without) <= CLIP * (1 + 1e-5)
