"""The runner's flag parsing, and its one-line refusals."""

import dataclasses
import json
import os
import subprocess
import sys

from absl import app
from absl import flags
from absl.testing import flagsaver
import pytest

from tff_dp import methods
from tff_dp.job import noise_seeds
from tff_dp import run
from tff_dp.job import training
from tff_dp.methods import options as options_lib
from tff_dp.methods import settings
from tff_dp.tasks import data_dir


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
  numeric = isinstance(flag.parser, (flags.IntegerParser, flags.FloatParser))
  if numeric or isinstance(value, str):
    candidates = [value]
    if numeric and flag.default:
      candidates.append(flag.default / 2 if isinstance(value, float) else 2)
    if isinstance(value, str):
      # A string that holds a number (e.g. --compression=2).
      candidates.append('2')
    for candidate in candidates:
      try:
        options_cls(**{flag.name: candidate})
        return candidate
      except ValueError:
        pass
      except TypeError:  # Not a field of these options (a renamed flag).
        break
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
    elif flag.name in ('train_layers', 'adapter_layers'):
      value = ['dense1,logits', 'conv2']
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
    expected = {
      'task_option': (('alpha', 0.5), ('model', 'mlp')),
      'train_layers': ('dense1', 'logits', 'conv2'),
      'adapter_layers': ('dense1', 'logits', 'conv2'),
    }.get(flag.name, value)
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
    # The frozen layers' weights (--train_layers): the bytes down.
    'num_frozen_params',
    'expected_clients_per_round',
    'noise_multiplier',
    # The strategy that --noise resolves to (tff_dp.job.noise_plan).
    'noise_strategy',
    'options',
  }


def _run_binary(args, **env):
  """`python -m tff_dp.run ARGS` as a user runs it: TF_CPP_MIN_LOG_LEVEL
  unset unless given."""
  environ = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  return subprocess.run(
    [sys.executable, '-m', 'tff_dp.run', *args],
    capture_output=True,
    text=True,
    timeout=300,
    env={**environ, **env},
  )


@pytest.mark.parametrize(
  'args, message',
  [
    # A flag value out of its range (the config's own check).
    (['--clip=-1'], 'clip must be a finite number > 0. Found -1.0.'),
    # Flags that do not go together (`ExperimentConfig.validate`).
    (
      ['--task=heart_disease', '--method=dp_fedavg'],
      "Method 'dp_fedavg' is private: set --noise_multiplier (>= 0) or "
      '--target_epsilon with --delta.',
    ),
  ],
)
def test_a_bad_flag_is_one_line_and_status_2(tmp_path, args, message):
  done = _run_binary([*args, f'--root_output_dir={tmp_path}'])
  # Nothing else: no --help text, no traceback, no TensorFlow start-up lines.
  assert done.stderr == f'tff_dp.run: error: {message}\n'
  assert done.returncode == run.USAGE_ERROR == 2
  assert done.stdout == ''


def test_missing_data_is_one_line_and_status_1(tmp_path):
  empty = tmp_path / 'no_data'
  empty.mkdir()
  done = _run_binary(
    [
      '--task=heart_disease',
      '--method=fedavg',
      f'--root_output_dir={tmp_path}',
    ],
    TFF_DP_DATA_DIR=str(empty),
    TFF_DP_NO_DOWNLOAD='1',
  )
  assert done.returncode == run.DATA_ERROR == 1
  # The last line, after the job's log lines; the loader's message says
  # where the data comes from and how to point the job at it.
  lines = done.stderr.splitlines()
  assert [line for line in lines if 'error:' in line] == lines[-1:]
  assert lines[-1].startswith('tff_dp.run: error: ')
  assert 'TFF_DP_DATA_DIR' in lines[-1]
  assert 'Traceback' not in done.stderr
  assert 'Unable to register' not in done.stderr


def _config(**flat) -> training.ExperimentConfig:
  return training.ExperimentConfig.create(
    **{'task': 'heart_disease', 'method': 'fedavg', 'rounds': 2, **flat}
  )


def test_a_resume_with_other_flags_is_refused(tmp_path):
  # The folder of a run of 2 rounds (its config.json, as the run wrote it).
  ran = _config(output_dir=str(tmp_path))
  (tmp_path / 'config.json').write_text(json.dumps(ran.to_dict()))
  config = ran.replace(rounds=4)
  # Refused before any data loads or any work.
  with pytest.raises(training.ConfigError) as refused:
    training.run_experiment(config)
  status, message = run.refusal(refused.value)
  assert status == run.USAGE_ERROR
  assert message == str(refused.value)
  assert (
    f'{tmp_path} holds a run with different flags (--rounds: 2 there, 4 now)'
    in message
  )


def test_a_noise_seed_of_another_configuration_is_refused(tmp_path):
  noise_seeds.check_and_register(tmp_path / 'a', 7, _config().to_dict())
  with pytest.raises(training.ConfigError) as refused:
    noise_seeds.check_and_register(
      tmp_path / 'b', 7, _config(rounds=3).to_dict()
    )
  assert run.refusal(refused.value) == (run.USAGE_ERROR, str(refused.value))


@pytest.mark.parametrize(
  'error, status',
  [
    (app.UsageError("Unexpected arguments: ['x']"), run.USAGE_ERROR),
    (training.ConfigError('rounds must be an integer >= 1.'), run.USAGE_ERROR),
    (data_dir.DataNotFoundError('Dataset file not found.'), run.DATA_ERROR),
  ],
)
def test_a_users_error_is_refused_with_its_message(error, status):
  assert run.refusal(error) == (status, str(error))


def test_a_refusal_is_one_line():
  error = training.ConfigError('Set a or b,\n  not both.\n')
  assert run.refusal(error) == (run.USAGE_ERROR, 'Set a or b, not both.')


def test_a_damaged_config_json_keeps_its_traceback(tmp_path):
  # A JSONDecodeError (a ValueError) inside the check is no refusal.
  (tmp_path / 'config.json').write_text('{')
  config = _config(output_dir=str(tmp_path))
  with pytest.raises(json.JSONDecodeError) as raised:
    training.run_experiment(config)
  assert run.refusal(raised.value) is None


@pytest.mark.parametrize(
  'error', [ValueError('a bug'), RuntimeError('a bug'), KeyError('bug')]
)
def test_any_other_error_keeps_its_traceback(error):
  # A plain ValueError is a bug's, not a refusal.
  assert run.refusal(error) is None


def test_the_final_line():
  summary = {
    'final': {'accuracy': 0.5},
    'epsilon_rdp': 1.23456,
    'epsilon_pld': 1.1,
    'delta': 1e-5,
  }
  assert run.final_line(summary) == (
    'final: accuracy 0.5000  epsilon 1.235 (RDP) 1.100 (PLD) at delta 1e-05'
  )
  # Fixed-size sampling: no PLD epsilon (NaN), so none is printed.
  summary['epsilon_pld'] = float('nan')
  assert run.final_line(summary) == (
    'final: accuracy 0.5000  epsilon 1.235 (RDP) at delta 1e-05'
  )
  summary['epsilon_rdp'] = None
  assert run.final_line(summary) == 'final: accuracy 0.5000'
