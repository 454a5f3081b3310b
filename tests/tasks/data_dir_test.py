import pathlib

import pytest

from tff_dp import tasks
from tff_dp.tasks import data_dir


def test_default_is_shared_data_next_to_repo(monkeypatch):
  monkeypatch.delenv(data_dir.DATA_DIR_ENV, raising=False)
  repo = pathlib.Path(__file__).resolve().parents[2]
  assert data_dir.resolve_data_dir() == repo.parent / 'shared' / 'data'


def test_env_then_argument(monkeypatch, tmp_path):
  monkeypatch.setenv(data_dir.DATA_DIR_ENV, str(tmp_path / 'env'))
  assert data_dir.resolve_data_dir() == tmp_path / 'env'
  assert data_dir.resolve_data_dir(tmp_path / 'arg') == tmp_path / 'arg'


@pytest.mark.parametrize(
  'name, missing, source',
  [
    ('fashion_mnist_iid', 'fashion_mnist.npz', 'Fashion-MNIST'),
    ('emnist', 'emnist_federated.npz', 'LEAF FEMNIST'),
    ('cifar10_dirichlet', 'cifar10_jpeg.npz', 'CIFAR-10'),
    ('physionet2012', 'physionet2012_patients.csv', 'PhysioNet'),
    ('heart_disease', 'heart_disease_4sites.csv', 'UCI Heart Disease'),
  ],
)
def test_missing_file_names_file_and_source(
  tmp_path, monkeypatch, name, missing, source
):
  # Keep the user's Keras cache and TFDS folder out of the way.
  monkeypatch.setattr(data_dir, 'KERAS_CACHE_DIR', tmp_path / 'no_keras')
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path / 'no_tfds'))
  with pytest.raises(data_dir.DataNotFoundError) as info:
    tasks.load_task(name, data_dir=tmp_path)
  message = str(info.value)
  assert str(tmp_path / missing) in message
  assert source in message
  assert '--data_dir' in message


def test_unknown_task():
  with pytest.raises(ValueError, match=r"Unknown task 'mnist'; choose one of"):
    tasks.load_task('mnist')


def test_file_sha256_hashes_once_while_the_file_stays(tmp_path, monkeypatch):
  import hashlib  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top

  path = tmp_path / 'data.bin'
  path.write_bytes(b'abc' * 1000)
  want = hashlib.sha256(b'abc' * 1000).hexdigest()
  assert data_dir.file_sha256(path) == want
  opened = []
  real_open = open
  monkeypatch.setattr(
    'builtins.open', lambda *a, **k: opened.append(a) or real_open(*a, **k)
  )
  assert data_dir.file_sha256(path) == want
  assert not opened  # Cached.
  path.write_bytes(b'xyz')
  os.utime(path, ns=(1, 1))  # A new size and mtime: hashed again.
  assert data_dir.file_sha256(path) == hashlib.sha256(b'xyz').hexdigest()
  assert opened


def test_recording_collects_each_source_read_once(tmp_path):
  data_dir.record_read('ignored', [tmp_path / 'a'])  # Outside: nothing.
  with data_dir.recording() as read:
    data_dir.record_read('kind', [tmp_path / 'a', tmp_path / 'b'])
    data_dir.record_read('kind', [tmp_path / 'a', tmp_path / 'b'])
    data_dir.record_read('other', [tmp_path / 'c'], cache=tmp_path / 'd')
  assert [s.to_dict() for s in read] == [
    {
      'kind': 'kind',
      'files': [str(tmp_path / 'a'), str(tmp_path / 'b')],
      'cache': None,
    },
    {
      'kind': 'other',
      'files': [str(tmp_path / 'c')],
      'cache': str(tmp_path / 'd'),
    },
  ]


def test_a_loaded_task_names_the_file_it_read(shared_data_dir):
  task = tasks.load_task('fashion_mnist_iid', data_dir=shared_data_dir)
  assert task.data_sources == (
    data_dir.DataSource(
      'fashion_mnist.npz',
      (str((shared_data_dir / 'fashion_mnist.npz').resolve()),),
    ),
  )
