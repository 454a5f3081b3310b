"""Warm starts on public data and partial private training (issue #105),
against our tuned DP-FedAvg from scratch at equal epsilon in seed 000's
EMNIST regime."""

from benchmarks.studies.seed000 import REGIME_000
from benchmarks.studies.linear_compression import COLUMNS_DP_FEDAVG
from benchmarks.studies.study import reseeded
from benchmarks.studies.study import Row
from benchmarks.studies.study import Study

STUDIES: dict[str, Study] = {}

# The public set's warm start: steps of batch 32 (benchmarks.public_only
# measured the public-only model at these steps).
PRETRAIN = dict(
  public_data='emnist_byclass_test',
  public_pretrain_steps=2000,
  public_pretrain_batch_size=32,
  public_pretrain_lr=0.05,
)
# CNN-2-layers' 1,206,590 weights: conv1 320, conv2 18,496, dense1
# (128 units) 1,179,776, logits 7,998. Training only the output layer
# sends 151x less and its noise has 151x less energy at the same z and C.
HEAD = 'dense1,logits'

_ROWS = (
  Row('warm_all', 'DP-FedAvg, warm start, all layers', dict(PRETRAIN)),
  Row(
    'warm_logits',
    'DP-FedAvg, warm start, output layer only',
    dict(PRETRAIN, train_layers='logits'),
  ),
  Row(
    'warm_head',
    'DP-FedAvg, warm start, dense and output layers',
    dict(PRETRAIN, train_layers=HEAD),
  ),
)

STUDIES['public_warm_emnist'] = Study(
  title="Warm starts on public data in seed 000's EMNIST regime",
  notes="""
Issue #105: the model is first trained centrally on the public set
`emnist_byclass_test` (EMNIST ByClass's test split at half size; no exact
image match with the 300 LEAF writers; `tff_dp.tasks.public`), then privately
as DP-FedAvg in seed 000's regime: 300 LEAF writers, q = 0.1, (6, 1/300)-DP
over 300 rounds, clip 0.03, 30 local steps of batch 64, CNN-2-layers.
`warm_*` rows train all layers or only the named ones (`--train_layers`).
The reference is our DP-FedAvg from scratch in the same regime:
`dp_fedavg_300` and its `_seed1` / `_seed2` in
benchmarks/results/seed000_regime.md, 58.53-60.28% final; the public-only
model (no private round) is in benchmarks/results/public_only.md.
""",
  metric='test_accuracy',
  common=dict(REGIME_000, method='dp_fedavg', rounds=300, eval_every=10),
  rows=_ROWS + reseeded(_ROWS[0], (1, 2)),
  columns=COLUMNS_DP_FEDAVG,
)
