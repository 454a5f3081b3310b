"""TensorFlow's start-up noise, dropped from the job's stderr.

TensorFlow writes `TF_STARTUP_NOISE` to stderr at ERROR level whenever it
loads. `stderr_without` drops it from this process's own stderr around a
block that ends (the job's TensorFlow import); `copy_stderr` copies a
child's stderr pipe to this process's without it, on a daemon thread
(`processes.popen_dying_with_parent` does this for each child it starts
without a `stderr`), and `finish_stderr_copies` waits at exit for the last
lines of the children that have ended.
"""

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import BinaryIO, Iterator, Sequence


# Lines TensorFlow 2.14 writes to stderr at ERROR level whenever it loads,
# GPU or not: its CUDA plugins register twice (tensorflow/tensorflow#62075).
# TF_CPP_MIN_LOG_LEVEL=3 would hide them, but with every later C++ error
# (TensorFlow reads the level once, at its first log line).
TF_STARTUP_NOISE = (
  b'Unable to register cuDNN factory',
  b'Unable to register cuFFT factory',
  b'Unable to register cuBLAS factory',
)


def _write_all(fd: int, data: bytes) -> None:
  """Writes `data` to `fd`; a closed reader (`| head`) drops it."""
  try:
    while data:
      data = data[os.write(fd, data) :]
  except OSError:
    pass


def _copy_lines_without(
  source: BinaryIO, fd: int, markers: Sequence[bytes]
) -> None:
  """Copies `source`'s lines to `fd` until its end, less those holding one
  of `markers`."""
  for line in iter(source.readline, b''):
    if not any(marker in line for marker in markers):
      _write_all(fd, line)


@contextlib.contextmanager
def stderr_without(
  markers: Sequence[bytes] = TF_STARTUP_NOISE,
) -> Iterator[None]:
  """Runs the block with this process's stderr (file descriptor 2, C++
  included) held in a file, then writes it back less the lines holding one
  of `markers`. For a block that ends, such as `import tensorflow`: a
  crash inside it loses what it wrote."""
  sys.stderr.flush()
  try:
    saved = os.dup(2)
  except OSError:  # No stderr (closed): nothing to drop.
    yield
    return
  try:
    with tempfile.TemporaryFile() as held:
      os.dup2(held.fileno(), 2)
      try:
        yield
      finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        held.seek(0)
        _copy_lines_without(held, 2, markers)
  finally:
    os.close(saved)


# Children whose stderr this process copies (`popen_dying_with_parent`),
# with their copying threads.
_STDERR_COPIES: list[tuple[subprocess.Popen, threading.Thread]] = []


def copy_stderr(process: subprocess.Popen, read_fd: int) -> None:
  """Copies `process`'s stderr (the pipe `read_fd`) to this process's on a
  daemon thread, less `TF_STARTUP_NOISE`, until the child closes it."""

  def copy():
    with open(read_fd, 'rb') as pipe:
      _copy_lines_without(pipe, 2, TF_STARTUP_NOISE)

  thread = threading.Thread(
    target=copy, name=f'tff_dp-stderr-{process.pid}', daemon=True
  )
  thread.start()
  _STDERR_COPIES[:] = [c for c in _STDERR_COPIES if c[1].is_alive()]
  _STDERR_COPIES.append((process, thread))


def finish_stderr_copies(timeout_s: float = 2.0) -> None:
  """Waits for the copies of the children that have ended (their last
  lines, such as a traceback), at most `timeout_s` in all."""
  deadline = time.monotonic() + timeout_s
  for process, thread in list(_STDERR_COPIES):
    if process.poll() is not None:
      thread.join(max(0.0, deadline - time.monotonic()))
