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


def smoke(name: str, label: str, flags: dict[str, Any], **kwargs) -> Row:
  """A short run that shows a mechanism acting (issue #24), not a result."""
  return Row(
    f'{name}_smoke',
    f'{label} (smoke run, {SMOKE_ROUNDS} rounds)',
    dict(flags, rounds=SMOKE_ROUNDS),
    **kwargs,
  )
