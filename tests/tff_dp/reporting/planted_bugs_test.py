"""The planted bugs: each is flagged against the ledger of the events the
run recorded (no clip, half the noise, a method that declares its full
noise), and a missing clip is unseen by canaries at the clip."""

import dp_accounting
import numpy as np
import pytest
import tensorflow_federated as tff

import audit_testing
from audit_testing import CLIP, DIM, ROUNDS, Z

from tff_dp.reporting import audit
from tff_dp.reporting import planted_bugs
from tff_dp.runtime import contexts
from tff_dp import methods as methods_lib
from tff_dp.aggregators import dp_events


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


@pytest.mark.parametrize('bug', ['no_clip', 'half_noise'])
def test_planted_bug_is_flagged_against_its_recorded_ledger(bug):
  # The planted query's state reports GaussianDpEvent(z), the correct
  # mechanism's event, so the ledger is that of z; what runs has mu = 3
  # (no clip, canaries at 3 x the clip) or mu = 2 (noise z / 2).
  result = audit_testing.audit_method(planted_bugs.planted_method(bug))
  assert result.events == (dp_accounting.GaussianDpEvent(Z),) * ROUNDS
  assert result.mu_lower > 1.5
  assert result.epsilon_lower > result.ledger_epsilon
  assert result.flagged


def test_missing_clip_is_unseen_by_canaries_at_the_clip():
  # Why the canaries sit beyond the clip: at the clip, a mechanism that
  # does not clip moves them exactly as far as one that does.
  result = audit_testing.audit_method(
    planted_bugs.planted_method('no_clip'), canary_norm=CLIP
  )
  assert not result.flagged


def test_declared_event_half_noise_is_flagged():
  # A method built with half its multiplier that declares the full one:
  # the ledger records the event its factory declares.
  method = planted_bugs.with_half_noise(methods_lib.METHODS['dp_fedavg'])
  factory = audit.method_aggregator(method, audit_testing.params())
  assert isinstance(factory.guarded, planted_bugs.DeclaredEventFactory)
  result = audit_testing.audit_method(method)
  assert result.events == (dp_accounting.GaussianDpEvent(Z),) * ROUNDS
  assert result.flagged


def test_planted_half_noise_query_reports_the_full_event():
  factory = planted_bugs.planted_dp_fedavg(
    'half_noise', Z, 10, CLIP, noise_seed=4
  )
  process = factory.create(tff.TensorType(np.float32, [DIM]))
  out = process.next(process.initialize(), [np.zeros(DIM, np.float32)] * 10)
  assert dp_events.round_event(out.state) == dp_accounting.GaussianDpEvent(Z)
  # The sum's noise has stddev Z * CLIP / 2 = 1, divided by 10 clients:
  # 0.1 per coordinate (the sample std of 20000 is within 2% of it).
  assert np.std(out.result) == pytest.approx(0.1, rel=0.02)


def test_bad_args():
  with pytest.raises(ValueError, match='bug must be one of'):
    planted_bugs.planted_method('no_noise')
