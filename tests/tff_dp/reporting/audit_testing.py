"""The audit tests' shared setting: the canary run's constants, the ledger
epsilon it must stay under, and a method's audit as the runner reads it."""

import dp_accounting
from dp_accounting import pld

from tff_dp import methods as methods_lib
from tff_dp.reporting import audit

Z, CLIP, ROUNDS, DELTA = 2.0, 1.0, 4, 1e-5
DIM, CANARIES = 20000, 300


def ledger_epsilon(z):
  # Every canary takes part in every round: T Gaussians, no sampling. The
  # PLD ledger is the tight one (exact mu = sqrt(T) / z GDP, up to its
  # pessimistic discretization): the hardest ledger to stay under.
  event = dp_accounting.SelfComposedDpEvent(
    dp_accounting.GaussianDpEvent(z), ROUNDS
  )
  return pld.PLDAccountant().compose(event).get_epsilon(DELTA)


def params(rate=1.0, noise_seed=2):
  return methods_lib.MethodParams(
    num_model_params=DIM,
    expected_clients_per_round=rate * CANARIES,
    noise_multiplier=Z,
    clip=CLIP,
    noise_seed=noise_seed,
  )


def audit_method(method, *, rate=1.0, rounds=ROUNDS, seed=1, **kwargs):
  # Canaries at 3 x the clip (the default), events read as the runner does.
  return audit.audit_method(
    method,
    params(rate, noise_seed=kwargs.pop('noise_seed', 2)),
    shape=[DIM],
    num_canaries=CANARIES,
    rounds=rounds,
    delta=DELTA,
    sampling_rate=rate,
    seed=seed,
    **kwargs,
  )
