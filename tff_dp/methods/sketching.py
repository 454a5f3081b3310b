"""FetchSGD, DPSFL and DPSFL-AC (the DPSFL paper): count-sketched updates;
their options and registry entries."""

import dataclasses
from typing import Optional

from absl import logging

from tff_dp.methods import communication
from tff_dp.aggregators import count_sketch
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import dpsfl_adaptive_clip
from tff_dp.methods import options
from tff_dp.methods import registry
from tff_dp.methods import style


@dataclasses.dataclass(frozen=True)
class SketchOptions(options.Options):
  sketch_rows: int = options.option(
    5, 'Count-sketch rows (>= 1).', check=options.integer(1)
  )
  # k / columns = 0.1: a count sketch recovers only coordinates well above
  # ||g|| / sqrt(columns); the DPSFL study diverged at k / columns = 0.5
  # (benchmarks/results/seed002_emnist.md). The rows of
  # benchmarks/results/method_cost.md ran 20,000 columns and k 5,000.
  sketch_columns: int = options.option(
    100_000, 'Count-sketch columns (>= 1).', check=options.integer(1)
  )
  sketch_k: int = options.option(
    10_000,
    'Coordinates recovered per round, in [1, --sketch_columns].',
    check=options.integer(1),
  )
  sketch_momentum: float = options.option(
    0.9,
    'Sketch-space momentum in [0, 1).',
    check=options.interval(0, 1, '[)'),
  )
  sketch_hashing: str = options.option(
    'murmur',
    'Count-sketch hashes: murmur (per coordinate) '
    'or block (a cyclic shift and a sign per block of columns coordinates: '
    'same collision probability 1/columns, about 4x cheaper to sketch).',
    choices=count_sketch.HASHINGS,
  )
  # The error-feedback step in sketch space (FetchSGD's lr; the server lr
  # must stay 1). With sketch momentum rho the steady step is lr / (1 - rho).
  sketch_lr: float = options.option(
    1.0,
    'The step applied from the momentum sketch to the error sketch (> 0; '
    "FetchSGD's lr; keep --server_lr at 1). With --sketch_momentum rho the "
    'steady step is sketch_lr / (1 - rho).',
    check=options.number(positive=True),
  )

  def __post_init__(self):
    super().__post_init__()
    if self.sketch_k > self.sketch_columns:
      raise ValueError(
        f'sketch_k must be at most sketch_columns ({self.sketch_columns}): '
        'a count sketch recovers only coordinates well above '
        f'||g|| / sqrt(columns). Found {self.sketch_k!r}.'
      )

  def check_run(self, config) -> None:
    del config
    if self.sketch_k > 0.1 * self.sketch_columns:
      logging.warning(
        'sketch_k / sketch_columns = %.2f > 0.1: FetchSGD diverged at 0.5 '
        "in the DPSFL study (benchmarks/results/seed002_emnist.md's "
        'notes).',
        self.sketch_k / self.sketch_columns,
      )


@dataclasses.dataclass(frozen=True)
class AdaptiveSketchOptions(SketchOptions):
  dpsfl_target_probability: float = options.option(
    0.5,
    'DPSFL-AC: target fraction of clients whose clipping impact on the last '
    'top-k is within --dpsfl_impact_threshold, in (0, 1).',
    check=options.interval(0, 1, '()'),
  )
  dpsfl_impact_threshold: float = options.option(
    0.1,
    'DPSFL-AC: the clipping-impact bound gamma (> 0; below 1 for the '
    'relative rule).',
    check=options.number(positive=True),
  )
  # None: expected clients per round / 20 (Andrew et al.; see dpsfl).
  dpsfl_bit_noise: Optional[float] = options.option(
    None,
    "DPSFL-AC: the bit sum's noise stddev (>= 0), composed in the ledger; "
    'default: expected clients per round / 20 (Andrew et al. 2021).',
    check=options.number(positive=False),
  )
  dpsfl_clip_lr: float = options.option(
    0.2,
    'DPSFL-AC: geometric clip step (> 0).',
    check=options.number(positive=True),
  )
  dpsfl_impact_rule: str = options.option(
    'relative',
    "DPSFL-AC's clipping-impact test on the last top-k: relative (clip "
    'error / norm of the top-k part <= gamma, in (0, 1)) or absolute (clip '
    'error <= gamma). absolute reproduces the rows dpsfl_ac and '
    'dpsfl_ac_gamma0.01 of benchmarks/results/seed002_emnist.md and '
    'seed002_cifar10.md.',
    choices=dpsfl_adaptive_clip.IMPACT_RULES,
    legacy='absolute',
  )

  def __post_init__(self):
    super().__post_init__()
    self.adaptive_clip().check()

  def adaptive_clip(self) -> dpsfl_adaptive_clip.AdaptiveClip:
    return dpsfl_adaptive_clip.AdaptiveClip(
      target_probability=self.dpsfl_target_probability,
      impact_threshold=self.dpsfl_impact_threshold,
      bit_noise_multiplier=self.dpsfl_bit_noise,
      learning_rate=self.dpsfl_clip_lr,
      impact_rule=self.dpsfl_impact_rule,
    )


_DESCRIPTIONS = {
  'fetchsgd': 'FetchSGD (Rothchild et al. 2020): count-sketched updates, '
  'sketch-space momentum and error feedback, top-k unsketch; no DP.',
  'dpsfl': 'DPSFL (the DPSFL paper): FetchSGD with clipped sketches and '
  'Gaussian noise on their secure sum.',
  'dpsfl_ac': 'DPSFL-AC (the DPSFL paper): DPSFL with the clip adapted from '
  'noisy one-bit clipping-impact signals.',
}


def _method(name: str) -> registry.Method:
  private = name != 'fetchsgd'
  adaptive = name == 'dpsfl_ac'

  def adaptive_clip(p: registry.MethodParams):
    if not adaptive:
      return None
    return p.options.adaptive_clip().resolved(p.expected_clients_per_round)

  def aggregator(p: registry.MethodParams):
    o = p.options
    return dpsfl.SketchAggregatorFactory(
      rows=o.sketch_rows,
      columns=o.sketch_columns,
      k=o.sketch_k,
      momentum=o.sketch_momentum,
      learning_rate=o.sketch_lr,
      hashing=o.sketch_hashing,
      noise_multiplier=p.noise_multiplier if private else None,
      clients_per_round=p.expected_clients_per_round if private else None,
      clip=p.clip if private else None,
      adaptive=adaptive_clip(p),
      seed=p.seed,
      noise_seed=p.noise_seed,
      noise=p.noise_strategy if private else None,
    )

  return registry.Method(
    name=name,
    description=_DESCRIPTIONS[name] + ' Keep --server_lr 1.',
    private=private,
    options=AdaptiveSketchOptions if adaptive else SketchOptions,
    build_aggregator=aggregator,
    upload_bytes=lambda p: dpsfl.upload_bytes(
      p.options.sketch_rows, p.options.sketch_columns, adaptive
    ),
    # Clients hold the model (frozen layers never change) and apply the
    # broadcast top-k update.
    extra_download_bytes=lambda p: dpsfl.download_bytes(
      p.options.sketch_k, adaptive
    )
    - communication.dense_float32_bytes(
      p.num_model_params + p.num_frozen_params
    ),
    round_event=(
      (lambda z, p: dpsfl.round_event(z, adaptive_clip(p), p.noise_strategy))
      if private
      else None
    ),
    correlated_noise=private,
    style=_STYLES[name],
    docs_page='papers/dpsfl.md',
  )


_STYLES = {
  'fetchsgd': style.Style('FetchSGD (no DP)', style.GREY, 'd'),
  'dpsfl': style.Style('DPSFL', style.BROWN, 'd'),
  'dpsfl_ac': style.Style('DPSFL-AC', style.PINK, '*'),
}

for _name in ('fetchsgd', 'dpsfl', 'dpsfl_ac'):
  registry.register(_method(_name))
