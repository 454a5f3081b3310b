"""Accountants: dp_accounting's RDP and PLD accountants, extended to the
events known only by an RDP curve (DDGauss's), with the subsampled-RDP
bounds they need (`subsampled_rdp`: Poisson, Zhu & Wang 2019, Thm 6;
fixed-size under replace-one, Wang, Balle & Kasiviswanathan 2019, Thm 9).
"""

import functools
import math
from typing import Callable

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
from scipy import special

from tff_dp.privacy import events


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
  return (
    special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
  )


def _log_sum_exp(x: np.ndarray) -> float:
  """log(sum(exp(x))), as max + log1p(rest): the CGF bounds are often
  log(1 + tiny), which `scipy.special.logsumexp` rounds at 1e-16 absolute."""
  i = int(np.argmax(x))
  rest = np.delete(x, i) - x[i]
  return float(x[i] + np.log1p(np.sum(np.exp(rest))))


def _poisson_cgf_bound(q: float, curve, alpha: int) -> float:
  """Zhu & Wang 2019, Theorem 6 (general upper bound), as a CGF.

  (alpha - 1) times the RDP at integer alpha >= 2 of the Poisson-sampled
  mechanism (rate 0 < q < 1, add/remove-one) whose RDP is at most eps(j):
    log[(1 - q)^(alpha - 1) (1 + (alpha - 1) q)
        + C(alpha, 2) q^2 (1 - q)^(alpha - 2) e^eps(2)
        + 3 sum_{j=3}^alpha C(alpha, j) q^j (1 - q)^(alpha - j)
          e^((j - 1) eps(j))].
  The 3 is the theorem's (its bound is tight up to log(3) / (alpha - 1));
  Kairouz et al.'s own accountant (google-research/federated,
  distributed_dp/accounting_utils.py) uses the same expression.
  """
  j = np.arange(2, alpha + 1)
  log_q, log_1mq = math.log(q), math.log1p(-q)
  terms = _log_comb(alpha, j) + j * log_q + (alpha - j) * log_1mq
  terms = terms + (j - 1) * curve(j)
  terms[1:] += math.log(3.0)
  first = (alpha - 1) * log_1mq + math.log1p((alpha - 1) * q)
  return _log_sum_exp(np.concatenate([[first], terms]))


def _wor_cgf_bound(q: float, curve, alpha: int) -> float:
  """Wang, Balle & Kasiviswanathan 2019, Theorem 9, as a CGF.

  (alpha - 1) times the RDP at integer alpha >= 2 of a mechanism with RDP
  at most eps(j) run on m = q N of N records drawn without replacement,
  under replace-one:
    log[1 + q^2 C(alpha, 2) min(4 (e^eps(2) - 1),
                                e^eps(2) min(2, (e^eps(inf) - 1)^2))
        + sum_{j=3}^alpha q^j C(alpha, j) e^((j - 1) eps(j))
          min(2, (e^eps(inf) - 1)^j)],
  here with eps(inf) = inf (a Gaussian-like curve has no pure-DP bound),
  so both min(2, ...) are 2.
  """
  j = np.arange(2, alpha + 1)
  eps = curve(j)
  log_q = math.log(q)
  e2 = float(eps[0])
  t2 = (
    2 * log_q
    + float(_log_comb(alpha, np.array(2)))
    + min(math.log(4.0) + e2 + math.log(-math.expm1(-e2)), e2 + math.log(2.0))
  )
  rest = (
    math.log(2.0)
    + j[1:] * log_q
    + _log_comb(alpha, j[1:])
    + (j[1:] - 1) * eps[1:]
  )
  return _log_sum_exp(np.concatenate([[0.0, t2], rest]))


def subsampled_rdp(
  curve: Callable[[np.ndarray], np.ndarray],
  q: float,
  orders,
  scheme: str,
) -> np.ndarray:
  """RDP of a subsampled mechanism known only by an upper curve eps(alpha).

  Generic bounds (valid for any mechanism whose RDP is at most `curve`):
  `scheme` 'poisson' (add/remove-one) by Zhu & Wang 2019 Theorem 6,
  'without_replacement' (replace-one; q = m / N) by Wang, Balle &
  Kasiviswanathan 2019 Theorem 9 with eps(inf) = inf. Both are computed as
  cumulant bounds K(alpha) at integer orders, each capped by the unsampled
  (alpha - 1) eps(alpha) (subsampling never hurts: joint convexity); a
  fractional order interpolates K linearly between its neighbouring
  integers (K is convex, K(1) = 0; WBK19 Corollary 10) and is capped by
  eps(alpha) too.

  Args:
    curve: eps(alpha) of the unsampled mechanism, vectorized over orders.
    q: Sampling probability (Poisson) or m / N, in [0, 1].
    orders: RDP orders, each > 1.
    scheme: 'poisson' or 'without_replacement'.

  Returns:
    The RDP at each order.

  Raises:
    ValueError: On a bad `q`, order or `scheme`.
  """
  bounds = {
    'poisson': _poisson_cgf_bound,
    'without_replacement': _wor_cgf_bound,
  }
  if scheme not in bounds:
    raise ValueError(
      f'scheme must be one of {sorted(bounds)}. Found {scheme!r}.'
    )
  if not 0 <= q <= 1:
    raise ValueError(f'q must be in [0, 1]. Found {q!r}.')
  orders = np.asarray(orders, np.float64)
  if not np.all(orders > 1) or not np.all(np.isfinite(orders)):
    raise ValueError(f'orders must be finite and > 1. Found {orders!r}.')
  if q == 0:
    return np.zeros_like(orders)
  if q == 1:
    return np.asarray(curve(orders), np.float64)
  cgf = {1: 0.0}
  for a in sorted(
    {math.floor(a) for a in orders} | {math.ceil(a) for a in orders}
  ):
    if a >= 2:
      unsampled = (a - 1) * float(curve(np.array([a], np.float64))[0])
      cgf[a] = min(bounds[scheme](q, curve, a), unsampled)
  out = []
  for a in orders:
    lo, hi = math.floor(a), math.ceil(a)
    t = a - lo
    k = cgf[lo] if lo == hi else (1 - t) * cgf[lo] + t * cgf[hi]
    out.append(min(k / (a - 1), float(curve(np.array([a]))[0])))
  return np.array(out)


@functools.lru_cache(maxsize=16)
def _subsampled_gaussian_pld(
  noise_multiplier: float, sampling_probability: float, interval: float
):
  """One Poisson-sampled Gaussian's PLD, as dp_accounting builds it.

  Building it is most of an epsilon's cost (about 0.5 s here) and does not
  depend on the round count; `PrivacyLossDistribution`s are immutable, so
  one object serves every round.
  """
  return pld.privacy_loss_distribution.from_gaussian_mechanism(
    standard_deviation=noise_multiplier,
    value_discretization_interval=interval,
    sampling_prob=sampling_probability,
  )


class PldAccountant(pld.PLDAccountant):
  """dp_accounting's PLD accountant, with the sampled Gaussian's PLD built
  once per (multiplier, sampling rate) and self-composed for each count.

  The same PLD objects and operations as `pld.PLDAccountant`, so the same
  epsilon to the bit (tested); only the rebuilding each round is saved.
  """

  def _maybe_compose(self, event, count, do_compose):
    if (
      do_compose
      and isinstance(event, dp_accounting.PoissonSampledDpEvent)
      and isinstance(event.event, dp_accounting.GaussianDpEvent)
      and self.neighboring_relation
      == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
      and event.sampling_probability != 0
      and event.event.noise_multiplier != 0
    ):
      base = _subsampled_gaussian_pld(
        event.event.noise_multiplier,
        event.sampling_probability,
        self._value_discretization_interval,
      )
      self._pld = self._pld.compose(base.self_compose(count))
      return None
    return super()._maybe_compose(event, count, do_compose)


class RdpAccountant(rdp.RdpAccountant):
  """dp_accounting's RDP accountant that also composes `CURVE_EVENTS`.

  A curve event, alone or as the inner event of a `PoissonSampledDpEvent`
  (add/remove-one) or `SampledWithoutReplacementDpEvent` (replace-one), is
  accounted with `subsampled_rdp`; every other event as dp_accounting does.
  Epsilon is dp_accounting's conversion (`get_epsilon`).
  """

  def _maybe_compose(self, event, count, do_compose):
    relation = dp_accounting.NeighboringRelation
    inner = getattr(event, 'event', None)
    if isinstance(event, events.CURVE_EVENTS):
      values = lambda: event.rdp(self._orders)
    elif isinstance(event, dp_accounting.PoissonSampledDpEvent) and isinstance(
      inner, events.CURVE_EVENTS
    ):
      if self._neighboring_relation is not relation.ADD_OR_REMOVE_ONE:
        return self.CompositionErrorDetails(
          invalid_event=event,
          error_message='PoissonSampledDpEvent needs ADD_OR_REMOVE_ONE.',
        )
      values = lambda: subsampled_rdp(
        inner.rdp, event.sampling_probability, self._orders, 'poisson'
      )
    elif isinstance(
      event, dp_accounting.SampledWithoutReplacementDpEvent
    ) and isinstance(inner, events.CURVE_EVENTS):
      if self._neighboring_relation is not relation.REPLACE_ONE:
        return self.CompositionErrorDetails(
          invalid_event=event,
          error_message='SampledWithoutReplacementDpEvent needs REPLACE_ONE.',
        )
      values = lambda: subsampled_rdp(
        inner.rdp,
        event.sample_size / event.source_dataset_size,
        self._orders,
        'without_replacement',
      )
    else:
      return super()._maybe_compose(event, count, do_compose)
    if do_compose:
      self._rdp += count * values()
    return None
