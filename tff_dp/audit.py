"""One-shot empirical privacy estimate with canary clients.

After Andrew et al., "One-shot Empirical Privacy Estimation for Federated
Learning" (ICLR 2024): k canary clients each send a fixed random direction
u_i (unit vectors in the model space, scaled to `canary_norm`, so clipped
to the clip) in every round they take part; after training, the final
model delta is projected on each canary's direction and on k fresh null
directions that never took part. If the mechanism is mu-GDP for one
client, the observed projections are shifted by about mu null standard
deviations; the estimate fits both as Gaussians, takes
mu_hat = (mean observed - mean null) / std null and converts it to
epsilon at delta with the Gaussian-DP curve (Dong, Roth, Su 2019):
delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2).

This is an estimate, not a proof: for a correct mechanism it must not
exceed the ledger's epsilon (beyond sampling error), and a mechanism that
adds less noise, or does not clip, than the ledger assumes shows up as an
estimate above the ledger's (`tests/tff_dp/audit_test.py` plants both).
Here it runs directly on an aggregation process (the part of a round that
must be private), with the canaries as the only clients of every round:
the setting of Andrew et al.'s "final model" statistic with full
participation.
"""

import dataclasses

import numpy as np
from scipy import optimize
from scipy import stats
import tensorflow_federated as tff


def gdp_epsilon(mu: float, delta: float) -> float:
  """Epsilon of a mu-GDP mechanism at delta (0 if mu <= 0)."""
  if not 0 < delta < 1:
    raise ValueError(f'delta must be in (0, 1). Found {delta!r}.')
  if mu <= 0:
    return 0.0

  def gap(eps):
    return (
      stats.norm.cdf(-eps / mu + mu / 2)
      - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
      - delta
    )

  if gap(0.0) <= 0:
    return 0.0
  hi = 1.0
  while gap(hi) > 0:
    hi *= 2
    if hi > 1e4:
      return float('inf')
  return float(optimize.brentq(gap, 0.0, hi))


@dataclasses.dataclass(frozen=True)
class AuditResult:
  epsilon_estimate: float
  mu_estimate: float
  observed_mean: float
  null_mean: float
  null_std: float
  num_canaries: int
  rounds: int


def audit_aggregator(
  factory: tff.aggregators.UnweightedAggregationFactory,
  *,
  dim: int,
  num_canaries: int,
  rounds: int,
  canary_norm: float,
  delta: float,
  seed: int = 0,
  shape=None,
) -> AuditResult:
  """Runs `rounds` of `factory` on canaries only; estimates epsilon.

  Args:
    factory: An unweighted aggregator over float32 tensors of `shape`.
    dim: The number of scalars (canary directions are nearly orthogonal
      when dim >> num_canaries).
    num_canaries: k >= 2 canaries (and k null directions).
    rounds: Rounds, >= 1; every canary takes part in each.
    canary_norm: The canaries' norm (at or above the clip).
    delta: The delta of the estimate.
    seed: Seeds the directions.
    shape: The tensor shape (default `[dim]`), e.g. a matrix for CMP-Fed.
  """
  for name, value, low in (
    ('dim', dim, 1),
    ('num_canaries', num_canaries, 2),
    ('rounds', rounds, 1),
  ):
    if not isinstance(value, (int, np.integer)) or value < low:
      raise ValueError(f'{name} must be an integer >= {low}. Found {value!r}.')
  rng = np.random.default_rng(seed)
  directions = rng.standard_normal((2 * num_canaries, dim))
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  canaries, null = directions[:num_canaries], directions[num_canaries:]
  shape = list(shape) if shape is not None else [dim]
  if int(np.prod(shape)) != dim:
    raise ValueError(f'shape {shape} must hold dim={dim} scalars.')
  process = factory.create(tff.TensorType(np.float32, shape))
  state = process.initialize()
  total = np.zeros(dim)
  values = [
    (canary_norm * u).astype(np.float32).reshape(shape) for u in canaries
  ]
  for _ in range(rounds):
    out = process.next(state, values)
    state = out.state
    total += np.asarray(out.result, np.float64).ravel()
  observed = canaries @ total
  nulls = null @ total
  null_std = float(np.std(nulls, ddof=1))
  mu = float((observed.mean() - nulls.mean()) / max(null_std, 1e-30))
  return AuditResult(
    epsilon_estimate=gdp_epsilon(mu, delta),
    mu_estimate=mu,
    observed_mean=float(observed.mean()),
    null_mean=float(nulls.mean()),
    null_std=null_std,
    num_canaries=num_canaries,
    rounds=rounds,
  )
