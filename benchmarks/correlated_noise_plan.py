"""Issue 86: what correlated noise predicts at the studies' settings.

For each regime (a study's rounds, sampling rate, epsilon and delta), each
strategy the runner can choose: the noise multiplier z calibrated to the
target (RDP, `tff_dp.privacy.calibration.calibrate_correlated`), the
per-round noise
multiplier of the release (`z * ||C^-1 row||`, what one round's update
sees), and the expected workload error (`mf_strategy.expected_error` times
z^2: the mean squared noise of the model trajectory under server SGD, per
unit clip and cohort), also relative to DP-FedAvg (iid noise under
independent Poisson sampling at the same rate). Banded rows are amplified
(cyclic Poisson, groups = bands); BLT rows are min-separation (no
amplification). It trains nothing. Writes
`results/correlated_noise_plan.md` (and `.json`).

  python -m benchmarks.correlated_noise_plan
"""

import math
import pathlib
import time

import numpy as np

from benchmarks import results_table
from tff_dp import privacy
from tff_dp.job import noise_plan
from tff_dp.aggregators import mf_strategy

OUT = pathlib.Path(__file__).parent / 'results' / 'correlated_noise_plan.md'
# name: (rounds, overall sampling rate, epsilon, delta, server momentum).
REGIMES = {
  'seed001 Fashion-MNIST IID': (180, 1 / 60, 1.0, 1e-4, 0.0),
  'seed000 EMNIST': (300, 0.1, 6.0, 1 / 300, 0.0),
  'seed004 in-hospital mortality': (100, 0.1, 1.0, 1e-4, 0.0),
}
BLT_GROUPS = (10, 30, 60)
# DP-RandAgg's rank-16 ratio (seed 001's `dp_randagg_r16_180` row): the
# fraction of coordinates one round releases.
PROJECTED_FRACTION = 0.047459
COLUMNS = (
  'regime',
  'strategy',
  'participation',
  'groups',
  'group visits',
  'z',
  'per-round noise multiplier',
  'expected error',
  'x DP-FedAvg',
  'final x DP-FedAvg',
  'projected x DP-FedAvg',
  'date',
  'command',
)


def _final_and_projected(strategy, rounds, momentum, sens):
  """Noise energy of the last model per unit z^2: over every coordinate
  (`||last row of A C^-1||^2 sens^2`), and over a coordinate a round
  releases with probability p = PROJECTED_FRACTION, independently across
  rounds (DP-RandAgg's random coordinates): the prefix sum of the released
  noise `sum_t 1_t n_t` has variance `p^2 1'M1 + (p - p^2) tr M` with
  `M = C^-1 C^-T` (server SGD, momentum 0)."""
  d = strategy.inverse_column(rounds)
  e = np.convolve(mf_strategy.workload_column(rounds, momentum), d)[:rounds]
  final = float(np.sum(e**2)) * sens**2
  p = PROJECTED_FRACTION
  prefix = float(np.sum(np.cumsum(d) ** 2))  # 1'M1: sum of C^-1 row sums^2
  trace = float(np.sum(np.cumsum(d**2)))  # tr M: sum of C^-1 row norms^2
  projected = (p * p * prefix + (p - p * p) * trace) * sens**2
  return final, projected


def _row(regime, strategy, participation, z, rounds, groups, base):
  base_error, base_final, base_projected = base
  error = z**2 * mf_strategy.expected_error(
    strategy,
    rounds,
    REGIMES[regime][4],
    groups,
    1 if participation.amplified else None,
  )
  final, projected = _final_and_projected(
    strategy,
    rounds,
    REGIMES[regime][4],
    mf_strategy.sensitivity(
      strategy, rounds, groups, 1 if participation.amplified else None
    ),
  )
  d = strategy.inverse_column(rounds)
  name = (
    f'banded {strategy.bands}'
    if strategy.kind == mf_strategy.BANDED
    else f'BLT {len(strategy.theta)} buffers'
  )
  if strategy == mf_strategy.identity():
    name = 'iid (DP-FedAvg noise)'
  return {
    'regime': regime,
    'strategy': name,
    'participation': participation.to_dict()['schema'],
    'groups': groups,
    'group visits': math.ceil(rounds / groups),
    'z': z,
    'per-round noise multiplier': z * float(np.linalg.norm(d)),
    'expected error': error,
    'x DP-FedAvg': error / base_error if base_error else 1.0,
    'final x DP-FedAvg': z**2 * final / base_final if base_final else 1.0,
    'projected x DP-FedAvg': (
      z**2 * projected / base_projected if base_projected else 1.0
    ),
    'date': results_table.today(),
    'command': results_table.command_line(),
  }


def rows() -> dict:
  out = {}
  for regime, (rounds, rate, eps, delta, momentum) in REGIMES.items():
    choices = privacy.calibration.choose_bands(
      noise_plan.AUTO_BANDS,
      rounds=rounds,
      rate=rate,
      target_epsilon=eps,
      delta=delta,
      momentum=momentum,
    )
    base = next(c for c in choices if c.bands == 1)
    base = (base.error,) + tuple(
      base.noise_multiplier**2 * x
      for x in _final_and_projected(
        base.strategy,
        rounds,
        momentum,
        mf_strategy.sensitivity(base.strategy, rounds, 1, 1),
      )
    )
    for c in sorted(choices, key=lambda c: c.bands):
      participation = privacy.Participation(
        c.bands, privacy.group_rate(rate, c.bands)
      )
      out[f'{regime} banded {c.bands:02d}'] = _row(
        regime,
        c.strategy,
        participation,
        c.noise_multiplier,
        rounds,
        c.bands,
        base,
      )
    for groups in BLT_GROUPS:
      if groups * rate > 1:
        continue
      k = math.ceil(rounds / groups)
      strategy = mf_strategy.optimize_blt(2, rounds, momentum, groups, k)
      participation = privacy.Participation(groups)
      z = privacy.calibration.calibrate_correlated(
        strategy, eps, delta, rounds, participation
      )
      out[f'{regime} blt {groups}'] = _row(
        regime, strategy, participation, z, rounds, groups, base
      )
  return out


NOTES = """What the accounting predicts before any training (issue #86): for
each study regime, the noise multiplier each strategy needs for the
study's epsilon (RDP, delta as the study's), and the expected workload
error it leaves: the mean over rounds of the squared noise in the model
trajectory of server SGD (`mf_strategy.expected_error`, momentum 0 as the
studies run), times z^2, per unit clip. `x DP-FedAvg` divides it by the
iid row's (banded 1: DP-FedAvg's own event). Banded rows use cyclic
Poisson participation with as many groups as bands (amplified banded MF);
`--bands=auto` takes the least error. BLT rows (2 buffers) use
min-separation participation, with no amplification. The per-round noise
multiplier is what one round's release carries (z times the norm of a row
of C^-1); it is larger than z for every correlated strategy, because the
noise is made to cancel across rounds, not within one. `group visits`
is how often a client's group is drawn (ceil(rounds / groups)); under
cyclic Poisson a client joins each visit with probability groups x rate,
so every banded row expects the same rounds x rate participations per
client as DP-FedAvg. `final x DP-FedAvg` is the same ratio for the noise
in the last model alone. `projected x DP-FedAvg` is that ratio where each
round releases a random fraction p = 0.0475 of the coordinates (DP-RandAgg
at the rank-16 ratio, random indices, as seed 001's
`dp_randagg_r16_banded_mf_180` row runs): a coordinate then sees about
one round in 21, the rounds whose noise was built to cancel are mostly
not released on it, and what it keeps is each round's larger per-round
noise (variance `p^2 1'M1 + (p - p^2) tr M`, `M = C^-1 C^-T`)."""


def main() -> None:
  t0 = time.time()
  results_table.replace_all(
    str(OUT),
    rows(),
    title="Correlated noise: the accounting at the studies' settings",
    columns=COLUMNS,
    notes=NOTES + f'\n\nMachine: {results_table.machine()}. Wall time '
    f'{time.time() - t0:.0f} s.',
  )
  print(OUT.read_text())


if __name__ == '__main__':
  main()
