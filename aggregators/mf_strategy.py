"""Matrix-factorisation strategies for noise correlated across rounds.

DP-FTRL's matrix factorisation (Choquette-Choo et al., "Multi-epoch matrix
factorization mechanisms for private machine learning", ICML 2023,
https://arxiv.org/abs/2211.06530) releases at round t the clipped sum of
round t plus `sigma * (C^-1 w)_t`, with `w_t` fresh Gaussian draws and `C` a
lower-triangular strategy matrix. The whole stream is then a
post-processing of `C x + sigma w` (`x + sigma C^-1 w = C^-1 (C x + sigma
w)`), a Gaussian mechanism whose L2 sensitivity is that of `C x`: the
norm of the sum of the columns of `C` at the rounds where one client took
part, times the clip. `C = I` is DP-FedAvg.

Here `C` is lower-triangular Toeplitz, given by its first column
`c = (c_0, c_1, ...)`; its inverse is lower-triangular Toeplitz too, with
first column `d` (`C d = e_0`), and the noise `y = C^-1 w` solves `C y = w`
one round at a time. Two families:

* **Banded** (`banded`): `c_j = 0` for `j >= bands`; `y_t = (w_t -
  sum_{j=1}^{bands-1} c_j y_{t-j}) / c_0` keeps the last `bands - 1` noise
  vectors (Choquette-Choo et al., "(Amplified) banded matrix factorization:
  a unified approach to private training", NeurIPS 2023,
  https://arxiv.org/abs/2306.08153). `bands = 1` is DP-FedAvg.
* **BLT** (`blt`): `C` is a buffered linear Toeplitz matrix, first column
  `(1, sum_i omega_i theta_i^(k-1) for k >= 1)`, and `C y = w` is solved
  with one buffer of past noise per (theta_i, omega_i) (Dvijotham et al.,
  "Efficient and near-optimal noise generation for streaming differential
  privacy", FOCS 2024, https://arxiv.org/abs/2404.16706).

Sensitivity (`sensitivity`): participations at least `separation` rounds
apart, at most `max_participations` of them. The maximum over such
patterns of `||sum_{t in P} C[:, t]||` (one clip per participation, the
clipped vectors aligned, which is the worst case when every inner product
of two columns is >= 0):

* where `separation >= ` the strategy's bands, no two columns of a pattern
  overlap and the maximum is attained by the pattern `0, s, 2s, ...` (the
  longest columns), whatever the signs;
* otherwise, for non-negative, non-increasing `c` (checked; refused
  otherwise), also by `0, s, 2s, ...`. Proof: write `G(s, t) = <C[:, s],
  C[:, t]> = sum_{m=0}^{n-1-t} c_{m+t-s} c_m` for `s <= t`. Every term is
  >= 0, so `G` grows with the remaining length `n - 1 - t`, and it does not
  grow with the gap `t - s` because `c` is non-increasing. A pattern `p_1 <
  ... < p_k` with gaps >= `s` has `p_i >= (i-1) s` and `p_j - p_i >= (j-i)
  s`, so each term `G(p_i, p_j)` of `||C 1_P||^2 = sum_{i,j} G(p_i, p_j)` is
  at most `G((i-1)s, (j-1)s)`, the greedy pattern's term, and the greedy
  pattern has at least as many elements. (`brute_force_sensitivity` checks
  this over every pattern in the tests.)

Everything here is NumPy/SciPy on the strategy's coefficients; the noise
itself is generated inside the aggregator from its secret seed.
"""

import dataclasses
import itertools
import math
from typing import Optional, Sequence

import numpy as np
from scipy import optimize
from scipy import signal

# Strategy families.
BANDED, BLT = 'banded', 'blt'


@dataclasses.dataclass(frozen=True)
class Strategy:
  """A lower-triangular Toeplitz strategy `C` (`banded` or `blt` build it).

  Attributes:
    kind: `BANDED` or `BLT`.
    coefficients: BANDED: `c_0..c_{bands-1}`, the first column of `C`.
    theta: BLT: the buffers' decays, each in [0, 1).
    omega: BLT: the buffers' weights in `C`'s column.
  """

  kind: str
  coefficients: tuple[float, ...] = ()
  theta: tuple[float, ...] = ()
  omega: tuple[float, ...] = ()

  @property
  def bands(self) -> Optional[int]:
    """The number of bands of a banded strategy; None for BLT (dense)."""
    return len(self.coefficients) if self.kind == BANDED else None

  def column(self, horizon: int) -> np.ndarray:
    """The first column of `C`, rounds 0..horizon-1."""
    _check_horizon(horizon)
    if self.kind == BANDED:
      c = np.zeros(horizon)
      b = min(horizon, len(self.coefficients))
      c[:b] = self.coefficients[:b]
      return c
    num, den = _blt_transfer(self.theta, self.omega)
    return signal.lfilter(num, den, _impulse(horizon))

  def inverse_column(self, horizon: int) -> np.ndarray:
    """The first column of `C^-1` (the noise generator), rounds
    0..horizon-1: `(C^-1 w)_t = sum_k d_k w_{t-k}`."""
    _check_horizon(horizon)
    if self.kind == BANDED:
      return signal.lfilter([1.0], self.coefficients, _impulse(horizon))
    num, den = _blt_transfer(self.theta, self.omega)
    return signal.lfilter(den, num, _impulse(horizon))

  def matrix(self, horizon: int) -> np.ndarray:
    """`C` as a dense horizon x horizon matrix (for tests and small n)."""
    return _toeplitz(self.column(horizon))

  def noise(self, draws: np.ndarray) -> np.ndarray:
    """`C^-1 w` for draws `w` of shape (rounds, ...): the NumPy reference of
    what `aggregators.correlated_noise` streams round by round."""
    w = np.asarray(draws, np.float64)
    if self.kind == BANDED:
      return signal.lfilter([1.0], self.coefficients, w, axis=0)
    num, den = _blt_transfer(self.theta, self.omega)
    return signal.lfilter(den, num, w, axis=0)

  def to_dict(self) -> dict:
    """JSON-ready: what the run's summary records."""
    out = {'kind': self.kind}
    if self.kind == BANDED:
      out['bands'] = self.bands
      out['coefficients'] = list(self.coefficients)
    else:
      out['buffers'] = len(self.theta)
      out['theta'] = list(self.theta)
      out['omega'] = list(self.omega)
    return out

  @classmethod
  def from_dict(cls, d: dict) -> 'Strategy':
    """The strategy `to_dict` wrote, exactly (JSON floats round-trip).

    Raises:
      ValueError: On another kind, a size that does not match its values,
        or values `banded` / `blt` refuse.
    """
    kind = d.get('kind')
    if kind == BANDED:
      s = banded(d['coefficients'])
      size, found = d.get('bands'), s.bands
    elif kind == BLT:
      s = blt(d['theta'], d['omega'])
      size, found = d.get('buffers'), len(s.theta)
    else:
      raise ValueError(
        f"A strategy's kind must be {BANDED!r} or {BLT!r}. Found {kind!r}."
      )
    if size != found:
      raise ValueError(
        f'A {kind} strategy of size {size!r} has {found} values: {d!r}.'
      )
    return s


def banded(coefficients: Sequence[float]) -> Strategy:
  """A banded strategy from `c_0..c_{b-1}` (`c_0 > 0`, all finite).

  Raises:
    ValueError: On an empty, non-finite or non-positive-leading column.
  """
  c = tuple(float(v) for v in coefficients)
  if not c:
    raise ValueError('A banded strategy needs at least one coefficient.')
  if not all(math.isfinite(v) for v in c):
    raise ValueError(f'Strategy coefficients must be finite. Found {c!r}.')
  if c[0] <= 0:
    raise ValueError(f'c_0 must be > 0. Found {c[0]!r}.')
  return Strategy(BANDED, coefficients=c)


def blt(theta: Sequence[float], omega: Sequence[float]) -> Strategy:
  """A BLT strategy `C` with first column `(1, sum_i omega_i
  theta_i^(k-1) for k >= 1)`: non-negative and non-increasing where every
  omega is >= 0 and they sum to at most 1.

  Raises:
    ValueError: If the lengths differ, a theta is outside [0, 1), or a
      value is not finite.
  """
  theta = tuple(float(v) for v in theta)
  omega = tuple(float(v) for v in omega)
  if len(theta) != len(omega) or not theta:
    raise ValueError(
      'theta and omega must be non-empty and of one length. Found '
      f'{len(theta)} and {len(omega)}.'
    )
  if not all(math.isfinite(v) for v in theta + omega):
    raise ValueError(
      f'BLT parameters must be finite. Found {theta!r}, {omega!r}.'
    )
  bad = [t for t in theta if not 0 <= t < 1]
  if bad:
    raise ValueError(f'Every theta must be in [0, 1). Found {bad!r}.')
  return Strategy(BLT, theta=theta, omega=omega)


def identity() -> Strategy:
  """`C = I`: independent noise each round (DP-FedAvg)."""
  return banded([1.0])


def sensitivity(
  strategy: Strategy,
  horizon: int,
  separation: int,
  max_participations: Optional[int] = None,
) -> float:
  """The L2 sensitivity of `C x` for one client with clip 1.

  The maximum over participation patterns (at most `max_participations`
  rounds in 0..horizon-1, at least `separation` apart) of `||C 1_P||`,
  attained by `0, separation, 2 separation, ...` (module docstring).

  Args:
    strategy: The strategy.
    horizon: Rounds n >= 1.
    separation: Minimum gap between a client's participations, >= 1.
    max_participations: At most this many (default: as many as fit,
      `ceil(horizon / separation)`).

  Raises:
    ValueError: On a bad argument, or if the strategy overlaps across the
      separation (`bands > separation`, or BLT) and its column is not
      non-negative and non-increasing, where the greedy pattern is not
      known to be the worst.
  """
  _check_horizon(horizon)
  if not isinstance(separation, int) or separation < 1:
    raise ValueError(
      f'separation must be an integer >= 1. Found {separation!r}.'
    )
  fit = -(-horizon // separation)
  k = fit if max_participations is None else max_participations
  if not isinstance(k, int) or k < 1:
    raise ValueError(
      f'max_participations must be an integer >= 1. Found {k!r}.'
    )
  k = min(k, fit)
  c = strategy.column(horizon)
  if strategy.bands is None or strategy.bands > separation:
    tol = 1e-12 * max(1.0, abs(c[0]))
    if np.any(c < -tol) or np.any(np.diff(c) > tol):
      raise ValueError(
        'The strategy overlaps across the separation and its column is not '
        'non-negative and non-increasing over the horizon, so the greedy '
        'pattern is not known to be the worst: use separation >= bands. '
        f'Column (first 8): {np.round(c[:8], 6).tolist()}.'
      )
  return _pattern_norm(c, [i * separation for i in range(k)])


def brute_force_sensitivity(
  strategy: Strategy,
  horizon: int,
  separation: int,
  max_participations: Optional[int] = None,
) -> float:
  """`sensitivity` by enumerating every allowed pattern (clipped vectors
  aligned), for tests and small horizons (at most 2^horizon patterns)."""
  _check_horizon(horizon)
  if horizon > 20:
    raise ValueError(f'brute force needs horizon <= 20. Found {horizon}.')
  fit = -(-horizon // separation)
  k = fit if max_participations is None else min(max_participations, fit)
  c = strategy.column(horizon)
  best = 0.0
  for size in range(1, k + 1):
    for pattern in itertools.combinations(range(horizon), size):
      if all(b - a >= separation for a, b in zip(pattern, pattern[1:])):
        best = max(best, _pattern_norm(c, list(pattern)))
  return best


def workload_column(horizon: int, momentum: float = 0.0) -> np.ndarray:
  """First column of the workload `A`: the model's dependence on each
  round's noisy sum under server SGD with `momentum` (prefix sums at 0):
  `a_k = sum_{j<=k} momentum^j`."""
  _check_horizon(horizon)
  if not 0 <= momentum < 1:
    raise ValueError(f'momentum must be in [0, 1). Found {momentum!r}.')
  return np.cumsum(momentum ** np.arange(horizon))


def expected_error(
  strategy: Strategy,
  horizon: int,
  momentum: float = 0.0,
  separation: int = 1,
  max_participations: Optional[int] = None,
) -> float:
  """`||A C^-1||_F^2 sens(C)^2 / horizon`: the mean squared error per
  round of the workload's noise per unit noise multiplier, with the
  sensitivity for the participation schema (one column for amplified
  banded MF: `max_participations=1`)."""
  e = np.convolve(
    workload_column(horizon, momentum), strategy.inverse_column(horizon)
  )[:horizon]
  frob = float(np.sum((horizon - np.arange(horizon)) * e**2))
  sens = sensitivity(strategy, horizon, separation, max_participations)
  return frob * sens**2 / horizon


def sqrt_prefix_coefficients(bands: int) -> np.ndarray:
  """The first `bands` coefficients of the square root of the prefix-sum
  matrix, `binom(2k, k) / 4^k` (non-negative and decreasing)."""
  k = np.arange(bands)
  log = (
    np.vectorize(math.lgamma)(2 * k + 1)
    - 2 * np.vectorize(math.lgamma)(k + 1)
    - k * math.log(4)
  )
  return np.exp(log)


def optimize_banded(
  bands: int, horizon: int, momentum: float = 0.0
) -> Strategy:
  """The `bands`-banded strategy minimising `expected_error` for one
  participation per `bands` rounds (`separation = bands`).

  Starts from the banded square root of the workload
  (`sqrt_prefix_coefficients`) and runs L-BFGS over `c_1..c_{b-1}` with
  `c_0 = 1` (the error is scale-free); the result is normalised to a unit
  column. Deterministic.
  """
  if not isinstance(bands, int) or bands < 1:
    raise ValueError(f'bands must be an integer >= 1. Found {bands!r}.')
  _check_horizon(horizon)
  if bands > horizon:
    raise ValueError(
      f'bands must be <= the horizon ({horizon}). Found {bands}.'
    )
  if bands == 1:
    return identity()

  def loss(free):
    s = banded(np.concatenate([[1.0], free]))
    return math.log(expected_error(s, horizon, momentum, bands, 1))

  start = sqrt_prefix_coefficients(bands)[1:]
  best = optimize.minimize(loss, start, method='L-BFGS-B')
  c = np.concatenate([[1.0], best.x if best.fun < loss(start) else start])
  return banded(c / np.linalg.norm(c))


def optimize_blt(
  buffers: int,
  horizon: int,
  momentum: float = 0.0,
  separation: int = 1,
  max_participations: Optional[int] = None,
) -> Strategy:
  """The `buffers`-buffer BLT strategy minimising `expected_error` under
  min-separation participation (`separation`, `max_participations`).

  The search keeps the column non-negative and non-increasing (every
  theta in (0, 1), every omega >= 0, their sum <= 1), where `sensitivity`'s
  greedy pattern is proven worst: theta_i = sigmoid(a_i), omega_i =
  sigmoid(b_i) / buffers. Nelder-Mead from three spreads of decays (the
  best kept); deterministic.

  Raises:
    ValueError: On a bad argument, naming it.
  """
  if not isinstance(buffers, int) or buffers < 1:
    raise ValueError(f'buffers must be an integer >= 1. Found {buffers!r}.')
  _check_horizon(horizon)

  def strategy_of(x):
    a, b = np.clip(x[:buffers], -40, 40), np.clip(x[buffers:], -40, 40)
    theta = 1.0 / (1.0 + np.exp(-a))
    omega = 1.0 / (1.0 + np.exp(-b)) / buffers
    return blt(np.minimum(theta, 1 - 1e-9), omega)

  def loss(x):
    s = strategy_of(x)
    return math.log(
      expected_error(s, horizon, momentum, separation, max_participations)
    )

  best = None
  for top in (0.9, 0.99, 0.999):
    theta0 = np.linspace(top, 0.5, buffers) if buffers > 1 else [top]
    x0 = np.concatenate(
      [np.log(np.array(theta0) / (1 - np.array(theta0))), np.zeros(buffers)]
    )
    res = optimize.minimize(
      loss,
      x0,
      method='Nelder-Mead',
      options={'maxiter': 400 * buffers, 'xatol': 1e-6, 'fatol': 1e-9},
    )
    if best is None or res.fun < best.fun:
      best = res
  return strategy_of(best.x)


def _pattern_norm(c: np.ndarray, pattern: list[int]) -> float:
  n = len(c)
  total = np.zeros(n)
  for p in pattern:
    total[p:] += c[: n - p]
  return float(np.linalg.norm(total))


def _blt_transfer(theta, omega):
  """`C(z) = 1 + sum_i omega_i z^-1 / (1 - theta_i z^-1)` as (num, den)."""
  den = np.array([1.0])
  for t in theta:
    den = np.convolve(den, [1.0, -t])
  num = den.copy()
  for i, w in enumerate(omega):
    others = np.array([1.0])
    for j, u in enumerate(theta):
      if j != i:
        others = np.convolve(others, [1.0, -u])
    term = np.concatenate([[0.0], w * others])
    num = num + np.pad(term, (0, len(num) - len(term)))
  return num, den


def _impulse(n: int) -> np.ndarray:
  e = np.zeros(n)
  e[0] = 1.0
  return e


def _toeplitz(column: np.ndarray) -> np.ndarray:
  n = len(column)
  out = np.zeros((n, n))
  for k in range(n):
    out[np.arange(k, n), np.arange(n - k)] = column[k]
  return out


def _check_horizon(horizon) -> None:
  if not isinstance(horizon, (int, np.integer)) or horizon < 1:
    raise ValueError(f'horizon must be an integer >= 1. Found {horizon!r}.')
