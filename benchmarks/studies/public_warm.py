"""Warm starts on public data and partial private training (issue #105),
against our tuned DP-FedAvg from scratch at equal epsilon in seed 000's
EMNIST regime and seed 001's Fashion-MNIST setting."""

import dataclasses

from benchmarks.studies.seed000 import REGIME_000
from benchmarks.studies.seed001 import COMMON_001
from benchmarks.studies.seed002 import STUDIES as STUDIES_002
from benchmarks.studies.linear_compression import COLUMNS_DP_FEDAVG
from benchmarks.studies.study import reseeded
from benchmarks.studies.study import Row
from benchmarks.studies.study import Study

STUDIES: dict[str, Study] = {}


def at_clip(row: Row, clip: float) -> Row:
  """`row` at another clip: the partial models' clip tuning (their update
  norms differ from the whole model's)."""
  return dataclasses.replace(
    row,
    name=f'{row.name}_clip{clip:g}',
    label=(
      row.label.replace(
        f"clip {row.flags.get('clip', 0.5):g}", f'clip {clip:g}'
      )
      if 'clip ' in row.label
      else f'{row.label}, clip {clip:g}'
    ),
    flags=dict(row.flags, clip=clip),
  )


# The public set's warm start: steps of batch 32 (benchmarks.public_only
# measured the public-only model at these steps).
PRETRAIN = dict(
  public_data='emnist_byclass_test',
  public_pretrain_steps=2000,
  public_pretrain_batch_size=32,
  public_pretrain_lr=0.05,
)
# The public set is EMNIST's test split, NIST SD19's test partition hsf_4:
# its writers (75 of the 300) leave the task, clients and test examples,
# in every row here, the from-scratch reference included.
WITHOUT_HSF4 = ['drop_nist_test_writers=1']
# CNN-2-layers' 1,206,590 weights: conv1 320, conv2 18,496, dense1
# (128 units) 1,179,776, logits 7,998. Training only the output layer
# (`warm_logits`) sends 151x less and its noise has 151x less energy at
# the same z and C; the dense and output layers (`warm_head`) are 98% of
# the model (1,187,774 weights).
HEAD = 'dense1,logits'

_SCRATCH = Row(
  'scratch',
  'DP-FedAvg from scratch on the 225 writers outside hsf_4',
  dict(),
)
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
  # Rank-8 adapters on dense1 (8 x (9,216 + 128) = 74,752) and the other
  # layers in full (26,814): 101,566 trained, 11.9x less up than the plain
  # model (the 'upload compression x' column, adapter factors counted in
  # the model as run, says 12.6x).
  Row(
    'warm_adapters',
    'DP-FedAvg, warm start, rank-8 adapters on dense1, other layers',
    dict(
      PRETRAIN,
      adapter_layers='dense1',
      adapter_rank=8,
      train_layers='conv1,conv2,logits',
    ),
  ),
)

_EMNIST_NOTES = """
The public set `emnist_byclass_test` is EMNIST ByClass's test split at half
size (`tff_dp.tasks.public`), NIST SD19's test partition hsf_4: its 75
writers among the 300 LEAF writers leave the task
(`--task_option=drop_nist_test_writers=1`, their training and test
examples), so 225 writers remain, in every row. "upload compression x"
is the whole model as run (frozen weights and adapter factors included)
over the bytes sent."""

_emnist = {r.name: r for r in _ROWS}

STUDIES['public_warm_emnist'] = Study(
  title="Warm starts on public data in seed 000's EMNIST regime",
  notes="""
Issue #105: the model is first trained centrally on the public set, then
privately as DP-FedAvg in seed 000's regime over the 225 writers: q = 0.1,
(6, 1/300)-DP over 300 rounds, clip 0.03, 30 local steps of batch 64,
CNN-2-layers. `warm_*` rows train all layers, only the named ones
(`--train_layers`), or low-rank adapters beside frozen layers
(`--adapter_layers`). The reference is `scratch` (3 seeds), our tuned
DP-FedAvg from scratch on the same 225 writers; on all 300 writers it
scores 58.53-60.28% (`dp_fedavg_300` and its seeds in
benchmarks/results/seed000_regime.md). The public-only model (no private
round) is in benchmarks/results/public_only.md. `*_clip0.01` tune the
partial models' clip (chosen on the test metric, outside the ledger).
"""
  + _EMNIST_NOTES,
  metric='test_accuracy',
  common=dict(
    REGIME_000,
    task_option=WITHOUT_HSF4,
    method='dp_fedavg',
    rounds=300,
    eval_every=10,
  ),
  rows=(_SCRATCH,)
  + reseeded(_SCRATCH, (1, 2))
  + _ROWS
  + reseeded(_emnist['warm_all'], (1, 2))
  # In seed 002's setting the partial models did best at a third of the
  # whole model's clip (public_warm_emnist002, clip 0.1 of 0.3): their
  # updates are smaller (median pre-clip norm 0.10-0.17 against 0.22).
  + tuple(
    at_clip(_emnist[name], 0.01) for name in ('warm_logits', 'warm_adapters')
  )
  # At 0.03 the output layer's updates are all clipped (median pre-clip
  # norm 0.25 in `warm_logits`): the clip then sets the step, not the
  # signal-to-noise ratio, so the tuning also goes up.
  + (at_clip(_emnist['warm_logits'], 0.1),)
  # The output layer's other seeds, the headline's.
  + reseeded(_emnist['warm_logits'], (1, 2))
  # The headline with the linear compressor: the output layer's 7,998
  # weights in 800 rows, 1,504x less up than the plain model, about as
  # many rows as the whole model's 1000x (1,207), which ended at 60.0%,
  # inside the uncompressed 58.53-60.28% on all 300 writers
  # (benchmarks/results/linear_compression_emnist.md).
  + (
    Row(
      'warm_logits_srht10x',
      'DP-FedAvg, warm start, output layer only, SRHT interleaved 10x',
      dict(
        PRETRAIN,
        train_layers='logits',
        compression='10',
        compression_sketch='srht_interleaved',
      ),
    ),
  ),
  columns=COLUMNS_DP_FEDAVG,
)

# Seed 001's Fashion-MNIST IID setting with 1% of the clients opting in
# (60 of 6,000, 600 examples) as public data; benchmarks.public_only
# measured the public-only model at these steps (78.5-80.7%, 3 seeds).
OPT_IN = ['public_clients=60']
PRETRAIN_FASHION = dict(
  public_data='fashion_mnist_opt_in',
  public_pretrain_steps=1000,
  public_pretrain_batch_size=32,
  public_pretrain_lr=0.05,
)
# McMahan et al.'s CNN: conv1 832, conv2 51,264, dense1 1,606,144, logits
# 5,130 weights. Leaving dense1 at its warm start sends 29x less; the
# output layer alone, 324x less.
CONVS_LOGITS = 'conv1,conv2,logits'
# Rank-8 adapters on dense1 (8 x (3,136 + 512) = 29,184) and the other
# layers in full (57,226): 86,410 trained, 19.2x less up than the plain
# model (19.6x in the 'upload compression x' column, adapters counted).
ADAPTERS_FASHION = dict(
  PRETRAIN_FASHION,
  adapter_layers='dense1',
  adapter_rank=8,
  train_layers=CONVS_LOGITS,
)

_FASHION_ROWS = (
  Row(
    'warm_all',
    'DP-FedAvg clip 0.5, warm start, all layers',
    dict(PRETRAIN_FASHION),
  ),
  Row(
    'warm_convs_logits',
    'DP-FedAvg clip 0.5, warm start, dense1 frozen',
    dict(PRETRAIN_FASHION, train_layers=CONVS_LOGITS),
  ),
  Row(
    'warm_logits',
    'DP-FedAvg clip 0.5, warm start, output layer only',
    dict(PRETRAIN_FASHION, train_layers='logits'),
  ),
  Row(
    'warm_adapters',
    'DP-FedAvg clip 0.5, warm start, rank-8 adapters on dense1, other '
    'layers',
    ADAPTERS_FASHION,
  ),
  Row(
    'warm_all_srht100x',
    'DP-FedAvg clip 0.5, warm start, all layers, SRHT interleaved 100x',
    dict(
      PRETRAIN_FASHION,
      compression='100',
      compression_sketch='srht_interleaved',
    ),
  ),
  # The adapters' 86,410 trained weights in 8,641 rows: 193x less up than
  # the plain model, about as many rows as the whole model's 100x (16,634).
  Row(
    'warm_adapters_srht10x',
    'DP-FedAvg clip 0.5, warm start, rank-8 adapters on dense1, other '
    'layers, SRHT interleaved 10x',
    dict(
      ADAPTERS_FASHION,
      compression='10',
      compression_sketch='srht_interleaved',
    ),
  ),
  Row(
    'scratch',
    'DP-FedAvg clip 0.5 from scratch on the 5,940 other clients',
    dict(),
  ),
)

_fashion = {r.name: r for r in _FASHION_ROWS}
# Clip tuning of the partial models around seed 001's 0.5: a 3-round
# non-private FedAvg probe from the warm start measured mean update norms
# of 0.67-0.95 for the output layer alone and for dense1 frozen (with or
# without adapters), against 0.72-1.03 for the whole model.
_FASHION_TUNING = tuple(
  at_clip(_fashion[name], clip)
  for name in ('warm_logits', 'warm_adapters')
  for clip in (0.25, 1.0)
)

STUDIES['public_warm_fashion'] = Study(
  title="Warm starts on public data in seed 001's Fashion-MNIST setting",
  notes="""
Issue #105: 60 of the 6,000 Fashion-MNIST IID clients opt in to share
their data (`--task_option=public_clients=60`: 600 examples, drawn by the
split seed, held out of training; the public set `fashion_mnist_opt_in`).
The model is first trained centrally on them, then privately as
DP-FedAvg over the other 5,940 clients in seed 001's setting: q = 1/60,
(1, 1e-4)-DP over 180 rounds, clip 0.5, 10 local steps of batch 10.
`warm_*` rows train all layers, only the named ones (`--train_layers`),
or low-rank adapters beside frozen layers (`--adapter_layers`);
`scratch` trains from random weights on the same 5,940 clients. The
reference is our tuned DP-FedAvg from scratch on all 6,000 clients:
`dp_fedavg_clip0.5_180` and its `_seed1` / `_seed2` in
benchmarks/results/seed001_iid.md, 82.38-82.75% final; the public-only
model (no private round) is in benchmarks/results/public_only.md.
`*_clip0.25` / `*_clip1` tune the partial models' clip (chosen on the test
metric, outside the ledger, as every baseline's tuning here). "upload
compression x" is the whole model as run (frozen weights and adapter
factors included) over the bytes sent.
""",
  metric='test_accuracy',
  common=dict(
    COMMON_001,
    task='fashion_mnist_iid',
    task_option=OPT_IN,
    method='dp_fedavg',
    rounds=180,
    eval_every=5,
    clip=0.5,
  ),
  rows=_FASHION_ROWS
  + reseeded(_fashion['warm_all'], (1, 2))
  + _FASHION_TUNING
  # The headline row's other seeds.
  + reseeded(_fashion['warm_adapters'], (1, 2)),
  columns=COLUMNS_DP_FEDAVG,
)

STUDIES['public_warm_emnist002'] = Study(
  title="Warm starts on public data in seed 002's EMNIST setting",
  notes="""
Issue #105: the rows of `public_warm_emnist` (the same public set and
warm start, 2,000 steps) in seed 002's EMNIST setting over the 225
writers: q = 0.1, (4, 1/300)-DP over 30 rounds, clip 0.3, server lr 2,
10 local steps of batch 64, CNN-2-layers. The reference is `scratch` (3
seeds), our tuned DP-FedAvg from scratch on the same 225 writers; on all
300 writers it scores 57.61-59.23% (`dp_fedavg_slr2_eqbytes` and its seeds
in benchmarks/results/seed002_emnist.md). The public-only model (no
private round) is in benchmarks/results/public_only.md. `*_clip0.1` /
`*_clip0.6` tune the partial models' clip (chosen on the test metric,
outside the ledger).
"""
  + _EMNIST_NOTES,
  metric='test_accuracy',
  common=dict(
    STUDIES_002['seed002_emnist'].common,
    task_option=WITHOUT_HSF4,
    method='dp_fedavg',
    server_lr=2.0,
  ),
  rows=(_SCRATCH,)
  + reseeded(_SCRATCH, (1, 2))
  + _ROWS
  + reseeded(_emnist['warm_all'], (1, 2))
  + tuple(
    at_clip(_emnist[name], clip)
    for name in ('warm_logits', 'warm_adapters')
    for clip in (0.1, 0.6)
  ),
  columns=COLUMNS_DP_FEDAVG,
)
