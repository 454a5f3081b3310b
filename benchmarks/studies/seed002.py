"""Seed 002: DPSFL, DPSFL-AC and FetchSGD on a count sketch against DP-FedAvg
and DP-RandAgg, on EMNIST and CIFAR-10."""

import dataclasses

from benchmarks.studies.study import reseeded
from benchmarks.studies.study import Row
from benchmarks.studies.study import STATEFUL_DROPOUT
from benchmarks.studies.study import smoke
from benchmarks.studies.study import Study

STUDIES: dict[str, Study] = {}

_SKETCH_COLUMNS = (
  'row',
  'method',
  'best test metric',
  'round of best',
  'final test metric',
  'KB up / client / round',
  'KB down / client / round',
  'upload compression x',
  'epsilon RDP',
  'epsilon PLD',
  'noise multiplier',
  'clip',
  'final clip',
  's/round',
  'tuning outside ledger',
  'seed',
  'date',
  'wall s',
  'command',
)
_SKETCH_NOTES = """
Seed 002 (DPSFL, DPSFL-AC) against DP-FedAvg and FetchSGD at equal epsilon.
The seed reports figures only (its numbers and most hyperparameters were
lost in extraction), so there is no paper column; it finds DPSFL-AC closest
to non-private FetchSGD and both above DP baselines. **Our scale:** {scale}
All private rows: epsilon = {eps} (RDP, delta {delta}) over the run, noise
calibrated per method (DPSFL-AC's bit noise 10 composed in). Sketch 5 rows
x {cols} columns (upload compression d / (5 x {cols})), top-k = {k} per round,
sketch momentum 0 (as the baseline's server: SGD lr 1, no momentum), error
feedback on; clip {clip} for all (DPSFL-AC's initial clip; target
probability 0.5, impact threshold 0.1, clip lr 0.2). With threshold 0.1
the clip collapsed on EMNIST (0.3 -> 0.016 in 28 rounds): the absolute
impact (1 - f) ||g_T|| on the previous top-k coordinates T stays below 0.1
for nearly every client at any clip, because ||g_T|| is a small part of
update norms of about 0.27, so the noisy unclipped probability stays near
1 > 0.5 and the geometric update only lowers the clip. The threshold must
sit below the typical ||g_T||; the row `dpsfl_ac_gamma0.01` reruns it at
0.01. These two rows use the absolute impact test
(`--dpsfl_impact_rule=absolute`); they ran on 2026-11-22, before the flag
existed (commit 41f9150, 2026-11-23), and their commands were given it on
2026-12-03 so that they rerun as they ran (not rerun to check); since
issue #24 the default is the relative test (clip error / ||g_T|| <= gamma), see
`aggregators/dpsfl.py`. On CIFAR-10 the rows `dp_fedavg_clip0.2` and
`dp_fedavg_slr0.5` tune the baseline (clip 0.2; server lr 0.5). Best test
accuracy over evaluated rounds (every 2nd). Bytes per participating client and
round: our declared cost (sketch up; top-k values and indices down, for
sketch methods a client that holds the current model). A first try at
5 x 24,000 columns with top-k 12,000 (k / columns = 0.5) diverged for
FetchSGD on EMNIST (train loss 4.1 -> 8.8 by round 14, accuracy under 7%):
a count sketch estimates only coordinates well above ||g|| / sqrt(columns),
so k must be a small fraction of the columns (FetchSGD's own settings keep
k / columns near 0.05-0.1); we use k / columns = 0.1. A DP-FedAvg row
recorded before that change carries the first try's sketch flags in its
command; DP-FedAvg ignores them.
The s/round of most rows is inflated: they ran while the test
suite ran beside them. `method_cost.md` has each method's round cost
measured on a quiet machine.
"""


def _sketch_rows(extra=()):
  return (
    Row('dp_fedavg', 'DP-FedAvg (fixed clip)', dict(method='dp_fedavg')),
    Row('fetchsgd', 'FetchSGD (no DP)', dict(method='fetchsgd')),
    Row('dpsfl', 'DPSFL', dict(method='dpsfl')),
    Row(
      'dpsfl_ac',
      'DPSFL-AC',
      dict(method='dpsfl_ac', dpsfl_impact_rule='absolute'),
    ),
    Row(
      'dpsfl_ac_gamma0.01',
      'DPSFL-AC, impact threshold 0.01',
      dict(
        method='dpsfl_ac',
        dpsfl_impact_threshold=0.01,
        dpsfl_impact_rule='absolute',
      ),
    ),
    *extra,
  )


_SKETCH_COMMON = dict(
  sketch_rows=5,
  sketch_momentum=0.0,
  dpsfl_bit_noise=10.0,
  eval_every=2,
  seed=0,
  # Reproducible research rows: the guarantee assumes this seed secret.
  noise_seed=0,
)


def _sketch_study(
  task, scale, delta, delta_words, rate, batch, lr, clip, extra_rows=()
):
  return Study(
    title=f'Seed 002: DPSFL and DPSFL-AC on {task} at reduced scale',
    notes=_SKETCH_NOTES.format(
      scale=scale,
      eps=4,
      delta=delta_words,
      cols=100000,
      k=10000,
      clip=clip,
    )
    + STATEFUL_DROPOUT,
    metric='test_accuracy',
    common=dict(
      task=task,
      rounds=30,
      client_sampling_rate=rate,
      delta=delta,
      target_epsilon=4.0,
      batch_size=batch,
      local_epochs=10,
      local_steps=10,
      client_lr=lr,
      clip=clip,
      sketch_columns=100000,
      sketch_k=10000,
      **_SKETCH_COMMON,
    ),
    rows=_sketch_rows(extra_rows),
    columns=_SKETCH_COLUMNS,
  )


# DPSFL-AC in the relative reading (the default since issue #24), its bit
# noise at the default expected clients / 20.
_AC_RELATIVE = (
  'dpsfl_ac_relative',
  'DPSFL-AC, relative impact test, bit noise expected clients / 20',
  dict(method='dpsfl_ac', dpsfl_bit_noise=None),
)
STUDIES['seed002_emnist'] = _sketch_study(
  'emnist',
  'LEAF EMNIST, 300 writers, 62 classes, CNN-2-layers (1,206,590 params; '
  'the seed uses ResNet-9 on CIFAR/MNIST); Poisson q = 0.1 (30 writers a '
  'round), 30 rounds, 10 local steps of batch 64, lr 0.03.',
  1 / 300,
  '1/300',
  0.1,
  64,
  0.03,
  0.3,
  extra_rows=(
    # The relative impact test over 30 rounds: does its clip settle?
    Row(*_AC_RELATIVE),
    smoke(*_AC_RELATIVE),
    # FetchSGD's sketch momentum 0.9 (the runner's default; the rows above
    # ran without it), at two sketch lrs: 0.1 gives the steady step
    # lr / (1 - 0.9) = 1 of the momentum-free rows, 0.03 a third of it.
    *(
      smoke(
        f'dpsfl_momentum0.9_lr{lr}',
        f'DPSFL, sketch momentum 0.9, sketch lr {lr}',
        dict(method='dpsfl', sketch_momentum=0.9, sketch_lr=lr),
      )
      for lr in (0.1, 0.03)
    ),
  ),
)
STUDIES['seed002_cifar10'] = _sketch_study(
  'cifar10_dirichlet',
  'CIFAR-10 over 100 clients, Dirichlet alpha 1, CNN-2-layers (the seed: '
  'ResNet-9, 7M params); Poisson q = 0.2 (20 clients a round), 30 rounds, '
  '10 local steps of batch 50, lr 0.05.',
  0.01,
  '1e-2 (1/N)',
  0.2,
  50,
  0.05,
  0.5,
  extra_rows=(
    # The baseline peaked at round 8 and fell back: tune it before drawing
    # conclusions (median pre-clip norm about 0.42).
    Row(
      'dp_fedavg_clip0.2',
      'DP-FedAvg (fixed clip 0.2)',
      dict(method='dp_fedavg', clip=0.2),
    ),
    Row(
      'dp_fedavg_slr0.5',
      'DP-FedAvg (fixed clip, server lr 0.5)',
      dict(method='dp_fedavg', server_lr=0.5),
    ),
  ),
)

# Issue #28 item 5: seed 002 at equal upload on EMNIST, all in today's code
# (stateless dropout), at the study's 30 rounds (the seed states no round
# count). The sketch is the study's 5 x 100,000 with top-k 10,000 (k /
# columns = 0.1, which the study found FetchSGD needs): compression level
# (bytes up and down against dense, the seed's measure in Fig. 5) 4.6x,
# inside the seed's sweep of 1 to 5. Upload per client and round, from
# `aggregators/dpsfl.upload_bytes(rows, columns)` = 4 x rows x columns:
# 4 x 5 x 100,000 = 2,000,000 B (DPSFL-AC 2,000,004 B: + its bit).
# DP-RandAgg uploads `aggregators/dp_randagg.upload_bytes(k)` = 4k B, so the
# same bytes are k = 500,000 of CNN-2-layers' d = 1,206,590 weights: k / d =
# 5 x 100,000 / 1,206,590 = 0.414391 (`methods/dp_randagg.num_coordinates`:
# round(0.414391 x 1,206,590) = 500,000, so 2,000,000 B). DP-FedAvg is the
# uncompressed reference: 4d = 4,826,360 B, 2.41x the others.
_emnist = STUDIES['seed002_emnist']
_by_name = {r.name: r for r in _emnist.rows}
_EMNIST_PARAMS = 1_206_590  # CNN-2-layers on EMNIST-62.
_RANDAGG_FRACTION = round(
  _emnist.common['sketch_rows']
  * _emnist.common['sketch_columns']
  / _EMNIST_PARAMS,
  6,
)
# The largest cohort the 300 writers allow: Poisson q = 1, all 300 every
# round (the accountant takes q = 1, with no amplification by sampling).
# It measures the cohort-size argument (results README: the noise per
# counter of the mean sketch, z sqrt(rows) C / n, against a typical
# coordinate of the mean update, C / sqrt(d) = 0.0003). Epsilon 4 at delta
# 1/300 over 30 rounds needs z = 4.532 at q = 1 against 0.835 at q = 0.1
# (`privacy.calibrate_noise_multiplier`, RDP; PLD epsilon 3.49), so the
# noise per counter is 4.532 x sqrt(5) x 0.3 / 300 = 0.0101 against
# 0.835 x sqrt(5) x 0.3 / 30 = 0.0187: 1.84x less, still about 34x the
# typical coordinate, so the estimate predicts no rescue. DPSFL at its
# fixed clip (not DPSFL-AC): C in the argument stays fixed and no bit
# shares the budget. 10x the cohort of every other row: the worker's
# memory grows with the cohort (performance notes, "Memory over long runs"), not
# measured at 300.
_EQUAL_UPLOAD = tuple(
  Row(f'{name}_eqbytes', label, flags)
  for name, label, flags in (
    (
      'dp_fedavg',
      'DP-FedAvg (fixed clip, uncompressed reference)',
      _by_name['dp_fedavg'].flags,
    ),
    ('fetchsgd', 'FetchSGD (no DP), sketch upload', _by_name['fetchsgd'].flags),
    ('dpsfl', 'DPSFL, sketch upload', _by_name['dpsfl'].flags),
    (
      'dpsfl_ac_relative',
      'DPSFL-AC (relative impact test), sketch upload',
      _by_name['dpsfl_ac_relative'].flags,
    ),
    (
      'dp_randagg',
      f'DP-RandAgg (k/d = {_RANDAGG_FRACTION}), sketch upload',
      dict(method='dp_randagg', randagg_fraction=_RANDAGG_FRACTION),
    ),
    (
      'dpsfl_q1',
      'DPSFL, sketch upload, all 300 writers a round (q = 1)',
      dict(_by_name['dpsfl'].flags, client_sampling_rate=1.0),
    ),
  )
)
_eq = {r.name: r for r in _EQUAL_UPLOAD}
# Issue #28 item 7: our DP-FedAvg tuned on EMNIST at the study's epsilon 4
# and 30 rounds: a clip grid around the study's 0.3 (the median pre-clip
# norm is 0.33, 78% of updates clipped) and a larger server lr at clip
# 0.3 (its curve was still rising at round 30); chosen on the test metric,
# outside the ledger, as the baseline's tuning in every study here.
_TUNING = tuple(
  Row(
    f'dp_fedavg_{name}_eqbytes',
    f'DP-FedAvg tuning: {words}',
    dict(_by_name['dp_fedavg'].flags, **flags),
  )
  for name, words, flags in (
    ('clip0.1', 'clip 0.1', dict(clip=0.1)),
    ('clip0.2', 'clip 0.2', dict(clip=0.2)),
    ('clip0.5', 'clip 0.5', dict(clip=0.5)),
    ('slr2', 'clip 0.3, server lr 2', dict(server_lr=2.0)),
    # Server lr 2 won the first grid (58.4% against 55.6%): one step on.
    ('slr4', 'clip 0.3, server lr 4', dict(server_lr=4.0)),
  )
)
STUDIES['seed002_emnist'] = dataclasses.replace(
  _emnist,
  notes=_emnist.notes
  + f"""Rows ending `_eqbytes` (issue #28) compare the methods at equal
upload, in today's code: DPSFL, DPSFL-AC (relative reading) and FetchSGD
with the sketch above (2,000,000 B a client and round) against DP-RandAgg
sending k / d = {_RANDAGG_FRACTION} of the weights (500,000 float32, the
same bytes; its download is the model and the k indices) and DP-FedAvg
uncompressed (4,826,360 B) as the reference, 30 rounds. `dpsfl_q1_eqbytes`
samples all 300 writers every round (q = 1, noise multiplier recalibrated
for epsilon 4: noise per counter 0.0101 against 0.0187 at q = 0.1) to
measure the cohort-size argument instead of estimating it.
`_seed1` / `_seed2` rerun the headline pair (DPSFL-AC relative, DP-FedAvg)
with `--seed` and `--noise_seed` set to 1 / 2. `dp_fedavg_clip*_eqbytes`
and `dp_fedavg_slr{2,4}_eqbytes` tune our DP-FedAvg (clip 0.1, 0.2, 0.5;
server lr 2 and 4 at clip 0.3) at the same epsilon, chosen on the test
metric outside the ledger; the winner, server lr 2, is rerun under seeds 1
and 2 (`dp_fedavg_slr2_eqbytes_seed1` / `_seed2`). Of the `_eqbytes` rows
(and their `_seed` reruns) defined in the study, only those in this table
have run.
""",
  rows=_emnist.rows
  + _EQUAL_UPLOAD
  # The headline pair (DPSFL-AC relative against DP-FedAvg) under seeds 1, 2.
  + reseeded(_eq['dpsfl_ac_relative_eqbytes'], (1, 2))
  + reseeded(_eq['dp_fedavg_eqbytes'], (1, 2))
  + _TUNING
  # The tuning winner (server lr 2; server lr 4 was unstable) under seeds
  # 1, 2.
  + reseeded({r.name: r for r in _TUNING}['dp_fedavg_slr2_eqbytes'], (1, 2)),
)
