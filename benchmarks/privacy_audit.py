r"""Empirical privacy audit of every DP aggregator (one-shot canaries).

Each DP method's aggregator (as the runner builds it, behind the finite
guard) runs `--rounds` rounds with `--canaries` canary clients only, all
taking part every round, noise multiplier `--noise_multiplier` and clip 1
(canaries at norm 1); `tff_dp.audit` estimates epsilon from the final
aggregate and compares it with the ledger's epsilon for the events that
ran (the method's round event composed `--rounds` times, no sampling). The
estimate must stay at or below the ledger's; methods that release less
than the full update (random-k, top-k, sketches, low rank) leak less
through the final sum and estimate lower.

  python -m benchmarks.privacy_audit
"""

import time

from absl import app
from absl import flags
import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np

from benchmarks import results_table
from tff_dp import audit
from tff_dp import contexts
from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import finite_guard

_Z = flags.DEFINE_float('noise_multiplier', 2.0, 'Noise multiplier.')
_ROUNDS = flags.DEFINE_integer('rounds', 4, 'Rounds.')
_CANARIES = flags.DEFINE_integer('canaries', 300, 'Canary clients.')
_DELTA = flags.DEFINE_float('delta', 1e-5, 'Delta.')
_OUTPUT = flags.DEFINE_string(
  'output', 'benchmarks/results/privacy_audit.md', 'Results file.'
)
SHAPE = (200, 100)


def _mechanisms(z, n):
  d = int(np.prod(SHAPE))
  adaptive = dpsfl.AdaptiveClip(bit_noise_multiplier=10.0)
  return {
    'dp_fedavg': (
      dp_fedavg.gaussian_fixed(z, n, 1.0, seed=2),
      dp_accounting.GaussianDpEvent(z),
    ),
    'dp_randagg (k = d/4)': (
      dp_randagg.DPRandAggFactory(z, n, 1.0, num_coordinates=d // 4, seed=2),
      dp_accounting.GaussianDpEvent(z),
    ),
    'fl_top_dp (fixed K = d/4)': (
      dp_randagg.DPRandAggFactory(
        z, n, 1.0, num_coordinates=d // 4, fixed_indices=np.arange(d // 4)
      ),
      dp_accounting.GaussianDpEvent(z),
    ),
    'dpsfl (5 x 2000, k = d/4)': (
      dpsfl.dpsfl(
        5,
        2000,
        d // 4,
        noise_multiplier=z,
        clients_per_round=n,
        clip=1.0,
        momentum=0.0,
        seed=2,
      ),
      dpsfl.round_event(z, None),
    ),
    'dpsfl_ac': (
      dpsfl.dpsfl_ac(
        5,
        2000,
        d // 4,
        noise_multiplier=z,
        clients_per_round=n,
        initial_clip=1.0,
        adaptive=adaptive,
        momentum=0.0,
        seed=2,
      ),
      dpsfl.round_event(z, adaptive),
    ),
    'cmp_fed (rank 16)': (
      cmp_fed.cmp_fed(
        16,
        noise_multiplier=z,
        clients_per_round=n,
        clip_u=1.0,
        clip_v=1.0,
        seed=2,
      ),
      dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z)] * 2),
    ),
  }


def main(argv):
  del argv
  contexts.set_simulation_context()
  z, rounds, n, delta = _Z.value, _ROUNDS.value, _CANARIES.value, _DELTA.value
  command = (
    f'python -m benchmarks.privacy_audit --noise_multiplier={z:g} '
    f'--rounds={rounds} --canaries={n} --delta={delta:g}'
  )
  for name, (factory, event) in _mechanisms(z, n).items():
    start = time.perf_counter()
    result = audit.audit_aggregator(
      finite_guard.FiniteGuardFactory(factory),
      dim=int(np.prod(SHAPE)),
      shape=SHAPE,
      num_canaries=n,
      rounds=rounds,
      canary_norm=1.0,
      delta=delta,
      seed=1,
    )
    composed = dp_accounting.SelfComposedDpEvent(event, rounds)
    eps_rdp = rdp.RdpAccountant().compose(composed).get_epsilon(delta)
    eps_pld = pld.PLDAccountant().compose(composed).get_epsilon(delta)
    row = {
      'mechanism': name,
      'estimated epsilon': round(result.epsilon_estimate, 3),
      'ledger epsilon RDP': round(eps_rdp, 3),
      'ledger epsilon PLD': round(eps_pld, 3),
      'estimate <= ledger': bool(result.epsilon_estimate <= eps_rdp),
      'mu estimate': round(result.mu_estimate, 3),
      'canaries': n,
      'rounds': rounds,
      'noise multiplier': z,
      'seed': 1,
      'date': results_table.today(),
      'wall s': round(time.perf_counter() - start, 1),
      'command': command,
    }
    print(row, flush=True)
    results_table.update(
      _OUTPUT.value,
      name,
      row,
      title='Empirical privacy audit (one-shot canaries)',
      columns=list(row),
      notes=__doc__.split('\n\n')[1].replace('\n', ' ')
      + f' Tensor shape {SHAPE}. Machine: {results_table.machine()}.',
    )


if __name__ == '__main__':
  app.run(main)
