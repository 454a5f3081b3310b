"""Tests of the TensorBoard events a run writes."""

import pytest

from tff_dp.job import checkpoints
from tff_dp.job import run_files

import job_testing

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def test_tensorboard_events_carry_the_round_not_the_clock(
  tmp_path, monkeypatch
):
  import socket  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  rows = [
    {'round': t, 'epsilon_rdp': 0.5 * t, 'round_seconds': 7.0 + t}
    for t in (1, 2, 3)
  ]
  files = run_files.RunFiles(tmp_path, True, test_private=True)
  for t in (1, 2):
    files.write_non_private(rows[:t], None)
  files.write_released(rows[:2], rows[:2])
  # A resumed invocation, hours later: its rounds keep the run's times.
  later = time.time() + 7200
  monkeypatch.setattr(time, 'time', lambda: later)
  resumed = run_files.RunFiles(tmp_path, True, test_private=True)
  monkeypatch.undo()
  resumed.write_non_private(rows, None)
  resumed.write_released(rows, rows[2:])
  names = sorted(p.name for p in (tmp_path / 'tensorboard').iterdir())
  start = int(names[0].split('.')[3])
  assert names == [
    f'events.out.tfevents.{start:010d}.tff_dp.000001',
    f'events.out.tfevents.{start:010d}.tff_dp.000003',
  ]
  assert not [n for n in names if socket.gethostname() in n]
  for run_dir, tag in (
    (tmp_path, 'epsilon_rdp'),
    (files.non_private_dir, 'round_seconds'),
  ):
    scalars = job_testing.tensorboard_scalars(run_dir, tag)
    assert [(e.step, e.wall_time) for e in scalars] == [
      (t, start + t) for t in (1, 2, 3)
    ]
    assert [e.value for e in scalars] == [r[tag] for r in rows]
  assert 'round_seconds' not in job_testing.tensorboard_tags(tmp_path)
  assert checkpoints.released_rounds(tmp_path) == (
    3,
    [str(tmp_path / 'metrics.csv'), str(tmp_path / 'tensorboard')],
  )
