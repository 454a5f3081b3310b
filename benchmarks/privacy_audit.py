r"""Empirical privacy audit of every DP aggregator (one-shot canaries).

Each DP method's aggregator, built by its registry entry as the runner
builds it (behind the finite guard), runs with canary clients only, at
noise multiplier `--noise_multiplier` and clip 1, with canaries of norm
`--canary_ratio` times the clip (a mechanism that does not clip shifts
them that many times as far as its ledger allows). `tff_dp.reporting.audit`
estimates mu and epsilon from the releases, with one-sided bounds at
level `--confidence` each (`mu lower`, `mu upper`; together a 90%
interval at 0.95). Each round's DP event is read the way the runner reads
it (`tff_dp.aggregators.dp_events.released_event`: from the aggregator
state, or as the factory declares it, from its measurements for DDGauss;
`recorded event` is the last round's) and recorded in a
`tff_dp.privacy.PrivacyLedger` of the canaries' Poisson sampling;
`ledger` is that ledger's epsilon, the smaller of its RDP and PLD values
(DDGauss has RDP only). The verdict flags a row when `epsilon lower`
exceeds the ledger (a correct mechanism passes with probability >=
`--confidence`) or when its noise is reused.

Committed settings (the flags' defaults): z = 2, delta 1e-5, confidence
0.95, 300 canaries at 3 x the clip, tensor 200 x 100, `--rounds` 4 with
every canary in every round, and for the rows `Poisson q = 0.5`
`--sampled_rounds` 8 in which each canary takes part independently with
probability `--sampling_rate` 0.5 (null directions never; the ledger
records Poisson-sampled events). Canary directions and participation use
seed 1; the mechanisms' public seed and their (research, reproducible)
noise seed are 2. Adaptive clipping starts at clip 1 and grows about 10%
a round, staying below the canaries' norm.

`probe` says where the audit looks. `final delta`: the sum of the
rounds' results projected on the canaries' and null directions. `aligned
canaries` (random-k, FL-TOP): each canary sends its direction restricted
to the round's public coordinates (drawn from the state's seed before the
round, or FL-TOP's fixed K), so its payload reaches the clip, as a worst
case client's would. `noised sketch` (DPSFL, DPSFL-AC): each round's
noised sketch mean, read from the server state (with sketch momentum 0,
its momentum sketch), projected on the canaries' sketches: the release
their ledger accounts for, of which error feedback and top-k are
post-processing. CMP-Fed's final delta U V^T projected on a canary is its
phase-2 payload's projection (canaries at 3 x the clip reach phase 2's
clip); phase 1's release is not audited on its own, so CMP-Fed audits at
about 1/sqrt(2) of its ledger's mu. `noise reuse` is
`tff_dp.reporting.noise_reuse.noise_reuse_check` on the same aggregator
and probe: `--rounds` rounds, each with its own canaries that take part
in that round only; the releases off the canaries' span must be uncorrelated
between rounds (`reuse z`: the largest |z| over round pairs, against its
Bonferroni threshold at alpha 1e-3).

Rows marked `planted` are deliberately broken mechanisms that must be
flagged (`as expected`): DP-FedAvg queries whose state reports the
correct event while they skip the clip, add half the noise, or never
advance their noise seed (identical noise every round: the final-model
estimate cannot see it, the reuse check does), and methods built with
half their noise multiplier that declare the full one. DDGauss needs
protobuf's pure-Python backend: its row runs in a child process with
PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python.

  python -m benchmarks.privacy_audit
"""

import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import time
from typing import Callable, Optional

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from benchmarks import results_table
from tff_dp.reporting import audit
from tff_dp.reporting import canary_rounds
from tff_dp.reporting import noise_reuse
from tff_dp.reporting import planted_bugs
from tff_dp.runtime import contexts
from tff_dp import methods as methods_lib
from tff_dp import privacy
from tff_dp.aggregators import count_sketch
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import dp_randagg
from tff_dp.methods import ddgauss as ddgauss_method
from tff_dp.methods import dp_fedavg as dp_fedavg_method
from tff_dp.methods import dp_randagg as dp_randagg_method
from tff_dp.methods import low_rank
from tff_dp.methods import options as options_lib
from tff_dp.methods import sketching
from tff_dp.methods import top_k

_Z = flags.DEFINE_float('noise_multiplier', 2.0, 'Noise multiplier.')
_ROUNDS = flags.DEFINE_integer('rounds', 4, 'Rounds (full participation).')
_CANARIES = flags.DEFINE_integer('canaries', 300, 'Canary clients.')
_DELTA = flags.DEFINE_float('delta', 1e-5, 'Delta.')
_CONFIDENCE = flags.DEFINE_float(
  'confidence', 0.95, 'Level of each one-sided bound on mu.'
)
_RATIO = flags.DEFINE_float(
  'canary_ratio', audit.CANARY_CLIP_RATIO, "Canaries' norm over the clip."
)
_RATE = flags.DEFINE_float(
  'sampling_rate', 0.5, 'Poisson rate of the canaries in the sampled rows.'
)
_SAMPLED_ROUNDS = flags.DEFINE_integer(
  'sampled_rounds', 8, 'Rounds of the sampled rows.'
)
_MECHANISMS = flags.DEFINE_multi_string(
  'mechanisms', [], 'A row to run, by name (repeat it; default: all).'
)
_OUTPUT = flags.DEFINE_string(
  'output', 'benchmarks/results/privacy_audit.md', 'Results file.'
)
SHAPE = (200, 100)
SEED = 1  # The canary directions' and participation's.
MECHANISM_SEED = 2  # Public randomness and the (research) noise seed.
REUSE_ALPHA = 1e-3
CLIP = 1.0
_TITLE = 'Empirical privacy audit (one-shot canaries)'

ProbeFn = Callable[[methods_lib.MethodParams, int], canary_rounds.Probe]


def _restricted(nominal: np.ndarray, indices: np.ndarray) -> np.ndarray:
  """Each row kept on `indices` only, rescaled to its own norm."""
  out = np.zeros_like(nominal)
  out[:, indices] = nominal[:, indices]
  norms = np.linalg.norm(out, axis=1, keepdims=True)
  return out * np.linalg.norm(nominal, axis=1, keepdims=True) / norms


def _random_k_probe(
  p: methods_lib.MethodParams, dim: int
) -> canary_rounds.Probe:
  """Canaries on the round's k coordinates (public: drawn from the state's
  seed before the round, as the aggregator draws them)."""
  k = dp_randagg_method.num_coordinates(p)

  def values(state, nominal):
    indices, _ = dp_randagg.draw_random_coordinates(
      tf.constant(np.asarray(state['seed']), tf.int64), dim, k
    )
    return _restricted(nominal, indices.numpy())

  return canary_rounds.Probe(canary_values=values)


def _fixed_k_probe(
  p: methods_lib.MethodParams, dim: int
) -> canary_rounds.Probe:
  """Canaries on FL-TOP's K server-chosen coordinates."""
  del dim
  indices = np.asarray(p.options.top_k_indices)
  return canary_rounds.Probe(
    canary_values=lambda state, nominal: _restricted(nominal, indices)
  )


def _sketch_probe(p: methods_lib.MethodParams, dim: int) -> canary_rounds.Probe:
  """DPSFL's noised sketch mean of each round, with the canaries' sketches.

  The server keeps momentum_t = rho momentum_{t-1} + (noised mean sketch),
  so the round's release is momentum_t - rho momentum_{t-1}.
  """
  o = p.options
  sketch = count_sketch.CountSketch(
    o.sketch_rows, o.sketch_columns, dim, p.seed, hashing=o.sketch_hashing
  )
  hashes = sketch.hashes()
  rho = o.sketch_momentum

  def release(before, after, result):
    del result
    return np.asarray(after['server']['momentum']) - rho * np.asarray(
      before['server']['momentum']
    )

  def embed(directions):
    return np.stack(
      [
        sketch.sketch(tf.constant(d, tf.float32), hashes).numpy().ravel()
        for d in directions
      ]
    )

  return canary_rounds.Probe(release=release, embed=embed)


_PROBE_NAMES = {
  None: 'final delta',
  _random_k_probe: 'final delta, aligned canaries',
  _fixed_k_probe: 'final delta, aligned canaries',
  _sketch_probe: 'noised sketch',
}


@dataclasses.dataclass(frozen=True)
class _Row:
  """One audited configuration."""

  method: methods_lib.Method
  options: options_lib.Options
  planted: str = ''  # The planted bug, '' for a correct mechanism.
  sampled: bool = False
  probe: Optional[ProbeFn] = None


def _rows() -> dict[str, _Row]:
  d = int(np.prod(SHAPE))
  m = methods_lib.METHODS
  sketch = dict(
    sketch_rows=5, sketch_columns=4000, sketch_k=400, sketch_momentum=0.0
  )
  randagg = dp_randagg_method.RandAggOptions(randagg_fraction=0.25)
  fl_top = top_k.TopKOptions(
    top_k_ratio=0.25, top_k_indices=np.arange(0, d, 4, dtype=np.int64)
  )
  cmp = low_rank.CMPFedOptions(cmp_rank=16)
  dpsfl = sketching.SketchOptions(**sketch)
  dpsfl_ac = sketching.AdaptiveSketchOptions(**sketch, dpsfl_bit_noise=10.0)
  none = options_lib.Options()
  rows = {
    'dp_fedavg': _Row(m['dp_fedavg'], none),
    'dp_fedavg, Poisson q': _Row(m['dp_fedavg'], none, sampled=True),
    'dp_fedavg_adaptive': _Row(
      m['dp_fedavg_adaptive'], dp_fedavg_method.AdaptiveClipOptions()
    ),
    'ddgauss': _Row(m['ddgauss'], ddgauss_method.DDGaussOptions()),
    'dp_randagg (k = d/4)': _Row(
      m['dp_randagg'], randagg, probe=_random_k_probe
    ),
    'fl_top_dp (K = d/4)': _Row(m['fl_top_dp'], fl_top, probe=_fixed_k_probe),
    'cmp_fed (rank 16)': _Row(m['cmp_fed'], cmp),
    'dpsfl (5 x 4000, k = 400)': _Row(m['dpsfl'], dpsfl, probe=_sketch_probe),
    'dpsfl_ac': _Row(m['dpsfl_ac'], dpsfl_ac, probe=_sketch_probe),
  }
  for bug, label in (
    ('no_clip', 'no clip'),
    ('half_noise', 'half the noise'),
    ('reused_noise', 'noise seed never advances'),
  ):
    rows[f'planted: dp_fedavg, {label}'] = _Row(
      planted_bugs.planted_method(bug), none, planted=label
    )
  rows['planted: dp_fedavg, half the noise, Poisson q'] = _Row(
    planted_bugs.planted_method('half_noise'),
    none,
    planted='half the noise',
    sampled=True,
  )
  for name in (
    'ddgauss',
    'dp_randagg (k = d/4)',
    'fl_top_dp (K = d/4)',
    'cmp_fed (rank 16)',
    'dpsfl (5 x 4000, k = 400)',
  ):
    row = rows[name]
    rows[f'planted: {name}, half the noise'] = dataclasses.replace(
      row,
      method=planted_bugs.with_half_noise(row.method),
      planted='half the noise, full declared',
    )
  return rows


def _row_name(name: str, rate: float) -> str:
  return f'{name} = {rate:g}' if name.endswith('Poisson q') else name


def _params(
  row: _Row, expected_clients: float, sampling: privacy.Sampling
) -> methods_lib.MethodParams:
  p = methods_lib.MethodParams(
    num_model_params=int(np.prod(SHAPE)),
    expected_clients_per_round=float(expected_clients),
    noise_multiplier=_Z.value,
    clip=CLIP,
    seed=MECHANISM_SEED,
    noise_seed=MECHANISM_SEED,
    options=row.options,
  )
  if row.method.resolve is not None:
    p = row.method.resolve(p, sampling)
  return p


def _verdict(result: audit.AuditResult, reused: bool) -> str:
  reasons = []
  if result.flagged:
    reasons.append('epsilon lower > ledger')
  if reused:
    reasons.append('noise reused')
  return 'FLAGGED: ' + ', '.join(reasons) if reasons else 'pass'


def _command() -> str:
  return (
    f'python -m benchmarks.privacy_audit --noise_multiplier={_Z.value:g} '
    f'--rounds={_ROUNDS.value} --canaries={_CANARIES.value} '
    f'--delta={_DELTA.value:g} --confidence={_CONFIDENCE.value:g} '
    f'--canary_ratio={_RATIO.value:g} --sampling_rate={_RATE.value:g} '
    f'--sampled_rounds={_SAMPLED_ROUNDS.value}'
  )


def _notes() -> str:
  """The docstring's paragraphs between the title and the command."""
  paragraphs = [p.replace('\n', ' ') for p in __doc__.split('\n\n')[1:-1]]
  paragraphs[-1] += f' Machine: {results_table.machine()}.'
  return '\n\n'.join(paragraphs)


def _audit_row(name: str, row: _Row) -> dict:
  start = time.perf_counter()
  k, delta = _CANARIES.value, _DELTA.value
  rate = _RATE.value if row.sampled else 1.0
  rounds = _SAMPLED_ROUNDS.value if row.sampled else _ROUNDS.value
  sampling = privacy.Sampling('poisson', k, rate=float(rate))
  params = _params(row, rate * k, sampling)
  dim = int(np.prod(SHAPE))
  probe = row.probe(params, dim) if row.probe is not None else None
  # One process for both checks (DDGauss takes minutes to build).
  process = audit.method_aggregator(row.method, params).create(
    tff.TensorType(np.float32, SHAPE)
  )
  result = audit.audit_method(
    row.method,
    params,
    shape=SHAPE,
    num_canaries=k,
    rounds=rounds,
    delta=delta,
    canary_norm=_RATIO.value * CLIP,
    sampling_rate=rate,
    probe=probe,
    seed=SEED,
    confidence=_CONFIDENCE.value,
    aggregator=process,
  )
  reuse = noise_reuse.noise_reuse_check(
    process,
    dim=dim,
    shape=SHAPE,
    num_canaries=k,
    canary_norm=_RATIO.value * CLIP,
    rounds=_ROUNDS.value,
    seed=SEED,
    alpha=REUSE_ALPHA,
    probe=probe,
  )
  flagged = result.flagged or reuse.reused
  return {
    'mechanism': name,
    'planted bug': row.planted or '',
    'probe': _PROBE_NAMES[row.probe],
    'sampling q': rate,
    'rounds': rounds,
    'mu lower': round(result.mu_lower, 3),
    'mu estimate': round(result.mu_estimate, 3),
    'mu upper': round(result.mu_upper, 3),
    'epsilon lower': round(result.epsilon_lower, 3),
    'estimated epsilon': round(result.epsilon_estimate, 3),
    'epsilon upper': round(result.epsilon_upper, 3),
    'ledger epsilon RDP': round(result.ledger_epsilon_rdp, 3),
    'ledger epsilon PLD': (
      round(result.ledger_epsilon_pld, 3)
      if math.isfinite(result.ledger_epsilon_pld)
      else 'n/a'
    ),
    'ledger': f'{result.ledger_epsilon:.3f} ({result.ledger_accountant})',
    'noise reuse': 'REUSED' if reuse.reused else 'fresh',
    'reuse z (threshold)': f'{reuse.max_abs_z:.3g} ({reuse.threshold:.3g})',
    'max cross-round corr': round(reuse.max_abs_correlation, 4),
    'verdict': _verdict(result, reuse.reused),
    'as expected': flagged == bool(row.planted),
    'recorded event': str(result.events[-1]) if result.events else '',
    'canaries': k,
    'canary norm': result.canary_norm,
    'noise multiplier': _Z.value,
    'confidence': _CONFIDENCE.value,
    'seed': SEED,
    'date': results_table.today(),
    'wall s': round(time.perf_counter() - start, 1),
    'command': _command(),
  }


def _in_child(name: str) -> None:
  """Runs row `name` in a child with protobuf's pure-Python backend."""
  holders = (
    _Z,
    _ROUNDS,
    _CANARIES,
    _DELTA,
    _CONFIDENCE,
    _RATIO,
    _RATE,
    _SAMPLED_ROUNDS,
    _OUTPUT,
  )
  args = [f'--{h.name}={h.value}' for h in holders]
  subprocess.run(
    [sys.executable, '-m', 'benchmarks.privacy_audit', *args]
    + [f'--mechanisms={name}'],
    env=dict(os.environ, **{ddgauss.PROTOBUF_ENV: 'python'}),
    check=True,
  )


def _drop_stale_rows(names) -> None:
  """Removes rows no longer produced from the JSON store."""
  store = pathlib.Path(_OUTPUT.value).with_suffix('.json')
  if store.exists():
    rows = json.loads(store.read_text())
    kept = {n: r for n, r in rows.items() if n in names}
    store.write_text(json.dumps(kept, indent=2, sort_keys=True) + '\n')


def main(argv):
  del argv
  rows = {_row_name(n, _RATE.value): r for n, r in _rows().items()}
  unknown = [n for n in _MECHANISMS.value if n not in rows]
  if unknown:
    raise ValueError(
      f'--mechanisms must name rows of {sorted(rows)}. Found {unknown!r}.'
    )
  if not _MECHANISMS.value:
    _drop_stale_rows(set(rows))
  contexts.set_simulation_context()
  for name, row in rows.items():
    if _MECHANISMS.value and name not in _MECHANISMS.value:
      continue
    if (
      row.method.name.startswith('ddgauss')
      and not ddgauss.protobuf_supports_ddgauss()
    ):
      _in_child(name)
      continue
    row_out = _audit_row(name, row)
    print(row_out, flush=True)
    results_table.update(
      _OUTPUT.value,
      name,
      row_out,
      title=_TITLE,
      columns=list(row_out),
      notes=_notes(),
    )


if __name__ == '__main__':
  app.run(main)
