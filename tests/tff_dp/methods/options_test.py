"""A method's options: one dataclass, validated on creation, whose fields
are the method's flags and its saved config keys."""

import dataclasses
from typing import Optional

import pytest

from tff_dp.methods import options


@dataclasses.dataclass(frozen=True)
class _Toy(options.Options):
  size: int = options.option(3, 'Size (>= 1).', check=options.integer(1))
  rate: float = options.option(
    0.5, 'Rate in (0, 1].', check=options.interval(0, 1, '(]')
  )
  mode: str = options.option('a', 'Mode.', choices=('a', 'b'), legacy='b')
  scale: Optional[float] = options.option(
    None, 'Scale (> 0).', check=options.number(positive=True)
  )
  cache: tuple = options.computed(())


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(size=0), r'size must be an integer >= 1. Found 0.'),
    (dict(size=True), r'size must be an integer >= 1. Found True.'),
    (dict(size=2.0), r'size must be an integer >= 1. Found 2.0.'),
    (dict(rate=0.0), r'rate must be in \(0, 1\]. Found 0.0.'),
    (dict(rate=1.5), r'rate must be in \(0, 1\]. Found 1.5.'),
    (dict(mode='c'), r"mode must be one of \('a', 'b'\). Found 'c'."),
    (dict(scale=0.0), r'scale must be a finite number > 0. Found 0.0.'),
    (dict(scale=float('inf')), r'scale must be a finite number > 0'),
  ],
)
def test_a_bad_value_is_named_with_its_range_on_creation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _Toy(**kwargs)


def test_edges_of_the_ranges_are_accepted():
  toy = _Toy(size=1, rate=1.0, mode='b', scale=1e-9)
  assert (toy.size, toy.rate, toy.mode, toy.scale) == (1, 1.0, 'b', 1e-9)
  assert _Toy(scale=None).scale is None  # Optional: None is unchecked.


def test_flat_form_holds_the_flag_fields_only():
  toy = _Toy(size=5, cache=(1, 2))
  assert toy.to_flat() == {'size': 5, 'rate': 0.5, 'mode': 'a', 'scale': None}
  assert [f.name for f in options.flag_fields(_Toy)] == [
    'size',
    'rate',
    'mode',
    'scale',
  ]
  # A computed value is not part of what the options are.
  assert toy == _Toy(size=5)


def test_from_flat_ignores_other_keys_and_fills_legacy_values():
  flat = {'size': 7, 'sketch_k': 10, 'method': 'x'}
  assert options.from_flat(_Toy, flat) == _Toy(size=7)
  # A saved config without `mode` ran with its legacy value.
  assert options.from_flat(_Toy, flat, legacy=True) == _Toy(size=7, mode='b')
  assert options.legacy_defaults(_Toy) == {'mode': 'b'}
  assert options.help_of(options.flag_fields(_Toy)[0]) == 'Size (>= 1).'
  assert options.choices_of(options.flag_fields(_Toy)[2]) == ('a', 'b')
