import dp_accounting
from dp_accounting import rdp  # noqa: F401 (dp_accounting.rdp)
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp import privacy
from tff_dp.aggregators import _tff_private
from tff_dp.aggregators import dp_fedavg

VALUE = tff.types.TensorType(np.float32, [3])


def _run(factory, client_values, rounds=1):
  process = factory.create(VALUE)
  state = process.initialize()
  outputs = []
  for _ in range(rounds):
    out = process.next(state, client_values)
    state = out.state
    outputs.append(out)
  return outputs


def test_zero_noise_exact_clipped_mean():
  # Client 1: [3, 4, 0] has norm 5 -> clipped to norm 1: [0.6, 0.8, 0].
  # Client 2: [0.1, 0, 0] has norm 0.1 <= 1: kept.
  # Sum [0.7, 0.8, 0] over the expected 4 clients: [0.175, 0.2, 0].
  factory = dp_fedavg.gaussian_fixed(0.0, clients_per_round=4, clip=1.0)
  (out,) = _run(
    factory,
    [np.array([3, 4, 0], np.float32), np.array([0.1, 0, 0], np.float32)],
  )
  np.testing.assert_allclose(out.result, [0.175, 0.2, 0.0], rtol=1e-6)


def test_event_in_state_is_gaussian():
  factory = dp_fedavg.gaussian_fixed(1.5, clients_per_round=2, clip=0.5)
  (out,) = _run(factory, [np.ones(3, np.float32)])
  event = privacy.event_from_named_tuple(out.state.dp_event)
  assert isinstance(event, dp_accounting.GaussianDpEvent)
  assert event.noise_multiplier == pytest.approx(1.5)


def test_noise_std_and_seeded_reproducibility():
  z, clip, n = 2.0, 0.5, 1
  factory = dp_fedavg.gaussian_fixed(
    z, clients_per_round=n, clip=clip, noise_seed=7
  )
  dim = 20_000
  process = factory.create(tff.types.TensorType(np.float32, [dim]))
  noise = process.next(process.initialize(), [np.zeros(dim, np.float32)])
  noise = noise.result
  # 20,000 draws of N(0, (z * clip / n)^2) = N(0, 1): the sample std's
  # standard error is 0.5%, and 2% is 4 of them.
  assert noise.std() == pytest.approx(z * clip / n, rel=0.02)
  assert abs(noise.mean()) < 4 / np.sqrt(dim)
  outs = _run(factory, [np.zeros(3, np.float32)], rounds=3)
  # Every round draws fresh noise ...
  assert not np.allclose(outs[0].result, outs[1].result)
  # ... and the same seed gives the same stream.
  again = _run(
    dp_fedavg.gaussian_fixed(z, n, clip, noise_seed=7),
    [np.zeros(3, np.float32)],
    rounds=3,
  )
  for a, b in zip(outs[:3], again):
    np.testing.assert_array_equal(a.result, b.result)
  other = _run(
    dp_fedavg.gaussian_fixed(z, n, clip, noise_seed=8),
    [np.zeros(3, np.float32)],
    rounds=1,
  )
  assert not np.allclose(outs[0].result, other[0].result)


def test_adaptive_clip_moves_towards_quantile_and_event_merges():
  factory = dp_fedavg.gaussian_adaptive(
    0.0,
    clients_per_round=4,
    initial_clip=0.1,
    learning_rate=0.2,
    target_unclipped_quantile=0.5,
  )
  values = [np.array([10.0, 0, 0], np.float32)] * 4  # All norms 10 > clip.
  outs = _run(factory, values, rounds=3)
  clips = [o.measurements['dp_query_metrics']['clip'] for o in outs]
  # All clipped, target 50% unclipped: clip grows by exp(0.2 * 0.5) a round.
  np.testing.assert_allclose(
    clips, 0.1 * np.exp(0.1 * np.arange(1, 4)), rtol=1e-5
  )
  factory = dp_fedavg.gaussian_adaptive(1.0, clients_per_round=100)
  (out,) = _run(factory, values)
  event = privacy.event_from_named_tuple(out.state.dp_event)
  assert isinstance(event, dp_accounting.ComposedDpEvent)
  merged = privacy.merge_gaussians(event)
  assert merged.noise_multiplier == pytest.approx(1.0, rel=1e-5)


def test_adaptive_noise_std_is_the_value_multiplier():
  # Adaptive clipping splits the round's multiplier z between the clipped
  # count (stddev b) and the value: z_v = (z^-2 - (2 b)^-2)^(-1/2), here
  # 2 / sqrt(3) = 1.155 (Andrew et al.'s Theorem 1). Zero updates from 3
  # of an expected 100 clients: the mean is N(0, (z_v clip / 100)^2) per
  # coordinate at the initial clip (a tiny learning rate keeps it).
  # 20,000 draws: the sample std's standard error is 0.5%, and 2% is 4 of
  # them, so z (15% lower) would fail.
  z, n, b, clip, dim = 1.0, 100, 1.0, 0.5, 20_000
  factory = dp_fedavg.gaussian_adaptive(
    z,
    clients_per_round=n,
    initial_clip=clip,
    learning_rate=1e-9,
    clipped_count_stddev=b,
    noise_seed=3,
  )
  process = factory.create(tff.types.TensorType(np.float32, [dim]))
  out = process.next(process.initialize(), [np.zeros(dim, np.float32)] * 3)
  z_value = (z**-2 - (2 * b) ** -2) ** -0.5
  assert z_value == pytest.approx(2 / 3**0.5)
  want = z_value * clip / n
  assert np.std(out.result) == pytest.approx(want, rel=0.02)
  assert abs(np.mean(out.result)) < 4 * want / np.sqrt(dim)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (
      dict(noise_multiplier=-1.0, clients_per_round=10, clip=1.0),
      r'noise_multiplier must be a finite number >= 0. Found -1.0',
    ),
    (
      dict(noise_multiplier=1.0, clients_per_round=0, clip=1.0),
      r'clients_per_round must be a finite number > 0',
    ),
    (
      dict(noise_multiplier=1.0, clients_per_round=10, clip=0.0),
      r'clip must be a finite number > 0',
    ),
    (
      dict(noise_multiplier=float('nan'), clients_per_round=10, clip=1.0),
      r'noise_multiplier must be a finite number',
    ),
  ],
)
def test_fixed_bad_args(kwargs, match):
  with pytest.raises(ValueError, match=match):
    dp_fedavg.gaussian_fixed(**kwargs)


def test_adaptive_bad_quantile():
  with pytest.raises(ValueError, match=r'target_unclipped_quantile must be in'):
    dp_fedavg.gaussian_adaptive(1.0, 10, target_unclipped_quantile=1.5)


def test_adaptive_small_cohort_says_what_to_pass():
  # TFF's default count noise, 0.05 x 10 = 0.5, is not above z / 2 = 0.5.
  with pytest.raises(
    ValueError,
    match=(
      r'noise_multiplier=1.0 needs clipped_count_stddev > noise_multiplier '
      r'/ 2 = 0.5, and got the default clipped_count_stddev, 0.05 x '
      r'clients_per_round = 0.5 at clients_per_round=10\. Pass a larger '
      r'clipped_count_stddev \(at 1, the sum\'s multiplier becomes 1.15\), '
      r'use more than 10 clients per round, or use gaussian_fixed'
    ),
  ):
    dp_fedavg.gaussian_adaptive(1.0, 10)
  with pytest.raises(ValueError, match=r'got clipped_count_stddev=0.4\.'):
    dp_fedavg.gaussian_adaptive(1.0, 100, clipped_count_stddev=0.4)
  # What the message suggests works, and gives the multiplier it names.
  dp_fedavg.gaussian_adaptive(1.0, 10, clipped_count_stddev=1.0)
  dp_fedavg.gaussian_adaptive(1.0, 11)
  value_z, _ = _tff_private.adaptive_clip_noise_params(1.0, 10, 1.0)
  assert value_z == pytest.approx(1 / 0.75**0.5)
  # No noise: no count noise needed.
  dp_fedavg.gaussian_adaptive(0.0, 1)


def test_type_signature():
  process = dp_fedavg.gaussian_fixed(1.0, 10, 1.0).create(VALUE)
  assert process.next.type_signature.parameter[1] == tff.FederatedType(
    VALUE, tff.CLIENTS
  )
  assert process.next.type_signature.result.result == tff.FederatedType(
    VALUE, tff.SERVER
  )


def test_dp_fraction_clipped_is_noised_charged_and_unbiased():
  # 10 expected clients, 4 of them above the clip of 1: true fraction 0.4.
  z, clients, sigma_b = 1.0, 10.0, 2.0
  factory = dp_fedavg.gaussian_fixed(
    z, clients, 1.0, noise_seed=5, clipped_fraction_stddev=sigma_b
  )
  values = [np.full(3, 0.1, np.float32)] * 6 + [np.full(3, 9.0, np.float32)] * 4
  outs = _run(factory, values, rounds=400)
  estimates = np.array(
    [o.measurements['dp_query_metrics']['dp_fraction_clipped'] for o in outs]
  )
  # Noise N(0, sigma_b^2) on the centred count over 10: stddev 0.2 (clipped
  # to [0, 1] only 2 stddevs away, which trims the tails a little).
  # 400 rounds: standard errors 0.01 (mean) and 3.5% (std).
  assert np.mean(estimates) == pytest.approx(0.4, abs=0.04)
  assert np.std(estimates) == pytest.approx(0.2, rel=0.1)
  # Fresh noise every round (the estimates clipped to 0 or 1 aside).
  interior = estimates[(estimates > 0) & (estimates < 1)]
  assert len(interior) > 380 and len(set(interior.tolist())) == len(interior)
  # The clip never moves.
  assert {o.measurements['dp_query_metrics']['clip'] for o in outs} == {1.0}
  # The round's event holds both releases, and merges to the requested z.
  event = privacy.event_from_named_tuple(outs[-1].state.dp_event)
  value_z, count_stddev = _tff_private.adaptive_clip_noise_params(
    z, clients, sigma_b
  )
  assert event == dp_accounting.ComposedDpEvent(
    [
      dp_accounting.GaussianDpEvent(pytest.approx(value_z, rel=1e-6)),
      dp_accounting.GaussianDpEvent(pytest.approx(count_stddev / 0.5)),
    ]
  )
  assert privacy.merge_gaussians(event).noise_multiplier == pytest.approx(
    z, rel=1e-6
  )
  # The sum's noise is the raised value multiplier's: zero updates.
  zeros = _run(
    dp_fedavg.gaussian_fixed(
      z, clients, 1.0, noise_seed=6, clipped_fraction_stddev=sigma_b
    ),
    [np.zeros(3, np.float32)] * 10,
    rounds=300,
  )
  noise = np.concatenate([o.result for o in zeros]) * clients
  assert np.std(noise) == pytest.approx(value_z, rel=0.1)


def test_dp_fraction_clipped_needs_more_noise_than_half_the_multiplier():
  with pytest.raises(ValueError, match=r'exceed noise_multiplier / 2 = 1\b'):
    dp_fedavg.gaussian_fixed(2.0, 10, 1.0, clipped_fraction_stddev=1.0)
  with pytest.raises(ValueError, match='clipped_fraction_stddev must be'):
    dp_fedavg.gaussian_fixed(2.0, 10, 1.0, clipped_fraction_stddev=-1.0)


@pytest.mark.parametrize('mode', ['poisson', 'fixed'])
def test_dp_fraction_clipped_ledger_equals_dp_accounting(mode):
  # The state's two-Gaussian event, recorded as the runner records it,
  # against dp_accounting on the effective Gaussian of the sampling.
  factory = dp_fedavg.gaussian_fixed(
    1.0, 10.0, 1.0, noise_seed=1, clipped_fraction_stddev=2.0
  )
  (out,) = _run(factory, [np.ones(3, np.float32)])
  event = privacy.event_from_named_tuple(out.state.dp_event)
  if mode == 'poisson':
    sampling = privacy.Sampling('poisson', 1000, rate=0.01)
    want = dp_accounting.PoissonSampledDpEvent(
      0.01, dp_accounting.GaussianDpEvent(1.0)
    )
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
  else:
    sampling = privacy.Sampling('fixed', 1000, clients_per_round=10)
    # Replace-one moves the sum by 2 C (and the count by 1, within it).
    want = dp_accounting.SampledWithoutReplacementDpEvent(
      1000, 10, dp_accounting.GaussianDpEvent(0.5)
    )
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
  ledger = privacy.PrivacyLedger(sampling, 1e-5)
  for _ in range(50):
    ledger.record(event)
  accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
  accountant.compose(want, 50)
  assert ledger.epsilon()[0] == pytest.approx(
    accountant.get_epsilon(1e-5), rel=1e-5
  )
