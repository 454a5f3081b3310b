"""Seed 003: model vs update clipping, CE-FedAvg and DP-FedAvg with their
update-distribution diagnostics, Tables 3-4."""

from benchmarks.studies.study import Row
from benchmarks.studies.study import STATEFUL_DROPOUT
from benchmarks.studies.study import Study

STUDIES: dict[str, Study] = {}

_PAPER_003 = {
  ('emnist_digits', 'mlp'): (94.0, 1.84, 0.29),
  ('cifar10_dirichlet', 'mlp'): (51.90, 7.39, 0.90),
}


def _rows_003():
  rows = []
  for task, model in (
    ('emnist_digits', 'mlp'),
    ('emnist_digits', 'cnn_2layers'),
    ('cifar10_dirichlet', 'mlp'),
    ('cifar10_dirichlet', 'cnn_2layers'),
  ):
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
  # Seed 003's own geometry on CIFAR-10 (issue #24): 1,920 clients of 500
  # examples, 50 of each class, overlapping across clients; Poisson
  # sampling with q = 80 / 1,920; Q = 32 local steps of batch 64; delta
  # 1e-5. (EMNIST cannot follow: 1,920 clients of 500 digits without
  # overlap need 960,000 digits; the FEMNIST digits here hold 55.)
  paper = _PAPER_003[('cifar10_dirichlet', 'mlp')]
  geometry = dict(
    task='cifar10_dirichlet',
    task_option=[
      'model=mlp',
      'split=class_balanced_overlap',
      'num_clients=1920',
      'per_class=50',
    ],
    clients_per_round=None,
    client_sampling_rate=80 / 1920,
    batch_size=64,
    local_steps=32,
    delta=1e-5,
  )
  tag = 'cifar10_mlp_paper'
  rows += [
    Row(
      f'{tag}_fedavg',
      "FedAvg, CIFAR-10 MLP, the seed's geometry",
      dict(geometry, method='fedavg'),
      dict(best=paper[0] / 100),
    ),
    Row(
      f'{tag}_ce_fedavg',
      "CE-FedAvg, CIFAR-10 MLP, the seed's geometry",
      dict(geometry, method='ce_fedavg'),
      dict(best=(paper[0] - paper[1]) / 100),
      clip_half_mean_of=f'{tag}_fedavg',
    ),
    Row(
      f'{tag}_dp_fedavg',
      "DP-FedAvg, CIFAR-10 MLP, the seed's geometry (Poisson q = 80/1920)",
      dict(geometry, method='dp_fedavg'),
      dict(best=(paper[0] - paper[1] - paper[2]) / 100),
      clip_half_mean_of=f'{tag}_fedavg',
    ),
  ]
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
80/1,920, Q = 32 local steps of batch 64, delta 1e-5. EMNIST cannot
follow it: 1,920 clients of 500 digits without overlap need 960,000
digits, and the seed's 2-dominant-class split
(`--task_option=split=dominant_classes`) fits 55 clients in the FEMNIST
digits here.

**Re-accounted (2026-11-23, issue 22):** the DP-FedAvg rows were
calibrated to epsilon 1.5 by a ledger that took the replace-one
sensitivity of fixed-size sampling as C instead of 2C. Their true
replace-one epsilon, from the corrected ledger at the noise multiplier
they ran (`python -m benchmarks.reaccount_fixed_size`), is in `epsilon
RDP`; `epsilon RDP as first reported` keeps the old figure. Their commands
now name that multiplier and `--noise_seed=0`, which reproduce the rows as
they ran (with `--target_epsilon=1.5` today's ledger calibrates more
noise). Every command carries `--noise_seed=0`: research rows with a
published noise seed, whose guarantee assumes that seed secret.
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
