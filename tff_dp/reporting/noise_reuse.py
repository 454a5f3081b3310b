"""A check that an aggregator draws fresh noise every round
(`noise_reuse_check`).

The final-model statistic of the one-shot audit (`audit`) cannot see
noise that repeats across rounds (identical noise every round adds up
like one draw scaled by the number of rounds, which looks like *more*
privacy), although the round-to-round difference of such releases is the
difference of the rounds' data, free of noise. `noise_reuse_check`
catches it: each round gets its own canaries, which take part in that
round only; the releases are projected off the span of all canaries, and
what is left (the noise, for a linear mechanism) is tested for
correlation between every pair of rounds. A mechanism that feeds its
released aggregate into later rounds (DPSFL's error feedback) correlates
there legitimately: check it on the fresh release (DPSFL's probe reads
the round's noised sketch).
"""

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np
from scipy import stats

from tff_dp.aggregators import mf_strategy
from tff_dp.reporting import canary_rounds


@dataclasses.dataclass(frozen=True)
class NoiseReuseResult:
  """Cross-round correlation of the noise left after removing the data.

  `correlations[s, t]` is the cosine between rounds s and t's residuals
  (~N(0, 1/m) for independent noise in m dimensions, 1 for identical
  noise, -1 for negated noise), `z_scores[s, t]` the self-normalized
  statistic sum_j x_sj x_tj / sqrt(sum_j x_sj^2 x_tj^2 / (1 - h_j)),
  where h_j is the leverage of coordinate j in the canaries' span (it
  corrects for the projection): ~N(0, 1) for independent zero-mean noise
  of any per-coordinate scale, about sqrt(m / 3) for identical Gaussian
  noise. `reused` is
  max |z| > `threshold`, the two-sided Bonferroni bound at level `alpha`
  over the round pairs.
  """

  reused: bool
  max_abs_correlation: float
  max_abs_z: float
  threshold: float
  alpha: float
  correlations: np.ndarray
  z_scores: np.ndarray
  rounds: int
  residual_dim: int


def noise_reuse_check(
  aggregator: canary_rounds.Aggregator,
  *,
  dim: int,
  num_canaries: int,
  canary_norm: float,
  rounds: int = 2,
  seed: int = 0,
  shape: Optional[Sequence[int]] = None,
  alpha: float = 1e-3,
  probe: Optional[canary_rounds.Probe] = None,
  strategy: Optional[mf_strategy.Strategy] = None,
) -> NoiseReuseResult:
  """Checks that an aggregator's process draws fresh noise every round.

  Round t's clients are `num_canaries` canaries of their own (random
  directions at `canary_norm`) that take part in round t only. Each
  round's release is projected off the span of all `rounds *
  num_canaries` canary directions (their images, with a probe's
  `embed`); with fresh noise the residuals of two rounds are independent,
  while noise repeated (or negated) from round to round makes them
  (anti)correlated, and the rounds' difference would release the
  difference of their canaries free of noise. A mechanism that
  legitimately feeds its released aggregate into later rounds (server
  momentum, error feedback on released values) correlates too: check its
  fresh release with a probe.

  Args:
    aggregator: An unweighted aggregation factory over float32 tensors of
      `shape`, or a process created for them.
    dim: The number of scalars, > rounds * num_canaries (the residual has
      m - rounds * num_canaries dimensions, m the release's size;
      hundreds or more for power).
    num_canaries: Canaries per round, >= 1.
    canary_norm: The canaries' norm, > 0.
    rounds: Rounds, >= 2; every pair of rounds is compared.
    seed: Seeds the directions.
    shape: The tensor shape (default `[dim]`).
    alpha: The false-alarm probability for fresh noise, in (0, 1).
    probe: Where the check looks (default: each round's result).
    strategy: For noise correlated across rounds by design
      (`mf_strategy.Strategy`, `dp_fedavg.gaussian_fixed(noise=...)`): the
      residuals are whitened by C first (row t becomes `sum_j C[t, j]
      r_j`, the fresh draw `w_t` of a correct stream), so the correlation
      the strategy puts in passes and a stream whose draws repeat is
      still caught. Default None: the rounds' noise must be independent.

  Returns:
    A `NoiseReuseResult`; `reused` is the verdict. A round whose residual
    is exactly 0 (no noise outside the canaries' span) counts as reused
    noise: its difference from any round is noise-free.

  Raises:
    ValueError: On a bad argument, naming it and its allowed range.
  """
  _check_reuse_args(dim, num_canaries, rounds, canary_norm, alpha)
  probe = probe or canary_rounds.Probe()
  shape = canary_rounds.shape(shape, dim)
  rng = np.random.default_rng(seed)
  canaries = canary_rounds.unit_directions(rng, rounds * num_canaries, dim)
  cohorts = [
    canary_norm * canaries[t * num_canaries : (t + 1) * num_canaries]
    for t in range(rounds)
  ]
  images = canary_rounds.embedded(canaries, probe)
  basis, kept = _canary_span(images)
  releases, _ = canary_rounds.run_rounds(
    aggregator, shape, cohorts, probe, None
  )
  residuals = [r - basis @ (basis.T @ r) for r in releases]
  if strategy is not None:
    # The projection is the same linear map every round, so whitening
    # after it is whitening the releases' noise.
    residuals = list(strategy.matrix(rounds) @ np.stack(residuals))
  corr, z = _pairwise_statistics(residuals, kept)
  return _reuse_result(
    corr, z, rounds, alpha, images.shape[1] - rounds * num_canaries
  )


def _reuse_result(
  corr: np.ndarray, z: np.ndarray, rounds: int, alpha: float, residual_dim
) -> NoiseReuseResult:
  """`noise_reuse_check`'s verdict from every pair's (cosine, z): reused
  when max |z| exceeds the two-sided Bonferroni bound at `alpha`."""
  pairs = rounds * (rounds - 1) // 2
  threshold = float(stats.norm.isf(alpha / (2 * pairs)))
  off = ~np.eye(rounds, dtype=bool)
  max_z = float(np.max(np.abs(z[off])))
  return NoiseReuseResult(
    reused=bool(max_z > threshold),
    max_abs_correlation=float(np.max(np.abs(corr[off]))),
    max_abs_z=max_z,
    threshold=threshold,
    alpha=float(alpha),
    correlations=corr,
    z_scores=z,
    rounds=rounds,
    residual_dim=residual_dim,
  )


def _check_reuse_args(dim, num_canaries, rounds, canary_norm, alpha) -> None:
  """`noise_reuse_check`'s argument checks (ValueError naming the range)."""
  canary_rounds.check_ints(
    ('dim', dim, 1), ('num_canaries', num_canaries, 1), ('rounds', rounds, 2)
  )
  if not 0 < alpha < 1:
    raise ValueError(f'alpha must be in (0, 1). Found {alpha!r}.')
  canary_rounds.check_positive('canary_norm', canary_norm)
  if dim <= rounds * num_canaries:
    raise ValueError(
      f'dim must be > rounds * num_canaries = {rounds * num_canaries}. '
      f'Found {dim!r}.'
    )


def _canary_span(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """An orthonormal basis of the canaries' images, and 1 - leverage.

  Raises:
    ValueError: If the release has no more scalars than there are images.
  """
  if images.shape[1] <= images.shape[0]:
    raise ValueError(
      f'The release has {images.shape[1]} scalars: it must have more than '
      f'rounds * num_canaries = {images.shape[0]}.'
    )
  basis, _ = np.linalg.qr(images.T)
  # 1 - leverage: the share of a coordinate's variance the projection keeps.
  kept = np.maximum(1 - np.sum(basis**2, axis=1), 1e-12)
  return basis, kept


def _pairwise_statistics(
  residuals: Sequence[np.ndarray], kept: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """(cosines, self-normalized z) of every pair of rounds' residuals.

  `kept` is 1 - leverage per coordinate (`NoiseReuseResult`). A pair
  with a zero residual or scale counts as identical noise (1, inf).
  """
  rounds = len(residuals)
  corr = np.eye(rounds)
  z = np.zeros((rounds, rounds))
  for s in range(rounds):
    for t in range(s + 1, rounds):
      x, y = residuals[s], residuals[t]
      norms = np.linalg.norm(x) * np.linalg.norm(y)
      scale = math.sqrt(float(np.sum((x * y) ** 2 / kept)))
      if norms == 0 or scale == 0:
        corr[s, t], z[s, t] = 1.0, float('inf')
      else:
        corr[s, t] = float(x @ y) / norms
        z[s, t] = float(x @ y) / scale
      corr[t, s], z[t, s] = corr[s, t], z[s, t]
  return corr, z
