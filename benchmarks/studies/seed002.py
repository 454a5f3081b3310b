"""Seed 002: DPSFL, DPSFL-AC and FetchSGD on a count sketch against DP-FedAvg
and DP-RandAgg, on EMNIST and CIFAR-10."""

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
(`--dpsfl_impact_rule=absolute`, kept in their commands); since issue #24
the default is the relative test (clip error / ||g_T|| <= gamma), see
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
    Row(
      'dpsfl_ac_relative',
      'DPSFL-AC, relative impact test, bit noise expected clients / 20',
      dict(method='dpsfl_ac', dpsfl_bit_noise=None),
    ),
    smoke(
      'dpsfl_ac_relative',
      'DPSFL-AC, relative impact test, bit noise expected clients / 20',
      dict(method='dpsfl_ac', dpsfl_bit_noise=None),
    ),
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
