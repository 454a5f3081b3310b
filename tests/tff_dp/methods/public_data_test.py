"""FL-TOP's public batch (seed 004): 10 random EMNIST digits by default."""

import numpy as np
import pytest

from tff_dp.methods import public_data
from tff_dp import tasks


@pytest.fixture
def fashion(shared_data_dir):
  return tasks.load_task('fashion_mnist_iid', data_dir=str(shared_data_dir))


def _emnist(shared_data_dir):
  with np.load(shared_data_dir / 'emnist_byclass_test.npz') as d:
    return d['x_test'], d['y_test']


def test_random_batch_is_seeded_digits_of_the_test_split(
  fashion, shared_data_dir
):
  x, y = public_data.public_batch(fashion, shared_data_dir, seed=3)
  assert x.shape == (10, 28, 28, 1) and x.dtype == np.float32
  assert y.dtype == np.int32 and np.all((0 <= y) & (y < 10))
  again = public_data.public_batch(fashion, shared_data_dir, seed=3)
  np.testing.assert_array_equal(x, again[0])
  other = public_data.public_batch(fashion, shared_data_dir, seed=4)
  assert not np.array_equal(x, other[0])
  # Every image is one of the split's digits, with its own label.
  ex, ey = _emnist(shared_data_dir)
  digits = np.flatnonzero(ey < 10)
  lookup = {ex[i].tobytes(): ey[i] for i in digits}
  for image, label in zip(x, y):
    raw = np.round(image[..., 0] * 255).astype(ex.dtype)
    assert lookup[raw.tobytes()] == label


def test_random_draws_are_not_class_balanced(fashion, shared_data_dir):
  # Drawn at random, as the paper says, not one per class: over 20 seeds
  # some batch repeats a class (a balanced batch never would).
  repeats = [
    len(set(public_data.public_batch(fashion, shared_data_dir, seed=s)[1])) < 10
    for s in range(20)
  ]
  assert any(repeats)


def test_first_per_class_is_the_legacy_batch(fashion, shared_data_dir):
  x, y = public_data.public_batch(
    fashion, shared_data_dir, mode='first_per_class'
  )
  np.testing.assert_array_equal(y, np.arange(10))
  ex, ey = _emnist(shared_data_dir)
  first = [int(np.flatnonzero(ey == c)[0]) for c in range(10)]
  np.testing.assert_array_equal(x[..., 0], ex[first].astype(np.float32) / 255.0)


def test_bad_mode(fashion):
  with pytest.raises(
    ValueError, match=r"public_batch must be one of .*'mnist'"
  ):
    public_data.public_batch(fashion, mode='mnist')
