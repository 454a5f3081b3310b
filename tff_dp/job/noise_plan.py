"""A run's noise across rounds and its participation groups, from its settings.

`--noise` (iid, banded, blt), `--bands`, `--blt_buffers`, `--participation`
and `--participation_groups` (`settings.RunSettings`) resolve here, before
the noise is calibrated, into the strategy the aggregator streams
(`aggregators.mf_strategy`) and the number of groups the sampler cycles
through (`tff_dp.job.cohorts`). The strategy is optimised at setup for the
workload of the server's optimiser (SGD with `--server_momentum`) over
`--rounds`; `--bands=auto` picks the number of bands by the expected error
at the target epsilon (`privacy.calibration.choose_bands`).

A run keeps its plan in its folder (`PLAN_FILE`, `resolve_in`) and a
resumed run reads it back rather than optimising again: the optimisers'
results can differ in their last bits between machines (floating point
summation order), and a resumed run must stream the noise and account the
strategy it started with.
"""

import dataclasses
import json
import math
import os
import pathlib
import tempfile
from typing import Optional

from absl import logging

from tff_dp import privacy
from tff_dp.aggregators import mf_strategy
from tff_dp.methods import settings

# --bands=auto's candidates (those that fit the rate and the rounds).
AUTO_BANDS = (1, 2, 4, 8, 16, 32, 64)

# The run folder's record of its plan (`resolve_in`).
PLAN_FILE = 'noise_plan.json'


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

  @classmethod
  def from_dict(cls, d: dict) -> 'NoisePlan':
    """The plan `to_dict` wrote, exactly (JSON floats round-trip)."""
    strategy = d.get('strategy')
    return cls(
      None if strategy is None else mf_strategy.Strategy.from_dict(strategy),
      d.get('groups'),
      tuple(
        (c['bands'], c['noise_multiplier'], c['expected_error'])
        for c in d.get('auto_bands_candidates', ())
      ),
    )


def check(config) -> None:
  """The settings that must go together (`ExperimentConfig.validate`).

  Raises:
    ValueError: Naming the values that do not go together.
  """
  cyclic = config.participation != 'independent'
  if config.noise != settings.IID and not cyclic:
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
  if config.noise == settings.BLT and config.participation != 'cyclic':
    raise ValueError(
      'BLT noise has no amplified accounting here: use '
      '--participation=cyclic (min-separation). Found '
      f'{config.participation!r}.'
    )
  auto = config.noise == settings.BANDED and config.bands == 'auto'
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
  elif config.noise != settings.BANDED and config.participation_groups is None:
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
  if config.noise == settings.IID:
    return NoisePlan(groups=config.participation_groups)
  if config.noise == settings.BLT:
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
  choices = privacy.calibration.choose_bands(
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


def resolve_in(
  config,
  num_clients: int,
  delta: Optional[float],
  output_dir: Optional[pathlib.Path],
) -> NoisePlan:
  """`resolve`, kept in the run folder: the first invocation writes the
  plan to `output_dir / PLAN_FILE`, a resumed one reads it back (the
  folder's settings are the run's: `checkpoints.check_same_config`).

  Raises:
    ValueError: As `resolve`; or if the folder's plan is unreadable or is
      not of this run's `--noise` (named, with the file).
  """
  check(config)
  path = None if output_dir is None else pathlib.Path(output_dir) / PLAN_FILE
  if path is not None and path.exists():
    try:
      plan = NoisePlan.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(
        f'{path} is not a readable noise plan ({e}): restore it from the '
        "run's summary.json privacy section, or choose a new "
        'root_output_dir.'
      ) from e
    kind = None if plan.strategy is None else plan.strategy.kind
    wanted = None if config.noise == settings.IID else config.noise
    if kind != wanted:
      raise ValueError(
        f'{path} holds a {kind or "iid"} noise plan, not --noise='
        f'{config.noise}: choose a new root_output_dir.'
      )
    logging.info('Noise plan read from %s (as the run started).', path)
    return plan
  plan = resolve(config, num_clients, delta)
  if path is not None and plan.strategy is not None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
      'w', dir=path.parent, delete=False, prefix=f'.{path.name}'
    ) as f:
      f.write(json.dumps(plan.to_dict(), indent=2))
    os.replace(f.name, path)
  return plan
