"""`dp_events.round_event`: one event per round, read from the state, and
the epsilon the ledger gets from it against dp_accounting directly, for
both sampling modes."""

import math

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp import privacy
from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import ddgauss_accounting
from tff_dp.aggregators import dp_events
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import finite_guard

TYPE = tff.StructWithPythonType(
  [tff.TensorType(np.float32, (6, 4)), tff.TensorType(np.float32, (4,))], list
)
G = dp_accounting.GaussianDpEvent
Z = 1.0  # Exact in float32, as the state keeps it.


@pytest.fixture(autouse=True, scope='module')
def _context():
  contexts.set_simulation_context()  # Simulates secure sum.


def _clients(n=3):
  rng = np.random.default_rng(0)
  return [
    [rng.normal(size=(6, 4)).astype(np.float32), np.ones(4, np.float32)]
    for _ in range(n)
  ]


def _state_after_next(factory, clients=None):
  process = factory.create(TYPE)
  return process.next(process.initialize(), clients or _clients()).state


def test_gaussian_fixed_round_event_in_python_numbers():
  event = dp_events.round_event(
    _state_after_next(dp_fedavg.gaussian_fixed(Z, 3, 1.0))
  )
  assert event == G(Z)
  assert type(event.noise_multiplier) is float


def _cmp_round_event():
  factory = cmp_fed.cmp_fed(
    2, noise_multiplier=Z, clients_per_round=3, clip_u=1.0, clip_v=1.0
  )
  return dp_events.round_event(_state_after_next(factory))


_ROUNDS, _DELTA = 50, 1e-5


@pytest.mark.parametrize('mode', ['poisson', 'fixed'])
def test_cmp_fed_round_is_one_event_and_its_epsilon_matches(mode):
  # CMP-Fed's two phases release on the same cohort in the same round: one
  # composed event, sampled once. Two Gaussians of multiplier z on one
  # sample are the Gaussian of z / sqrt(2).
  event = _cmp_round_event()
  assert event == dp_accounting.ComposedDpEvent([G(Z), G(Z)])
  n, q, m = 1000, 0.03, 30
  sampling = (
    privacy.Sampling('poisson', n, rate=q)
    if mode == 'poisson'
    else privacy.Sampling('fixed', n, clients_per_round=m)
  )
  ledger = privacy.PrivacyLedger(sampling, _DELTA)
  for _ in range(_ROUNDS):
    ledger.record(event)
  eps_rdp, eps_pld = ledger.epsilon()
  z_round = Z / math.sqrt(2)
  if mode == 'poisson':
    sampled = dp_accounting.PoissonSampledDpEvent(q, G(z_round))
    want_rdp = rdp.RdpAccountant().compose(sampled, _ROUNDS)
    want_pld = pld.PLDAccountant().compose(sampled, _ROUNDS)
    assert eps_pld == pytest.approx(want_pld.get_epsilon(_DELTA), rel=1e-6)
  else:
    # Replace-one moves each phase's clipped sum by twice its clip.
    sampled = dp_accounting.SampledWithoutReplacementDpEvent(
      n, m, G(z_round / 2)
    )
    want_rdp = rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    ).compose(sampled, _ROUNDS)
    assert math.isnan(eps_pld)  # PLD does not take it; reported as NaN.
  assert eps_rdp == pytest.approx(want_rdp.get_epsilon(_DELTA), rel=1e-9)
  # Recording the phases as two rounds (the mistake one event per round
  # prevents) would report less.
  split = privacy.PrivacyLedger(sampling, _DELTA)
  for _ in range(_ROUNDS):
    for e in event.events:
      split.record(e)
  assert split.epsilon()[0] < 0.9 * eps_rdp


def test_adaptive_round_event_merges_to_the_effective_multiplier():
  factory = dp_fedavg.gaussian_adaptive(
    Z, 3, initial_clip=1.0, clipped_count_stddev=2.0
  )
  event = dp_events.round_event(_state_after_next(factory))
  ledger = privacy.PrivacyLedger(
    privacy.Sampling('poisson', 100, rate=0.1), _DELTA
  )
  ledger.record(event)
  want = (
    rdp.RdpAccountant()
    .compose(dp_accounting.PoissonSampledDpEvent(0.1, G(Z)))
    .get_epsilon(_DELTA)
  )
  assert ledger.epsilon()[0] == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize(
  'factory, match',
  [
    (
      lambda: dpsfl.dpsfl(
        3, 16, 4, noise_multiplier=Z, clients_per_round=3, clip=1.0
      ),
      'factory.round_event',
    ),
    (lambda: cmp_fed.uv_fed(2), 'holds no DP state'),
  ],
)
def test_states_without_an_event_are_refused(factory, match):
  state = _state_after_next(factory())
  assert dp_events.events_in_state(state) == []
  with pytest.raises(ValueError, match=match):
    dp_events.round_event(state)


def test_ddgauss_state_is_refused_with_its_reader():
  factory = ddgauss.ddgauss_mean(Z, 2, 1.0, min_clients=2, bits=16)
  state = _state_after_next(factory, _clients(2))
  (event,) = dp_events.events_in_state(state)
  assert isinstance(event, dp_accounting.UnsupportedDpEvent)
  with pytest.raises(ValueError, match='round_event_from_measurements'):
    dp_events.round_event(state)


def test_initial_state_is_refused():
  process = dp_fedavg.gaussian_fixed(Z, 3, 1.0).create(TYPE)
  with pytest.raises(Exception, match='initialize'):
    dp_events.round_event(process.initialize())


def _released(factory, clients=None):
  process = factory.create(TYPE)
  out = process.next(process.initialize(), clients or _clients())
  return dp_events.released_event(factory, out.state, out.measurements), out


@pytest.mark.parametrize('wrap', ['bare', 'guarded'])
def test_released_event_reads_every_private_factory(wrap):
  def wrapped(factory):
    if wrap == 'guarded':
      return finite_guard.FiniteGuardFactory(factory)
    return factory

  # A TFF DP state: its event, as round_event reads it.
  event, _ = _released(wrapped(dp_fedavg.gaussian_fixed(Z, 3, 1.0)))
  assert event == G(Z)
  # CMP-Fed: its two phases composed.
  event, _ = _released(
    wrapped(
      cmp_fed.cmp_fed(
        2, noise_multiplier=Z, clients_per_round=3, clip_u=1.0, clip_v=1.0
      )
    )
  )
  assert event == dp_accounting.ComposedDpEvent([G(Z), G(Z)])
  # DPSFL: the event it was built with (no DP state).
  sketch = dpsfl.dpsfl(
    3, 16, 4, noise_multiplier=Z, clients_per_round=3, clip=1.0
  )
  event, _ = _released(wrapped(sketch))
  assert event == sketch.round_event() == G(Z)
  if wrap == 'guarded':
    return  # The guarded DDGauss graph needs protobuf's Python backend.
  # DDGauss: from the noise that ran, in its measurements.
  factory = ddgauss.ddgauss_mean(Z, 2, 1.0, min_clients=2, bits=16)
  event, out = _released(factory, _clients(2))
  assert event == ddgauss_accounting.round_event_from_measurements(
    out.measurements
  )
  assert isinstance(event, ddgauss_accounting.DiscreteGaussianSumDpEvent)


def test_released_event_reads_a_weighted_factory_and_refuses_a_non_private():
  factory = dp_fedavg.gaussian_fixed(Z, 3, 1.0)
  weighted = factory.weighted()
  process = weighted.create(TYPE, tff.TensorType(np.float32))
  out = process.next(process.initialize(), _clients(), [1.0, 2.0, 3.0])
  assert dp_events.unwrap(weighted) is factory
  assert dp_events.released_event(weighted, out.state, out.measurements) == G(Z)
  for factory, match in (
    (cmp_fed.uv_fed(2), 'holds no DP state'),
    (dpsfl.fetchsgd(3, 16, 4), 'FetchSGD releases no DP event'),
  ):
    process = factory.create(TYPE)
    out = process.next(process.initialize(), _clients())
    with pytest.raises(ValueError, match=match):
      dp_events.released_event(factory, out.state, out.measurements)


def test_released_values_read_the_clip_and_the_dp_fraction_clipped():
  adaptive = dp_fedavg.gaussian_adaptive(
    Z, 3, initial_clip=1.0, clipped_count_stddev=2.0
  )
  process = adaptive.create(TYPE)
  out = process.next(process.initialize(), _clients())
  values = dp_events.released_values(out.measurements)
  assert values.clip == pytest.approx(
    float(out.measurements['dp_query_metrics']['clip'])
  )
  assert values.dp_fraction_clipped is None
  fixed = dp_fedavg.gaussian_fixed(Z, 3, 1.0, clipped_fraction_stddev=4.0)
  process = fixed.create(TYPE)
  out = process.next(process.initialize(), _clients())
  values = dp_events.released_values(out.measurements)
  assert values.clip == 1.0  # Its query reports the fixed clip too.
  assert values.dp_fraction_clipped == float(
    out.measurements['dp_query_metrics']['dp_fraction_clipped']
  )
  assert dp_events.released_values({}) == (None, None)
