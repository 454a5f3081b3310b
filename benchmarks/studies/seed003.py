"""Seed 003: model vs update clipping, CE-FedAvg and DP-FedAvg with their
update-distribution diagnostics, Tables 3-4."""

import math

from benchmarks.studies.study import at_rounds
from benchmarks.studies.study import reseeded
from benchmarks.studies.study import Row
from benchmarks.studies.study import STATEFUL_DROPOUT
from benchmarks.studies.study import Study

STUDIES: dict[str, Study] = {}

_PAPER_003 = {
  ('emnist_digits', 'mlp'): (94.0, 1.84, 0.29),
  ('cifar10_dirichlet', 'mlp'): (51.90, 7.39, 0.90),
}


_TASK_MODELS_003 = (
  ('emnist_digits', 'mlp'),
  ('emnist_digits', 'cnn_2layers'),
  ('cifar10_dirichlet', 'mlp'),
  ('cifar10_dirichlet', 'cnn_2layers'),
)

# Seed 003's own geometry (Sec. 4): N = 1,920 clients, 80 a round (here
# Poisson with q = 80 / 1,920, the sampling of the moments accountant it
# cites), Q = 32 local steps of batch 64, delta 1e-5.
_N_003 = 1920
_GEOMETRY_003 = dict(
  clients_per_round=None,
  client_sampling_rate=80 / _N_003,
  batch_size=64,
  local_steps=32,
  delta=1e-5,
)
# EMNIST digits in it: the seed deals EMNIST's 240,000 training digits to
# the 1,920 clients, 125 each, about 92% of them in 2 dominant classes
# (Secs. 2 and 4). The 29,289 FEMNIST digits here hold 1,920 clients of 7
# digits of each of 2 classes and none of the others (partition seed 0;
# 8 a class does not fit), so a client holds 14 digits.
_EMNIST_DOMINANT_003 = 7
_EMNIST_DIGITS_003 = 2 * _EMNIST_DOMINANT_003
_SPLIT_003 = {
  # 500 examples a client, 50 of each class, overlapping across clients.
  'cifar10_dirichlet': [
    'split=class_balanced_overlap',
    f'num_clients={_N_003}',
    'per_class=50',
  ],
  'emnist_digits': [
    'split=dominant_classes',
    f'num_clients={_N_003}',
    f'dominant_count={_EMNIST_DOMINANT_003}',
    'other_count=0',
  ],
}
# The local passes that give the Q steps of a full batch: CIFAR-10's 500
# examples fill them within the common 10 passes; a client's 14 digits
# need ceil(32 x 64 / 14) = 147.
_LOCAL_003 = {
  'cifar10_dirichlet': {},
  'emnist_digits': dict(
    local_epochs=math.ceil(
      _GEOMETRY_003['local_steps']
      * _GEOMETRY_003['batch_size']
      / _EMNIST_DIGITS_003
    )
  ),
}
# The seed states no round count T. Its geometry's 30-round rows were
# still rising (CE-FedAvg and DP-FedAvg best at round 30; FedAvg 40.7%
# against the seed's 51.9%), as were the CNN-2-layers rows at 20 clients;
# 200 rounds is our choice for a plateau.
_ROUNDS_003 = 200
_WORDS_003 = {
  'cifar10_dirichlet': 'CIFAR-10',
  'emnist_digits': 'EMNIST digits',
  'mlp': 'MLP',
  'cnn_2layers': 'CNN-2-layers',
}


def _geometry_rows_003(task, model, rounds=None):
  """FedAvg, CE-FedAvg and DP-FedAvg in seed 003's geometry, the clips from
  that geometry's FedAvg row; at `rounds` (`at_rounds`, evaluated every
  5th round) if given, else at the common 30."""
  paper = _PAPER_003.get((task, model))
  tag = f'{task.split("_")[0]}_{model}_paper'
  where = f"{_WORDS_003[task]} {_WORDS_003[model]}, the seed's geometry"
  flags = dict(
    task=task,
    task_option=[f'model={model}', *_SPLIT_003[task]],
    **_GEOMETRY_003,
    **_LOCAL_003[task],
  )

  def scaled(row):
    return row if rounds is None else at_rounds(row, rounds, eval_every=5)

  fedavg = scaled(
    Row(
      f'{tag}_fedavg',
      f'FedAvg, {where}',
      dict(flags, method='fedavg'),
      dict(best=paper[0] / 100) if paper else {},
    )
  )
  return [
    fedavg,
    scaled(
      Row(
        f'{tag}_ce_fedavg',
        f'CE-FedAvg, {where}',
        dict(flags, method='ce_fedavg'),
        dict(best=(paper[0] - paper[1]) / 100) if paper else {},
        clip_half_mean_of=fedavg.name,
      )
    ),
    scaled(
      Row(
        f'{tag}_dp_fedavg',
        f'DP-FedAvg, {where} (Poisson q = 80/1920)',
        dict(flags, method='dp_fedavg'),
        dict(best=(paper[0] - paper[1] - paper[2]) / 100) if paper else {},
        clip_half_mean_of=fedavg.name,
      )
    ),
  ]


def _rows_003():
  rows = []
  for task, model in _TASK_MODELS_003:
    options = [f'model={model}']
    if task == 'cifar10_dirichlet':
      options.append('alpha=100')  # Seed 003's CIFAR-10 split is IID.
    paper = _PAPER_003.get((task, model))
    tag = f'{task.split("_")[0]}_{model}'
    base = dict(task=task, task_option=options)
    rows += [
      Row(
        f'{tag}_fedavg',
        f'FedAvg, {task}, {model}',
        dict(base, method='fedavg'),
        dict(best=paper[0] / 100) if paper else {},
      ),
      Row(
        f'{tag}_ce_fedavg',
        f'CE-FedAvg, {task}, {model}',
        dict(base, method='ce_fedavg'),
        dict(best=(paper[0] - paper[1]) / 100) if paper else {},
        clip_half_mean_of=f'{tag}_fedavg',
      ),
      Row(
        f'{tag}_dp_fedavg',
        f'DP-FedAvg, {task}, {model}',
        dict(base, method='dp_fedavg'),
        dict(best=(paper[0] - paper[1] - paper[2]) / 100) if paper else {},
        clip_half_mean_of=f'{tag}_fedavg',
      ),
      # Sec. 2.1: model clipping at CE-FedAvg's clip (the same c) and at
      # the same rule applied to what it clips (0.5 x FedAvg's model norm).
      Row(
        f'{tag}_model_clip_same_c',
        f'Model clipping at the CE-FedAvg clip, {task}, {model}',
        dict(base, method='model_clip'),
        clip_half_mean_of=f'{tag}_fedavg',
      ),
      Row(
        f'{tag}_model_clip',
        f'Model clipping at 0.5 x FedAvg model norm, {task}, {model}',
        dict(base, method='model_clip'),
        clip_half_model_norm_of=f'{tag}_fedavg',
      ),
    ]
    if model == 'mlp':
      # Issue #24's reading: Poisson sampling at the same expected cohort
      # (20 of 300 writers, 20 of 100 clients), at the clip the fixed-size
      # row used (0.5 x the FedAvg row's mean update norm, as recorded).
      rows.append(
        Row(
          f'{tag}_dp_fedavg_poisson',
          f'DP-FedAvg, Poisson sampling, {task}, {model}',
          dict(
            base,
            method='dp_fedavg',
            clients_per_round=None,
            client_sampling_rate=20 / _CLIENTS_003[task],
            clip=_CLIP_003[tag],
            clip_source=(
              f'0.5 x the mean update norm of the non-private {tag}_fedavg '
              'run'
            ),
          ),
          dict(best=(paper[0] - paper[1] - paper[2]) / 100),
        )
      )
  # Seed 003's own geometry on CIFAR-10 (issue #24), 30 rounds.
  rows += _geometry_rows_003('cifar10_dirichlet', 'mlp')
  # Issue #28: the geometry on both tasks and both models, to a plateau
  # (noise recalibrated for epsilon 1.5 over the rounds), evaluated every
  # 5th round; the headline pair (DP-FedAvg against CE-FedAvg, CIFAR-10
  # MLP, the setting with the seed's numbers for both) also under seeds 1
  # and 2, at the clip of the seed-0 FedAvg row.
  paper_scale = [
    row
    for task, model in _TASK_MODELS_003
    for row in _geometry_rows_003(task, model, rounds=_ROUNDS_003)
  ]
  rows += paper_scale
  by_name = {row.name: row for row in paper_scale}
  for method in ('ce_fedavg', 'dp_fedavg'):
    row = by_name[f'cifar10_mlp_paper_{method}_{_ROUNDS_003}']
    rows += list(reseeded(row, (1, 2)))
  return tuple(rows)


# The clients of seed 003's tasks here, and the clips the fixed-size
# DP-FedAvg MLP rows ran with (benchmarks/results/seed003_clipping.json).
_CLIENTS_003 = {'emnist_digits': 300, 'cifar10_dirichlet': 100}
_CLIP_003 = {'emnist_mlp': 0.172, 'cifar10_mlp': 0.133}


STUDIES['seed003_clipping'] = Study(
  title='Seed 003 Tables 3-4: the drop from clipping and from DP at reduced '
  'scale',
  notes="""
Zhang et al. (seed 003) Tables 3-4: FedAvg, CE-FedAvg (update-difference
clipping at 0.5 x FedAvg's average update norm, no noise) and DP-FedAvg
(same clip, epsilon 1.5) on EMNIST digits (non-IID by writer) and CIFAR-10
(IID: Dirichlet alpha 100), a 2-layer MLP (200 hidden) and CNN-2-layers.
**Reduced:** LEAF's 300 EMNIST writers (the seed: 1,920 clients of 125
digits), CIFAR-10 over 100 clients; 20 clients a round by fixed-size
sampling (uniform without replacement; the seed also fixes its cohort,
"|P_t| = 80, for all t", and accounts with the moments accountant of
Abadi et al. it cites, a Poisson-sampling analysis), 30
rounds, 10 local steps of batch 32 (the seed: 80 clients,
Q = 32, batch 64); delta 1e-3. Seed 003's claims to check: clipping costs
accuracy (more for the MLP and for dispersed updates), DP costs more on top,
and the deeper model's updates are more concentrated (compare the update
norm std / mean, the cohort's spread of pre-clip norms over their mean,
median over rounds, and the norm-angle plots in `seed003_plots/`); and
(Sec. 2.1) difference clipping beats model clipping, run here at the same
clip c as CE-FedAvg and at 0.5 x the norm of FedAvg's final model (the
paper's rule applied to what model clipping clips; no noise; their norm
columns describe the update they report, the round's model minus the
clipped model). Best
test accuracy over evaluated rounds; paper numbers (MLP rows only; its
CNNs are AlexNet and ResNet-18) are its FedAvg accuracy minus its reported
drops. The `cifar10_mlp_paper_*` rows run the seed's own geometry on
CIFAR-10: 1,920 clients of 500 examples (50 of each class, overlapping
across clients, as the seed describes), Poisson sampling with q =
80/1,920, Q = 32 local steps of batch 64, delta 1e-5. EMNIST can follow
it only in part: the seed deals 125 digits to each client (Sec. 4), 240,000
in all, and the 29,289 FEMNIST digits here fit 1,920 clients only at 14
digits each (the `_200` rows below).

Rows ending `_200` (issue #28) run that geometry for FedAvg, CE-FedAvg
and DP-FedAvg on both tasks and both models, 200 rounds (the seed states
no round count; our choice for a plateau, as its geometry's 30-round rows
were still rising), noise calibrated for epsilon 1.5 over them, evaluated
every 5th round, each clip from its own `_200` FedAvg row. On EMNIST
digits the 1,920 clients hold 14 digits each, 7 of each of 2 classes
(`dominant_count=7`, `other_count=0`: the most the FEMNIST digits here
hold; the seed: 125, about 92% in 2 classes), with 147 local passes to
make the 32 steps of 64. `_seed1` / `_seed2` rerun the headline pair
(DP-FedAvg against CE-FedAvg, CIFAR-10 MLP) with `--seed` and
`--noise_seed` set to 1 / 2, at the seed-0 FedAvg row's clip. Of the
`_200` rows defined in the study, only those in this table have run.

**Re-accounted (2026-11-23, issue 22):** the DP-FedAvg rows were
calibrated to epsilon 1.5 by a ledger that took the replace-one
sensitivity of fixed-size sampling as C instead of 2C. Their true
replace-one epsilon, from the corrected ledger at the noise multiplier
they ran (`python -m benchmarks.reaccount_fixed_size`), is in `epsilon
RDP`; `epsilon RDP as first reported` keeps the old figure. Their commands
now name that multiplier and `--noise_seed=0`, which reproduce the rows as
they ran (with `--target_epsilon=1.5` today's ledger calibrates more
noise). Their `epsilon PLD` is NaN: fixed-size (without-replacement)
cohorts are accounted by RDP only. Every command names its
`--noise_seed` (0, or the `_seed1` / `_seed2` rows' 1 / 2): research rows
with a published noise seed, whose guarantee assumes that seed secret.
"""
  + STATEFUL_DROPOUT,
  metric='test_accuracy',
  common=dict(
    rounds=30,
    clients_per_round=20,
    delta=1e-3,
    target_epsilon=1.5,
    batch_size=32,
    local_epochs=10,
    local_steps=10,
    client_lr=0.05,
    eval_every=2,
    seed=0,
    # Reproducible research rows: the guarantee assumes this seed secret.
    noise_seed=0,
  ),
  rows=_rows_003(),
  columns=(
    'row',
    'method',
    'best test metric',
    'paper',
    'round of best',
    'final test metric',
    'clip',
    'median pre-clip norm',
    'update norm std / mean',
    'fraction clipped',
    'epsilon RDP',
    'epsilon PLD',
    'epsilon RDP as first reported',
    'noise multiplier',
    's/round',
    'tuning outside ledger',
    'seed',
    'date',
    'wall s',
    'command',
  ),
)
