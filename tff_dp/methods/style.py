"""How a method looks in every plot: its `Style` (label, colour, marker),
declared in its registry entry (`registry.Method.style`), and the style of
its correlated-noise variants (`noise_variant`).

A method keeps one colour and marker in every plot. The colours are the
Okabe-Ito set and a few more, chosen so that the methods of one study
differ in colour as well as in marker, and that no two methods that take
correlated noise share a colour (`tests/tff_dp/methods/registry_test.py`
checks that every method and variant has its own pair).
"""

import dataclasses
from typing import Optional

from tff_dp.methods import settings

BLACK, BLUE, SKY, GREEN = '#000000', '#0072B2', '#56B4E9', '#009E73'
ORANGE, VERMILION, PINK = '#E69F00', '#D55E00', '#CC79A7'
PURPLE, BROWN, CYAN, OLIVE = '#9467bd', '#8c564b', '#17becf', '#bcbd22'
GREY, NAVY, WINE = '#7f7f7f', '#332288', '#882255'


@dataclasses.dataclass(frozen=True)
class Style:
  """A method's label, colour and matplotlib marker in every plot.

  Attributes:
    name: The label in legends and tables.
    color: A matplotlib colour.
    marker: A matplotlib marker.
    variant_color: The colour of its correlated-noise variants (default:
      its own colour).
  """

  name: str
  color: str
  marker: str
  variant_color: Optional[str] = None


# Each correlated `--noise` value: the words a variant's label adds and its
# marker (a hexagon for banded MF noise, a turned one for BLT).
NOISE_VARIANTS = {
  settings.BANDED: ('banded MF noise', 'h'),
  settings.BLT: ('BLT noise', 'H'),
}


# A run with linear compression (`--compression`): the words its label
# adds and its marker (a filled X), in the method's colour.
COMPRESSED = ('linear compression', 'X')
COMPRESSED_KEY = 'compressed'


def variant_key(method: str, noise: str, compressed: bool = False) -> str:
  """The style key of `method` run with `--noise=noise`: the method's
  name for iid noise, else '<method>+<noise>'; '+compressed' for a run
  with linear compression (iid noise)."""
  if compressed:
    return f'{method}+{COMPRESSED_KEY}'
  return method if noise == settings.IID else f'{method}+{noise}'


def compressed_variant(style: Style) -> Style:
  """The style of a method's run with linear compression."""
  words, marker = COMPRESSED
  return Style(f'{style.name}, {words}', style.color, marker)


def noise_variant(style: Style, noise: str) -> Style:
  """The style of a method's run with correlated `noise` (banded or blt):
  its label with the noise's words, its variant colour, the noise's
  marker.

  Raises:
    ValueError: If `noise` is not a correlated noise.
  """
  if noise not in NOISE_VARIANTS:
    raise ValueError(
      f'noise must be one of {tuple(NOISE_VARIANTS)}. Found {noise!r}.'
    )
  words, marker = NOISE_VARIANTS[noise]
  return Style(
    f'{style.name}, {words}', style.variant_color or style.color, marker
  )
