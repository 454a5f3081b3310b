"""DPSFL-AC's adaptive clip: its rule and the clip bit's noise.

`AdaptiveClip` holds the rule's parameters: each client sends the bit
b = 1[clipping impact on the previous top-k <= gamma] (the impact relative
or absolute, `IMPACT_RULES`), and the server moves the clip
C <- C exp(eta_C (p - p_hat)), p_hat = (sum_i b_i + N(0, sigma_b^2)) / n.
The bit's noise sigma_b defaults to the expected cohort / 20
(`default_bit_noise`); the round's sketch and bit Gaussians merge into one
(`merged_noise_multiplier`), and a warning is logged when the bit lowers it
below `BIT_NOISE_WARNING_RATIO` of the sketch's own. The factory is
`dpsfl.SketchAggregatorFactory` (`dpsfl.dpsfl_ac`).
"""

import dataclasses
import math
from typing import Optional

from absl import logging


IMPACT_RULES = ('relative', 'absolute')


# DPSFL-AC logs a warning when its clip bit's noise lowers the round's
# merged noise multiplier below this fraction of the sketch's own.
BIT_NOISE_WARNING_RATIO = 0.8


def merged_noise_multiplier(noise_multiplier: float, bit_noise: float) -> float:
  """The sketch and clip bit as one Gaussian: 1/z^2 = 1/z_s^2 + 1/sigma_b^2.

  (What the ledger's `privacy.merge_gaussians` records for the round.)
  """
  if noise_multiplier == 0 or bit_noise == 0:
    return 0.0
  return 1.0 / math.sqrt(noise_multiplier**-2 + bit_noise**-2)


def warn_if_bit_noise_dominates(
  noise_multiplier: float, adaptive: 'AdaptiveClip', clients_per_round: float
) -> None:
  if noise_multiplier == 0:
    return
  bit_noise = adaptive.bit_noise_multiplier
  merged = merged_noise_multiplier(noise_multiplier, bit_noise)
  if merged < BIT_NOISE_WARNING_RATIO * noise_multiplier:
    logging.warning(
      "DPSFL-AC: the clip bit's noise (sigma_b = %.4g; the default is the "
      "expected cohort / 20 = %.4g) lowers the round's merged noise "
      "multiplier to %.4g, %.0f%% of the sketch's own %.4g (below %.0f%%): "
      'the bit, not the sketch, dominates the privacy cost. Raise '
      '--dpsfl_bit_noise or the cohort.',
      bit_noise,
      default_bit_noise(clients_per_round),
      merged,
      100 * merged / noise_multiplier,
      noise_multiplier,
      100 * BIT_NOISE_WARNING_RATIO,
    )


def default_bit_noise(expected_clients_per_round: float) -> float:
  """sigma_b = expected clients / 20 (Andrew et al. 2021's choice)."""
  return expected_clients_per_round / 20.0


@dataclasses.dataclass(frozen=True)
class AdaptiveClip:
  """DPSFL-AC's adaptive clip.

  Attributes:
    target_probability: p in (0, 1): the wanted fraction of clients whose
      clipping impact on the previous top-k is at most `impact_threshold`.
    impact_threshold: gamma > 0 (< 1 for the relative rule).
    bit_noise_multiplier: sigma_b >= 0, the bit sum's noise stddev; None
      (default): expected clients per round / 20 (`default_bit_noise`),
      resolved by the factory from its `clients_per_round`.
    learning_rate: eta_C > 0 of the geometric update.
    impact_rule: 'relative' (||clip error on T|| / ||g_T||, the default) or
      'absolute' (||clip error on T||: the rows `dpsfl_ac` and
      `dpsfl_ac_gamma0.01` of benchmarks/results/seed002_emnist.md and
      seed002_cifar10.md, and the DPSFL-AC rows of
      benchmarks/results/method_cost.md, were recorded with it).
  """

  target_probability: float = 0.5
  impact_threshold: float = 0.1
  bit_noise_multiplier: Optional[float] = None
  learning_rate: float = 0.2
  impact_rule: str = 'relative'

  def resolved(self, clients_per_round: float) -> 'AdaptiveClip':
    """A copy with the default bit noise filled in from the cohort."""
    if self.bit_noise_multiplier is not None:
      return self
    return dataclasses.replace(
      self, bit_noise_multiplier=default_bit_noise(clients_per_round)
    )

  def check(self) -> None:
    if self.impact_rule not in IMPACT_RULES:
      raise ValueError(
        f'impact_rule must be one of {IMPACT_RULES}. Found '
        f'{self.impact_rule!r}.'
      )
    if self.impact_rule == 'relative' and not self.impact_threshold < 1:
      raise ValueError(
        'impact_threshold must be in (0, 1) for the relative rule (a '
        'relative clipping error is at most 1, so gamma >= 1 always '
        f'passes). Found {self.impact_threshold!r}.'
      )
    p = self.target_probability
    if not (isinstance(p, (int, float)) and 0 < p < 1):
      raise ValueError(f'target_probability must be in (0, 1). Found {p!r}.')
    if not self.impact_threshold > 0:
      raise ValueError(
        f'impact_threshold must be > 0. Found {self.impact_threshold!r}.'
      )
    if (
      self.bit_noise_multiplier is not None
      and not self.bit_noise_multiplier >= 0
    ):
      raise ValueError(
        'bit_noise_multiplier must be >= 0. Found '
        f'{self.bit_noise_multiplier!r}.'
      )
    if not self.learning_rate > 0:
      raise ValueError(
        f'learning_rate must be > 0. Found {self.learning_rate!r}.'
      )
