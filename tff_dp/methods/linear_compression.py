"""Linear compression around a method's DP sum (`--compression`): its
options, its plan (`--compression=auto`) and the wrapper that gives a
method it.

A method whose aggregator is a DP sum over the dense update (DP-FedAvg,
fixed and adaptive, and DDGauss) takes these options: its aggregator is
built for b-dim records and wrapped in
`aggregators.linear_compression.LinearCompressionFactory`, and its round
event, upload and download are its own at d = b (DDGauss's event depends on
the dimension), plus the round's 8-byte seed each way.
"""

import dataclasses
import math
from typing import Any, Optional

from tff_dp.aggregators import linear_compression as lc
from tff_dp.methods import options
from tff_dp.methods import registry

NONE = 'none'
AUTO = 'auto'
NORM_SOURCES = ('assumed', 'pilot')


@options.refusing('0.5', '-3', 'nan', 'inf', 'fast', '', True, 0.5)
def _check_compression(name, value):
  """'none', 'auto' or a number >= 1 (a string from the flag, or a
  number from Python)."""
  if value in (NONE, AUTO):
    return
  try:
    if isinstance(value, bool):
      raise ValueError
    lc.check_compression(float(value))
  except (TypeError, ValueError):
    raise ValueError(
      f"{name} must be 'none', 'auto' or a finite number >= 1 (d / b). "
      f'Found {value!r}.'
    ) from None


@dataclasses.dataclass(frozen=True)
class CompressionOptions(options.Options):
  """Linear compression of the update before the DP sum."""

  compression: str = options.option(
    NONE,
    'Linear compression (Chen et al. 2022): every client sends S x, b = d '
    '/ this many values (S b x d from a public per-round seed), clipped '
    'and noised in the compressed space, decoded by S^T; the same DP '
    'event. none (default), a number >= 1 (d / b), or auto: the largest '
    'compression whose predicted error stays under '
    '--compression_tolerance of the DP noise (needs --compression_norm_ratio).',
    check=_check_compression,
  )
  compression_sketch: str = options.option(
    'srht_interleaved',
    "--compression's S: srht_interleaved (subsampled randomized Hadamard "
    'on blocks of 1,024 that interleave the coordinates, so the decode '
    'error spreads over every layer like the noise), srht (the same on '
    'blocks of 1,024 consecutive coordinates: the error stays in the '
    'layers that carry the update) or count_sketch (one hash row).',
    choices=lc.SKETCHES,
  )
  compression_norm_ratio: Optional[float] = options.option(
    None,
    '--compression=auto: a public bound on ||mu|| / C, the norm of the '
    "cohort's mean clipped update over the clip (> 0): an assumption you "
    'state, or a number from a separate non-private pilot '
    '(--compression_norm_source). Also predicts the error of a given '
    'compression in the summary.',
    check=options.number(positive=True),
  )
  compression_norm_source: str = options.option(
    'assumed',
    'Where --compression_norm_ratio comes from: assumed (stated by you) '
    'or pilot (measured in a separate non-private run); the summary says so.',
    choices=NORM_SOURCES,
  )
  compression_tolerance: float = options.option(
    0.05,
    '--compression=auto: the largest predicted error of the decode, as a '
    "fraction of the DP noise's energy on the mean, in (0, 1].",
    check=options.interval(0, 1, '(]'),
  )
  # What the plan chose (`plan`): set by the method's setup.
  compression_plan: Any = options.computed(None)

  def __post_init__(self):
    super().__post_init__()
    if not isinstance(self.compression, str):  # A number from Python.
      x = float(self.compression)
      object.__setattr__(
        self, 'compression', str(int(x)) if x.is_integer() else repr(x)
      )

  def tuning_outside_ledger(self) -> list[str]:
    if self.compression != AUTO or self.compression_norm_source != 'pilot':
      return []
    return [
      f'--compression=auto from --compression_norm_ratio '
      f'{self.compression_norm_ratio:g}, measured in a non-private pilot '
      "(public only if the pilot ran on other clients' data)"
    ]

  def summary(self) -> dict[str, Any]:
    if self.compression_plan is None:
      return {}
    return {'compression_plan': self.compression_plan}

  def check_run(self, config) -> None:
    super().check_run(config)
    if self.compression == AUTO and self.compression_norm_ratio is None:
      raise ValueError(
        '--compression=auto needs --compression_norm_ratio (a public bound '
        "on ||mu|| / C, the cohort's mean clipped update over the clip)."
      )


# The settings that do nothing without --compression.
SETTINGS_WITH_COMPRESSION = tuple(
  f.name
  for f in dataclasses.fields(CompressionOptions)
  if f.name.startswith('compression_')
)


def active(p: registry.MethodParams) -> bool:
  """Whether `p` asks for compression (options without the field, e.g. a
  bare `Options()` built by hand, do not)."""
  return getattr(p.options, 'compression', NONE) != NONE


def rows(p: registry.MethodParams) -> int:
  """b: the plan's under auto, else ceil(d / compression)."""
  if p.options.compression_plan is not None:
    return p.options.compression_plan['rows']
  if p.options.compression == AUTO:
    raise ValueError(
      '--compression=auto: b is chosen after the noise is calibrated '
      "(the method's setup); this step needs it before."
    )
  return lc.num_rows(p.num_model_params, float(p.options.compression))


def inner_params(p: registry.MethodParams) -> registry.MethodParams:
  """The params the inner method sees: d = b."""
  return dataclasses.replace(p, num_model_params=rows(p))


def choose_rows(
  sketch: str,
  dim: int,
  *,
  noise_multiplier,
  clients_per_round,
  norm_ratio,
  tolerance,
) -> int:
  """The fewest rows b < d whose predicted `added_error_share` <= tolerance.

  Raises:
    ValueError: If no b < d meets it (then compression cannot be free:
      give --compression a number, or none), naming the inputs.
  """

  def share(rows):
    return lc.added_error_share(
      sketch,
      dim,
      rows,
      noise_multiplier=noise_multiplier,
      clients_per_round=clients_per_round,
      norm_ratio=norm_ratio,
    )

  if dim < 2 or noise_multiplier <= 0 or share(dim - 1) > tolerance:
    raise ValueError(
      f"--compression=auto: no b < d = {dim} keeps the {sketch} decode's "
      f'predicted error under {tolerance:g} of the DP noise (expected '
      f'cohort {clients_per_round:g}, noise multiplier '
      f'{noise_multiplier:g}, ||mu|| / C <= {norm_ratio:g}). Give '
      '--compression a number >= 1, or none.'
    )
  budget = (
    tolerance
    * dim
    * noise_multiplier**2
    / (norm_ratio**2 * clients_per_round**2)
  )
  if sketch == 'count_sketch':
    b = math.ceil((dim - 1) / budget)
  else:
    b = math.ceil(lc.padded_dim(sketch, dim) / (1 + budget))
  b = min(max(1, b), dim - 1)
  while b > 1 and share(b - 1) <= tolerance:  # Rounding: never one too many.
    b -= 1
  while share(b) > tolerance:
    b += 1
  return b


def plan(p: registry.MethodParams) -> Optional[dict]:
  """The compression plan written into the summary: b, d / b and, with a
  norm ratio, the predicted error of the decode over the DP noise."""
  o = p.options
  if o.compression == NONE:
    return None
  d, z, n = p.num_model_params, p.noise_multiplier, p.expected_clients_per_round
  sketch = o.compression_sketch
  if o.compression == AUTO:
    b = choose_rows(
      sketch,
      d,
      noise_multiplier=z,
      clients_per_round=n,
      norm_ratio=o.compression_norm_ratio,
      tolerance=o.compression_tolerance,
    )
  else:
    b = lc.num_rows(d, float(o.compression))
  predicted = None
  if o.compression_norm_ratio is not None:
    predicted = lc.added_error_share(
      sketch,
      d,
      b,
      noise_multiplier=z,
      clients_per_round=n,
      norm_ratio=o.compression_norm_ratio,
    )
  return {
    'chosen_by': 'auto' if o.compression == AUTO else 'given',
    'sketch': sketch,
    'dim': d,
    'rows': b,
    'compression': d / b,
    'noise_multiplier': z,
    'clip': p.clip,
    'expected_clients_per_round': n,
    'norm_ratio': o.compression_norm_ratio,
    'norm_source': o.compression_norm_source
    if o.compression_norm_ratio is not None
    else None,
    'tolerance': o.compression_tolerance if o.compression == AUTO else None,
    # E||S^T S mu - mu||^2 / (d z^2 C^2 / n^2) at ||mu|| = norm_ratio C.
    'predicted_added_error_share': predicted,
  }


def compressible(**method) -> dict:
  """A method's `registry.Method` arguments, given `--compression`.

  Its aggregator, round event, upload and download are its own at d = b
  when compression is on (the aggregator wrapped in
  `LinearCompressionFactory`), unchanged when it is off; its setup then
  also writes the plan (`plan`) into the options.
  """
  build, upload = method['build_aggregator'], method['upload_bytes']
  event, setup = method['round_event'], method.get('setup')
  extra = method.get('extra_download_bytes', lambda p: 0)

  def build_aggregator(p):
    if not active(p):
      return build(p)
    return lc.LinearCompressionFactory(
      build(inner_params(p)),
      sketch=p.options.compression_sketch,
      rows=rows(p),
      seed=p.seed,
      # Correlated noise streams over rounds in one b-dim space.
      resample=p.noise_strategy is None,
      measure_error_clip=p.clip if p.builds_diagnostics else None,
      clients_per_round=p.expected_clients_per_round,
    )

  def round_event(z, p):
    if not active(p):
      return event(z, p)
    if p.options.compression == AUTO and p.options.compression_plan is None:
      # Before the plan: only an event that does not depend on d.
      at_d, at_1 = (
        event(z, p),
        event(z, dataclasses.replace(p, num_model_params=1)),
      )
      if at_d != at_1:
        raise ValueError(
          '--compression=auto needs a round event that does not depend on '
          "the dimension (a Gaussian one); this method's does: give "
          '--compression a number.'
        )
      return at_d
    return event(z, inner_params(p))

  def planned_setup(p, task, data_dir):
    if setup is not None:
      p = setup(p, task, data_dir)
    if not active(p):
      return p
    return p.replace_options(compression_plan=plan(p))

  return {
    **method,
    'build_aggregator': build_aggregator,
    'round_event': round_event,
    'upload_bytes': lambda p: lc.upload_bytes(upload(inner_params(p)))
    if active(p)
    else upload(p),
    'extra_download_bytes': lambda p: extra(inner_params(p)) + lc.SEED_BYTES
    if active(p)
    else extra(p),
    'setup': planned_setup,
  }
