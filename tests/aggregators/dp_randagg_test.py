from unittest import mock

import dp_accounting
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp import privacy
from tff_dp.job import training
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import mf_strategy

STRUCT = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [2, 2]), tff.TensorType(np.float32, [2])], list
)
VALUE = [np.array([[1, 2], [3, 4]], np.float32), np.array([5, 6], np.float32)]


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


def _selected(result):
  flat = np.concatenate([np.ravel(r) for r in result])
  return np.flatnonzero(flat), flat


def test_zero_noise_exact_values_by_hand():
  # k = 3 of d = 6 coordinates; two clients send the same value
  # [1, 2, 3, 4, 5, 6] (norm 9.5 < clip 100, so unclipped). The sum of the
  # selected coordinates over the expected 2 clients is the value itself
  # there, and 0 elsewhere.
  factory = dp_randagg.DPRandAggFactory(
    0.0, 2, 100.0, num_coordinates=3, seed=1
  )
  process = factory.create(STRUCT)
  out = process.next(process.initialize(), [VALUE, VALUE])
  idx, flat = _selected(out.result)
  assert len(idx) == 3
  np.testing.assert_array_equal(flat[idx], np.arange(1, 7)[idx])
  assert out.measurements['num_coordinates'] == 3
  # rescale=True multiplies kept coordinates by d/k = 2.
  factory = dp_randagg.DPRandAggFactory(
    0.0, 2, 100.0, num_coordinates=3, seed=1, rescale=True
  )
  process = factory.create(STRUCT)
  out2 = process.next(process.initialize(), [VALUE, VALUE])
  np.testing.assert_array_equal(_selected(out2.result)[1], 2 * flat)


def test_payload_scope_clips_the_k_vector():
  # Selected values of [1..6] at indices idx, clipped to norm 1 on the
  # k-vector: the result's nonzero part has norm 1 (one client, n = 1).
  factory = dp_randagg.DPRandAggFactory(
    0.0, 1, 1.0, num_coordinates=3, seed=1, clip_scope='payload'
  )
  process = factory.create(STRUCT)
  out = process.next(process.initialize(), [VALUE])
  idx, flat = _selected(out.result)
  kept = np.arange(1, 7, dtype=np.float64)[idx]
  np.testing.assert_allclose(flat[idx], kept / np.linalg.norm(kept), rtol=1e-5)


def test_update_scope_clips_the_whole_update_before_sparsifying():
  # Seed 001's baseline (the default): [1..6] has norm sqrt(91), so with
  # clip 1 each kept coordinate is scaled by 1 / sqrt(91), not by 1 over the
  # k-vector's norm; the k-vector's norm is then below the clip.
  factory = dp_randagg.DPRandAggFactory(0.0, 1, 1.0, num_coordinates=3, seed=1)
  process = factory.create(STRUCT)
  out = process.next(process.initialize(), [VALUE])
  idx, flat = _selected(out.result)
  kept = np.arange(1, 7, dtype=np.float64)[idx]
  np.testing.assert_allclose(flat[idx], kept / np.sqrt(91.0), rtol=1e-5)
  assert np.linalg.norm(flat) < 1.0
  # An update inside the clip is sent as it is under either scope.
  factory = dp_randagg.DPRandAggFactory(0.0, 1, 10.0, num_coordinates=3, seed=1)
  process = factory.create(STRUCT)
  out = process.next(process.initialize(), [VALUE])
  np.testing.assert_allclose(_selected(out.result)[1][idx], kept, rtol=1e-6)


def test_non_private_mean_does_not_clip():
  # noise_multiplier=None, clip=None (seed 004's non-private FL-TOP): the
  # fixed K values of two clients are averaged over the 2 participants,
  # unclipped, although the expected cohort is 5. Values [1..6] and
  # [3..8] at indices 1, 3, 5: means 3, 5, 7 (the old clip at 1 with the
  # expected cohort's 5 gave norms of at most 2/5).
  factory = dp_randagg.DPRandAggFactory(
    None, 5, None, num_coordinates=3, fixed_indices=[1, 3, 5]
  )
  process = factory.create(STRUCT)
  other = [VALUE[0] + 2, VALUE[1] + 2]
  out = process.next(process.initialize(), [VALUE, other])
  _, flat = _selected(out.result)
  np.testing.assert_array_equal(flat, [0, 3, 0, 5, 0, 7])
  assert training.find_dp_events(out.state) == []


def test_coordinates_shared_fresh_each_round_and_seeded():
  factory = dp_randagg.DPRandAggFactory(0.0, 1, 100.0, fraction=0.5, seed=3)
  process = factory.create(STRUCT)
  state = process.initialize()
  picks = []
  for _ in range(6):
    out = process.next(state, [VALUE])
    state = out.state
    picks.append(tuple(_selected(out.result)[0]))
  assert len(set(picks)) > 1  # Redrawn every round.
  again = factory.create(STRUCT)
  out = again.next(again.initialize(), [VALUE])
  assert tuple(_selected(out.result)[0]) == picks[0]


@pytest.mark.parametrize('fixed', [False, True])
def test_noise_only_on_selected_coordinates(fixed):
  # DP-RandAgg's random K (FL-BASIC-DP) and FL-TOP-DP's fixed indices: zero
  # updates from 2 of an expected 4 clients, so the mean is the noise over
  # the expected cohort, N(0, (z clip / 4)^2) on the K coordinates and 0
  # elsewhere. 5 rounds x 4,000 = 20,000 draws: the sample std's standard
  # error is 0.5%, and 2% is 4 of them.
  z, clip, n, dim, k = 2.0, 0.5, 4, 10_000, 4_000
  indices = np.sort(np.random.default_rng(5).choice(dim, k, replace=False))
  factory = dp_randagg.DPRandAggFactory(
    z,
    n,
    clip,
    num_coordinates=k,
    fixed_indices=indices if fixed else None,
    seed=0,
    noise_seed=0,
    secure_sum=False,
  )
  process = factory.create(tff.TensorType(np.float32, [dim]))
  state = process.initialize()
  draws, supports = [], []
  for _ in range(5):
    out = process.next(state, [np.zeros(dim, np.float32)] * 2)
    state = out.state
    support = np.flatnonzero(out.result)
    assert len(support) == k
    supports.append(support)
    draws.append(out.result[support])
  if fixed:
    for support in supports:
      np.testing.assert_array_equal(support, indices)
  else:  # A fresh K each round.
    assert len({tuple(s) for s in supports}) == 5
  noise = np.concatenate(draws)
  assert noise.std() == pytest.approx(z * clip / n, rel=0.02)
  assert abs(noise.mean()) < 4 * (z * clip / n) / np.sqrt(noise.size)
  event = training.find_dp_events(state)[0]
  assert event == dp_accounting.GaussianDpEvent(pytest.approx(z))


@pytest.mark.parametrize('fixed', [False, True])
def test_correlated_noise_streams_in_the_space_its_coordinates_live_in(fixed):
  # Zero updates from 2 of an expected 4 clients: the release at I_t is the
  # correlated noise over 4. Random coordinates (DP-RandAgg, FL-BASIC-DP):
  # C^-1 over d-dim draws, read at the round's I_t (so coordinate j's noise
  # cancels across the rounds that release it); fixed ones (FL-TOP-DP):
  # C^-1 over the k-dim draws. The draws are DP-FedAvg's query's for the
  # same seed.
  z, clip, n, dim, k, rounds = 2.0, 0.5, 4, 40, 8, 5
  strategy = mf_strategy.banded([1.0, 0.5, 0.25])
  indices = np.arange(0, dim, dim // k)
  factory = dp_randagg.DPRandAggFactory(
    z,
    n,
    clip,
    num_coordinates=k,
    fixed_indices=indices if fixed else None,
    seed=2,
    noise_seed=0,
    secure_sum=False,
    noise=strategy,
  )
  process = factory.create(tff.TensorType(np.float32, [dim]))
  state = process.initialize()
  base = dp_queries.SeededGaussianSumQuery(clip, z * clip, 0)
  base_state = base.initial_global_state()
  space = k if fixed else dim
  draws, releases, supports = [], [], []
  for _ in range(rounds):
    w, base_state, _ = base.get_noised_result(
      np.zeros(space, np.float32), base_state
    )
    draws.append(np.asarray(w, np.float64))
    out = process.next(state, [np.zeros(dim, np.float32)] * 2)
    state = out.state
    supports.append(np.flatnonzero(out.result))
    releases.append(out.result[supports[-1]])
  y = strategy.noise(np.stack(draws)) / n
  for t in range(rounds):
    want = y[t] if fixed else y[t, supports[t]]
    np.testing.assert_allclose(releases[t], want, rtol=2e-5, atol=2e-6)
  if not fixed:
    assert len({tuple(s) for s in supports}) == rounds
  event = training.find_dp_events(state)[0]
  assert event == correlated_noise.MatrixFactorizationDpEvent(
    z, correlated_noise.strategy_json(strategy)
  )


@pytest.mark.parametrize('fixed', [False, True])
def test_correlated_noise_over_random_coordinates_warns(fixed):
  # A coordinate is released in about k/d of the rounds, so the noise
  # built to cancel it is mostly never released on it: the factory says so
  # where it happens (random coordinates), and not for fixed ones.
  factory = dp_randagg.DPRandAggFactory(
    1.0,
    10,
    1.0,
    num_coordinates=4,
    fixed_indices=np.arange(4) if fixed else None,
    noise=mf_strategy.banded([1.0, 0.5]),
  )
  with mock.patch.object(dp_randagg.logging, 'warning') as warning:
    factory.create(tff.TensorType(np.float32, [40]))
  if fixed:
    warning.assert_not_called()
  else:
    warning.assert_called_once()
    assert 'k/d = %d/%d' in warning.call_args.args[0]
    assert warning.call_args.args[1:] == (0.1, 4, 40)


def test_correlated_noise_needs_a_private_factory_and_a_strategy():
  with pytest.raises(ValueError, match='needs a private DPRandAggFactory'):
    dp_randagg.DPRandAggFactory(
      None, 10, None, num_coordinates=2, noise=mf_strategy.banded([1.0])
    )
  with pytest.raises(ValueError, match=r'noise must be None or an mf_strat'):
    dp_randagg.DPRandAggFactory(1.0, 10, 1.0, num_coordinates=2, noise='blt')


def test_payload_and_bytes():
  factory = dp_randagg.DPRandAggFactory(1.0, 10, 1.0, fraction=0.01)
  assert factory.num_coordinates(1_663_370) == 16_634
  assert dp_randagg.upload_bytes(16_634) == 4 * 16_634
  # CMP-Fed rank 1 on a 100 x 10 matrix: r(m + n) / (m n) = 110 / 1000.
  assert dp_randagg.fraction_for_rank(1, [(100, 10)]) == pytest.approx(0.11)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(num_coordinates=0), r'num_coordinates must be an integer >= 1'),
    (dict(fraction=0.0), r'fraction must be in \(0, 1\]'),
    (dict(fraction=1.5), r'fraction must be in \(0, 1\]'),
    (dict(num_coordinates=2, fraction=0.5), 'exactly one of'),
    (
      dict(num_coordinates=2, clip_scope='k'),
      r"clip_scope must be one of \('update', 'payload'\). Found 'k'",
    ),
    (
      dict(num_coordinates=2, noise_multiplier=-1.0),
      'noise_multiplier must be a finite number >= 0',
    ),
    (dict(num_coordinates=2, clip=0.0), 'clip must be a finite number > 0'),
    (
      dict(num_coordinates=2, noise_multiplier=None),
      r'must both be None .* Found noise_multiplier=None, clip=1.0',
    ),
    (
      dict(num_coordinates=2, clip=None),
      r'must both be None .* Found noise_multiplier=1.0, clip=None',
    ),
  ],
)
def test_bad_args(kwargs, match):
  args = dict(noise_multiplier=1.0, clients_per_round=10, clip=1.0)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    dp_randagg.DPRandAggFactory(**args)


def test_k_larger_than_dimension():
  factory = dp_randagg.DPRandAggFactory(1.0, 10, 1.0, num_coordinates=7)
  with pytest.raises(ValueError, match=r'num_coordinates must be in \[1, 6\]'):
    factory.create(STRUCT)


@pytest.mark.usefixtures('shared_data_dir')
def test_runner_method_accounts_and_counts_bytes(tmp_path):
  summary = training.run_experiment(
    training.ExperimentConfig.create(
      task='heart_disease',
      method='dp_randagg',
      rounds=2,
      client_sampling_rate=1.0,
      noise_multiplier=1.0,
      delta=1e-3,
      randagg_fraction=0.1,
      batch_size=32,
      output_dir=str(tmp_path / 'r'),
      background_evaluation=False,
    )
  )
  k = round(0.1 * 1281)
  assert summary['bytes_per_client_per_round'] == {
    'down': 4 * 1281 + 4 * k,
    'up': 4 * k,
  }
  event = privacy.event_from_dict(summary['dp_events'][-1])
  assert event == dp_accounting.PoissonSampledDpEvent(
    1.0, dp_accounting.GaussianDpEvent(pytest.approx(1.0))
  )
