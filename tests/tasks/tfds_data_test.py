"""A user's prepared TFDS data (tasks/tfds_data.py), read without a download.

Tiny datasets are written here in TFDS format, with the names, versions and
features of the real `fashion_mnist` (3.0.1), `cifar10` (3.0.2) and
`emnist/<config>` (3.0.0) of tensorflow-datasets 4.9.3. `HOME`,
`TFDS_DATA_DIR` and the Keras cache point into tmp dirs, so the user's own
data are never read.
"""

import pickle
import types

import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.utils import gcs_utils

from tff_dp.methods import public_data
from tff_dp.tasks import cifar10
from tff_dp.tasks import data_dir
from tff_dp.tasks import emnist
from tff_dp.tasks import fashion_mnist
from tff_dp.tasks import partition
from tff_dp.tasks import public
from tff_dp.tasks import tfds_data

_FASHION_NAMES = [
  'T-shirt/top',
  'Trouser',
  'Pullover',
  'Dress',
  'Coat',
  'Sandal',
  'Shirt',
  'Sneaker',
  'Bag',
  'Ankle boot',
]


def _store(root, name, version, features, splits, config=None):
  tfds.dataset_builders.store_as_tfds_dataset(
    name=name,
    version=version,
    config=config,
    features=tfds.features.FeaturesDict(features),
    split_datasets={
      s: [(i, example) for i, example in enumerate(examples)]
      for s, examples in splits.items()
    },
    data_dir=str(root),
  )


def _images(rng, n, shape):
  return rng.integers(0, 256, (n,) + shape).astype(np.uint8)


@pytest.fixture(scope='module')
def stores(tmp_path_factory):
  """Two TFDS dirs: `main` (all but emnist/digits) and `digits`."""
  root = tmp_path_factory.mktemp('tfds_stores')
  rng = np.random.default_rng(0)
  data = types.SimpleNamespace(main=root / 'main', digits=root / 'digits')
  with pytest.MonkeyPatch.context() as mp:
    # Writing a new dataset would otherwise ask GCS (gs://tfds-data) for it.
    mp.setattr(gcs_utils, '_is_gcs_disabled', True)
    mp.setenv('HOME', str(root / 'home'))
    mp.setenv(tfds_data.TFDS_DATA_DIR_ENV, str(root / 'unused'))
    # Fashion-MNIST: 20 train, 10 test, image (28, 28, 1).
    data.fashion = {
      s: (_images(rng, n, (28, 28)), (np.arange(n) * 3 % 10).astype(np.uint8))
      for s, n in (('train', 20), ('test', 10))
    }
    _store(
      data.main,
      'fashion_mnist',
      '3.0.1',
      {
        'image': tfds.features.Image(shape=(28, 28, 1)),
        'label': tfds.features.ClassLabel(names=_FASHION_NAMES),
      },
      {
        s: [
          {'image': x[i, ..., None], 'label': int(y[i])} for i in range(len(y))
        ]
        for s, (x, y) in data.fashion.items()
      },
    )
    # CIFAR-10, with the 'id' feature ('train_00000', ...) of the real one.
    data.cifar = {
      s: (_images(rng, n, (32, 32, 3)), rng.integers(0, 10, n).astype(np.uint8))
      for s, n in (('train', 20), ('test', 10))
    }
    _store(
      data.main,
      'cifar10',
      '3.0.2',
      {
        'id': tfds.features.Text(),
        'image': tfds.features.Image(shape=(32, 32, 3)),
        'label': tfds.features.ClassLabel(num_classes=10),
      },
      {
        s: [
          {'id': f'{s}_{i:05d}', 'image': x[i], 'label': int(y[i])}
          for i in range(len(y))
        ]
        for s, (x, y) in data.cifar.items()
      },
    )
    # EMNIST: upright images here, stored transposed as raw EMNIST is.
    for config, labels, store in (
      (
        'byclass',
        {
          'train': np.arange(30) % 62 * 2 % 62,  # digits and letters
          'test': np.concatenate([np.arange(20) % 10, 10 + np.arange(10)]),
        },
        data.main,
      ),
      (
        'digits',
        {'train': np.arange(50) % 10, 'test': np.arange(20) % 10},
        data.digits,
      ),
    ):
      arrays = {
        s: (_images(rng, len(y), (28, 28)), y.astype(np.uint8))
        for s, y in labels.items()
      }
      setattr(data, f'emnist_{config}', arrays)
      _store(
        store,
        'emnist',
        '3.0.0',
        {
          'image': tfds.features.Image(shape=(28, 28, 1)),
          'label': tfds.features.ClassLabel(
            num_classes=62 if config == 'byclass' else 10
          ),
        },
        {
          s: [
            {'image': x[i].T[..., None], 'label': int(y[i])}
            for i in range(len(y))
          ]
          for s, (x, y) in arrays.items()
        },
        config=config,
      )
  return data


@pytest.fixture
def isolated(tmp_path, monkeypatch):
  """No real data: empty data dir, Keras cache, home and TFDS dir."""
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  monkeypatch.setenv(tfds_data.TFDS_DATA_DIR_ENV, str(tmp_path / 'no_tfds'))
  monkeypatch.setenv(data_dir.DATA_DIR_ENV, str(tmp_path / 'no_env_data'))
  monkeypatch.setenv(data_dir.CACHE_DIR_ENV, str(tmp_path / 'cache'))
  monkeypatch.setattr(data_dir, 'KERAS_CACHE_DIR', tmp_path / 'keras')
  (tmp_path / 'empty').mkdir()
  return tmp_path


@pytest.fixture
def tfds_home(isolated, stores, monkeypatch):
  """The `main` store as the user's TFDS dir ($TFDS_DATA_DIR)."""
  monkeypatch.setenv(tfds_data.TFDS_DATA_DIR_ENV, str(stores.main))
  return isolated


def _as_set(x, y):
  """Examples as a sorted list of (label, pixel bytes), order-free."""
  return sorted(zip(y.tolist(), [a.tobytes() for a in x]))


def test_default_tfds_dir(monkeypatch, tmp_path):
  monkeypatch.setenv('HOME', str(tmp_path))
  monkeypatch.delenv(tfds_data.TFDS_DATA_DIR_ENV, raising=False)
  assert tfds_data.default_tfds_dir() == tmp_path / 'tensorflow_datasets'
  monkeypatch.setenv(tfds_data.TFDS_DATA_DIR_ENV, str(tmp_path / 't'))
  assert tfds_data.default_tfds_dir() == tmp_path / 't'


@pytest.mark.parametrize(
  'name, store, num_train',
  [
    ('fashion_mnist', 'main', 20),
    ('cifar10', 'main', 20),
    ('emnist/byclass', 'main', 30),
    ('emnist/digits', 'digits', 50),
  ],
)
def test_copies_are_in_the_real_datasets_layout(
  isolated, stores, name, store, num_train
):
  # TFDS's own registered builders (their code versions) read these copies.
  root = getattr(stores, store)
  builder = tfds.builder(name, data_dir=str(root))
  assert builder.info.splits['train'].num_examples == num_train
  dataset, _, config = name.partition('/')
  found, _ = tfds_data.find_prepared(dataset, root, config or None)
  assert str(found) == str(builder.data_path)


def test_fashion_mnist_from_tfds_dir(tfds_home, stores):
  x_tr, y_tr, x_te, y_te = fashion_mnist.load_arrays(tfds_home / 'empty')
  # The form of the IDX / npz sources: uint8 (N, 28, 28), uint8 labels.
  assert x_tr.shape == (20, 28, 28) and x_te.shape == (10, 28, 28)
  assert x_tr.dtype == x_te.dtype == np.uint8
  assert y_tr.shape == (20,) and y_te.shape == (10,)
  assert y_tr.dtype == y_te.dtype == np.uint8
  # The same examples (TFDS stores them in its own order), split kept.
  assert _as_set(x_tr, y_tr) == _as_set(*stores.fashion['train'])
  assert _as_set(x_te, y_te) == _as_set(*stores.fashion['test'])
  task = fashion_mnist.load_fashion_mnist(
    tfds_home / 'empty', num_clients=4, model='mlp'
  )
  assert len(task.train_data.client_ids) == 4
  assert task.test_x.shape == (10, 28, 28, 1)
  assert task.test_x.dtype == np.float32
  np.testing.assert_array_equal(task.test_x[..., 0] * 255.0, x_te)
  np.testing.assert_array_equal(task.test_y, y_te)


def test_tfds_copy_in_the_data_dir(isolated, stores):
  # --data_dir pointing at a TFDS dir works too; $TFDS_DATA_DIR is empty.
  x_tr, y_tr, _, _ = fashion_mnist.load_arrays(stores.main)
  assert _as_set(x_tr, y_tr) == _as_set(*stores.fashion['train'])


def test_existing_sources_still_come_first(tfds_home, stores):
  data = tfds_home / 'data'
  data.mkdir()
  # fashion_mnist.npz in the data dir wins over the TFDS copy.
  npz = [np.full((2, 28, 28), 7, np.uint8), np.array([1, 2], np.uint8)] * 2
  np.savez(
    data / 'fashion_mnist.npz',
    **dict(zip(['x_train', 'y_train', 'x_test', 'y_test'], npz)),
  )
  for got, want in zip(fashion_mnist.load_arrays(data), npz):
    np.testing.assert_array_equal(got, want)
  # So do CIFAR-10's pickled batches.
  folder = data / 'cifar-10-batches-py'
  folder.mkdir()
  for name in [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']:
    with open(folder / name, 'wb') as f:
      pickle.dump({b'data': np.zeros((1, 3072), np.uint8), b'labels': [3]}, f)
  x_tr, y_tr, _, _ = cifar10.load_arrays(data)
  assert x_tr.shape == (5, 32, 32, 3) and y_tr.tolist() == [3] * 5


def test_cifar10_from_tfds_in_official_order(tfds_home, stores):
  x_tr, y_tr, x_te, y_te = cifar10.load_arrays(tfds_home / 'empty')
  # The pickled batches' form: uint8 NHWC, uint8 labels; the `id` order.
  assert x_tr.dtype == x_te.dtype == y_tr.dtype == y_te.dtype == np.uint8
  np.testing.assert_array_equal(x_tr, stores.cifar['train'][0])
  np.testing.assert_array_equal(y_tr, stores.cifar['train'][1])
  np.testing.assert_array_equal(x_te, stores.cifar['test'][0])
  np.testing.assert_array_equal(y_te, stores.cifar['test'][1])
  # So a seeded split is the one the same labels give from Keras's files.
  task = cifar10.load_cifar10(
    tfds_home / 'empty',
    num_clients=2,
    min_examples_per_client=1,
    model='mlp',
  )
  parts = partition.dirichlet_partition(
    stores.cifar['train'][1], 2, 1.0, 0, min_examples_per_client=1
  )
  for cid, part in zip(task.train_data.client_ids, parts):
    x, y = task.train_data.client_arrays(cid)
    np.testing.assert_array_equal(x, stores.cifar['train'][0][part])
    np.testing.assert_array_equal(y, stores.cifar['train'][1][part])
  np.testing.assert_array_equal(
    task.test_x * 255.0, stores.cifar['test'][0].astype(np.float32)
  )


@pytest.mark.parametrize(
  'load, files',
  [
    (fashion_mnist.load_arrays, ['fashion_mnist.npz', 'fashion-mnist']),
    (cifar10.load_arrays, ['cifar10_jpeg.npz', 'cifar-10-batches-py']),
  ],
)
def test_absence_names_every_place_tried(isolated, load, files):
  # An unfinished preparation ('3.0.1.incomplete...') is not a dataset.
  for name in ('fashion_mnist/3.0.1.incompleteX', 'cifar10/3.0.2.incompleteX'):
    (isolated / 'no_tfds' / name).mkdir(parents=True)
    (isolated / 'no_tfds' / name / 'dataset_info.json').write_text('{}')
  with pytest.raises(data_dir.DataNotFoundError) as info:
    load(isolated / 'empty')
  message = str(info.value)
  tfds_name = 'fashion_mnist' if 'fashion' in files[0] else 'cifar10'
  for path in (
    isolated / 'empty' / files[0],
    isolated / 'empty' / files[1],
    isolated / 'keras' / files[1],
    isolated / 'empty' / tfds_name,
    isolated / 'no_tfds' / tfds_name,
  ):
    assert str(path) in message
  assert 'TFDS' in message and '--data_dir' in message
  assert len(info.value.tried) == 5


def test_federated_emnist_writers_cannot_come_from_tfds(tfds_home):
  # The writer split needs writer ids: refused before any data is read.
  with pytest.raises(ValueError) as info:
    emnist.load_emnist(tfds_home / 'empty', source='tfds')
  message = str(info.value)
  assert 'no writer ids' in message
  assert "source='tfds' serves split='dominant_classes' only" in message
  # The default source is the LEAF file only: a prepared TFDS copy beside
  # it is never read instead.
  with pytest.raises(data_dir.DataNotFoundError) as info:
    emnist.load_emnist(tfds_home / 'empty')
  assert str(info.value).startswith(
    f'Dataset file not found. Tried: {tfds_home / "empty"}'
    '/emnist_federated.npz.'
  )


def test_emnist_dominant_classes_from_tfds_digits(tfds_home, stores):
  # emnist/digits (in the data dir) is preferred for only_digits.
  task = emnist.load_emnist(
    stores.digits,
    only_digits=True,
    split='dominant_classes',
    num_clients=2,
    dominant_count=2,
    other_count=1,
    model='mlp',
    source='tfds',
  )
  x_tr, y_tr = stores.emnist_digits['train']
  x_te, y_te = stores.emnist_digits['test']
  assert 'TFDS emnist/digits 3.0.0' in task.description
  assert task.num_classes == 10
  cd = task.train_data
  for cid in cd.client_ids:
    x, y = cd.client_arrays(cid)
    assert sorted(np.bincount(y, minlength=10).tolist()) == [1] * 8 + [2] * 2
    # Upright (transposed back) and ink high as stored (not inverted).
    assert x.dtype == np.uint8 and x.shape[1:] == (28, 28, 1)
    assert set(_as_set(x[..., 0], y)) <= set(_as_set(x_tr, y_tr))
  assert task.test_x.shape == (20, 28, 28, 1)
  got = np.rint(task.test_x[..., 0] * 255).astype(np.uint8)
  assert _as_set(got, task.test_y) == _as_set(x_te, y_te)


def test_emnist_from_tfds_byclass(tfds_home, stores):
  # Only emnist/byclass prepared: 62 classes, or its digits.
  x_all, y_all, w_tr, x_te, y_te, w_te, source = emnist.load_emnist_arrays(
    tfds_home / 'empty', source='tfds'
  )
  assert w_tr is None and w_te is None and 'emnist/byclass' in source
  assert x_all.dtype == np.uint8 and y_all.dtype == np.uint8
  assert _as_set(x_all, y_all) == _as_set(*stores.emnist_byclass['train'])
  assert _as_set(x_te, y_te) == _as_set(*stores.emnist_byclass['test'])
  x, y, _, _, _, _, _ = emnist.load_emnist_arrays(
    tfds_home / 'empty', only_digits=True, source='tfds'
  )
  bx, by = stores.emnist_byclass['train']
  assert _as_set(x, y) == _as_set(bx[by < 10], by[by < 10])
  task = emnist.load_emnist(
    tfds_home / 'empty',
    split='dominant_classes',
    num_clients=2,
    dominant_count=1,
    other_count=0,
    model='mlp',
    source='tfds',
  )
  assert task.num_classes == 62 and len(task.train_data.client_ids) == 2


def test_emnist_tfds_absence_names_every_folder_tried(isolated):
  with pytest.raises(data_dir.DataNotFoundError) as info:
    emnist.load_emnist(
      isolated / 'empty',
      only_digits=True,
      split='dominant_classes',
      num_clients=2,
      source='tfds',
    )
  message = str(info.value)
  for config in ('digits', 'byclass'):
    assert str(isolated / 'no_tfds' / 'emnist' / config) in message
  assert "source='tfds'" in message


def _fashion_task():
  return types.SimpleNamespace(
    name='fashion_mnist_iid', public_x=None, public_y=None
  )


def test_public_batch_from_tfds_emnist_byclass_test_split(tfds_home, stores):
  x_te, y_te = stores.emnist_byclass['test']
  digits = {a.tobytes(): int(b) for a, b in zip(x_te, y_te) if b < 10}
  for mode in ('random', 'first_per_class'):
    x, y = public_data.public_batch(
      _fashion_task(), tfds_home / 'empty', mode=mode, seed=1
    )
    assert x.shape == (10, 28, 28, 1) and x.dtype == np.float32
    assert y.dtype == np.int32
    for image, label in zip(x, y):
      raw = np.rint(image[..., 0] * 255).astype(np.uint8)
      assert digits[raw.tobytes()] == label  # upright test-split digits
  np.testing.assert_array_equal(y, np.arange(10))  # first_per_class


def test_the_public_set_refuses_a_tfds_byclass_of_other_counts(tfds_home):
  # FL-TOP's batch takes the fixture's 30 test images (above); the public
  # set emnist_byclass_test needs the ByClass test split itself.
  with pytest.raises(ValueError, match=r'TFDS emnist/byclass .*gives 30'):
    public.load_emnist_byclass_test(tfds_home / 'empty')


def test_public_batch_npz_first_and_absence(isolated, stores, monkeypatch):
  monkeypatch.setenv(tfds_data.TFDS_DATA_DIR_ENV, str(stores.main))
  data = isolated / 'data'
  data.mkdir()
  x = np.repeat(np.arange(10, dtype=np.uint8), 784).reshape(10, 28, 28)
  np.savez(data / 'emnist_byclass_test.npz', x_test=x, y_test=np.arange(10))
  got, y = public_data.public_batch(
    _fashion_task(), data, mode='first_per_class'
  )
  np.testing.assert_array_equal(got[..., 0] * 255, x)
  monkeypatch.setenv(tfds_data.TFDS_DATA_DIR_ENV, str(isolated / 'no_tfds'))
  with pytest.raises(data_dir.DataNotFoundError) as info:
    public_data.public_batch(_fashion_task(), isolated / 'empty')
  message = str(info.value)
  assert str(isolated / 'empty' / 'emnist_byclass_test.npz') in message
  assert str(isolated / 'no_tfds' / 'emnist' / 'byclass') in message
  assert str(isolated / 'no_tfds' / 'emnist' / 'digits') in message
