"""TensorBoard events whose times say nothing of the clients (`EventFile`),
and the rounds a run folder's events hold (`tensorboard_steps`,
`last_event_round`).
"""

import math
import pathlib
import time

from tensorboard.summary.writer import record_writer
import tensorflow as tf


# TensorBoard's event files are found by this in their name.
_EVENTS_PREFIX = 'events.out.tfevents.'


class EventFile:
  """TensorBoard events whose times say nothing of the clients.

  `tf.summary`'s writers stamp each event with the wall-clock time it was
  written, and so each round's duration, which follows the cohort's size
  (secret under Poisson sampling). Here each round's scalars (as
  `simple_value`s) carry the wall time `start + round`, `start` being the
  whole seconds when the run's first event file was begun (read back from
  its name on resume), and the file is named
  `events.out.tfevents.<start>.tff_dp.<first round>` (no host name or
  process id). Each invocation that releases rounds begins a file of its
  own, from the first round it writes; files sort by round.
  """

  def __init__(self, log_dir: pathlib.Path):
    self.log_dir = log_dir
    starts = [
      int(p.name.split('.')[3])
      for p in (log_dir.glob(_EVENTS_PREFIX + '*.tff_dp.*'))
      if p.name.split('.')[3].isdigit()
    ]
    # A folder without one (or with tf.summary's files only, from before
    # this writer): this invocation's start, after any file before it.
    self.start = min(starts) if starts else int(time.time())
    self._path = None

  def write(self, rows: list[dict]) -> None:
    """Each row's finite float values, as scalars of step `row['round']`,
    appended to this invocation's file (begun by its first row)."""
    if not rows:
      return
    if self._path is None:
      self.log_dir.mkdir(parents=True, exist_ok=True)
      first = int(rows[0]['round'])
      self._path = self.log_dir / (
        f'{_EVENTS_PREFIX}{self.start:010d}.tff_dp.{first:06d}'
      )
    events = []
    if not self._path.exists() or not self._path.stat().st_size:
      events.append(
        tf.compat.v1.Event(
          wall_time=self.start + int(rows[0]['round']),
          file_version='brain.Event:2',
        )
      )
    for row in rows:
      step = int(row['round'])
      values = [
        tf.compat.v1.Summary.Value(tag=k, simple_value=v)
        for k, v in row.items()
        if k != 'round' and isinstance(v, float) and math.isfinite(v)
      ]
      events.append(
        tf.compat.v1.Event(
          wall_time=self.start + step,
          step=step,
          summary=tf.compat.v1.Summary(value=values),
        )
      )
    with open(self._path, 'ab') as f:
      writer = record_writer.RecordWriter(f)  # TFRecords, as TF writes them.
      for event in events:
        writer.write(event.SerializeToString())


def tensorboard_steps(log_dir: pathlib.Path) -> list[int]:
  """The steps of the events in `log_dir`'s event files (a torn record at
  a file's end, from a crash mid-write, ends that file's reading)."""
  steps = []
  for path in sorted(log_dir.glob(_EVENTS_PREFIX + '*')):
    try:
      for record in tf.data.TFRecordDataset(str(path)):
        event = tf.compat.v1.Event.FromString(record.numpy())
        if event.HasField('summary') and event.summary.value:
          steps.append(int(event.step))
    except tf.errors.OpError:
      pass
  return steps


def last_event_round(output_dir: pathlib.Path) -> int:
  """The last round of the run folder's TensorBoard events, 0 if none."""
  return max(tensorboard_steps(output_dir / 'tensorboard'), default=0)
