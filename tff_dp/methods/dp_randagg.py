"""DP-RandAgg (the baseline of Guo et al. (CMP-Fed)): its options and
registry entry."""

import dataclasses

from tff_dp.aggregators import dp_randagg
from tff_dp.methods import options
from tff_dp.methods import registry
from tff_dp.methods import style


@dataclasses.dataclass(frozen=True)
class RandAggOptions(options.Options):
  randagg_fraction: float = options.option(
    0.01,
    'DP-RandAgg: fraction k/d of coordinates sent each round, in (0, 1].',
    check=options.interval(0, 1, '(]'),
  )
  randagg_clip_scope: str = options.option(
    'update',
    'DP-RandAgg: clip the whole update to --clip before taking its k '
    'coordinates (update, as Guo et al. describe it) or only the k-vector '
    '(payload). payload reproduces the 30-round DP-RandAgg rows of '
    'benchmarks/results/seed001_iid.md and seed001_5labels.md.',
    choices=dp_randagg.CLIP_SCOPES,
    legacy='payload',
  )


def num_coordinates(p: registry.MethodParams) -> int:
  return max(1, int(round(p.options.randagg_fraction * p.num_model_params)))


registry.register(
  registry.Method(
    name='dp_randagg',
    description=(
      'DP-RandAgg (Guo et al.): k = --randagg_fraction x d shared random '
      'coordinates, clipped, noised, secure-summed.'
    ),
    private=True,
    options=RandAggOptions,
    build_aggregator=lambda p: dp_randagg.DPRandAggFactory(
      p.noise_multiplier,
      p.expected_clients_per_round,
      p.clip,
      num_coordinates=num_coordinates(p),
      seed=p.seed,
      noise_seed=p.noise_seed,
      clip_scope=p.options.randagg_clip_scope,
      noise=p.noise_strategy,
    ),
    upload_bytes=lambda p: dp_randagg.upload_bytes(num_coordinates(p)),
    # The round's k coordinate indices (int32) come down with the model.
    extra_download_bytes=lambda p: 4 * num_coordinates(p),
    round_event=registry.gaussian,
    correlated_noise=True,
    style=style.Style('DP-RandAgg', style.VERMILION, 'v'),
    docs_page='papers/dp_randagg.md',
  )
)
