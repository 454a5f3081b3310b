"""`python -m tff_dp.run` end to end for every registered method.

One round on the tiny real heart-disease task per method, from its flags as
a user gives them: the run writes its row and summary, accounts a private
method's round and counts its bytes, and writes or logs nothing the ledger
does not cover. Every method runs through the binary's own path in this
process (its flags parsed, `run.config_from_flags`, the run, the final
line): the first method of each family (its docs page) in `make test`, the
others in `make test-slow`, which also runs every method as the binary in a
subprocess (each start imports TF and TFF again: about 20 s a method on two
cores; `make test` runs the binary in training_test's
`test_binary_end_to_end_and_bad_flag`). DDGauss needs pure-Python protobuf
(5-10 minutes a run) and fixed-size sampling here: its end-to-end run of
the binary is `tests/aggregators/ddgauss_test.py::
test_ddgauss_run_end_to_end_with_honest_ledger` (`make test-slow`), not
repeated here.
"""

import csv
import json
import logging
import math
import os
import subprocess
import sys

from absl import flags
import pytest

from tff_dp import methods
from tff_dp import run
from tff_dp.job import preparation
from tff_dp.job import training

pytestmark = pytest.mark.usefixtures('shared_data_dir')

_BASE = [
  '--task=heart_disease',
  '--rounds=1',
  '--client_sampling_rate=0.75',
  '--delta=1e-3',
  '--batch_size=32',
  '--local_steps=2',
  '--eval_every=1',
]
# Flags a method needs on this task beyond its defaults (why, per row).
_EXTRA = {
  # The sketch's defaults (100,000 columns, k = 10,000) exceed the model.
  'fetchsgd': ['--sketch_columns=200', '--sketch_k=20'],
  'dpsfl': ['--sketch_columns=200', '--sketch_k=20'],
  'dpsfl_ac': ['--sketch_columns=200', '--sketch_k=20'],
  # FL-TOP picks its Top-K from a server-held batch (patients held out).
  'fl_top': ['--task_option=server_batch_size=100'],
  'fl_top_dp': ['--task_option=server_batch_size=100'],
}
# Run by ddgauss_test's end-to-end test (see the module doc).
_ELSEWHERE = {'ddgauss'}
_NOISE = 0.2  # Below 2 x the adaptive clip's default count noise here.


def _failure(stderr: str) -> str:
  """The end of a failed run's stderr; after a crash, the faulthandler's
  report from its start (its thread stacks come before the long list of
  extension modules that ends it)."""
  start = stderr.find('Fatal Python error')
  if start >= 0:
    return stderr[start : start + 6000]
  return stderr[-3000:]


def _cases():
  return sorted(set(methods.METHODS) - _ELSEWHERE)


def _family_cases():
  """Every method, the first of each family (its docs page) in the fast
  tier and the others in `make test-slow`: each family's methods share
  their module, and the registry test plans every method's event."""
  first = {}
  for name in _cases():
    first.setdefault(methods.METHODS[name].docs_page, name)
  fast = set(first.values())
  return [
    name if name in fast else pytest.param(name, marks=pytest.mark.slow)
    for name in _cases()
  ]


def test_every_method_has_a_case():
  assert set(_cases()) | _ELSEWHERE == set(methods.METHODS)


def _argv(name: str, out) -> list[str]:
  method = methods.METHODS[name]
  return (
    [f'--method={name}']
    + _BASE
    + _EXTRA.get(name, [])
    # A fixed --noise_seed for every method, so its Poisson cohort (4
    # heart_disease clients at rate 0.75) is the same nonempty draw each run.
    + ['--noise_seed=0']
    + ([f'--noise_multiplier={_NOISE}'] if method.private else [])
    + [f'--root_output_dir={out}']
  )


def _check_run(name: str, out, final: str, log: str) -> None:
  """What one round of `name` wrote to `out`, printed (`final`) and logged."""
  method = methods.METHODS[name]
  assert 'final:' in final
  with open(out / 'metrics.csv') as f:
    (row,) = list(csv.DictReader(f))
  assert row['round'] == '1'
  assert float(row['bytes_up_per_client']) > 0
  assert float(row['bytes_down_per_client']) > 0
  # By default nothing the ledger does not cover is written or logged.
  for column in ('train_loss', 'sampled_clients', 'bytes_up_total'):
    assert column not in row
  assert 'train_loss' not in log
  assert not (out / 'non_private').exists()

  summary = json.loads((out / 'summary.json').read_text())
  assert summary['config']['method'] == name
  assert summary['rounds_completed'] == 1
  assert summary['privacy']['private'] is method.private
  if method.private:
    assert summary['noise_multiplier'] == pytest.approx(_NOISE)
    assert 0 < summary['epsilon_rdp'] < math.inf
    assert 0 < summary['epsilon_pld'] < math.inf
    assert summary['dp_events'], 'no DP event recorded'
    assert float(row['epsilon_rdp']) == pytest.approx(summary['epsilon_rdp'])
  else:
    assert not summary['dp_events']


@pytest.mark.parametrize('name', _family_cases())
def test_every_method_runs_one_round_from_its_flags(tmp_path, caplog, name):
  out = tmp_path / name
  was_parsed = flags.FLAGS.is_parsed()
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['tff_dp.run', *_argv(name, out), '--nobackground_evaluation'])
    config = run.config_from_flags().validate()
    probe = run.probe_from_flags()
    with caplog.at_level(logging.INFO):
      final = run.final_line(training.run_experiment(config, clip_probe=probe))
  finally:
    flags.FLAGS.unparse_flags()
    if was_parsed:
      flags.FLAGS.mark_as_parsed()
  _check_run(name, out, final, caplog.text)


def _binary_runs_one_round(tmp_path, name):
  out = tmp_path / name
  cmd = [sys.executable, '-m', 'tff_dp.run', *_argv(name, out)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  done = subprocess.run(
    cmd, capture_output=True, text=True, timeout=600, env=env
  )
  # The end of stdout says whether a crashed run had finished ('final:').
  assert (
    done.returncode == 0
  ), f'{_failure(done.stderr)}\nstdout ends: {done.stdout[-500:]!r}'
  _check_run(name, out, done.stdout, done.stderr)


@pytest.mark.slow
@pytest.mark.parametrize('name', _cases())
def test_the_binary_runs_one_round_of_every_method(tmp_path, name):
  _binary_runs_one_round(tmp_path, name)


def test_adaptive_clip_small_cohort_names_the_flag(tmp_path):
  # 3 expected clients: TFF's default count noise (0.15) is below z / 2.
  config = training.ExperimentConfig.create(
    task='heart_disease',
    method='dp_fedavg_adaptive',
    client_sampling_rate=0.75,
    noise_multiplier=0.5,
    delta=1e-3,
    output_dir=str(tmp_path / 'small'),
  )
  with pytest.raises(ValueError, match='Pass a larger clipped_count_stddev'):
    preparation.prepare(config)
  # The flag it names is there and takes the run through.
  prepared = preparation.prepare(config.replace(clipped_count_stddev=1.0))
  assert prepared.params.options.clipped_count_stddev == 1.0


def test_a_crash_report_is_shown_from_its_start():
  stderr = (
    'log line\n' * 500
    + 'Fatal Python error: Segmentation fault\n\n'
    + 'Thread 0x01 (most recent call first):\n  File "training.py"\n'
    + 'Extension modules: '
    + 'numpy.core, ' * 1000
  )
  shown = _failure(stderr)
  assert shown.startswith('Fatal Python error: Segmentation fault')
  assert 'Thread 0x01 (most recent call first)' in shown
  assert _failure('a' * 4000 + 'end') == 'a' * 2997 + 'end'
