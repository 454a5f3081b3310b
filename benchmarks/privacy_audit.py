r"""Empirical privacy audit of every DP aggregator (one-shot canaries).

Each DP method's aggregator (as the runner builds it, behind the finite
guard) runs `--rounds` rounds with `--canaries` canary clients only, all
taking part every round, noise multiplier `--noise_multiplier` and clip 1
(canaries at norm 1); `tff_dp.audit` estimates mu and epsilon from the
final aggregate, with one-sided bounds at level `--confidence` each
(`mu lower`, `mu upper`; together a 90% interval at 0.95), and compares
the epsilon of the lower bound with the ledger's epsilon for the events
that ran (the method's round event composed `--rounds` times, no
sampling; PLD, the tight ledger): a correct mechanism has `epsilon lower
<= ledger` with probability >= `--confidence`, while a single point
estimate exceeds a tight ledger about half the time. Methods that release
less than the full update (random-k, top-k, sketches, low rank) leak less
through the final sum and estimate lower. `noise reuse` is
`tff_dp.audit.noise_reuse_check` on the same aggregator: `--rounds`
rounds, each with its own `--canaries` canaries that take part in that
round only; the releases off the canaries' span must be uncorrelated
between rounds (`reuse z`: the largest |z| over round pairs, against its
Bonferroni threshold at alpha 1e-3); repeated noise reads `REUSED`. A
server that carries noised aggregates into later rounds (DPSFL's
error-feedback sketch: post-processing of the noised sketch) correlates
its rounds legitimately: those rows read `correlated (error feedback)`
when flagged, as the check cannot tell reuse from feedback there (DPSFL
splits its noise seed every round). Rows marked `planted` are
deliberately broken DP-FedAvg variants that the audit must flag: half
the noise the ledger claims, and a noise seed that never advances
(identical noise every round, which the final-model estimate cannot
see).

  python -m benchmarks.privacy_audit
"""

import time

from absl import app
from absl import flags
import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from benchmarks import results_table
from tff_dp import audit
from tff_dp import contexts
from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import finite_guard

_Z = flags.DEFINE_float('noise_multiplier', 2.0, 'Noise multiplier.')
_ROUNDS = flags.DEFINE_integer('rounds', 4, 'Rounds.')
_CANARIES = flags.DEFINE_integer('canaries', 300, 'Canary clients.')
_DELTA = flags.DEFINE_float('delta', 1e-5, 'Delta.')
_CONFIDENCE = flags.DEFINE_float(
  'confidence', 0.95, 'Level of each one-sided bound on mu.'
)
_OUTPUT = flags.DEFINE_string(
  'output', 'benchmarks/results/privacy_audit.md', 'Results file.'
)
SHAPE = (200, 100)
SEED = 1  # The canary directions'.
REUSE_ALPHA = 1e-3
_FEEDBACK = ('dpsfl (5 x 2000, k = d/4)', 'dpsfl_ac')


class _FrozenSeedQuery(dp_queries.SeededGaussianSumQuery):
  """Planted bug: never advances its noise seed (same noise every round)."""

  def get_noised_result(self, sample_state, global_state):
    result, _, event = super().get_noised_result(sample_state, global_state)
    return result, global_state, event


def _mechanisms(z, n):
  """Name -> (factory, the round's DpEvent as the ledger records it).

  Names in `_FEEDBACK` carry noisy aggregates across rounds.
  """
  d = int(np.prod(SHAPE))
  adaptive = dpsfl.AdaptiveClip(bit_noise_multiplier=10.0)
  gaussian = dp_accounting.GaussianDpEvent(z)
  return {
    'dp_fedavg': (
      dp_fedavg.gaussian_fixed(z, n, 1.0, noise_seed=2),
      gaussian,
    ),
    'dp_randagg (k = d/4)': (
      # The committed rows clip the k-vector; the default scope ('update')
      # clips the whole update first, with the same DP event.
      dp_randagg.DPRandAggFactory(
        z,
        n,
        1.0,
        num_coordinates=d // 4,
        seed=2,
        noise_seed=2,
        clip_scope='payload',
      ),
      gaussian,
    ),
    'fl_top_dp (fixed K = d/4)': (
      dp_randagg.DPRandAggFactory(
        z,
        n,
        1.0,
        num_coordinates=d // 4,
        fixed_indices=np.arange(d // 4),
        noise_seed=2,
        clip_scope='payload',
      ),
      gaussian,
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
        noise_seed=2,
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
        noise_seed=2,
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
        noise_seed=2,
      ),
      dp_accounting.ComposedDpEvent([gaussian] * 2),
    ),
    'planted: dp_fedavg with noise z/2 (ledger z)': (
      dp_fedavg.gaussian_fixed(z / 2, n, 1.0, noise_seed=2),
      gaussian,
    ),
    'planted: dp_fedavg, noise seed never advances': (
      tff.aggregators.DifferentiallyPrivateFactory(
        tfp.NormalizedQuery(_FrozenSeedQuery(1.0, z, 2), denominator=float(n))
      ),
      gaussian,
    ),
  }


def _reuse_verdict(name: str, flagged: bool) -> str:
  if not flagged:
    return 'fresh'
  return 'correlated (error feedback)' if name in _FEEDBACK else 'REUSED'


def main(argv):
  del argv
  contexts.set_simulation_context()
  z, rounds, n, delta = _Z.value, _ROUNDS.value, _CANARIES.value, _DELTA.value
  confidence = _CONFIDENCE.value
  command = (
    f'python -m benchmarks.privacy_audit --noise_multiplier={z:g} '
    f'--rounds={rounds} --canaries={n} --delta={delta:g} '
    f'--confidence={confidence:g}'
  )
  dim = int(np.prod(SHAPE))
  for name, (factory, event) in _mechanisms(z, n).items():
    start = time.perf_counter()
    guarded = finite_guard.FiniteGuardFactory(factory)
    result = audit.audit_aggregator(
      guarded,
      dim=dim,
      shape=SHAPE,
      num_canaries=n,
      rounds=rounds,
      canary_norm=1.0,
      delta=delta,
      seed=SEED,
      confidence=confidence,
    )
    reuse = audit.noise_reuse_check(
      guarded,
      dim=dim,
      shape=SHAPE,
      num_canaries=n,
      canary_norm=1.0,
      rounds=rounds,
      seed=SEED,
      alpha=REUSE_ALPHA,
    )
    composed = dp_accounting.SelfComposedDpEvent(event, rounds)
    eps_rdp = rdp.RdpAccountant().compose(composed).get_epsilon(delta)
    eps_pld = pld.PLDAccountant().compose(composed).get_epsilon(delta)
    row = {
      'mechanism': name,
      'mu lower': round(result.mu_lower, 3),
      'mu estimate': round(result.mu_estimate, 3),
      'mu upper': round(result.mu_upper, 3),
      'epsilon lower': round(result.epsilon_lower, 3),
      'estimated epsilon': round(result.epsilon_estimate, 3),
      'epsilon upper': round(result.epsilon_upper, 3),
      'ledger epsilon RDP': round(eps_rdp, 3),
      'ledger epsilon PLD': round(eps_pld, 3),
      'epsilon lower <= ledger PLD': result.consistent_with(eps_pld),
      'noise reuse': _reuse_verdict(name, reuse.reused),
      'max cross-round corr': round(reuse.max_abs_correlation, 4),
      'reuse z (threshold)': (f'{reuse.max_abs_z:.3g} ({reuse.threshold:.3g})'),
      'canaries': n,
      'rounds': rounds,
      'noise multiplier': z,
      'confidence': confidence,
      'seed': SEED,
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
