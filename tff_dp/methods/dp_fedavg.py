"""FedAvg and DP-FedAvg (fixed and adaptive clip): their options and
registry entries."""

import dataclasses
from typing import Optional

from tff_dp.aggregators import dp_fedavg
from tff_dp.methods import linear_compression
from tff_dp.methods import options
from tff_dp.methods import public_round
from tff_dp.methods import registry
from tff_dp.methods import style


@dataclasses.dataclass(frozen=True)
class FixedClipOptions(linear_compression.CompressionOptions):
  """DP-FedAvg with a fixed clip."""

  # None: no fraction-clipped release.
  fraction_clipped_stddev: Optional[float] = options.option(
    None,
    'Release a DP estimate of the fraction of clients clipped each round '
    '(the dp_fraction_clipped column), with this noise stddev on the '
    'clipped count (> --noise_multiplier / 2; e.g. 0.05 x expected '
    "clients, as adaptive clipping's default). It is charged to the "
    "ledger: the sum's multiplier rises so that --noise_multiplier stays "
    'the effective one. Default: off.',
    check=options.number(positive=True),
  )


@dataclasses.dataclass(frozen=True)
class AdaptiveClipOptions(linear_compression.CompressionOptions):
  """DP-FedAvg with adaptive clipping (Andrew et al. 2021)."""

  target_unclipped_quantile: float = options.option(
    0.5,
    'Adaptive clipping target quantile, in (0, 1).',
    check=options.interval(0, 1, '()'),
  )
  clip_learning_rate: float = options.option(
    0.2,
    'Adaptive clipping learning rate (>= 0).',
    check=options.number(positive=False),
  )
  # None: TFF's default, 0.05 x expected clients per round.
  clipped_count_stddev: Optional[float] = options.option(
    None,
    "Adaptive clipping: the clipped count's noise stddev (> 0); it must "
    'exceed --noise_multiplier / 2. Default: 0.05 x expected clients per '
    "round (TFF's), too small for cohorts under 10 x the multiplier.",
    check=options.number(positive=True),
  )


def fixed_clip_aggregator(p: registry.MethodParams):
  return dp_fedavg.gaussian_fixed(
    p.noise_multiplier,
    p.expected_clients_per_round,
    p.clip,
    noise_seed=p.noise_seed,
    clipped_fraction_stddev=getattr(p.options, 'fraction_clipped_stddev', None),
    noise=p.noise_strategy,
  )


registry.register(
  registry.Method(
    name='fedavg',
    description='FedAvg (McMahan et al. 2017), example-weighted, no DP.',
    private=False,
    build_aggregator=lambda p: None,
    upload_bytes=registry.weighted_dense_upload,
    style=style.Style('FedAvg (no DP)', style.BLACK, 's'),
    docs_page='papers/dp_fedavg.md',
    ceiling=True,
  )
)

registry.register(
  registry.Method(
    name='dp_fedavg',
    description=(
      'DP-FedAvg (McMahan et al. 2018): fixed clip, Gaussian noise, '
      'uniform weights; --compression sends a linear sketch instead.'
    ),
    private=True,
    options=FixedClipOptions,
    **linear_compression.compressible(
      build_aggregator=fixed_clip_aggregator,
      upload_bytes=registry.dense_upload,
      round_event=registry.gaussian,
      # --clip_from_public_round: the full update of one public round
      # (Kerkouche et al. 2021's FL-STD-DP: "when K = |T| = n, the scheme
      # is equivalent to FL-STD").
      setup=public_round.clip_setup(lambda p, task: [None]),
    ),
    public_round_clip=True,
    correlated_noise=True,
    # Its correlated-noise variants sit beside it at its upload: a lighter
    # blue tells them apart at a glance.
    style=style.Style('DP-FedAvg', style.BLUE, 'o', variant_color=style.SKY),
    docs_page='papers/dp_fedavg.md',
  )
)

registry.register(
  registry.Method(
    name='dp_fedavg_adaptive',
    description=(
      'DP-FedAvg with adaptive clipping (Andrew et al. 2021); '
      '--clip is the initial clip.'
    ),
    private=True,
    options=AdaptiveClipOptions,
    **linear_compression.compressible(
      build_aggregator=lambda p: dp_fedavg.gaussian_adaptive(
        p.noise_multiplier,
        p.expected_clients_per_round,
        initial_clip=p.clip,
        target_unclipped_quantile=p.options.target_unclipped_quantile,
        learning_rate=p.options.clip_learning_rate,
        clipped_count_stddev=p.options.clipped_count_stddev,
        noise_seed=p.noise_seed,
      ),
      upload_bytes=registry.dense_upload,
      round_event=registry.gaussian,  # The effective multiplier.
    ),
    style=style.Style('DP-FedAvg, adaptive clip', style.SKY, 'o'),
    docs_page='papers/dp_fedavg.md',
  )
)
