"""Seed 004 (Kerkouche et al.): FL-TOP(-DP), FL-BASIC(-DP) and FL-STD(-DP) on
Fashion-MNIST and the in-hospital mortality task, Tables 1-2."""

import dataclasses

from benchmarks.studies.study import at_rounds
from benchmarks.studies.study import reseeded
from benchmarks.studies.study import Row
from benchmarks.studies.study import smoke
from benchmarks.studies.study import Study

_FASHION_004 = dict(
  task='fashion_mnist_iid',
  rounds=30,
  client_sampling_rate=1 / 60,
  delta=1e-5,
  target_epsilon=1.0,
  batch_size=10,
  local_epochs=10,
  local_steps=10,
  client_lr=0.05,
  client_momentum=0.5,
  top_k_ratio=0.005,
  eval_every=2,
  seed=0,
  # Reproducible research rows: the guarantee assumes this seed secret.
  noise_seed=0,
)
_MEDICAL_004 = dict(
  task='physionet2012',
  task_option=['clients_per_unit=100', 'server_batch_size=356'],
  rounds=100,
  client_sampling_rate=0.1,
  delta=1e-4,
  target_epsilon=1.0,
  batch_size=8,
  local_epochs=5,
  client_lr=0.05,
  client_momentum=0.5,
  top_k_ratio=0.001,
  eval_every=2,
  seed=0,
  # Reproducible research rows: the guarantee assumes this seed secret.
  noise_seed=0,
)
_COLUMNS_004 = (
  'row',
  'method',
  'best test metric',
  'paper',
  'round of best',
  'AUROC at best',
  'paper AUROC',
  'final test metric',
  'KB down / client (to best)',
  'KB up / client (to best)',
  'paper KB down / up',
  'epsilon RDP',
  'epsilon PLD',
  'paper epsilon',
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
)

# Seed 004 Table 1 (Fashion-MNIST, r = 0.5%): best accuracy, KB down / up
# per client, epsilon.
_PAPER_004_FASHION = dict(
  fl_top=dict(best=0.82, kb='110.88 / 110.88', eps='N/A'),
  fl_basic=dict(best=0.65, kb='21402.03 / 107', eps='N/A'),
  fedavg=dict(best=0.86, kb='22178.27 / 22178.27', eps='N/A'),
  fl_top_dp=dict(best=0.81, kb='110.88 / 110.88', eps=1),
  fl_basic_dp=dict(best=0.59, kb='22178.27 / 110.88', eps=1),
  dp_fedavg=dict(best=0.56, kb='6653.48 / 6653.48', eps=0.76),
)

# Seed 004 Table 2 (medical) at r = 5% and 10%: (balanced accuracy, AUROC).
_PAPER_004_MEDICAL_R = {
  ('fl_top', 5): (0.72, 0.80),
  ('fl_top_dp', 5): (0.68, 0.75),
  ('fl_top', 10): (0.74, 0.82),
  ('fl_top_dp', 10): (0.68, 0.74),
  ('fl_basic', 5): (0.72, 0.80),
  ('fl_basic_dp', 5): (0.69, 0.76),
  ('fl_basic', 10): (0.74, 0.81),
  ('fl_basic_dp', 10): (0.69, 0.76),
}

STUDIES: dict[str, Study] = {
  'seed004_fashion': Study(
    title='Seed 004 Table 1 (Fashion-MNIST IID, r = 0.5%) at reduced scale',
    notes="""
Kerkouche et al. (seed 004) Table 1, r = 0.5%: FL-TOP(-DP), FL-BASIC(-DP)
and FL-STD(-DP) (= FedAvg / DP-FedAvg) on Fashion-MNIST, 6,000 IID clients,
Poisson sampling q = 1/60 (100 clients a round), McMahan CNN (1,663,370
params), K = 0.5% = 8,317 weights. **Reduced:** 30 rounds instead of 200
(noise calibrated for epsilon = 1 over those 30 rounds, RDP, delta 1e-5),
10 local steps of batch 10 (lr 0.05, momentum 0.5; the paper's local
schedule is in its appendix, which the seed text lacks). FL-TOP-DP and
FL-BASIC-DP clip at the median pre-clip update norm measured in the
non-private FL-TOP / FL-BASIC run (seed 004 sets S from an unclipped
round on public data); FL-STD-DP uses our tuned DP-FedAvg clip 1. The
Top-K set is chosen from 10 EMNIST digits, as the paper uses 10 random
MNIST digits: rows before issue #24 took the first digit of each class
(`--public_batch=first_per_class`, kept in their commands), the default
since draws 10 at random from `--seed`. Best test accuracy over the
evaluated rounds (every 2nd) as in the paper; KB per client are the
paper's Cost: bytes per participant x round of best x q. Paper numbers
are after up to 200 rounds. Non-private FL-TOP and FL-BASIC rows ran
before issue #24 with their K values clipped at 1 and divided by the
expected cohort (`--top_k_nonprivate_clip`, kept in their commands); the
paper does not clip them (its Alg. 1), which is the default since. The
rows dated 2026-11-22 ran before either flag existed, when their
behaviour was the default, and were recorded without them; their
commands were given the flags on 2026-11-25 so that they rerun as they
ran (not rerun to check).
""",
    metric='test_accuracy',
    common=_FASHION_004,
    rows=(
      Row(
        'fl_top',
        'FL-TOP',
        dict(
          method='fl_top',
          top_k_nonprivate_clip=True,
          public_batch='first_per_class',
        ),
        _PAPER_004_FASHION['fl_top'],
      ),
      Row(
        'fl_basic',
        'FL-BASIC',
        dict(method='fl_basic', top_k_nonprivate_clip=True),
        _PAPER_004_FASHION['fl_basic'],
      ),
      Row(
        'fedavg',
        'FL-STD',
        dict(method='fedavg'),
        _PAPER_004_FASHION['fedavg'],
      ),
      Row(
        'fl_top_dp',
        'FL-TOP-DP',
        dict(method='fl_top_dp', public_batch='first_per_class'),
        _PAPER_004_FASHION['fl_top_dp'],
        clip_from='fl_top',
      ),
      Row(
        'fl_basic_dp',
        'FL-BASIC-DP',
        dict(method='fl_basic_dp'),
        _PAPER_004_FASHION['fl_basic_dp'],
        clip_from='fl_basic',
      ),
      Row(
        'dp_fedavg',
        'FL-STD-DP (our DP-FedAvg)',
        dict(method='dp_fedavg', clip=1.0),
        _PAPER_004_FASHION['dp_fedavg'],
      ),
      smoke(
        'fl_top', 'FL-TOP, no clip, random public batch', dict(method='fl_top')
      ),
      smoke('fl_basic', 'FL-BASIC, no clip', dict(method='fl_basic')),
      smoke(
        'fl_top_dp_public_clip',
        'FL-TOP-DP, S from one round on the public batch',
        dict(method='fl_top_dp', clip_from_public_round=True),
      ),
      smoke(
        'fl_basic_dp_public_clip',
        'FL-BASIC-DP, S the median of 100 public rounds on random K-subsets',
        dict(method='fl_basic_dp', clip_from_public_round=True),
      ),
      smoke(
        'fl_std_dp_public_clip',
        'FL-STD-DP (DP-FedAvg), S from one round on the public batch',
        dict(method='dp_fedavg', clip_from_public_round=True),
      ),
    ),
    columns=_COLUMNS_004,
  ),
  'seed004_medical': Study(
    title=(
      'Seed 004 Table 2 (in-hospital mortality, r = 0.1%) on PhysioNet '
      '2012 at reduced scale'
    ),
    notes="""
Kerkouche et al. (seed 004) Table 2, r = 0.1%, on the public stand-in for
the Premier database (not public): PhysioNet 2012 in-hospital mortality,
each ICU unit's training stays split into 100 clients (400 clients of
about 16 stays), 356 training stays held out as the server's batch for
the Top-K choice (as the paper's 356 patients) and given to no client;
MLP 340+ features -> 64 -> 32 -> 1. Poisson q = 0.1 (40 clients a round),
100 rounds as in the paper, 5 local epochs of batch 8, epsilon = 1 (RDP,
delta 1e-4). Balanced accuracy at threshold 0 (logit) and AUROC on the
held-out 20% of each unit. DP clips as in the Fashion-MNIST study (median
pre-clip norm of the non-private run; DP-FedAvg at clip 1). Non-private
FL-TOP and FL-BASIC rows at r = 0.1% ran with a clip at 1
(`--top_k_nonprivate_clip`, see the Fashion-MNIST study), before the flag
existed; their commands were given it on 2026-11-25 so that they rerun
as they ran (not rerun to check). Rows recorded before 2026-11-24 said
"EMNIST digits stand in for the public set" in their "tuning outside
ledger": a label that was not yet task-aware. Their public batch was the
356 held-out patients (the task's server batch, used since the medical
task got it on 2026-11-22, before any row here ran); relabelled on
2026-11-25. Headline pair (issue #28): FL-TOP-DP at r = 5% against
DP-FedAvg at clip 1, also under seeds 1 and 2 (`_seed1`, `_seed2`: the
initial model, client sampling, local shuffles and noise reseeded; the
clients' data split and the held-out patients stay).
""",
    metric='test_balanced_accuracy',
    common=_MEDICAL_004,
    rows=(
      Row(
        'fl_top',
        'FL-TOP',
        dict(method='fl_top', top_k_nonprivate_clip=True),
        dict(best=0.69, auroc=0.76, kb='8.12 / 8.12', eps='N/A'),
      ),
      Row(
        'fl_basic',
        'FL-BASIC',
        dict(method='fl_basic', top_k_nonprivate_clip=True),
        dict(best=0.51, auroc=0.51, kb='11829.42 / 11.82', eps='N/A'),
      ),
      Row(
        'fedavg',
        'FL-STD',
        dict(method='fedavg'),
        dict(best=0.74, auroc=0.82, kb='11829.42 / 11829.42', eps='N/A'),
      ),
      Row(
        'fl_top_dp',
        'FL-TOP-DP',
        dict(method='fl_top_dp'),
        dict(best=0.69, auroc=0.76, kb='10.15 / 10.15', eps=0.97),
        clip_from='fl_top',
      ),
      Row(
        'fl_basic_dp',
        'FL-BASIC-DP',
        dict(method='fl_basic_dp'),
        dict(best=0.50, auroc=0.49, kb='11948.91 / 11.94', eps=1),
        clip_from='fl_basic',
      ),
      Row(
        'dp_fedavg',
        'FL-STD-DP (our DP-FedAvg)',
        dict(method='dp_fedavg', clip=1.0),
        dict(best=0.66, auroc=0.72, kb='7408.32 / 7408.32', eps=0.91),
      ),
      # Seed 004's Table 2 K at r = 5% and 10% (its r = 0.1% gives K = 24
      # on our MLP, about 100x below the paper's inferred K): non-private
      # rows unclipped, DP rows with S from one public round.
      *(
        Row(
          f'{method}_r{pct}pct',
          f'{label}, r = {pct}%',
          dict(method=method, top_k_ratio=pct / 100, **extra),
          dict(
            best=_PAPER_004_MEDICAL_R[(method, pct)][0],
            auroc=_PAPER_004_MEDICAL_R[(method, pct)][1],
            eps='N/A' if method in ('fl_top', 'fl_basic') else 1,
          ),
        )
        for pct in (5, 10)
        for method, label, extra in (
          ('fl_top', 'FL-TOP', {}),
          ('fl_top_dp', 'FL-TOP-DP', dict(clip_from_public_round=True)),
          ('fl_basic', 'FL-BASIC', {}),
          ('fl_basic_dp', 'FL-BASIC-DP', dict(clip_from_public_round=True)),
        )
      ),
      # The paper's public clip rule for the other two DP rows at r = 0.1%
      # (the rows above them clip at the non-private run's median, and at
      # 1 for FL-STD-DP): 100 random K-subsets for FL-BASIC-DP.
      Row(
        'fl_basic_dp_public_clip',
        'FL-BASIC-DP, S the median of 100 public rounds on random K-subsets',
        dict(method='fl_basic_dp', clip_from_public_round=True),
        dict(best=0.50, auroc=0.49, kb='11948.91 / 11.94', eps=1),
      ),
      Row(
        'fl_std_dp_public_clip',
        'FL-STD-DP (DP-FedAvg), S from one round on the public batch',
        dict(method='dp_fedavg', clip_from_public_round=True),
        dict(best=0.66, auroc=0.72, kb='7408.32 / 7408.32', eps=0.91),
      ),
    ),
    columns=_COLUMNS_004,
  ),
}


# Issue #28: our DP-FedAvg tuned on this task (a clip grid around 1 and a
# smaller server lr), each row at epsilon 1; the grid is chosen on the test
# metric, outside the ledger, as the baseline's tuning in every study here.
_MEDICAL_TUNING = tuple(
  Row(
    f'dp_fedavg_{name}',
    f'DP-FedAvg tuning: {words}',
    dict(method='dp_fedavg', **flags),
    dict(best=0.66, auroc=0.72, kb='7408.32 / 7408.32', eps=0.91),
  )
  for name, words, flags in (
    ('clip0.1', 'clip 0.1', dict(clip=0.1)),
    ('clip0.3', 'clip 0.3', dict(clip=0.3)),
    ('clip3', 'clip 3', dict(clip=3.0)),
    ('slr0.3', 'clip 1, server lr 0.3', dict(clip=1.0, server_lr=0.3)),
  )
)
# The headline pair under seeds 1 and 2: FL-TOP-DP at r = 5% (K matched to
# the paper's, issue #25) against the strongest DP baseline measured here
# at the time, DP-FedAvg at clip 1.
_medical = STUDIES['seed004_medical']
_by_name = {r.name: r for r in _medical.rows}
STUDIES['seed004_medical'] = dataclasses.replace(
  _medical,
  rows=_medical.rows
  + _MEDICAL_TUNING
  + reseeded(_by_name['fl_top_dp_r5pct'], (1, 2))
  + reseeded(_by_name['dp_fedavg'], (1, 2)),
)


# Issue #28: Table 1 at the paper's 200 rounds (noise recalibrated for
# epsilon 1 over them), evaluated every 5th round. The DP rows clip at S
# from one unclipped round on the public batch (the paper's rule, inside
# the ledger's assumptions: public data), beside our DP-FedAvg at clip 1;
# the non-private rows are unclipped (the paper's Alg. 1).
_FASHION_200 = tuple(
  at_rounds(
    Row(name, label, dict(method=method, **flags), _PAPER_004_FASHION[method]),
    200,
    eval_every=5,
  )
  for name, label, method, flags in (
    ('fl_top', 'FL-TOP', 'fl_top', {}),
    ('fl_basic', 'FL-BASIC', 'fl_basic', {}),
    ('fedavg', 'FL-STD', 'fedavg', {}),
    (
      'fl_top_dp_public_clip',
      'FL-TOP-DP, S from one round on the public batch',
      'fl_top_dp',
      dict(clip_from_public_round=True),
    ),
    (
      'fl_basic_dp_public_clip',
      'FL-BASIC-DP, S the median of 100 public rounds on random K-subsets',
      'fl_basic_dp',
      dict(clip_from_public_round=True),
    ),
    (
      'fl_std_dp_public_clip',
      'FL-STD-DP (DP-FedAvg), S from one round on the public batch',
      'dp_fedavg',
      dict(clip_from_public_round=True),
    ),
    (
      'dp_fedavg',
      'FL-STD-DP (our DP-FedAvg, clip 1)',
      'dp_fedavg',
      dict(clip=1.0),
    ),
  )
)
_by_name_200 = {r.name: r for r in _FASHION_200}
# Issue #103: the DP-FedAvg baseline tuned as in seed 001 (clip 0.5 gained
# 2.5 points over clip 1 there), under seeds 0-2, and clip 0.25 on seed 0.
_TUNED_200 = tuple(
  at_rounds(
    Row(
      f'dp_fedavg_clip{clip}',
      f'FL-STD-DP (our DP-FedAvg), clip tuning: clip {clip}',
      dict(method='dp_fedavg', clip=clip),
      _PAPER_004_FASHION['dp_fedavg'],
    ),
    200,
    eval_every=5,
  )
  for clip in (0.5, 0.25)
)
_fashion = STUDIES['seed004_fashion']
STUDIES['seed004_fashion'] = dataclasses.replace(
  _fashion,
  notes=_fashion.notes
  + """Rows ending `_200` (issue #28) run the paper's 200 rounds, noise
calibrated for epsilon 1 over them, evaluated every 5th round and the
last, in today's defaults (random public batch, non-private rows
unclipped); the DP rows' S comes from one unclipped round on the public
batch (`--clip_from_public_round`), beside our DP-FedAvg at clip 1. Of
the `_200` rows defined in the study, only those in this table have run;
`_seed1` / `_seed2` rerun the headline pair (FL-TOP-DP, our DP-FedAvg)
with `--seed` and `--noise_seed` set to 1 / 2.
""",
  # The headline pair (FL-TOP-DP against our DP-FedAvg) under seeds 1, 2.
  rows=_fashion.rows
  + _FASHION_200
  + reseeded(_by_name_200['fl_top_dp_public_clip_200'], (1, 2))
  + reseeded(_by_name_200['dp_fedavg_200'], (1, 2))
  + _TUNED_200
  + reseeded(_TUNED_200[0], (1, 2)),
)
