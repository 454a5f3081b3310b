"""A study's rows and table: the data types every paper's study module uses."""

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class Row:
  name: str
  label: str
  flags: dict[str, Any]
  paper: dict[str, Any] = dataclasses.field(default_factory=dict)
  clip_from: Optional[str] = None
  # Seed 003's rule: clip = 0.5 x that row's average update norm.
  clip_half_mean_of: Optional[str] = None
  # The same rule for model clipping: clip = 0.5 x the L2 norm of that
  # row's final global model (its trainable weights).
  clip_half_model_norm_of: Optional[str] = None
  # Seed 001's rule for CMP-Fed: each phase's clip ('cmp_clip_u',
  # 'cmp_clip_v') from the median over rounds of that phase's mean pre-clip
  # client norm in the named probe row (`cmp_clip_from_run`).
  cmp_clips_from: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Study:
  title: str
  notes: str
  metric: str  # The test metric whose best round is reported.
  common: dict[str, Any]
  rows: tuple[Row, ...]
  columns: tuple[str, ...]


SMOKE_ROUNDS = 10

# Appended to the notes of every study whose rows train CNN-2-layers.
STATEFUL_DROPOUT = """
CNN-2-layers rows recorded before 2026-11-25 ran with Keras' seeded
`Dropout`, whose masks depended on what ran before a client (stateful
random kernels), so they cannot be rerun to the same number (round-1 train
loss 4.109985 vs 4.110261 for two runs of one command in one process).
Since then its dropout is `models.StatelessDropout` (masks a function of
the seed and the batch) and a seeded command reproduces exactly
(`tests/tff_dp/reproducibility_test.py`); a rerun of a recorded row
will not give its recorded numbers.
"""


def smoke(name: str, label: str, flags: dict[str, Any], **kwargs) -> Row:
  """A short run that shows a mechanism acting (issue #24), not a result."""
  return Row(
    f'{name}_smoke',
    f'{label} (smoke run, {SMOKE_ROUNDS} rounds)',
    dict(flags, rounds=SMOKE_ROUNDS),
    **kwargs,
  )


def reseeded(row: Row, seeds: tuple[int, ...]) -> tuple[Row, ...]:
  """`row` again under other seeds: `seed` (the initial model and public
  randomness) and `noise_seed` (client sampling, local shuffles and the
  noise) both set to each of `seeds`; the clients' data split is the
  task's and stays. Issue #28's seed spread for each paper's headline
  pair."""
  return tuple(
    dataclasses.replace(
      row,
      name=f'{row.name}_seed{s}',
      label=f'{row.label}, seed {s}',
      flags=dict(row.flags, seed=s, noise_seed=s),
    )
    for s in seeds
  )


def at_rounds(row: Row, rounds: int, **flags) -> Row:
  """`row` at the paper's round count (issue #28), noise recalibrated for
  the same epsilon over `rounds`."""
  return dataclasses.replace(
    row,
    name=f'{row.name}_{rounds}',
    label=f'{row.label} ({rounds} rounds)',
    flags=dict(row.flags, rounds=rounds, **flags),
  )
