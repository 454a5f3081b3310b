"""The one-shot canary audit: below the ledger, and catches broken noise."""

import dp_accounting
from dp_accounting import rdp
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp import audit
from tff_dp import contexts
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import finite_guard

Z, CLIP, ROUNDS, DELTA = 2.0, 1.0, 4, 1e-5
DIM, CANARIES = 20000, 300


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


def _ledger_epsilon(z):
  # Every canary takes part in every round: T Gaussians, no sampling.
  event = dp_accounting.SelfComposedDpEvent(
    dp_accounting.GaussianDpEvent(z), ROUNDS
  )
  return rdp.RdpAccountant().compose(event).get_epsilon(DELTA)


def test_gdp_epsilon_known_values():
  # mu = 1 at delta 1e-5 (Dong et al.'s curve), and monotone in mu.
  e1 = audit.gdp_epsilon(1.0, 1e-5)
  assert 4.2 < e1 < 4.6
  assert audit.gdp_epsilon(2.0, 1e-5) > e1 > audit.gdp_epsilon(0.5, 1e-5)
  assert audit.gdp_epsilon(0.0, 1e-5) == 0.0


class _Unclipped(tff.aggregators.UnweightedAggregationFactory):
  """A broken DP-FedAvg: noise for `clip` but the update is not clipped."""

  def create(self, value_type):
    inner = dp_fedavg.gaussian_fixed(0.0, CANARIES, 1e9, seed=3)
    noise = Z * CLIP / CANARIES
    process = inner.create(value_type)

    @tff.tensorflow.computation(value_type)
    def add_noise(v):
      import tensorflow as tf  # pylint: disable=g-import-not-at-top

      return v + tf.random.stateless_normal(
        tf.shape(v), seed=[7, 7], stddev=noise
      )

    @tff.federated_computation(
      process.initialize.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      out = process.next(state, value)
      noisy = tff.federated_map(add_noise, out.result)
      return tff.templates.MeasuredProcessOutput(
        out.state, noisy, out.measurements
      )

    return tff.templates.AggregationProcess(process.initialize, next_fn)


def _audit(factory, canary_norm=CLIP):
  return audit.audit_aggregator(
    finite_guard.FiniteGuardFactory(factory),
    dim=DIM,
    num_canaries=CANARIES,
    rounds=ROUNDS,
    canary_norm=canary_norm,
    delta=DELTA,
    seed=1,
  )


def test_correct_dp_fedavg_stays_below_the_ledger():
  result = _audit(dp_fedavg.gaussian_fixed(Z, CANARIES, CLIP, seed=2))
  # mu = sqrt(T) / z = 1 for this mechanism; the estimate is near it.
  assert result.mu_estimate == pytest.approx(1.0, abs=0.3)
  assert result.epsilon_estimate < _ledger_epsilon(Z)


def test_halved_noise_is_caught():
  # The mechanism adds noise z/2 while the ledger claims z.
  result = _audit(dp_fedavg.gaussian_fixed(Z / 2, CANARIES, CLIP, seed=2))
  assert result.epsilon_estimate > _ledger_epsilon(Z)


def test_missing_clip_is_caught():
  # Canaries 3x the clip, and the clip is not applied.
  result = _audit(_Unclipped(), canary_norm=3 * CLIP)
  assert result.epsilon_estimate > _ledger_epsilon(Z)


def test_bad_args():
  with pytest.raises(ValueError, match='num_canaries must be an integer >= 2'):
    audit.audit_aggregator(
      dp_fedavg.gaussian_fixed(1.0, 1, 1.0),
      dim=10,
      num_canaries=1,
      rounds=1,
      canary_norm=1.0,
      delta=1e-5,
    )
  with pytest.raises(ValueError, match=r'delta must be in \(0, 1\)'):
    audit.gdp_epsilon(1.0, 0.0)
  assert np.isfinite(audit.gdp_epsilon(5.0, 1e-5))
