import io
import pickle

import numpy as np
import pytest
from PIL import Image

from tff_dp.tasks import cifar10
from tff_dp.tasks import data_dir
from tff_dp.tasks import partition


@pytest.fixture
def isolated(tmp_path, monkeypatch):
  monkeypatch.setattr(data_dir, 'KERAS_CACHE_DIR', tmp_path / 'keras')
  monkeypatch.setenv(data_dir.CACHE_DIR_ENV, str(tmp_path / 'cache'))
  return tmp_path


def test_pickled_batches_source(isolated):
  folder = isolated / 'data' / 'cifar-10-batches-py'
  folder.mkdir(parents=True)
  rng = np.random.default_rng(0)
  batches = {}
  for name in [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']:
    data = rng.integers(0, 256, (20, 3072)).astype(np.uint8)
    labels = rng.integers(0, 10, 20).tolist()
    batches[name] = (data, labels)
    with open(folder / name, 'wb') as f:
      pickle.dump({b'data': data, b'labels': labels}, f)
  x_tr, y_tr, x_te, y_te = cifar10.load_arrays(isolated / 'data')
  assert x_tr.shape == (100, 32, 32, 3) and x_te.shape == (20, 32, 32, 3)
  # Channel-major rows -> NHWC.
  first = batches['data_batch_1'][0][0].reshape(3, 32, 32).transpose(1, 2, 0)
  np.testing.assert_array_equal(x_tr[0], first)
  assert y_te.tolist() == batches['test_batch'][1]


def _jpeg_npz(path, n_train, n_test, rng):
  out = {}
  for split, n in (('train', n_train), ('test', n_test)):
    bufs = []
    for _ in range(n):
      img = Image.fromarray(rng.integers(0, 256, (32, 32, 3)).astype(np.uint8))
      b = io.BytesIO()
      img.save(b, format='JPEG', quality=75)
      bufs.append(np.frombuffer(b.getvalue(), np.uint8))
    out[f'jpeg_{split}'] = np.concatenate(bufs)
    out[f'offsets_{split}'] = np.concatenate(
      [[0], np.cumsum([len(b) for b in bufs])]
    ).astype(np.int64)
    out[f'y_{split}'] = (np.arange(n) % 10).astype(np.uint8)
  np.savez(path, **out)


def test_jpeg_npz_decoded_once_and_cached(isolated):
  rng = np.random.default_rng(1)
  (isolated / 'data').mkdir()
  _jpeg_npz(isolated / 'data' / 'cifar10_jpeg.npz', 30, 10, rng)
  first = cifar10.load_arrays(isolated / 'data')
  caches = list((isolated / 'cache').glob('cifar10_decoded_*.npz'))
  assert len(caches) == 1
  second = cifar10.load_arrays(isolated / 'data')
  for a, b in zip(first, second):
    np.testing.assert_array_equal(a, b)
  assert first[0].shape == (30, 32, 32, 3) and first[0].dtype == np.uint8


def test_real_dirichlet_task(shared_data_dir):
  task = cifar10.load_cifar10(
    shared_data_dir, num_clients=50, alpha=0.5, partition_seed=3
  )
  cd = task.train_data
  assert len(cd.client_ids) == 50
  assert int(cd.client_sizes().sum()) == 50_000
  assert min(cd.client_sizes()) >= 10
  labels = np.concatenate([cd.client_arrays(c)[1] for c in cd.client_ids])
  assert np.bincount(labels).tolist() == [5000] * 10
  # Same partition as the partition function with the same seed.
  _, y_tr, _, _ = cifar10.load_arrays(shared_data_dir)
  parts = partition.dirichlet_partition(
    y_tr, 50, 0.5, 3, min_examples_per_client=10
  )
  hist = partition.label_histogram(y_tr, parts, 10)
  got = np.stack(
    [np.bincount(cd.client_arrays(c)[1], minlength=10) for c in cd.client_ids]
  )
  np.testing.assert_array_equal(got, hist)
  assert task.test_x.shape == (10000, 32, 32, 3)
  assert task.test_x.dtype == np.float32


def test_rejects_bad_alpha(shared_data_dir):
  with pytest.raises(ValueError, match='alpha must be a finite number > 0'):
    cifar10.load_cifar10(shared_data_dir, alpha=0.0)


def _balanced_batches(folder):
  """Five train batches of 20 and a test batch, labels 0-9 twice each."""
  folder.mkdir(parents=True)
  rng = np.random.default_rng(2)
  for name in [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']:
    data = rng.integers(0, 256, (20, 3072)).astype(np.uint8)
    with open(folder / name, 'wb') as f:
      pickle.dump({b'data': data, b'labels': list(range(10)) * 2}, f)


def test_seed003_class_balanced_overlapping_split(isolated):
  _balanced_batches(isolated / 'data' / 'cifar-10-batches-py')
  task = cifar10.load_cifar10(
    isolated / 'data',
    num_clients=40,  # 40 x 30 examples from 100: clients overlap.
    split='class_balanced_overlap',
    per_class=3,
    model='mlp',
  )
  cd = task.train_data
  assert len(cd.client_ids) == 40
  for c in cd.client_ids:
    assert (
      np.bincount(cd.client_arrays(c)[1], minlength=10).tolist() == [3] * 10
    )
  assert '3 per class each, overlapping' in task.description
  with pytest.raises(ValueError, match=r"split must be one of .* 'bad'"):
    cifar10.load_cifar10(isolated / 'data', split='bad')
