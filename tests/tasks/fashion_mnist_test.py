import gzip

import numpy as np
import pytest

from tff_dp.tasks import data_dir
from tff_dp.tasks import fashion_mnist
from tff_dp.tasks import partition
from tff_dp.methods import public_data


def test_iid_real(shared_data_dir):
  task = fashion_mnist.load_fashion_mnist(shared_data_dir)
  cd = task.train_data
  assert len(cd.client_ids) == 6000
  assert np.all(cd.client_sizes() == 10)
  el = next(iter(cd.create_tf_dataset_for_client(cd.client_ids[0])))
  assert el['x'].shape == (28, 28, 1) and el['x'].dtype.name == 'float32'
  assert el['y'].dtype.name == 'int32'
  assert 0.0 <= float(np.min(el['x'])) and float(np.max(el['x'])) <= 1.0
  assert task.test_x.shape == (10000, 28, 28, 1)
  assert task.test_x.dtype == np.float32 and task.test_y.dtype == np.int32
  assert np.bincount(task.test_y).tolist() == [1000] * 10
  assert task.num_parameters() == 1_663_370


def test_five_labels_real_histogram_and_determinism(shared_data_dir):
  task = fashion_mnist.load_fashion_mnist(shared_data_dir, labels_per_client=5)
  cd = task.train_data
  labels = np.stack([cd.client_arrays(c)[1] for c in cd.client_ids])
  hist = np.stack([np.bincount(l, minlength=10) for l in labels])
  assert np.all((hist > 0).sum(1) == 5)  # Exactly 5 labels per client.
  assert np.all(hist.sum(1) == 10)
  assert np.all((hist > 0).sum(0) == 3000)  # Each label on 3,000 clients.
  again = fashion_mnist.load_fashion_mnist(shared_data_dir, labels_per_client=5)
  c = cd.client_ids[123]
  assert np.array_equal(
    cd.client_arrays(c)[0], again.train_data.client_arrays(c)[0]
  )
  other = fashion_mnist.load_fashion_mnist(
    shared_data_dir, labels_per_client=5, partition_seed=1
  )
  assert not np.array_equal(
    cd.client_arrays(c)[1], other.train_data.client_arrays(c)[1]
  )


def _write_idx(path, array):
  header = bytes([0, 0, 8, array.ndim]) + b''.join(
    int(d).to_bytes(4, 'big') for d in array.shape
  )
  with gzip.open(path, 'wb') as f:
    f.write(header + array.astype(np.uint8).tobytes())


def test_keras_idx_cache_source(tmp_path, monkeypatch):
  monkeypatch.setattr(data_dir, 'KERAS_CACHE_DIR', tmp_path / 'keras')
  folder = tmp_path / 'keras' / 'fashion-mnist'
  folder.mkdir(parents=True)
  rng = np.random.default_rng(0)
  x_tr = rng.integers(0, 256, (40, 28, 28))
  y_tr = np.repeat(np.arange(10), 4)
  _write_idx(folder / 'train-images-idx3-ubyte.gz', x_tr)
  _write_idx(folder / 'train-labels-idx1-ubyte.gz', y_tr)
  _write_idx(folder / 't10k-images-idx3-ubyte.gz', x_tr[:10])
  _write_idx(folder / 't10k-labels-idx1-ubyte.gz', y_tr[:10])
  task = fashion_mnist.load_fashion_mnist(tmp_path / 'empty', num_clients=4)
  assert len(task.train_data.client_ids) == 4
  x, y = task.train_data.client_arrays('0')
  idx = partition.iid_partition(40, 4, 0)[0]
  np.testing.assert_array_equal(x[..., 0], x_tr[idx])
  np.testing.assert_array_equal(y, y_tr[idx])


def test_bad_model_name(shared_data_dir):
  with pytest.raises(ValueError, match=r"model must be one of .*'resnet'"):
    fashion_mnist.load_fashion_mnist(shared_data_dir, model='resnet')


def test_labels_per_client_more_than_classes(shared_data_dir):
  with pytest.raises(ValueError, match=r'labels_per_client .*\[1, 10\]'):
    fashion_mnist.load_fashion_mnist(shared_data_dir, labels_per_client=11)


def test_opt_in_clients_are_held_out_as_public_data(shared_data_dir):
  task = fashion_mnist.load_fashion_mnist(shared_data_dir, public_clients=60)
  cd = task.train_data
  assert len(cd.client_ids) == 5940
  assert task.opt_in_x.shape == (600, 28, 28, 1)
  assert task.opt_in_x.dtype == np.float32 and task.opt_in_y.dtype == np.int32
  # Every training image is a client's or an opt-in client's, not both.
  x_all, _, _, _ = fashion_mnist.load_arrays(shared_data_dir)
  clients_x, _ = cd.all_arrays()
  public_u8 = np.rint(task.opt_in_x[..., 0] * 255).astype(np.uint8)
  pixels = {x.tobytes() for x in clients_x[..., 0]}
  assert not any(x.tobytes() in pixels for x in public_u8)
  assert len(pixels) + len(public_u8) == len({x.tobytes() for x in x_all})
  # The draw is the split seed's.
  again = fashion_mnist.load_fashion_mnist(shared_data_dir, public_clients=60)
  np.testing.assert_array_equal(again.opt_in_x, task.opt_in_x)
  other = fashion_mnist.load_fashion_mnist(
    shared_data_dir, public_clients=60, partition_seed=1
  )
  assert not np.array_equal(other.opt_in_x, task.opt_in_x)
  # FL-TOP's public batch stays EMNIST's digits, not the opt-in data.
  assert task.public_x is None
  x, y = public_data.public_batch(task, shared_data_dir)
  assert x.shape == (10, 28, 28, 1) and set(y.tolist()) <= set(range(10))


@pytest.mark.parametrize('bad', [-1, 6000, 2.5])
def test_public_clients_out_of_range_is_named(shared_data_dir, bad):
  with pytest.raises(ValueError, match=r'public_clients .*\[0, 5999\]'):
    fashion_mnist.load_fashion_mnist(shared_data_dir, public_clients=bad)
