"""Correlated-noise accounting: events equal independent dp_accounting."""

import math

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import pytest

from tff_dp.privacy import calibration
from tff_dp.privacy import correlated
from tff_dp import privacy
from tff_dp.aggregators import mf_strategy as mf

ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def _independent(event, delta):
  """dp_accounting's own accountants (not the ledger's subclasses)."""
  return (
    rdp.RdpAccountant(neighboring_relation=ADD_REMOVE)
    .compose(event)
    .get_epsilon(delta),
    pld.PLDAccountant(neighboring_relation=ADD_REMOVE)
    .compose(event)
    .get_epsilon(delta),
  )


def test_one_group_one_band_is_dp_fedavgs_ledger_exactly():
  z, q, rounds, delta = 1.1, 0.05, 40, 1e-5
  event = correlated.mf_run_event(
    mf.identity(), z, rounds, correlated.Participation(1, q)
  )
  ledger = privacy.PrivacyLedger(privacy.Sampling('poisson', 1000, q), delta)
  for _ in range(rounds):
    ledger.record(dp_accounting.GaussianDpEvent(z))
  assert correlated.epsilon(event, delta) == ledger.epsilon()


@pytest.mark.parametrize('rounds', [1, 7, 60, 61])
def test_cyclic_poisson_event_and_epsilon_equal_dp_accounting(rounds):
  groups, q, z, delta = 4, 0.2, 0.9, 1e-5
  c = [1.0, 0.6, 0.3]
  strategy = mf.banded(c)
  event = correlated.mf_run_event(
    strategy, z, rounds, correlated.Participation(groups, q)
  )
  # The theorem's event, built by hand from its statement.
  kappa = math.sqrt(sum(v * v for v in c[:rounds]))
  expected = dp_accounting.SelfComposedDpEvent(
    dp_accounting.PoissonSampledDpEvent(
      q, dp_accounting.GaussianDpEvent(z / kappa)
    ),
    -(-rounds // groups),
  )
  assert event.count == expected.count
  assert event.event.sampling_probability == q
  assert event.event.event.noise_multiplier == pytest.approx(
    expected.event.event.noise_multiplier, rel=1e-12
  )
  rdp_eps, pld_eps = correlated.epsilon(event, delta)
  want_rdp, want_pld = _independent(expected, delta)
  assert rdp_eps == pytest.approx(want_rdp, rel=1e-9)
  assert pld_eps == pytest.approx(want_pld, rel=1e-9)


@pytest.mark.parametrize(
  'strategy',
  [mf.banded([1.0, 0.7, 0.5, 0.2]), mf.blt([0.9, 0.4], [0.4, 0.3])],
  ids=['banded4', 'blt'],
)
@pytest.mark.parametrize('groups', [1, 2, 3])
def test_min_separation_event_is_one_gaussian_over_brute_force_sens(
  strategy, groups
):
  rounds, z, delta = 12, 3.0, 1e-5
  event = correlated.mf_run_event(
    strategy, z, rounds, correlated.Participation(groups)
  )
  sens = mf.brute_force_sensitivity(strategy, rounds, groups)
  assert isinstance(event, dp_accounting.GaussianDpEvent)
  assert event.noise_multiplier == pytest.approx(z / sens, rel=1e-12)
  got = correlated.epsilon(event, delta)
  want = _independent(dp_accounting.GaussianDpEvent(z / sens), delta)
  assert got == pytest.approx(want, rel=1e-9)


def test_epsilon_grows_with_the_rounds_run():
  strategy = mf.blt([0.9], [0.5])
  part = correlated.Participation(2)
  eps = [
    correlated.epsilon(correlated.mf_run_event(strategy, 5.0, t, part), 1e-5)[0]
    for t in (1, 2, 5, 20)
  ]
  assert eps == sorted(eps) and eps[0] < eps[-1]


def test_correlated_bands_cost_no_more_epsilon_per_visit_than_dp_fedavg():
  # A unit-norm b-banded C with b groups: ceil(T/b) visits at the group
  # rate b q, each with multiplier z (kappa = 1).
  s = mf.optimize_banded(4, 40)
  event = correlated.mf_run_event(s, 1.0, 40, correlated.Participation(4, 0.2))
  assert event.count == 10
  assert event.event.event.noise_multiplier == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize(
  'call, match',
  [
    (lambda: correlated.Participation(0), 'groups must be an integer >= 1'),
    (lambda: correlated.Participation(2, 1.5), r'\(0, 1\]. Found 1.5'),
    (
      lambda: correlated.mf_run_event(
        mf.blt([0.5], [0.2]), 1.0, 10, correlated.Participation(2, 0.1)
      ),
      'needs a banded strategy',
    ),
    (
      lambda: correlated.mf_run_event(
        mf.banded([1, 0.5, 0.2]), 1.0, 10, correlated.Participation(2, 0.1)
      ),
      'bands <= groups. Found 3 bands and 2 groups',
    ),
    (
      lambda: correlated.mf_run_event(
        mf.identity(), 0.0, 10, correlated.Participation(1)
      ),
      'noise_multiplier must be finite and > 0',
    ),
    (
      lambda: correlated.group_rate(0.3, 4),
      r'4 \* 0.3 = 1.2.*at most 3 groups',
    ),
    (
      lambda: calibration.calibrate_correlated(
        mf.identity(), 1.0, 1e-5, 0, correlated.Participation(1)
      ),
      'rounds must be an integer >= 1',
    ),
    (
      lambda: calibration.choose_bands(
        [8], rounds=50, rate=0.2, target_epsilon=1.0, delta=1e-5
      ),
      'No candidate bands',
    ),
  ],
)
def test_bad_arguments_are_named(call, match):
  with pytest.raises(ValueError, match=match):
    call()


@pytest.mark.parametrize('accountant', ['rdp', 'pld'])
def test_calibration_meets_the_target_and_no_less_noise_would(accountant):
  strategy = mf.banded([1.0, 0.5])
  part = correlated.Participation(2, 0.1)
  target, delta, rounds = 2.0, 1e-5, 30
  z = calibration.calibrate_correlated(
    strategy, target, delta, rounds, part, accountant
  )
  index = 0 if accountant == 'rdp' else 1
  eps = lambda z: correlated.epsilon(
    correlated.mf_run_event(strategy, z, rounds, part), delta
  )
  assert eps(z)[index] <= target
  assert eps(z - 2e-3)[index] > target


def test_auto_bands_beat_independent_noise_in_a_many_visit_regime():
  # Seed 000's regime, shortened: rate 0.1, epsilon 6, 60 rounds.
  choices = calibration.choose_bands(
    [1, 2, 4, 8], rounds=60, rate=0.1, target_epsilon=6.0, delta=1e-5
  )
  by_bands = {c.bands: c for c in choices}
  assert set(by_bands) == {1, 2, 4, 8}
  assert [c.error for c in choices] == sorted(c.error for c in choices)
  # b = 1 is DP-FedAvg at the same epsilon.
  dp_fedavg_z = privacy.calibrate_noise_multiplier(
    6.0, 1e-5, 60, privacy.Sampling('poisson', 1000, 0.1)
  )
  assert by_bands[1].noise_multiplier == pytest.approx(dp_fedavg_z, abs=2e-4)
  assert choices[0].error <= by_bands[1].error


def _mf_event(z, strategy):
  from tff_dp.aggregators import correlated_noise  # pylint: disable=g-import-not-at-top

  return correlated_noise.MatrixFactorizationDpEvent(
    z, correlated_noise.strategy_json(strategy)
  )


@pytest.mark.parametrize('mode', ['poisson', 'fixed'])
def test_the_ledger_refuses_correlated_rounds_as_independent(mode):
  sampling = (
    privacy.Sampling('poisson', 100, 0.1)
    if mode == 'poisson'
    else privacy.Sampling('fixed', 100, clients_per_round=10)
  )
  ledger = privacy.PrivacyLedger(sampling, 1e-5)
  with pytest.raises(dp_accounting.UnsupportedEventError, match='cyclic'):
    ledger.record(_mf_event(1.0, mf.banded([1.0, 0.5])))
  assert ledger.rounds == 0


def _cyclic_ledger(mode, groups, rate, event, rounds, delta=1e-5):
  ledger = privacy.PrivacyLedger(
    privacy.Sampling(mode, 1200, rate=rate, groups=groups), delta
  )
  for _ in range(rounds):
    ledger.record(event)
  return ledger


@pytest.mark.parametrize('rounds', [1, 5, 24, 25])
def test_cyclic_poisson_ledger_equals_independent_dp_accounting(rounds):
  groups, q, z, delta = 4, 0.3, 1.3, 1e-5
  c = [0.8, 0.5, 0.3]
  ledger = _cyclic_ledger(
    'cyclic_poisson', groups, q, _mf_event(z, mf.banded(c)), rounds, delta
  )
  # The amplified-BandMF event from its statement, by hand: z over the
  # longest column's norm, Poisson at q, once per visit of a group.
  kappa = math.sqrt(sum(v * v for v in c[:rounds]))
  expected = dp_accounting.SelfComposedDpEvent(
    dp_accounting.PoissonSampledDpEvent(
      q, dp_accounting.GaussianDpEvent(z / kappa)
    ),
    -(-rounds // groups),
  )
  rdp_eps, pld_eps = ledger.epsilon()
  want_rdp, want_pld = _independent(expected, delta)
  assert rdp_eps == pytest.approx(want_rdp, rel=1e-9)
  assert pld_eps == pytest.approx(want_pld, rel=1e-9)


@pytest.mark.parametrize('rounds', [1, 6, 13])
def test_min_separation_ledger_equals_one_gaussian_of_brute_force_sens(rounds):
  groups, z, delta = 3, 2.0, 1e-5
  strategy = mf.blt([0.9, 0.4], [0.3, 0.2])
  ledger = _cyclic_ledger(
    'cyclic', groups, 0.5, _mf_event(z, strategy), rounds, delta
  )
  sens = mf.brute_force_sensitivity(strategy, rounds, groups)
  want_rdp, want_pld = _independent(
    dp_accounting.GaussianDpEvent(z / sens), delta
  )
  rdp_eps, pld_eps = ledger.epsilon()
  assert rdp_eps == pytest.approx(want_rdp, rel=1e-6)
  assert pld_eps == pytest.approx(want_pld, rel=1e-6)


def test_iid_rounds_under_cyclic_poisson_are_dp_fedavg_per_group_visit():
  # A client is in one group: ceil(T / b) Poisson-sampled Gaussians.
  groups, q, z, rounds, delta = 5, 0.4, 1.1, 23, 1e-5
  ledger = _cyclic_ledger(
    'cyclic_poisson',
    groups,
    q,
    dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z)]),
    rounds,
    delta,
  )
  want = _independent(
    dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)),
      5,
    ),
    delta,
  )
  assert ledger.epsilon() == pytest.approx(want, rel=1e-9)


def test_iid_rounds_under_min_separation_compose_one_gaussian_per_visit():
  groups, z, rounds, delta = 4, 3.0, 10, 1e-5
  ledger = _cyclic_ledger(
    'cyclic', groups, 1.0, dp_accounting.GaussianDpEvent(z), rounds, delta
  )
  want = _independent(
    dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 3),
    delta,
  )
  assert ledger.epsilon() == pytest.approx(want, rel=1e-6)


def test_a_cyclic_ledger_round_trips_and_refuses_a_changed_round():
  event = _mf_event(1.5, mf.banded([0.9, 0.43]))
  ledger = _cyclic_ledger('cyclic_poisson', 2, 0.2, event, 7)
  back = privacy.PrivacyLedger.from_json(ledger.to_json())
  assert back.sampling == ledger.sampling
  assert back.events == ledger.events
  assert back.epsilon() == ledger.epsilon()
  with pytest.raises(ValueError, match='round 8 released'):
    back.record(_mf_event(1.4, mf.banded([0.9, 0.43])))
  with pytest.raises(dp_accounting.UnsupportedEventError, match='Gaussian'):
    back.record(dp_accounting.LaplaceDpEvent(1.0))


def test_amplified_schema_refuses_more_bands_than_groups_at_calibration():
  sampling = privacy.Sampling('cyclic_poisson', 100, rate=0.2, groups=2)
  with pytest.raises(ValueError, match='bands <= groups'):
    privacy.calibrate_noise_multiplier(
      1.0,
      1e-5,
      10,
      sampling,
      round_event_fn=lambda z: _mf_event(z, mf.banded([1.0, 0.5, 0.2])),
    )


@pytest.mark.parametrize('accountant', ['rdp', 'pld'])
def test_calibrating_a_cyclic_run_meets_the_target_in_its_ledger(accountant):
  sampling = privacy.Sampling('cyclic_poisson', 100, rate=0.4, groups=3)
  strategy = mf.optimize_banded(3, 30)
  z = privacy.calibrate_noise_multiplier(
    2.0,
    1e-5,
    30,
    sampling,
    round_event_fn=lambda z: _mf_event(z, strategy),
    accountant=accountant,
  )
  ledger = privacy.PrivacyLedger(sampling, 1e-5)
  for _ in range(30):
    ledger.record(_mf_event(z, strategy))
  eps = ledger.epsilon()[0 if accountant == 'rdp' else 1]
  assert eps <= 2.0 + 1e-9
  assert eps > 1.95
  assert z == pytest.approx(
    calibration.calibrate_correlated(
      strategy, 2.0, 1e-5, 30, sampling.participation(), accountant
    ),
    abs=2e-4,
  )


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(mode='cyclic_poisson', rate=0.2), 'groups'),
    (dict(mode='cyclic', rate=0.2, groups=0), 'groups'),
    (dict(mode='cyclic', rate=1.5, groups=2), 'within-group'),
    (dict(mode='cyclic_poisson', rate=0.2, groups=101), r'\[1, 100\]'),
  ],
)
def test_bad_cyclic_sampling_is_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    privacy.Sampling(num_clients=100, **kwargs)


def test_two_streams_of_one_strategy_are_accounted_as_one_merged_stream():
  # CMP-Fed's two phases and DPSFL-AC's sketch and bit: one round releases
  # MF(z1, C) and MF(z2, C) on one cohort; the ledger charges them as one
  # MF(z, C), 1/z^2 = 1/z1^2 + 1/z2^2 (privacy.merge_gaussians' docstring
  # gives the argument), equal to independent dp_accounting of that event.
  strategy = mf.banded([0.8, 0.5, 0.3])
  z1, z2, groups, q, rounds, delta = 1.2, 2.5, 3, 0.3, 10, 1e-5
  composed = dp_accounting.ComposedDpEvent(
    [_mf_event(z1, strategy), _mf_event(z2, strategy)]
  )
  ledger = _cyclic_ledger('cyclic_poisson', groups, q, composed, rounds, delta)
  z = (z1**-2 + z2**-2) ** -0.5
  kappa = math.sqrt(0.8**2 + 0.5**2 + 0.3**2)
  want = _independent(
    dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(z / kappa)
      ),
      -(-rounds // groups),
    ),
    delta,
  )
  assert ledger.epsilon() == pytest.approx(want, rel=1e-9)


def test_streams_of_different_strategies_or_mixed_with_iid_are_refused():
  a, b = mf.banded([1.0, 0.5]), mf.banded([1.0, 0.3])
  ledger = privacy.PrivacyLedger(
    privacy.Sampling('cyclic_poisson', 1200, rate=0.2, groups=2), 1e-5
  )
  for parts in (
    [_mf_event(1.0, a), _mf_event(1.0, b)],
    [_mf_event(1.0, a), dp_accounting.GaussianDpEvent(1.0)],
  ):
    event = dp_accounting.ComposedDpEvent(parts)
    assert privacy.merge_gaussians(event) is event
    with pytest.raises(dp_accounting.UnsupportedEventError, match='Gaussian'):
      ledger.record(event)
  assert ledger.rounds == 0


def test_merged_streams_under_min_separation_equal_one_gaussian():
  # The same merge under `cyclic` (no amplification): one Gaussian of the
  # merged z over the brute-force sensitivity, from dp_accounting.
  strategy = mf.blt([0.9, 0.4], [0.3, 0.2])
  z1, z2, groups, rounds, delta = 1.5, 3.0, 3, 9, 1e-5
  composed = dp_accounting.ComposedDpEvent(
    [_mf_event(z1, strategy), _mf_event(z2, strategy)]
  )
  ledger = _cyclic_ledger('cyclic', groups, 0.5, composed, rounds, delta)
  z = (z1**-2 + z2**-2) ** -0.5
  sens = mf.brute_force_sensitivity(strategy, rounds, groups)
  want = _independent(dp_accounting.GaussianDpEvent(z / sens), delta)
  assert ledger.epsilon() == pytest.approx(want, rel=1e-6)
