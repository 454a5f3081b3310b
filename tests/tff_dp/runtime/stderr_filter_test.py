"""TensorFlow's start-up noise is dropped from the job's and its children's
stderr, and nothing else is."""

import os
import subprocess
import sys

import pytest

from tff_dp.runtime import stderr_filter

pytestmark = pytest.mark.usefixtures('shared_data_dir')


# TensorFlow's three start-up ERROR lines, as it writes them, between two
# lines that are kept.
_NOISY = (
  b'kept 1\n'
  + b''.join(
    b'2026-12-04 20:15:37.151457: E tensorflow/compiler/xla/stream_executor/'
    b'cuda/cuda_dnn.cc:9342] ' + marker + b': Attempting to register factory '
    b'for plugin cuDNN when one has already been registered\n'
    for marker in stderr_filter.TF_STARTUP_NOISE
  )
  + b'kept 2\n'
)


def test_stderr_without_drops_only_the_noise(capfd):
  with stderr_filter.stderr_without():
    os.write(2, _NOISY)
    assert capfd.readouterr().err == ''  # Held until the block ends.
  assert capfd.readouterr().err == 'kept 1\nkept 2\n'


def test_stderr_without_keeps_the_output_of_a_block_that_raises(capfd):
  with pytest.raises(ImportError):
    with stderr_filter.stderr_without():
      os.write(2, b'why it failed\n')
      raise ImportError('no module')
  assert capfd.readouterr().err == 'why it failed\n'
  os.write(2, b'after\n')  # Descriptor 2 is back.
  assert capfd.readouterr().err == 'after\n'


def test_a_childs_stderr_is_copied_without_the_noise():
  # In a fresh interpreter: in this one, the gRPC that earlier tests loaded
  # can write a line of its own to descriptor 2 whenever a child forks
  # ("Kick failed: ... Bad file descriptor"), in the parent or in the
  # forked child before it execs, which is not the child's output.
  write = f'import os; os.write(2, {_NOISY!r})'
  parent = f"""
import subprocess
import sys
from tff_dp.runtime import processes, stderr_filter
child = processes.popen_dying_with_parent([sys.executable, '-c', {write!r}])
assert child.stderr is None  # The copying thread's pipe alone.
assert child.wait(timeout=60) == 0
stderr_filter.finish_stderr_copies()
# A stderr the caller gives is the child's as given.
child = processes.popen_dying_with_parent(
  [sys.executable, '-c', {write!r}], stderr=subprocess.PIPE
)
assert child.communicate(timeout=60)[1] == {_NOISY!r}
"""
  result = subprocess.run(
    [sys.executable, '-c', parent], capture_output=True, timeout=120
  )
  assert result.returncode == 0, result.stderr.decode()
  assert result.stderr == b'kept 1\nkept 2\n'
