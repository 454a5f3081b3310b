"""What the tests of tff_dp.job share: a small run's config on the real
heart data (`config`), readers of its folder's files, and a reference run
(the `reference` fixture, which a test file takes in as
`reference = job_testing.reference`).

Imported as `import job_testing`: pytest puts this folder on `sys.path`
for its test files (tests/ has no `__init__.py`).
"""

import csv

import numpy as np
import pytest

from tff_dp.job import training
from tff_dp.job import metrics_log


def config(tmp_path, name, **kwargs):
  base = dict(
    task='heart_disease',
    method='dp_fedavg',
    rounds=4,
    client_sampling_rate=0.75,
    noise_multiplier=0.5,
    delta=1e-3,
    clip=1.0,
    batch_size=32,
    client_lr=0.1,
    checkpoint_every=1,
    output_dir=str(tmp_path / name),
    # Runs compared bit for bit: reproducible noise and sampling.
    noise_seed=0,
    # Research runs: their tests read the non-private outputs too.
    release_non_private_metrics=True,
    allow_noise_seed_reuse=True,
    # Evaluated inline: no child process to start and import TF in (the
    # same metrics to the bit; tests/tff_dp/runtime/evaluation_test.py
    # tests the background evaluator).
    background_evaluation=False,
  )
  base.update(kwargs)
  return training.ExperimentConfig.create(**base)


def read_csv(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def rows(path):
  """A metrics.csv's rows, with its run's non_private/metrics.csv merged in
  by round where the run released one."""
  rows = read_csv(path)
  extra = path.parent / metrics_log.NON_PRIVATE_DIR / path.name
  if extra.exists():
    by_round = {r['round']: r for r in read_csv(extra)}
    rows = [{**by_round[r['round']], **r} for r in rows]
  return rows


def final_weights(output_dir):
  with np.load(output_dir / 'final_model_weights.npz') as d:
    return {k: d[k] for k in d.files}


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """`(output dir, summary)` of one uninterrupted `config` run (4 rounds,
  its checkpoints kept), shared by the tests that compare an interrupted
  run with it."""
  base = tmp_path_factory.mktemp('reference')
  summary = training.run_experiment(config(base, 'run', keep_checkpoints=True))
  return base / 'run', summary


class Interrupt(Exception):
  pass


def tensorboard_events(run_dir):
  """The events of a run folder's TensorBoard files with scalars."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return [
    event
    for path in sorted((run_dir / 'tensorboard').glob('events.*'))
    for event in tf.compat.v1.train.summary_iterator(str(path))
    if event.summary.value
  ]


def tensorboard_tags(run_dir):
  return {v.tag for e in tensorboard_events(run_dir) for v in e.summary.value}


def tensorboard_scalars(run_dir, tag):
  """TensorBoard's own reading of `tag` in a run folder's events."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top

  accumulator = event_accumulator.EventAccumulator(str(run_dir / 'tensorboard'))
  accumulator.Reload()
  return accumulator.Scalars(tag)


def files(run_dir):
  return sorted(p for p in run_dir.rglob('*') if p.is_file())
