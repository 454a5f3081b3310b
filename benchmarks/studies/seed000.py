"""Seed 000: BLUR and LUS against DP-FedAvg on federated EMNIST, Table 3, and
the paper's own regime (Q = 30, S binding)."""

from benchmarks.studies.study import at_rounds
from benchmarks.studies.study import reseeded
from benchmarks.studies.study import Row
from benchmarks.studies.study import STATEFUL_DROPOUT
from benchmarks.studies.study import smoke
from benchmarks.studies.study import Study

STUDIES: dict[str, Study] = {}

_EMNIST_000 = dict(
  task='emnist',
  rounds=30,
  client_sampling_rate=0.1,
  delta=1 / 300,
  target_epsilon=6.0,
  batch_size=64,
  local_epochs=10,
  local_steps=10,
  client_lr=0.03,
  clip=0.3,
  blur_lambda=0.4,
  eval_every=2,
  seed=0,
  # Reproducible research rows: the guarantee assumes this seed secret.
  noise_seed=0,
)
_PAPER_000 = {
  ('dp_fedavg', 0.0): 76.24,
  ('lus', 0.1): 76.52,
  ('lus', 0.3): 77.28,
  ('lus', 0.5): 77.75,
  ('lus', 0.7): 77.54,
  ('lus', 0.9): 77.39,
  ('blur_lus', 0.1): 78.28,
  ('blur_lus', 0.3): 79.26,
  ('blur_lus', 0.5): 79.97,
  ('blur_lus', 0.7): 80.32,
  ('blur_lus', 0.9): 80.17,
}


def _rows_000():
  rows = [
    Row(
      'dp_fedavg',
      'DP-FedAvg (sparsity 0)',
      dict(method='dp_fedavg'),
      dict(best=_PAPER_000[('dp_fedavg', 0.0)] / 100),
    ),
  ]
  for method, label in (
    ('lus', 'DP-FedAvg + LUS'),
    ('blur_lus', 'DP-FedAvg + BLUR + LUS'),
  ):
    for c in (0.5, 0.9):
      rows.append(
        Row(
          f'{method}_{c}',
          f'{label} (sparsity {c})',
          dict(method=method, lus_sparsity=c),
          dict(best=_PAPER_000[(method, c)] / 100),
        )
      )
  return tuple(rows)


STUDIES['seed000_table3'] = Study(
  title='Seed 000 Table 3 (LUS sparsity, with and without BLUR) at reduced '
  'scale',
  notes="""
Cheng et al. (seed 000) Table 3: LUS sparsity c with and without BLUR vs
DP-FedAvg at one epsilon (6), EMNIST. **Reduced:** LEAF's 300 EMNIST
writers (62 classes) instead of TFF's 3,400; CNN-2-layers (1,206,590
params) instead of ResNet-18; Poisson q = 0.1 (30 writers a round) for
30 rounds instead of p = 0.04 for 1,000 rounds; 10 local steps of batch
64 instead of 30 (lr 0.03, server lr 1, as the paper); clip S = 0.3
(the paper's grid found 0.03 for EMNIST with 30 steps at its scale);
BLUR lambda 0.4 (the paper's default); delta = 1/N. Noise is calibrated
for epsilon = 6 over the 30 rounds (RDP). Sparsities 0.5 and 0.9 only
(the 2-core budget: each row is about 6 minutes). The pre-clip norm columns are
the sparsified update's (what is clipped), median over rounds of the
cohort's median and of the fraction clipped. Best test accuracy over the
evaluated rounds (every 2nd). The paper's numbers are after 1,000 rounds.
"""
  + STATEFUL_DROPOUT,
  metric='test_accuracy',
  common=_EMNIST_000,
  rows=_rows_000(),
  columns=(
    'row',
    'method',
    'best test metric',
    'paper',
    'round of best',
    'final test metric',
    'epsilon RDP',
    'epsilon PLD',
    'noise multiplier',
    'clip',
    'median pre-clip norm',
    'fraction clipped',
    's/round',
    'tuning outside ledger',
    'seed',
    'date',
    'wall s',
    'command',
  ),
)

# Seed 000's own regime (its Sec. 6: Q = 30, batch 64, lr 0.03, S = 0.03
# on EMNIST), where BLUR's pull and LUS's sparsity have a binding clip to
# act on; the clip is the same for every row.
REGIME_000 = dict(
  _EMNIST_000,
  local_steps=30,
  # LEAF writers hold about 138 digits (~2 batches of 64): enough epochs
  # that the 30-step cap binds.
  local_epochs=100,
  clip=0.03,
)
# DDGauss's paper number: Table 3 has no DDGauss; Table 1's CNN-2-Layers
# entry at epsilon 6 (our model; its ResNet-18 entry is 77.64).
_PAPER_000_DDGAUSS = 74.34
# Issue #28: Table 3's rows and DDGauss in this regime at 300 of the
# paper's 1,000 rounds (noise recalibrated for epsilon 6 over them),
# evaluated every 10th round (and the last).
_REGIME_300 = tuple(
  at_rounds(row, 300, eval_every=10)
  for row in STUDIES['seed000_table3'].rows
  + (
    Row(
      'ddgauss',
      'DDGauss',
      dict(method='ddgauss'),
      dict(best=_PAPER_000_DDGAUSS / 100),
    ),
  )
)
_by_name_300 = {r.name: r for r in _REGIME_300}
# Issue #86: DP-FedAvg with noise correlated across rounds, at the same
# epsilon. Each writer takes part about 30 times (q = 0.1 over 300 rounds),
# where correlation has the most rounds to cancel over. Banded MF under
# cyclic Poisson (amplified; bands auto) under seeds 0-2; BLT under
# min-separation over 10 groups (each member of the round's group takes
# part: 30 writers a round, 30 participations each; no amplification).
_banded_300 = at_rounds(
  Row(
    'banded_mf',
    'DP-FedAvg, banded MF noise (bands auto, cyclic Poisson)',
    dict(
      method='dp_fedavg',
      participation='cyclic_poisson',
      # As its seed-0 run began before groups were dealt by client id
      # (zero-out neighbouring; docs/privacy.md), for all three seeds.
      participation_partition='balanced',
      noise='banded',
      bands='auto',
    ),
  ),
  300,
  eval_every=10,
)
_CORRELATED_300 = (
  _banded_300,
  *reseeded(_banded_300, (1, 2)),
  at_rounds(
    Row(
      'blt',
      'DP-FedAvg, BLT noise (2 buffers, 10 groups, min-separation)',
      dict(
        method='dp_fedavg',
        participation='cyclic',
        participation_groups=10,
        participation_partition='balanced',
        noise='blt',
      ),
    ),
    300,
    eval_every=10,
  ),
)
_PAPER_SCALE_000 = """
Rows ending `_300` (issue #28) run Table 3's rows (DP-FedAvg, LUS and
BLUR + LUS at sparsity 0.5 / 0.9, lambda 0.4) and DDGauss in this regime
for 300 of the paper's 1,000 rounds: noise calibrated for epsilon 6 over
the 300 rounds (RDP), evaluated every 10th round and the last, otherwise
as the rows above. DDGauss is the paper's Table 1 baseline (Table 3 has
none); its paper number is Table 1's CNN-2-Layers entry at epsilon 6
(ResNet-18: 77.64). It runs the default 20 bits and release gate: under
Poisson q = 0.1 over 300 writers min_clients is 19 (the 1% quantile of
the cohort), so its clients' noise is calibrated to 18 shares and a
round of 30 carries about 1.7 times the noise variance of DP-FedAvg's at
the same epsilon, and the ledger does not charge for what the cohort
count reveals (README). Its row rests on that assumption and is not a
rigorous guarantee (its 'guarantee caveat' cell): under Poisson sampling
the round's participant count is public (to the server through secure
aggregation, to anyone through the noise variance), which the subsampling
bound assumes hidden; fixed-size sampling would need no such assumption.
Its epsilon columns are the earlier continuous-Gaussian reading of its
rounds; by DDGauss's own theorem it is 6.88 RDP and has no PLD
(`benchmarks/results/ddgauss_reaccounting.md`). `_seed1` / `_seed2`
rerun the headline pair (BLUR + LUS at sparsity 0.9, DP-FedAvg) with
`--seed` and `--noise_seed` set to 1 / 2. `banded_mf_300` (seeds 0-2)
and `blt_300` are DP-FedAvg with noise correlated across rounds at the
same epsilon (issue #86; docs/privacy.md), with the groups dealt from a
permutation of the population (`--participation_partition=balanced`, as
the seed-0 run began under it): their epsilon holds for zero-out
neighbouring, where DP-FedAvg's Poisson-sampled epsilon is the same
number. `banded_mf_300` resumed from a config saved before that setting
existed, and its run named its own earlier rounds as a noise seed used
for another configuration; its guarantee caveat cell is cleared after the
run (the kept summary's `privacy.correction`), since that caveat was
false, and the registry now fills settings added since. Its noise seed
is shared with the other rows, as for every study row
(`benchmarks/results/README.md`). `blt_300` was resumed at round 31 on
another machine from a folder that predated `noise_plan.json`; its
`noise_plan.json` was written from the strategy its ledger recorded for
round 1 (`benchmarks/in_progress/README.md`), so rounds 31-300 ran the
strategy of rounds 1-30. Of the `_300` rows defined in the study, only
those in this table have run.
"""
STUDIES['seed000_regime'] = Study(
  title="Seed 000's regime (Q = 30, S = 0.03): BLUR and LUS with a binding "
  'clip',
  notes="""
Cheng et al. (seed 000), Sec. 6: "the number of local iterations Q = 30",
"the mini-batch size to 64", "the local LR eta_l to 0.03", and "S = 0.03
... perform best on EMNIST"; lambda and c from its grids ("lambda = 0.4 and
c = 0.7" by default; 0.8 is its grid's largest lambda). Everything else as
`seed000_table3` (LEAF EMNIST, 300 writers, CNN-2-layers, Poisson q = 0.1,
epsilon 6 over the rows' rounds, delta 1/300). What the paper's Lemma 2
predicts: an update that stays outside the ball for all Q steps has its
norm scaled by the mean discount (1 - (1 - lambda eta)^Q) / (Q lambda eta),
0.84 at lambda 0.4 and 0.72 at lambda 0.8; with pre-clip norms far above
S = 0.03 BLUR lowers the median pre-clip norm by roughly that much, and the
fraction clipped stays near 1. Smoke rows run 10 rounds (less noise for
the same epsilon) and show only the mechanism; full rows run 30.
"""
  + _PAPER_SCALE_000
  + STATEFUL_DROPOUT,
  metric='test_accuracy',
  common=REGIME_000,
  rows=(
    smoke('dp_fedavg', 'DP-FedAvg', dict(method='dp_fedavg')),
    smoke(
      'blur_0.8',
      'DP-FedAvg + BLUR (lambda 0.8)',
      dict(method='blur', blur_lambda=0.8),
    ),
    smoke(
      'lus_0.7',
      'DP-FedAvg + LUS (sparsity 0.7)',
      dict(method='lus', lus_sparsity=0.7),
    ),
    Row('dp_fedavg', 'DP-FedAvg', dict(method='dp_fedavg')),
    Row('blur_0.4', 'DP-FedAvg + BLUR (lambda 0.4)', dict(method='blur')),
    Row(
      'blur_0.8',
      'DP-FedAvg + BLUR (lambda 0.8)',
      dict(method='blur', blur_lambda=0.8),
    ),
    Row(
      'lus_0.7',
      'DP-FedAvg + LUS (sparsity 0.7)',
      dict(method='lus', lus_sparsity=0.7),
      dict(best=_PAPER_000[('lus', 0.7)] / 100),
    ),
    Row(
      'blur_lus_0.7',
      'DP-FedAvg + BLUR + LUS (lambda 0.4, sparsity 0.7)',
      dict(method='blur_lus', lus_sparsity=0.7),
      dict(best=_PAPER_000[('blur_lus', 0.7)] / 100),
    ),
  )
  + _REGIME_300
  # The headline pair (BLUR + LUS at sparsity 0.9 against DP-FedAvg) under
  # seeds 1, 2.
  + reseeded(_by_name_300['blur_lus_0.9_300'], (1, 2))
  + reseeded(_by_name_300['dp_fedavg_300'], (1, 2))
  + _CORRELATED_300
  # Issue #103: does accuracy here depend on the DP noise at all? DP-FedAvg
  # at the same clip without noise (multiplier 0: no guarantee).
  + (
    at_rounds(
      Row(
        'dp_fedavg_no_noise',
        'DP-FedAvg clip 0.03, no noise (multiplier 0, no guarantee)',
        dict(method='dp_fedavg', noise_multiplier=0.0, target_epsilon=None),
      ),
      300,
      eval_every=10,
    ),
  ),
  # Table 3's columns and, after the epsilons, why a row's epsilon is not
  # a rigorous guarantee where its run says so (DDGauss under Poisson).
  columns=tuple(
    c
    for column in STUDIES['seed000_table3'].columns
    for c in (
      (column, 'guarantee caveat') if column == 'epsilon PLD' else (column,)
    )
  ),
)
