"""Linear compression with the noise in the compressed space (issue #103),
against our tuned DP-FedAvg at equal epsilon in seed 001's Fashion-MNIST
setting and seed 000's EMNIST regime."""

from benchmarks.studies.seed000 import REGIME_000
from benchmarks.studies.seed001 import COLUMNS_001
from benchmarks.studies.seed001 import COMMON_001
from benchmarks.studies.study import reseeded
from benchmarks.studies.study import Row
from benchmarks.studies.study import Study

STUDIES: dict[str, Study] = {}

# The compressions of the issue: upload d / b.
COMPRESSIONS = (10, 30, 100, 300, 1000)

# Seed 001's columns less the paper's and CMP-Fed's.
COLUMNS_DP_FEDAVG = tuple(
  c
  for c in COLUMNS_001
  if c
  not in (
    'paper',
    'U signal share',
    'V signal share',
    'C1 / C2',
    'mean ||U_i|| / ||V_i|| / ||vectors||',
    'U / V clipped',
  )
)
_NOISE = COLUMNS_DP_FEDAVG.index('noise multiplier') + 1
_COLUMNS = (
  *COLUMNS_DP_FEDAVG[:_NOISE],
  'sketch rows b',
  'median ||mu|| / C',
  'added error / noise: predicted / measured',
  *COLUMNS_DP_FEDAVG[_NOISE:],
)


_LABELS = {
  'srht_interleaved': 'SRHT, interleaved blocks',
  'srht': 'SRHT, consecutive blocks',
  'count_sketch': 'count sketch',
}


def _row(sketch: str, compression, clip: float = 0.5, **flags) -> Row:
  """A row at `compression`; `clip` names the study's clip in the label."""
  return Row(
    f'{sketch}_{compression}x',
    f'DP-FedAvg clip {clip:g}, {_LABELS[sketch]}, {compression}x',
    dict(
      method='dp_fedavg',
      compression=str(compression),
      compression_sketch=sketch,
      **flags,
    ),
  )


def _fashion_rows() -> tuple[Row, ...]:
  # The consecutive-block SRHT's rows (run first: its decode error stays
  # in the layers that carry the update, see the study's notes).
  rows = [_row('srht', 100), _row('srht', 1000)]
  rows += reseeded(_row('srht', 100), (1, 2))
  # The default sketch at every compression, 3 seeds at 100x and 1,000x.
  rows += [_row('srht_interleaved', c) for c in COMPRESSIONS]
  rows += reseeded(_row('srht_interleaved', 100), (1, 2))
  rows += reseeded(_row('srht_interleaved', 1000), (1, 2))
  rows.append(_row('count_sketch', 1000))
  rows.append(
    Row(
      'srht_auto',
      'DP-FedAvg clip 0.5, SRHT interleaved, compression from the plan '
      '(5%, ||mu|| / C <= 0.5 assumed: 47.7x)',
      dict(
        method='dp_fedavg',
        compression='auto',
        compression_sketch='srht_interleaved',
        compression_norm_ratio=0.5,
        compression_norm_source='assumed',
      ),
    )
  )
  rows.append(
    Row(
      'ddgauss_srht_100x',
      'DDGauss clip 0.5 (secure sum, 16 bits), SRHT interleaved 100x',
      dict(
        method='ddgauss',
        compression='100',
        compression_sketch='srht_interleaved',
        ddgauss_bits=16,
      ),
    )
  )
  return tuple(rows)


_NOTES = """Issue #103: every client sends S x, b = d / compression values
(S from a public per-round seed; `aggregators/linear_compression.py`),
clipped to C and noised in the compressed space by the inner DP sum (the
same Gaussian event, the same ledger and noise multiplier as uncompressed
DP-FedAvg at this epsilon), decoded by S^T. Setting: {setting}. The
reference is our tuned DP-FedAvg in the same setting: {reference}.
"upload compression x" counts the 8-byte seed. "median ||mu|| / C" is the
norm of the cohort's mean clipped update over the clip, "added error /
noise" the decode's squared error on that mean over the DP noise's energy
d z^2 C^2 / n^2, medians over rounds: predicted from the measured ||mu||
(`linear_compression.added_error_share`) and measured
(`compression_error_sq`; both non-private research measurements, outside
the ledger). Only the rows in this table have run. {history} `srht_*`
rows use blocks of 1,024 consecutive coordinates, `srht_interleaved_*`
(the default sketch since 2026-12-05) blocks that interleave the
coordinates: with consecutive blocks the decode error stays in the layers
that carry the update (measured by `benchmarks/compression_error_by_layer.py`,
`benchmarks/results/compression_error_by_layer.md`)."""

STUDIES['linear_compression_fashion'] = Study(
  title='Linear compression on Fashion-MNIST IID (seed 001 setting)',
  notes=_NOTES.format(
    setting='seed 001 Table I, Fashion-MNIST IID, 6,000 clients, q = 1/60, '
    '(1, 1e-4)-DP over 180 rounds, clip 0.5, 10 local steps of batch 10',
    reference='`dp_fedavg_clip0.5_180` and its `_seed1` / `_seed2` in '
    'benchmarks/results/seed001_iid.md, 82.38-82.75% final, 82.55-82.79% '
    'best',
    history='Rows killed to change the queue (a run stopped between '
    'checkpoints) were deleted and rerun from round 1, never resumed under '
    'other code; `srht_100x` first ran under per-stratum SRHT offsets (a '
    'row could be kept twice) and was stopped at round ~130 and rerun from '
    'scratch with systematic sampling.',
  ),
  metric='test_accuracy',
  common=dict(
    COMMON_001,
    task='fashion_mnist_iid',
    rounds=180,
    eval_every=5,
    clip=0.5,
  ),
  rows=_fashion_rows(),
  columns=_COLUMNS,
)

_emnist_rows = tuple(
  _row('srht_interleaved', c, REGIME_000['clip'], eval_every=10)
  for c in (100, 1000)
) + reseeded(
  _row('srht_interleaved', 100, REGIME_000['clip'], eval_every=10), (1, 2)
)

STUDIES['linear_compression_emnist'] = Study(
  title="Linear compression on federated EMNIST (seed 000's regime)",
  notes=_NOTES.format(
    setting="seed 000's regime, 300 LEAF writers, q = 0.1, (6, 1/300)-DP "
    'over 300 rounds, clip 0.03, 30 local steps of batch 64',
    reference='`dp_fedavg_300` and its `_seed1` / `_seed2` in '
    'benchmarks/results/seed000_regime.md, 58.53-60.28% final',
    history='A row longer than a session was kept at a checkpoint in '
    'benchmarks/in_progress and resumed from it (its cohorts and noise are '
    "those of an uninterrupted run); its wall s covers the last session's "
    'rounds only, and the sum of `round_seconds` in its '
    'non_private/metrics.csv the whole row.',
  ),
  metric='test_accuracy',
  common=dict(REGIME_000, rounds=300),
  rows=_emnist_rows,
  columns=_COLUMNS,
)
