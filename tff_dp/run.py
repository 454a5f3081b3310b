r"""Runs (or resumes) a federated training job.

Example, DP-FedAvg on Fashion-MNIST at a target (1, 1e-4)-DP:

  python -m tff_dp.run --task=fashion_mnist_iid --method=dp_fedavg \
      --rounds=180 --client_sampling_rate=0.016667 --target_epsilon=1 \
      --delta=1e-4 --clip=1.0 --local_epochs=10 --local_steps=10 \
      --root_output_dir=runs/dp_fedavg

Rerunning the same command after an interruption resumes from the last
checkpoint in --root_output_dir (ledger included).

A run refused for the user's error (a flag value out of its range, flags
that do not go together, an output directory that holds a run with other
flags, data not found) prints one line on stderr, `tff_dp.run: error:
<message>`, and exits with status 2 (1 for data not found).
"""

import math
import os
import sys
import typing
from typing import Optional


def _method_from_argv(argv) -> str:
  for i, arg in enumerate(argv):
    if arg.startswith('--method='):
      return arg.split('=', 1)[1]
    if arg == '--method' and i + 1 < len(argv):
      return argv[i + 1]
  return ''


from tff_dp.runtime import processes  # noqa: E402  (light: no TensorFlow)
from tff_dp.runtime import stderr_filter  # noqa: E402  (light: no TensorFlow)

# The exit statuses of a refused run (`refusal`): argparse's for a usage
# error, and 1 for data not found.
USAGE_ERROR = 2
DATA_ERROR = 1


def _exit_with_error(status: int, message: str) -> None:
  """Ends the process with `status` after one line on stderr."""
  sys.stderr.write(f'tff_dp.run: error: {message}\n')
  processes.exit_without_teardown(status)


# TensorFlow's C++ INFO and WARNING lines (its CUDA and TensorRT probes,
# CPU features) are off unless the user sets TF_CPP_MIN_LOG_LEVEL: set
# before TensorFlow loads, and inherited by the processes the job starts.
# TFF_DP_JEMALLOC=auto (or a path) runs this process on jemalloc
# (`processes.rerun_under_jemalloc`; performance notes, "Memory over long
# runs"):
# re-executed here, before TensorFlow loads.
# Otherwise glibc's malloc gets a fixed arena count and mmap threshold
# (`processes.tune_glibc_malloc`, TFF_DP_GLIBC_MALLOC=none to skip), set
# while this process has one thread.
_GLIBC_MALLOC = {}
if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  try:
    processes.rerun_under_jemalloc()
    _GLIBC_MALLOC = processes.tune_glibc_malloc()
  except ValueError as e:
    _exit_with_error(USAGE_ERROR, str(e))

# DDGauss needs protobuf's pure-Python backend (see
# `tff_dp.aggregators.ddgauss.protobuf_supports_ddgauss`), which must be
# chosen before TensorFlow imports protobuf: decided from argv, here.
if _method_from_argv(sys.argv[1:]) == 'ddgauss':
  os.environ.setdefault('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION', 'python')

# TensorFlow's ERROR lines as it loads (`stderr_filter.TF_STARTUP_NOISE`) are
# dropped; anything else it writes is kept.
if __name__ == '__main__':
  with stderr_filter.stderr_without(stderr_filter.TF_STARTUP_NOISE):
    import tensorflow  # noqa: F401

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from tff_dp import methods  # noqa: E402
from tff_dp.methods import options as options_lib  # noqa: E402
from tff_dp.methods import settings  # noqa: E402
from tff_dp.tasks import data_dir  # noqa: E402
from tff_dp.job import training  # noqa: E402


def _field_type(field) -> type:
  """A setting's value type (`Optional[float]` -> float)."""
  args = [a for a in typing.get_args(field.type) if a is not type(None)]
  return args[0] if args else field.type


def define_flag(field, help_: str) -> flags.FlagHolder:
  """The absl flag of one declared setting (`options.option`)."""
  name = options_lib.flag_name_of(field)
  choices = options_lib.choices_of(field)
  kind = _field_type(field)
  if options_lib.parser_of(field) is not None:
    return flags.DEFINE_multi_string(name, [], help_)
  if choices is not None:
    return flags.DEFINE_enum(name, field.default, list(choices), help_)
  if kind is bool:
    return flags.DEFINE_bool(name, field.default, help_)
  if kind is int:
    return flags.DEFINE_integer(name, field.default, help_)
  if kind is float:
    return flags.DEFINE_float(name, field.default, help_)
  if kind is str:
    return flags.DEFINE_string(name, field.default, help_)
  raise TypeError(f'Setting {name!r}: no flag type for {field.type!r}.')


def _help(field) -> str:
  help_ = options_lib.help_of(field)
  if field.name == 'method':
    help_ += ' ' + '; '.join(
      f'{k}: {m.description}' for k, m in sorted(methods.METHODS.items())
    )
  return help_


# The settings every run has (`settings.RunSettings`), by field name.
_SETTINGS = {
  f.name: define_flag(f, _help(f))
  for f in options_lib.flag_fields(settings.RunSettings)
}
# The methods' options (`methods.option_fields`), with the methods that
# take each.
_OPTIONS = {
  name: define_flag(field, f'{options_lib.help_of(field)} [{", ".join(users)}]')
  for name, (field, users) in methods.option_fields().items()
}
# This binary's clip tuning step (`training.ClipProbe`).
_PROBE = {
  f.name: define_flag(f, options_lib.help_of(f))
  for f in options_lib.flag_fields(training.ClipProbe)
}


# `['a=1', 'b=x']` -> `(('a', 1), ('b', 'x'))` (the --task_option flag).
parse_task_options = settings.parse_task_options


def _value(field, holder):
  parse = options_lib.parser_of(field)
  return holder.value if parse is None else parse(holder.value)


def config_from_flags() -> training.ExperimentConfig:
  """The run's config; an option flag of another method than --method is
  ignored with a warning (`ExperimentConfig.create`)."""
  method = _SETTINGS['method'].value
  takes = {
    f.name for f in options_lib.flag_fields(methods.METHODS[method].options)
  }
  method_options = {
    name: holder.value
    for name, holder in _OPTIONS.items()
    if name in takes or holder.present
  }
  common = {
    f.name: _value(f, _SETTINGS[f.name])
    for f in options_lib.flag_fields(settings.RunSettings)
  }
  return training.ExperimentConfig.create(**common, **method_options)


def probe_from_flags() -> training.ClipProbe:
  return training.ClipProbe(**{k: h.value for k, h in _PROBE.items()})


def refusal(error: BaseException) -> Optional[tuple[int, str]]:
  """The exit status and one-line message of a run refused for the user's
  error, or None for any other exception (its traceback is shown).

  The user's errors: a flag value out of its range, flags that do not go
  together or an unexpected argument (`app.UsageError`), an output
  directory that holds a run with other flags or released rounds no
  checkpoint covers, or a noise seed registered for another configuration
  (`training.ConfigError`); all USAGE_ERROR. Data neither found nor
  fetched (`data_dir.DataNotFoundError`): DATA_ERROR.
  """
  if isinstance(error, data_dir.DataNotFoundError):
    status = DATA_ERROR
  elif isinstance(error, (app.UsageError, training.ConfigError)):
    status = USAGE_ERROR
  else:
    return None
  lines = (line.strip() for line in str(error).splitlines())
  return status, ' '.join(line for line in lines if line)


def final_line(summary: dict) -> str:
  """The line printed at the end of a run: the final metrics, and epsilon
  for a private run."""
  final = '  '.join(f'{k} {v:.4f}' for k, v in summary['final'].items())
  eps = ''
  if summary['epsilon_rdp'] is not None:
    pld = summary['epsilon_pld']
    # No PLD epsilon for this sampling (the summary says why).
    pld = '' if pld is None or math.isnan(pld) else f' {pld:.3f} (PLD)'
    eps = (
      f"  epsilon {summary['epsilon_rdp']:.3f} (RDP){pld} at delta "
      f"{summary['delta']:g}"
    )
  return f'final: {final}{eps}'


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  try:
    # The flags that go together are checked here too (the run checks
    # them again), so that a refusal comes before the job logs anything.
    config = config_from_flags().validate()
    probe = probe_from_flags()
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  # SIGTERM (a scheduler, `timeout`, `kill`) stops the job like Ctrl-C:
  # atexit ends the TFF worker; the last checkpoint is kept.
  processes.exit_on_signals()
  logging.info(
    'Memory allocator: %s%s',
    processes.loaded_jemalloc() or 'glibc malloc',
    ''.join(f' {k}={v}' for k, v in _GLIBC_MALLOC.items()),
  )
  print(final_line(training.run_experiment(config, clip_probe=probe)))


def main_without_teardown(argv):
  """`main`, then the end of the process without the interpreter's
  teardown (`processes.exit_without_teardown`): status 0 once it has
  succeeded, or a refused run's (`refusal`) after its one line on stderr.
  Any other exception is raised (its traceback is shown)."""
  try:
    main(argv)
  except Exception as e:  # pylint: disable=broad-except
    refused = refusal(e)
    if refused is None:
      raise
    _exit_with_error(*refused)
  processes.exit_without_teardown(0)


if __name__ == '__main__':
  app.run(main_without_teardown)
