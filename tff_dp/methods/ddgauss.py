"""DDGauss (Kairouz et al. 2021): its options and registry entry."""

import dataclasses
from typing import Optional

from tff_dp.methods import communication
from tff_dp import privacy
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import ddgauss_accounting
from tff_dp.methods import linear_compression
from tff_dp.methods import options
from tff_dp.methods import registry
from tff_dp.methods import style


@dataclasses.dataclass(frozen=True)
class DDGaussOptions(linear_compression.CompressionOptions):
  ddgauss_bits: int = options.option(
    20,
    'DDGauss bit width of the modular sum, in [2, 22].',
    check=options.integer(2),
  )
  # None: the cohort m under fixed-size sampling, the 1% quantile of
  # Binomial(N, q) under Poisson sampling
  # (`tff_dp.aggregators.ddgauss_accounting.binomial_min_clients`).
  ddgauss_min_clients: Optional[int] = options.option(
    None,
    'DDGauss: smallest cohort whose round is released (rounds below it '
    'release a zero update), an integer in [2, expected cohort]. Default: '
    'the cohort under fixed-size sampling, the 1% quantile of the cohort '
    'under Poisson sampling.',
    check=options.integer(2),
  )

  def check_run(self, config) -> None:
    super().check_run(config)
    if self.compression == linear_compression.AUTO:
      raise ValueError(
        "--compression=auto is for Gaussian noise: DDGauss's event and "
        'noise depend on the dimension. Give --compression a number.'
      )

  def __post_init__(self):
    super().__post_init__()
    if self.ddgauss_bits > 22:  # TFF's DistributedDpSumFactory limit.
      raise ValueError(
        f'ddgauss_bits must be in [2, 22]. Found {self.ddgauss_bits!r}.'
      )


def _preflight() -> None:
  if not ddgauss.protobuf_supports_ddgauss():
    raise ValueError(
      "Method ddgauss needs protobuf's pure-Python backend: set "
      f'{ddgauss.PROTOBUF_ENV}=python before TensorFlow is imported '
      '(python -m tff_dp.run --method=ddgauss does so itself).'
    )


def default_min_clients(sampling: privacy.Sampling) -> int:
  """DDGauss's default cohort lower bound for this sampling.

  Fixed-size sampling of m clients: m. Poisson sampling: the largest k that
  a Binomial(N, q) cohort falls below with probability <= 1% (so at most
  1% of rounds are withheld); never the expected cohort rounded down.
  """
  if sampling.mode == 'fixed':
    return sampling.clients_per_round
  return ddgauss_accounting.binomial_min_clients(
    sampling.num_clients, sampling.rate, withhold_prob=0.01
  )


def _resolve(p: registry.MethodParams, sampling) -> registry.MethodParams:
  if p.options.ddgauss_min_clients is not None:
    return p
  return p.replace_options(ddgauss_min_clients=default_min_clients(sampling))


registry.register(
  registry.Method(
    name='ddgauss',
    description=(
      'DDGauss (Kairouz et al. 2021): distributed discrete Gaussian over '
      "TFF's threshold-gated secure sum; RDP accounting only (no PLD)."
    ),
    private=True,
    options=DDGaussOptions,
    **linear_compression.compressible(
      build_aggregator=lambda p: ddgauss.ddgauss_mean(
        p.noise_multiplier,
        p.expected_clients_per_round,
        p.clip,
        min_clients=p.options.ddgauss_min_clients,
        bits=p.options.ddgauss_bits,
      ),
      # One integer of `bits` bits per coordinate of the DFT-padded vector.
      upload_bytes=lambda p: communication.packed_bits_bytes(
        2 * ((p.num_model_params + 1) // 2), p.options.ddgauss_bits
      ),
      # The same event every round: h = min_clients - 1 shares, never the
      # realised count (a round below min_clients is withheld). It is a
      # `DiscreteGaussianSumDpEvent` (Kairouz et al.'s RDP curve), which the
      # ledger amplifies with generic bounds; noise is calibrated through
      # that accounting and only with the RDP accountant
      # (`privacy.calibrate_noise_multiplier` refuses 'pld'). What ran is read
      # from the measurements (`dp_events.released_event`).
      round_event=lambda z, p: ddgauss_accounting.planned_round_event(
        z,
        p.clip,
        p.expected_clients_per_round,
        p.num_model_params,
        p.options.ddgauss_bits,
        min_clients=p.options.ddgauss_min_clients,
      ),
    ),
    preflight=_preflight,
    resolve=_resolve,
    style=style.Style('DDGauss', style.PINK, 'D'),
    docs_page='papers/ddgauss.md',
    reveals_cohort_size=True,
  )
)
