"""How each method is drawn in every plot, read from its registry entry.

`METHOD_STYLES` holds each method's legend name, colour and marker
(`registry.Method.style`), by its `--method` name, and by
'<method>+<noise>' for the correlated-noise variants of the methods that
take correlated noise (`Method.correlated_noise`; `style.noise_variant`),
and by '<method>+compressed' for the runs of the methods that take
`--compression` (`style.compressed_variant`);
`method_key` reads a run's key from its flags and `method_style` looks it
up. `is_ceiling` says whether a method's rows draw the frontier's
non-private ceiling (`Method.ceiling`).
"""

from typing import Any, Mapping

from tff_dp import methods
from tff_dp.methods import linear_compression
from tff_dp.methods import settings
from tff_dp.methods import style as style_lib

METHOD_STYLES: dict[str, style_lib.Style] = {
  name: method.style for name, method in sorted(methods.METHODS.items())
}
METHOD_STYLES.update(
  {
    style_lib.variant_key(name, noise): style_lib.noise_variant(
      method.style, noise
    )
    for name, method in sorted(methods.METHODS.items())
    if method.correlated_noise
    for noise in style_lib.NOISE_VARIANTS
  }
)
METHOD_STYLES.update(
  {
    style_lib.variant_key(name, settings.IID, compressed=True): (
      style_lib.compressed_variant(method.style)
    )
    for name, method in sorted(methods.METHODS.items())
    if issubclass(method.options, linear_compression.CompressionOptions)
  }
)


def is_ceiling(method: str) -> bool:
  """Whether `method`'s rows draw the non-private ceiling."""
  found = methods.METHODS.get(method)
  return found is not None and found.ceiling


def method_key(flags: Mapping[str, Any]) -> str:
  """The `METHOD_STYLES` key of a run from its flags (`--method`, and
  `--noise` when it is not 'iid')."""
  method = str(flags.get('method') or '')
  noise = str(flags.get('noise') or settings.IID)
  compression = str(flags.get('compression') or linear_compression.NONE)
  return style_lib.variant_key(
    method, noise, compressed=compression != linear_compression.NONE
  )


def method_style(key: str) -> style_lib.Style:
  """`METHOD_STYLES[key]`.

  Raises:
    ValueError: If the method has no entry (give its registry entry a
      `style`: a method's colour and marker must be the same in every
      plot).
  """
  if key not in METHOD_STYLES or METHOD_STYLES[key] is None:
    raise ValueError(
      f'No style for method {key!r} in tff_dp.reporting.styles.METHOD_STYLES '
      f'(each comes from its registry entry); it has {sorted(METHOD_STYLES)}.'
    )
  return METHOD_STYLES[key]
