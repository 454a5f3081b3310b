"""Seed 001: CMP-Fed and UV-Fed (low rank) against DP-FedAvg and DP-RandAgg on
Fashion-MNIST IID and 5 labels per client, Tables I-II."""

from benchmarks.studies.study import at_rounds
from benchmarks.studies.study import reseeded
from benchmarks.studies.study import Row
from benchmarks.studies.study import smoke
from benchmarks.studies.study import Study

STUDIES: dict[str, Study] = {}

# Seed 001 Tables I-II (accuracy %, mean of 5 seeds after 180 rounds).
_PAPER_001 = {
  'iid': {
    'cmp_fed': {1: 68.54, 2: 71.00, 4: 73.64, 8: 76.20, 16: 78.87},
    'dp_randagg': {1: 52.42, 2: 59.05, 4: 66.82, 8: 70.93, 16: 74.84},
    'uv_fed': {1: 77.44, 2: 79.71, 4: 83.10, 8: 84.76, 16: 86.15},
    'dp_fedavg': 77.65,
    'fedavg': 86.61,
  },
  '5labels': {
    'cmp_fed': {1: 67.25, 2: 70.72, 4: 73.92, 8: 76.24, 16: 77.93},
    'dp_randagg': {1: 49.67, 2: 56.56, 4: 65.54, 8: 69.89, 16: 74.12},
    'uv_fed': {1: 77.15, 2: 80.24, 4: 82.87, 8: 84.68, 16: 85.82},
    'dp_fedavg': 75.75,
    'fedavg': 86.49,
  },
}
# DP-RandAgg's k/d matching CMP-Fed's rank-r upload r(m + n) (+ biases) on
# the McMahan CNN (`cmp_fed.payload_sizes` over its 1,663,370 params).
_RANDAGG_FRACTION = {
  1: 0.003432,
  2: 0.006493,
  4: 0.012614,
  8: 0.024857,
  16: 0.047459,
}
_RANKS_001 = (16, 8, 4, 2, 1)
_CMP_CLIPS = dict(cmp_clip_u=0.01, cmp_clip_v=1.0)
# The CMP-Fed/UV-Fed rows before issue #24: U on the input side, biases in
# the U phase (the defaults since are out_in and v).
_CMP_LEGACY = dict(cmp_layout='in_out', cmp_vectors_phase='u')


def _rows_001(split):
  paper = _PAPER_001[split]
  rows = []
  ranked = (
    (
      'cmp_fed',
      'CMP-Fed rank {r}',
      lambda r: dict(cmp_rank=r, **_CMP_CLIPS, **_CMP_LEGACY),
    ),
    (
      'dp_randagg',
      'DP-RandAgg (rank-{r} ratio)',
      lambda r: dict(
        randagg_fraction=_RANDAGG_FRACTION[r], randagg_clip_scope='payload'
      ),
    ),
    (
      'uv_fed',
      'UV-Fed rank {r} (no DP)',
      lambda r: dict(cmp_rank=r, **_CMP_LEGACY),
    ),
  )
  for method, label, flags_at in ranked:
    for r in _RANKS_001:
      rows.append(
        Row(
          f'{method}_r{r}',
          label.format(r=r),
          dict(method=method, **flags_at(r)),
          dict(best=paper[method][r] / 100),
        )
      )
  rows += [
    Row(
      'dp_fedavg',
      'DP-FedAvg (ours, clip 1)',
      dict(method='dp_fedavg'),
      dict(best=paper['dp_fedavg'] / 100),
    ),
    Row(
      'fedavg',
      'FedAvg (no DP)',
      dict(method='fedavg'),
      dict(best=paper['fedavg'] / 100),
    ),
  ]
  # Issue #28: the paper's 180 rounds, in today's defaults (U on the
  # output side, biases in V; DP-RandAgg clips the whole update), the
  # headline pair (CMP-Fed rank 16 against DP-FedAvg) also under seeds 1
  # and 2. Evaluated every 5th round (and the last).
  paper_scale = tuple(
    at_rounds(Row(name, label, flags, dict(best=best / 100)), 180, eval_every=5)
    for name, label, flags, best in (
      (
        'dp_fedavg',
        'DP-FedAvg (ours, clip 1)',
        dict(method='dp_fedavg'),
        paper['dp_fedavg'],
      ),
      (
        'cmp_fed_r16',
        'CMP-Fed rank 16',
        dict(method='cmp_fed', cmp_rank=16, **_CMP_CLIPS),
        paper['cmp_fed'][16],
      ),
      ('fedavg', 'FedAvg (no DP)', dict(method='fedavg'), paper['fedavg']),
      (
        'uv_fed_r16',
        'UV-Fed rank 16 (no DP)',
        dict(method='uv_fed', cmp_rank=16),
        paper['uv_fed'][16],
      ),
      (
        'dp_randagg_r16',
        'DP-RandAgg (rank-16 ratio)',
        dict(method='dp_randagg', randagg_fraction=_RANDAGG_FRACTION[16]),
        paper['dp_randagg'][16],
      ),
      (
        'cmp_fed_r1',
        'CMP-Fed rank 1',
        dict(method='cmp_fed', cmp_rank=1, **_CMP_CLIPS),
        paper['cmp_fed'][1],
      ),
      (
        'cmp_fed_r4',
        'CMP-Fed rank 4',
        dict(method='cmp_fed', cmp_rank=4, **_CMP_CLIPS),
        paper['cmp_fed'][4],
      ),
      (
        'dp_randagg_r1',
        'DP-RandAgg (rank-1 ratio)',
        dict(method='dp_randagg', randagg_fraction=_RANDAGG_FRACTION[1]),
        paper['dp_randagg'][1],
      ),
    )
  )
  rows += list(paper_scale)
  rows += list(reseeded(paper_scale[0], (1, 2)))
  rows += list(reseeded(paper_scale[1], (1, 2)))
  # Ours (issue #28 item 7), no paper number: CMP-Fed rank 16 on the large
  # layer only. The 3136 x 512 dense kernel (1,605,632 of the 1,663,370
  # params) is factorised; the conv kernels and the output kernel (51,200,
  # 800 and 5,120 entries) travel dense with the biases under C2.
  rows.append(
    at_rounds(
      Row(
        'cmp_fed_r16_dense',
        'CMP-Fed rank 16, only the 3136 x 512 layer factorised (ours)',
        dict(
          method='cmp_fed', cmp_rank=16, cmp_dense_below=10**5, **_CMP_CLIPS
        ),
        {},
      ),
      180,
      eval_every=5,
    )
  )
  # Issue #28 item 7: our DP-FedAvg tuned at the paper's 180 rounds (a
  # clip grid around the seed's C = 1, extended to 0.25 when 0.5 won, and
  # a smaller server lr), each row at epsilon 1; chosen on the test metric,
  # outside the ledger, as the baseline's tuning in every study here. The
  # grid ran on the IID split; the 5-label split gets the IID winner (clip
  # 0.5) untuned, and the winner is rerun under seeds 1 and 2 on IID.
  tuning = {
    name: at_rounds(
      Row(
        f'dp_fedavg_{name}',
        f'DP-FedAvg tuning: {words}',
        dict(method='dp_fedavg', **flags),
        dict(best=paper['dp_fedavg'] / 100),
      ),
      180,
      eval_every=5,
    )
    for name, words, flags in (
      ('clip0.25', 'clip 0.25', dict(clip=0.25)),
      ('clip0.5', 'clip 0.5', dict(clip=0.5)),
      ('clip2', 'clip 2', dict(clip=2.0)),
      ('slr0.5', 'clip 1, server lr 0.5', dict(clip=1.0, server_lr=0.5)),
      # The winner with its noise calibrated by PLD (epsilon 1 PLD, so
      # more than 1 by RDP): what the tighter accountant buys a user.
      (
        'clip0.5_pld',
        'clip 0.5, noise calibrated with PLD',
        dict(clip=0.5, accountant='pld'),
      ),
    )
  }
  if split == 'iid':
    rows += list(tuning.values())
    rows += list(reseeded(tuning['clip0.5'], (1, 2)))
    # Issue #86: the tuned DP-FedAvg with noise correlated across rounds,
    # at the same epsilon. Banded MF under cyclic Poisson participation
    # (amplified), b picked by --bands=auto; BLT under min-separation (no
    # amplification), 30 groups (6 participations).
    banded = at_rounds(
      Row(
        'banded_mf_clip0.5',
        'DP-FedAvg clip 0.5, banded MF noise (bands auto, cyclic Poisson)',
        dict(
          method='dp_fedavg',
          clip=0.5,
          participation='cyclic_poisson',
          participation_partition='balanced',
          noise='banded',
          bands='auto',
        ),
        dict(best=paper['dp_fedavg'] / 100),
      ),
      180,
      eval_every=5,
    )
    rows += [banded, *reseeded(banded, (1, 2))]
    # A compressed method with the same noise, beside its iid row
    # (dp_randagg_r16_180, clip 1): the noise streams over all d
    # coordinates and each round releases its projection on the round's k.
    rows.append(
      at_rounds(
        Row(
          'dp_randagg_r16_banded_mf',
          'DP-RandAgg (rank-16 ratio), banded MF noise (bands auto, cyclic '
          'Poisson)',
          dict(
            method='dp_randagg',
            randagg_fraction=_RANDAGG_FRACTION[16],
            participation='cyclic_poisson',
            participation_partition='balanced',
            noise='banded',
            bands='auto',
          ),
          dict(best=paper['dp_randagg'][16] / 100),
        ),
        180,
        eval_every=5,
      )
    )
    rows.append(
      at_rounds(
        Row(
          'blt_clip0.5',
          'DP-FedAvg clip 0.5, BLT noise (2 buffers, 30 groups, '
          'min-separation)',
          dict(
            method='dp_fedavg',
            clip=0.5,
            participation='cyclic',
            participation_groups=30,
            noise='blt',
          ),
          dict(best=paper['dp_fedavg'] / 100),
        ),
        180,
        eval_every=5,
      )
    )
    # Probes of the IID split at 10 rounds.
    cmp_r4 = dict(method='cmp_fed', cmp_rank=4)
    rows += [
      smoke(
        'cmp_fed_r4',
        'CMP-Fed rank 4, U on the output side, biases in V, C1 0.01, C2 1',
        dict(cmp_r4, **_CMP_CLIPS),
      ),
      # One step of the median rule from the row above (a C1 probe at the
      # resulting C2 would be the next step: ||U_i|| scales with V's noise).
      # The same 10 rounds in the layout the 30-round rows ran (U on the
      # input side, biases in U under C1): the layout comparison, paired.
      smoke(
        'cmp_fed_r4_in_out',
        'CMP-Fed rank 4, U on the input side, biases in U, C1 0.01, C2 1',
        dict(cmp_r4, **_CMP_CLIPS, **_CMP_LEGACY),
      ),
      smoke(
        'cmp_fed_r4_median',
        'CMP-Fed rank 4, C1 and C2 by the median rule',
        cmp_r4,
        cmp_clips_from=dict(
          cmp_clip_u='cmp_fed_r4_smoke', cmp_clip_v='cmp_fed_r4_smoke'
        ),
      ),
      smoke(
        'dp_randagg_r4',
        'DP-RandAgg (rank-4 ratio), whole update clipped at C = 1',
        dict(method='dp_randagg', randagg_fraction=_RANDAGG_FRACTION[4]),
      ),
      # The seed's median rule applied to what DP-RandAgg clips here (the
      # whole update): C = the median over rounds of the cohort's median
      # pre-clip norm in the row above (its 'median pre-clip norm' column
      # in seed001_iid.json; the probe ran at C = 1 with the same epsilon).
      smoke(
        'dp_randagg_r4_median',
        'DP-RandAgg (rank-4 ratio), C by the median rule',
        dict(
          method='dp_randagg',
          randagg_fraction=_RANDAGG_FRACTION[4],
          clip=1.16,
          clip_source=(
            'the median rule: the median over rounds of the median '
            'pre-clip client norm of the private dp_randagg_r4_smoke run '
            '(1.157)'
          ),
        ),
      ),
      # CMP-Fed rank 4 in the seed's own sampling and schedule (below).
      smoke(
        'cmp_fed_r4_fixed100_decay',
        'CMP-Fed rank 4, S = 100 fixed-size cohorts, local lr decay 0.99',
        dict(
          cmp_r4,
          **_CMP_CLIPS,
          client_sampling_rate=None,
          clients_per_round=100,
          client_lr_decay=0.99,
        ),
      ),
      # The seed's own sampling and schedule (issue #24): exactly S = 100
      # clients a round without replacement (its Alg. 1), accounted as
      # such (replace-one), and the local lr decayed by 0.99 a round.
      smoke(
        'dp_fedavg_fixed100_decay',
        'DP-FedAvg, S = 100 fixed-size cohorts, local lr decay 0.99',
        dict(
          method='dp_fedavg',
          client_sampling_rate=None,
          clients_per_round=100,
          client_lr_decay=0.99,
        ),
      ),
    ]
  else:
    rows.append(tuning['clip0.5'])
  return tuple(rows)


_NOTES_001 = """
Guo, Hu, Gong (seed 001) Table {table}: Fashion-MNIST {split_words}, 6,000
clients, McMahan CNN (1,663,370 params), S = 100 a round (Poisson q =
1/60), 10 local steps of batch 10, momentum 0.5, (1, 1e-4)-DP; CMP-Fed
C1 = 0.01, C2 = 1 and DP-FedAvg / DP-RandAgg C = 1 as the seed; DP-RandAgg
at CMP-Fed rank 16's upload (k/d = 4.75%). **Reduced:** 30 rounds instead
of 180 (noise calibrated for epsilon = 1 over the 30 rounds with RDP:
CMP-Fed's two Gaussians a round are composed, so it gets a larger
multiplier than DP-FedAvg at the same epsilon), one seed instead of 5,
local lr 0.05 without the seed's 0.99 decay. DP-RandAgg's k/d at each rank
matches CMP-Fed's upload at that rank. Only the rows listed below ran (the
seed has ranks 1, 2, 4, 8, 16 for each method). Best test accuracy over
evaluated rounds (every 2nd); paper numbers are after 180 rounds. U / V
signal share (CMP-Fed): median over rounds of 1 - E||noise||^2 / ||released
mean||^2, each phase's share of energy that was not noise
(`cmp_fed.signal_share`); near 0, U_hat spans a nearly random subspace.
The 30-round CMP-Fed and UV-Fed rows ran before issue #24 with U on each
kernel's input side and the biases in the U phase under C1
(`--cmp_layout=in_out --cmp_vectors_phase=u`); the defaults since put U
on the output side (PyTorch's and PowerSGD's layout) and the biases in
the V phase under C2 (`aggregators/cmp_fed.py`). The 30-round DP-RandAgg
rows clipped only the k-vector at C = 1 (`--randagg_clip_scope=payload`);
the default since clips the whole update at C and then takes its k
coordinates, as the seed describes its baseline ("perturbed ... and then
sparsified"). Those 30 rows ran before the flags existed (2026-11-22 and
-23; the flags came with commits 5f4fa8a, 2026-11-23 23:28 UTC, and
40d7376, 2026-11-24) and were recorded without them; their commands
were given the flags on 2026-12-03 so that they rerun as they ran (not
rerun to check; `tests/benchmarks/command_replay_test.py`). The seed
samples exactly
S agents without replacement (its Alg. 1) but accounts them with Opacus'
RDP accountant, a Poisson analysis; we sample by Poisson with q = 1/60.
The `dp_fedavg_fixed100_decay_smoke` row runs the seed's own setting:
exactly S = 100 clients a round and the local lr decayed by 0.99 a round
("decays at a rate of 0.99"), its fixed-size cohorts accounted as such
(sampling without replacement, replace-one neighbours: RDP only, PLD
NaN), so its epsilon is not comparable with the Poisson rows'.{paper_scale}
"""
_PAPER_SCALE_001 = """
Rows ending `_180` (issue #28) run the seed's 180 rounds: noise
calibrated for epsilon 1 over the 180 rounds (RDP), evaluated every 5th
round and the last, in today's defaults (CMP-Fed: U on the output side,
biases in V; DP-RandAgg clips the whole update), otherwise as the rows
above; `_seed1` / `_seed2` rerun the headline pair (CMP-Fed rank 16,
DP-FedAvg) with `--seed` and `--noise_seed` set to 1 / 2.
`cmp_fed_r16_dense_180` is ours, not the seed's: CMP-Fed rank 16 with
only the 3136 x 512 kernel factorised (`--cmp_dense_below=100000`), the
other kernels sent dense with the biases under C2. On the IID split,
`dp_fedavg_clip0.25_180`, `dp_fedavg_clip0.5_180`, `dp_fedavg_clip2_180`
and `dp_fedavg_slr0.5_180` tune our DP-FedAvg (clip, server lr) at epsilon
1, on the test metric (outside the ledger); clip 0.25 was added once clip
0.5 came out best of the first grid (0.5, 1, 2); the winner, clip 0.5, is
rerun under seeds 1 and 2 (`dp_fedavg_clip0.5_180_seed1` / `_seed2`). On
the 5-label split, `dp_fedavg_clip0.5_180` takes the IID winner untuned
(no grid ran there). `dp_fedavg_clip0.5_pld_180` calibrates the winner's
noise with PLD (`--accountant=pld`) to epsilon 1 by PLD, so its RDP
epsilon is above 1 and it is not at the other rows' epsilon: it shows
what the tighter accountant buys at the seed's (1, 1e-4). Rows with
`banded_mf` (issue #86; IID split) add noise correlated across rounds at
the same epsilon (docs/privacy.md): `--noise=banded --bands=auto` under
cyclic Poisson participation (the clients dealt into b fixed groups by
the public seed, round t sampling group t mod b at b x the rate, accounted
as amplified banded MF). These rows dealt the groups from a permutation
of the whole population (`--participation_partition=balanced`, added to
their commands on 2026-12-03, when the default became `by_client_id`): a
client's group then depends on who else is in the population, so their
epsilon holds for zero-out neighbouring (a client's data replaced by data
contributing nothing), not add/remove, as their summaries first stated
(corrected there). DP-FedAvg's Poisson-sampled epsilon is the same
number under zero-out, so the comparison stays at equal epsilon.
`--bands=auto` picks 4 bands here (z 1.93, a
per-round noise multiplier of 4.26 against DP-FedAvg's 1.185, and 0.76 x
its expected prefix-sum error; benchmarks/results/correlated_noise_plan.md).
`banded_mf_clip0.5_180` is the tuned DP-FedAvg (clip 0.5) with it, under
seeds 0-2: 0.53, 0.57 and 0.63 points under `dp_fedavg_clip0.5_180` of
the same seed at the best round, the two 3-seed ranges 0.33 points apart
(its seed-2 run started before summaries recorded their provenance, so
its kept summary.json has none); `dp_randagg_r16_banded_mf_180` is
`dp_randagg_r16_180` with it
(the noise streams over all d coordinates, and each round releases its
projection on the round's k; a coordinate is released about one round in
21, so it keeps each round's larger noise and little of the cancellation:
12.2 x DP-FedAvg's noise energy by the plan's projected column).
`blt_clip0.5_180` (BLT, min-separation, 30
groups) is defined but predicted 89 x DP-FedAvg's error (the plan). Of
the `_180` rows defined in the study, only those in this table have
run."""
COMMON_001 = dict(
  rounds=30,
  client_sampling_rate=1 / 60,
  delta=1e-4,
  target_epsilon=1.0,
  batch_size=10,
  local_epochs=10,
  local_steps=10,
  client_lr=0.05,
  client_momentum=0.5,
  clip=1.0,
  eval_every=2,
  seed=0,
  # Reproducible research rows: the guarantee assumes this seed secret.
  noise_seed=0,
)
COLUMNS_001 = (
  'row',
  'method',
  'best test metric',
  'paper',
  'round of best',
  'final test metric',
  'KB up / client / round',
  'KB down / client / round',
  'upload compression x',
  'epsilon RDP',
  'epsilon PLD',
  'noise multiplier',
  'U signal share',
  'V signal share',
  'C1 / C2',
  'mean ||U_i|| / ||V_i|| / ||vectors||',
  'U / V clipped',
  'median pre-clip norm',
  'fraction clipped',
  's/round',
  'tuning outside ledger',
  'seed',
  'date',
  'wall s',
  'command',
)
for _split, _task, _table, _words in (
  ('iid', 'fashion_mnist_iid', 'I', 'IID'),
  ('5labels', 'fashion_mnist_5labels', 'II', 'non-IID (5 labels per client)'),
):
  STUDIES[f'seed001_{_split}'] = Study(
    title=f'Seed 001 Table {_table} (Fashion-MNIST {_words}) at reduced '
    'scale',
    notes=_NOTES_001.format(
      table=_table,
      split_words=_words,
      paper_scale=_PAPER_SCALE_001,
    ),
    metric='test_accuracy',
    common=dict(task=_task, **COMMON_001),
    rows=_rows_001(_split),
    columns=COLUMNS_001,
  )

# Seed 003 Tables 3-4: (FedAvg acc, drop FedAvg -> CE-FedAvg, drop
