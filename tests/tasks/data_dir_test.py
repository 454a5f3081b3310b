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
    ('emnist', 'emnist_federated.npz', 'Federated EMNIST'),
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
