"""Settings as typed dataclass fields: each field is also the absl flag of
its name, with its help, its allowed range (checked on creation) and, if
any, its legacy default.

`option(...)` declares one; `Options` is the base of every method's options
(`tff_dp/methods/`), and the settings every run has
(`tff_dp.methods.settings.RunSettings`) are declared the same way, so the
flags, `config.json`, validation and the builders' view all come from one
declaration per setting."""

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional

import numpy as np

# Field metadata keys.
_HELP = 'help'
_CHECK = 'check'
_CHOICES = 'choices'
_LEGACY = 'legacy'
_FLAG = 'flag'
_FLAG_NAME = 'flag_name'
_PARSE = 'parse'

Check = Callable[[str, Any], None]


def option(
  default: Any,
  help: str,  # pylint: disable=redefined-builtin
  *,
  check: Optional[Check] = None,
  choices: Optional[tuple[str, ...] | Callable[[], tuple[str, ...]]] = None,
  legacy: Any = dataclasses.MISSING,
  flag_name: Optional[str] = None,
  parse: Optional[Callable[[list[str]], Any]] = None,
  metadata: Optional[Mapping[str, Any]] = None,
) -> Any:
  """A method option: a field that is also the absl flag of the same name.

  Args:
    default: The value when neither the flag nor the caller sets it.
    help: The flag's help (say the allowed range).
    check: `check(name, value)` raises ValueError naming the value and its
      allowed range; None values of an optional option are not checked.
    choices: The allowed strings (an enum flag), or a function returning
      them (a registry filled after this declaration).
    legacy: The behaviour runs recorded before this option existed had, when
      it differs from `default`: a saved config without the key is read
      with this value (resumed runs, rebuilt aggregators).
    flag_name: The flag's name when it is not the field's (e.g.
      `root_output_dir` for `output_dir`).
    parse: For a repeatable flag (a `DEFINE_multi_string`): maps the
      flag's list of strings to the field's value.
    metadata: More field metadata (e.g. `settings.BUILDERS`).
  """
  metadata = {
    **(metadata or {}),
    _HELP: help,
    _CHECK: check,
    _CHOICES: choices,
    _FLAG: True,
    _FLAG_NAME: flag_name,
    _PARSE: parse,
  }
  if legacy is not dataclasses.MISSING:
    metadata[_LEGACY] = legacy
  return dataclasses.field(default=default, metadata=metadata)


def computed(default: Any = None) -> Any:
  """A value a method's setup fills in (no flag, not in the saved config)."""
  return dataclasses.field(
    default=default, compare=False, metadata={_FLAG: False}
  )


@dataclasses.dataclass(frozen=True)
class Options:
  """Base of every method's options (a method without options uses it)."""

  def __post_init__(self):
    check_fields(self)

  def check_run(self, config) -> None:
    """Checks that need the run's other settings (an `ExperimentConfig`)."""
    del config

  def clip_words(self, clip: float) -> str:
    """The clip(s) `clip` sets, in words (for the summary)."""
    return f'clip {clip:.6g}'

  def tuning_outside_ledger(self) -> list[str]:
    """Choices these options make from client data outside the privacy
    ledger, in words (for the summary's privacy section); none by
    default."""
    return []

  def summary(self) -> dict[str, Any]:
    """What the options add to the run's summary.json (e.g. a plan their
    setup computed); empty by default."""
    return {}

  def to_flat(self) -> dict[str, Any]:
    """The options under their flag names (as saved in config.json)."""
    return {f.name: getattr(self, f.name) for f in flag_fields(type(self))}


def flag_fields(cls) -> list[dataclasses.Field]:
  return [f for f in dataclasses.fields(cls) if f.metadata.get(_FLAG)]


def help_of(f: dataclasses.Field) -> str:
  return f.metadata[_HELP]


def choices_of(f: dataclasses.Field) -> Optional[tuple[str, ...]]:
  choices = f.metadata[_CHOICES]
  return choices() if callable(choices) else choices


def flag_name_of(f: dataclasses.Field) -> str:
  """The absl flag's name (the field's unless declared otherwise)."""
  return f.metadata.get(_FLAG_NAME) or f.name


def parser_of(f: dataclasses.Field) -> Optional[Callable[[list[str]], Any]]:
  """The parser of a repeatable flag's strings, or None (a scalar flag)."""
  return f.metadata.get(_PARSE)


def check_fields(instance) -> None:
  """Runs every flag field's choices and check on `instance`'s values
  (None values of an optional field are not checked)."""
  for f in flag_fields(type(instance)):
    value = getattr(instance, f.name)
    if value is None:
      continue
    # A field's own check first: it may name the value more helpfully.
    if f.metadata[_CHECK] is not None:
      f.metadata[_CHECK](f.name, value)
    choices = choices_of(f)
    if choices is not None and value not in choices:
      raise ValueError(f'{f.name} must be one of {choices}. Found {value!r}.')


def legacy_defaults(cls) -> dict[str, Any]:
  return {
    f.name: f.metadata[_LEGACY]
    for f in flag_fields(cls)
    if _LEGACY in f.metadata
  }


def from_flat(cls, flat: Mapping[str, Any], *, legacy: bool = False):
  """`cls` from a flat mapping (a saved config); other keys are ignored.

  A missing key takes its legacy value if `legacy` (a config saved before
  the option existed), else its default.
  """
  old = legacy_defaults(cls) if legacy else {}
  values = {}
  for f in flag_fields(cls):
    if f.name in flat:
      values[f.name] = flat[f.name]
    elif f.name in old:
      values[f.name] = old[f.name]
  return cls(**values)


# Checks (`check(name, value)`), each naming the value and its range. Each
# also carries values it refuses (`refused(check)`): the registry's house
# test feeds them to every method's options, so a new technique's checks
# are tested without a table kept beside them.


def refusing(*values) -> Callable[[Check], Check]:
  """Declares values a check refuses (a decorator for a custom check)."""

  def declare(check: Check) -> Check:
    check.refused = values
    return check

  return declare


def refused(check: Check) -> tuple[Any, ...]:
  """The values `check` declares it refuses (empty if it declares none)."""
  return getattr(check, 'refused', ())


def integer(minimum: int) -> Check:
  @refusing(minimum - 1, minimum + 0.5, True)
  def check(name, value):
    if (
      isinstance(value, bool)
      or not isinstance(value, (int, np.integer))
      or value < minimum
    ):
      raise ValueError(
        f'{name} must be an integer >= {minimum}. Found {value!r}.'
      )

  return check


def number(*, positive: bool) -> Check:
  """A finite number, > 0 if `positive` else >= 0."""

  @refusing(0 if positive else -1e-3, math.inf, math.nan, True)
  def check(name, value):
    ok = (
      isinstance(value, (int, float))
      and not isinstance(value, bool)
      and math.isfinite(value)
      and (value > 0 if positive else value >= 0)
    )
    if not ok:
      raise ValueError(
        f'{name} must be a finite number '
        f'{"> 0" if positive else ">= 0"}. Found {value!r}.'
      )

  return check


def interval(low: float, high: float, closed: str) -> Check:
  """A number in the interval; `closed` is '()', '(]', '[)' or '[]'."""

  @refusing(
    low if closed[0] == '(' else low - 1,
    high if closed[1] == ')' else high + 1,
    True,
  )
  def check(name, value):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
      ok = (low <= value if closed[0] == '[' else low < value) and (
        value <= high if closed[1] == ']' else value < high
      )
    if not ok:
      raise ValueError(
        f'{name} must be in {closed[0]}{low:g}, {high:g}{closed[1]}. '
        f'Found {value!r}.'
      )

  return check
