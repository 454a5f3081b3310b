"""The correlated-noise plan's last-model and projected noise energies
against a Monte Carlo of the released noise (4 standard errors)."""

from unittest import mock

import numpy as np

from benchmarks import correlated_noise_plan
from tff_dp.aggregators import mf_strategy


def test_final_and_projected_noise_energy_match_monte_carlo():
  strategy = mf_strategy.banded([1.0, 0.6, 0.3])
  rounds, p, n = 30, 0.2, 40_000
  with mock.patch.object(correlated_noise_plan, 'PROJECTED_FRACTION', p):
    final, projected = correlated_noise_plan._final_and_projected(
      strategy, rounds, 0.0, 1.0
    )
  rng = np.random.default_rng(0)
  # Released noise n_t = (C^-1 w)_t for each of n independent streams; the
  # last model (server SGD, momentum 0) holds the prefix sum of what was
  # released on a coordinate: every round, or each with probability p.
  noise = strategy.noise(rng.standard_normal((rounds, n)))
  released = rng.random((rounds, n)) < p
  for want, samples in (
    (final, np.sum(noise, 0) ** 2),
    (projected, np.sum(noise * released, 0) ** 2),
  ):
    se = np.std(samples) / np.sqrt(n)
    assert abs(np.mean(samples) - want) < 4 * se, (want, np.mean(samples), se)
  # Projection keeps each round's larger noise and loses the cancellation:
  # the energy per released round exceeds the full stream's per round.
  assert projected / p > final / rounds
