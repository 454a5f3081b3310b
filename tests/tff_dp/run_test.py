"""The runner's flag parsing."""

import dataclasses

from absl import flags
from absl.testing import flagsaver
import pytest

from tff_dp import methods
from tff_dp import run
from tff_dp import training
from tff_dp.methods import options as options_lib
from tff_dp.methods import settings


def test_parse_task_options():
  assert run.parse_task_options(
    ['clients_per_unit=100', 'alpha=0.5', 'model=resnet18_gn']
  ) == (('clients_per_unit', 100), ('alpha', 0.5), ('model', 'resnet18_gn'))


@pytest.mark.parametrize('bad', ['novalue', '=3'])
def test_parse_task_options_rejects(bad):
  with pytest.raises(ValueError, match='--task_option must be NAME=VALUE'):
    run.parse_task_options([bad])


# Flags whose config field has another name, and flags `main` reads itself.
_RENAMED = {'task_option': 'task_kwargs', 'root_output_dir': 'output_dir'}
_NOT_CONFIG = {'clip_from_fedavg_rounds', 'clip_fraction'}


def _other_value(flag):
  """A value of `flag`'s type that is not its default."""
  default = flag.default
  if isinstance(flag, flags.BooleanFlag):
    return not default
  if isinstance(flag, flags.EnumFlag):
    return next(v for v in flag.parser.enum_values if v != default)
  if isinstance(flag.parser, flags.ListParser):
    return ['one', 'two']
  if isinstance(flag.parser, flags.IntegerParser):
    return 7 if default is None else default + 7
  if isinstance(flag.parser, flags.FloatParser):
    return 0.375 if default is None else default + 0.375
  return f'not_{default}'


def _run_flags():
  return flags.FLAGS.get_flags_for_module(run.__name__)


def test_every_flag_reaches_the_config():
  options = methods.option_fields()
  # One flag per method option, from the options dataclasses.
  assert set(run._OPTIONS) == set(options)
  names = {flag.name for flag in _run_flags()} - set(options)
  fields = {f.name for f in dataclasses.fields(training.ExperimentConfig)} - {
    'options'
  }
  # Every config field has a flag, and every flag but main's own a field.
  assert fields == (names - _NOT_CONFIG - set(_RENAMED)) | set(
    _RENAMED.values()
  )
  was_parsed = flags.FLAGS.is_parsed()
  flags.FLAGS.mark_as_parsed()
  try:
    assert _each_flag_moves_its_field_alone() == len(fields) + len(options)
  finally:
    if not was_parsed:
      flags.FLAGS.unparse_flags()


def _valid_other_value(flag, options_cls):
  """A value of an option flag, not its default, that its options take."""
  value = _other_value(flag)
  if isinstance(flag.parser, (flags.IntegerParser, flags.FloatParser)):
    candidates = [value]
    if flag.default:
      candidates.append(flag.default / 2 if isinstance(value, float) else 2)
    for candidate in candidates:
      try:
        options_cls(**{flag.name: candidate})
        return candidate
      except ValueError:
        pass
  return value


def _each_flag_moves_its_field_alone() -> int:
  checked = 0
  options = methods.option_fields()
  for flag in _run_flags():
    if flag.name in _NOT_CONFIG:
      continue
    saved = {}
    if flag.name in options:
      # An option flag moves its option, under a method that takes it.
      method = options[flag.name][1][0]
      saved['method'] = method
      value = _valid_other_value(flag, methods.METHODS[method].options)
    elif flag.name == 'task_option':
      value = ['alpha=0.5', 'model=mlp']
    elif flag.name == 'workers':
      value = 'localhost:8000'  # Checked on creation: host:port items.
    elif flag.name == 'bands':
      value = '3'  # Checked on creation: 'auto' or an integer's digits.
    else:
      # Each setting is checked on creation: a value it takes.
      value = _valid_other_value(flag, settings.RunSettings)
    with flagsaver.flagsaver(**saved, **{flag.name: value}):
      config = run.config_from_flags()
    with flagsaver.flagsaver(**saved):
      base = run.config_from_flags()
    if flag.name in options:
      config, base = config.options, base.options
    field = _RENAMED.get(flag.name, flag.name)
    expected = (
      (('alpha', 0.5), ('model', 'mlp'))
      if flag.name == 'task_option'
      else value
    )
    assert getattr(config, field) == expected, flag.name
    # And only that field moved from what the default flags give.
    moved = [
      f.name
      for f in dataclasses.fields(config)
      if getattr(config, f.name) != getattr(base, f.name)
    ]
    if flag.name == 'method':
      # The method brings its own options, at their defaults.
      assert config.options == methods.METHODS[value].options()
      moved.remove('options')
    assert moved == [field], (flag.name, moved)
    checked += 1
  return checked


def _declared_settings():
  """flag name -> declared field: the run settings, every method's options
  and the runner's clip probe, each declared once."""
  declared = {}
  for cls in (settings.RunSettings, training.ClipProbe):
    for f in options_lib.flag_fields(cls):
      declared[options_lib.flag_name_of(f)] = f
  for name, (f, _) in methods.option_fields().items():
    assert name not in declared, name  # One declaration per name.
    declared[name] = f
  return declared


def test_the_flags_are_the_declared_settings_with_their_defaults():
  declared = _declared_settings()
  run_flags = {flag.name: flag for flag in _run_flags()}
  assert set(run_flags) == set(declared)
  for name, flag in run_flags.items():
    field = declared[name]
    parse = options_lib.parser_of(field)
    default = flag.default if parse is None else parse(flag.default or [])
    assert default == field.default, name
    assert options_lib.help_of(field) in flag.help, name
  # The config is the run settings plus the method's options; its fields'
  # defaults are the declarations'.
  config_fields = {
    f.name: f for f in dataclasses.fields(training.ExperimentConfig)
  }
  for f in dataclasses.fields(settings.RunSettings):
    assert config_fields[f.name].default == f.default, f.name
  assert set(config_fields) - {'options'} == {
    f.name for f in dataclasses.fields(settings.RunSettings)
  }


def test_the_builders_params_derive_from_the_declared_settings():
  params = {f.name: f for f in dataclasses.fields(methods.MethodParams)}
  builders = settings.fields_where(settings.BUILDERS)
  assert builders
  for f in builders:
    assert params[f.name].default == f.default, f.name
    assert params[f.name].type == f.type, f.name
  # Beside them only the values resolved for the run.
  assert set(params) - {f.name for f in builders} == {
    'num_model_params',
    'expected_clients_per_round',
    'noise_multiplier',
    # The strategy that --noise resolves to (tff_dp.noise_plan).
    'noise_strategy',
    'options',
  }
