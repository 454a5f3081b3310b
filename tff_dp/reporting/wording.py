"""The words every plot shares: a test metric's axis label, unit and scale
(`metric_axis_label`), a rate or delta as a reader writes it
(`format_probability`), how a run sampled its clients (`sampling_words`) and
why a run's epsilon is not comparable with the others' (`epsilon_caveat`).
"""

import math
from typing import Any, Mapping, Optional

from tff_dp import methods


# A metric's axis words, unit and the factor from its stored value.
_METRIC_AXES = {
  'test_accuracy': ('test accuracy', '%', 100.0),
  'test_balanced_accuracy': ('test balanced accuracy', '%', 100.0),
  'test_auroc': ('test AUROC', '0.5 = chance, 1 = perfect', 1.0),
}


def metric_axis_label(metric: str) -> str:
  """'test accuracy (%)': the metric named with its unit."""
  words, unit, _ = _METRIC_AXES[metric]
  return f'{words} ({unit})'


def scale(metric: str) -> float:
  """The factor from `metric`'s stored values to its axis (100 for %)."""
  return _METRIC_AXES[metric][2]


def number(value: Any) -> Optional[float]:
  """A finite float, or None for '', None, NaN and non-numbers."""
  if isinstance(value, bool):
    return None
  try:
    v = float(value)
  except (TypeError, ValueError):
    return None
  return v if math.isfinite(v) else None


def format_probability(p: float) -> str:
  """A rate or delta as a reader writes it: '0.1', '1/60', '1e-4'."""
  n = round(1 / p) if p > 0 else 0
  exact = n > 0 and abs(n * p - 1) < 1e-4
  power_of_ten = exact and n > 1 and 10 ** round(math.log10(n)) == n
  if p >= 0.05 or (power_of_ten and p >= 0.01) or not exact or n == 1:
    return f'{p:.3g}'
  if power_of_ten:
    return f'1e-{round(math.log10(n))}'
  return f'1/{n}'


def sampling_words(flags: Mapping[str, Any]) -> str:
  """How a run sampled its clients each round, from its flags."""
  participation = str(flags.get('participation') or 'independent')
  per_round = number(flags.get('clients_per_round'))
  rate = number(flags.get('client_sampling_rate'))
  # Balanced groups: the epsilon holds for zero-out neighbouring only.
  zero_out = (
    ', zero-out' if flags.get('participation_partition') == 'balanced' else ''
  )
  if participation == 'cyclic_poisson':
    return f'cyclic Poisson{zero_out}, q = {format_probability(rate)}'
  if participation == 'cyclic':
    return f'cyclic (min-separation{zero_out}), q = {format_probability(rate)}'
  if per_round:
    return f'fixed cohorts of {per_round:g}'
  if rate is None:
    return 'sampling not recorded'
  return f'Poisson q = {format_probability(rate)}'


# A row whose table (or summary) says its epsilon is not a rigorous
# guarantee, for a reason the flags do not show.
TABLE_CAVEAT = 'ε not rigorous: see its guarantee caveat'


def epsilon_caveat(flags: Mapping[str, Any]) -> str:
  """Why a private run's epsilon is not comparable with the others', or ''.

  A method whose round reveals the cohort's count
  (`Method.reveals_cohort_size`: DDGauss) under Poisson sampling: the
  subsampling bound assumes the count hidden (`privacy.assumptions`;
  benchmarks/results/ddgauss_reaccounting.md), so its epsilon is not
  rigorous.
  """
  method = methods.METHODS.get(flags.get('method'))
  if (
    method is not None
    and method.reveals_cohort_size
    and sampling_words(flags).startswith('Poisson')
  ):
    return 'Poisson: ε not rigorous'
  return ''
