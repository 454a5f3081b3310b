"""A run's noise across rounds and its participation groups, from its settings.

`--noise` (iid, banded, blt), `--bands`, `--blt_buffers`, `--participation`
and `--participation_groups` (`settings.RunSettings`) resolve here, before
the noise is calibrated, into the strategy the aggregator streams
(`aggregators.mf_strategy`) and the number of groups the sampler cycles
through (`tff_dp.sampling`). The strategy is optimised at setup for the
workload of the server's optimiser (SGD with `--server_momentum`) over
`--rounds`; `--bands=auto` picks the number of bands by the expected error
at the target epsilon (`mf_accounting.choose_bands`).
"""

import dataclasses
import math
from typing import Optional

from tff_dp import mf_accounting
from tff_dp.aggregators import mf_strategy

# --bands=auto's candidates (those that fit the rate and the rounds).
AUTO_BANDS = (1, 2, 4, 8, 16, 32, 64)


@dataclasses.dataclass(frozen=True)
class NoisePlan:
  """What `--noise` and `--participation` resolve to.

  Attributes:
    strategy: The correlated-noise strategy; None for iid noise.
    groups: The cyclic modes' number of groups; None for independent
      participation.
    choices: `--bands=auto`'s candidates, `(bands, noise multiplier,
      expected error)`, best first (empty otherwise): for the summary.
  """

  strategy: Optional[mf_strategy.Strategy] = None
  groups: Optional[int] = None
  choices: tuple = ()

  def to_dict(self) -> dict:
    return {
      'strategy': None if self.strategy is None else self.strategy.to_dict(),
      'groups': self.groups,
      'auto_bands_candidates': [
        {'bands': b, 'noise_multiplier': z, 'expected_error': e}
        for b, z, e in self.choices
      ],
    }


def check(config) -> None:
  """The settings that must go together (`ExperimentConfig.validate`).

  Raises:
    ValueError: Naming the values that do not go together.
  """
  cyclic = config.participation != 'independent'
  if config.noise != 'iid' and not cyclic:
    raise ValueError(
      f'--noise={config.noise} (noise correlated across rounds) needs a '
      'cyclic --participation (cyclic_poisson or cyclic; see '
      "docs/privacy.md). Found --participation='independent'."
    )
  if not cyclic:
    if config.participation_groups is not None:
      raise ValueError(
        '--participation_groups is for cyclic --participation. Found '
        f'{config.participation_groups!r} with independent participation.'
      )
    if config.participation_partition != 'by_client_id':
      raise ValueError(
        '--participation_partition is for cyclic --participation. Found '
        f'{config.participation_partition!r} with independent '
        'participation.'
      )
    return
  if config.clients_per_round is not None:
    raise ValueError(
      f'--participation={config.participation} samples each member of the '
      "round's group with a probability (--client_sampling_rate), not a "
      f'fixed cohort. Found clients_per_round={config.clients_per_round!r}.'
    )
  if config.noise == 'blt' and config.participation != 'cyclic':
    raise ValueError(
      'BLT noise has no amplified accounting here: use '
      '--participation=cyclic (min-separation). Found '
      f'{config.participation!r}.'
    )
  auto = config.noise == 'banded' and config.bands == 'auto'
  if auto:
    if config.participation != 'cyclic_poisson':
      raise ValueError(
        '--bands=auto picks b groups for amplified banded MF: it needs '
        '--participation=cyclic_poisson (or an integer --bands). Found '
        f'{config.participation!r}.'
      )
    if config.participation_groups is not None:
      raise ValueError(
        '--bands=auto picks the groups too (one per band); unset '
        f'--participation_groups (found {config.participation_groups}) or '
        'set an integer --bands.'
      )
    if config.target_epsilon is None:
      raise ValueError(
        '--bands=auto compares strategies at the target epsilon: set '
        '--target_epsilon (or an integer --bands).'
      )
  elif config.noise != 'banded' and config.participation_groups is None:
    raise ValueError(
      f'--participation={config.participation} with --noise={config.noise} '
      'needs --participation_groups (the number of groups, >= 1).'
    )


def resolve(config, num_clients: int, delta: Optional[float]) -> NoisePlan:
  """The run's `NoisePlan` (`check` first).

  Args:
    config: The run's settings.
    num_clients: The population N.
    delta: The run's delta (for `--bands=auto`).

  Raises:
    ValueError: On settings that do not go together, or that the
      accounting cannot state (named).
  """
  check(config)
  if config.participation == 'independent':
    return NoisePlan()
  rate = config.client_sampling_rate
  if rate is None:
    rate = min(10, num_clients) / num_clients
  rounds, momentum = config.rounds, config.server_momentum
  if config.noise == 'iid':
    return NoisePlan(groups=config.participation_groups)
  if config.noise == 'blt':
    groups = config.participation_groups
    strategy = mf_strategy.optimize_blt(
      config.blt_buffers,
      rounds,
      momentum,
      separation=groups,
      max_participations=math.ceil(rounds / groups),
    )
    return NoisePlan(strategy, groups)
  if config.bands != 'auto':
    bands = int(config.bands)
    strategy = mf_strategy.optimize_banded(bands, rounds, momentum)
    return NoisePlan(strategy, config.participation_groups or bands)
  choices = mf_accounting.choose_bands(
    AUTO_BANDS,
    rounds=rounds,
    rate=float(rate),
    target_epsilon=config.target_epsilon,
    delta=delta,
    momentum=momentum,
    accountant=config.accountant,
  )
  best = choices[0]
  return NoisePlan(
    best.strategy,
    best.bands,
    tuple((c.bands, c.noise_multiplier, c.error) for c in choices),
  )
