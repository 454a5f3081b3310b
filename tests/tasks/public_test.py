"""Public sets: overlap removal, hashes, and the warm-start builder."""

import dataclasses
import functools
import gzip
import io
import pickle
import zipfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.tasks import client_data
from tff_dp.tasks import data_dir
from tff_dp.tasks import download
from tff_dp.tasks import metrics
from tff_dp.tasks import models
from tff_dp.tasks import partial_training
from tff_dp.tasks import public
from tff_dp.tasks import task as task_lib


def tiny_task(name='tiny', seed=0):
  """4x4 images, 3 classes, 4 clients of 5 examples; a 3-class MLP."""
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 256, (20, 4, 4, 1), dtype=np.uint8)
  y = rng.integers(0, 3, 20)
  parts = [np.arange(i, i + 5) for i in range(0, 20, 5)]
  test_x = rng.integers(0, 256, (6, 4, 4, 1), dtype=np.uint8)
  return task_lib.FederatedTask(
    name=name,
    train_data=client_data.ArrayClientData(x, y, parts),
    test_x=test_x.astype(np.float32) / 255.0,
    test_y=rng.integers(0, 3, 6).astype(np.int32),
    model_builder=functools.partial(
      models.create_image_mlp, (4, 4, 1), 3, (5,), 0
    ),
    loss_builder=lambda: tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True
    ),
    metrics_builder=metrics.classification_metrics,
    num_classes=3,
    description='tiny synthetic task',
  )


def test_examples_a_client_or_the_test_set_holds_are_removed():
  task = tiny_task()
  clients_x, _ = task.train_data.all_arrays()
  fresh = np.random.default_rng(9).integers(0, 256, (300, 4, 4), np.uint8)
  x = np.concatenate(
    [fresh, clients_x[[2, 7], ..., 0], public.to_uint8(task.test_x[:1])]
  )
  y = np.arange(len(x)) % 3
  # Compared as loaded, then mapped to the clients' style.
  data = public.from_arrays('p', x, y, task, transform=lambda im: 255 - im)
  assert data.removed == 3
  np.testing.assert_array_equal(public.to_uint8(data.x), 255 - fresh)
  assert data.x.shape == (300, 4, 4, 1) and data.x.dtype == np.float32
  np.testing.assert_array_equal(data.y, y[:300])
  # The content hash names exactly the examples kept, as trained on.
  assert data.content_sha256 == public.content_sha256(255 - fresh, y[:300])
  assert data.content_sha256 != public.content_sha256(255 - fresh, y[1:301])


def test_a_set_that_is_the_tasks_own_data_is_refused():
  # E.g. EMNIST's test split offered to a task whose test set it is.
  task = tiny_task()
  with pytest.raises(ValueError, match='shares 6 of its 6 examples'):
    public.from_arrays('p', public.to_uint8(task.test_x), task.test_y, task)


def test_load_names_the_sets_and_their_tasks():
  with pytest.raises(ValueError, match="must be one of \\['emnist_byclass"):
    public.load('imagenet', tiny_task())
  with pytest.raises(ValueError, match="for task\\(s\\) \\['emnist'\\], not"):
    public.load('emnist_byclass_test', tiny_task())


def test_emnists_public_set_needs_its_writers_out_of_the_task():
  task = dataclasses.replace(tiny_task(), name='emnist')
  with pytest.raises(
    ValueError,
    match="partition 'hsf_4', which task 'emnist' still holds.*"
    '--task_option=drop_nist_test_writers=1',
  ):
    public.load('emnist_byclass_test', task)


def _weights(seed):
  model = models.create_image_mlp((4, 4, 1), 3, (5,), seed)
  return tuple(w.numpy() for w in model.weights)


def test_warm_start_builds_models_at_the_given_weights():
  task = tiny_task()
  want = _weights(7)
  builder = public.WarmStart(task.model_builder, want)
  for model in (builder(), pickle.loads(pickle.dumps(builder))()):
    for got, w in zip(model.get_weights(), want):
      np.testing.assert_array_equal(got, w)


def test_warm_start_holds_where_tff_traces_the_builder():
  # TFF builds the initial weights in a graph: an assignment after the
  # build would not run there; the initializers do.
  task = tiny_task()
  want = _weights(7)
  warm = dataclasses.replace(
    task, model_builder=public.WarmStart(task.model_builder, want)
  )
  initial = tff.learning.algorithms.build_unweighted_fed_avg(
    warm.model_fn, tff.learning.optimizers.build_sgdm(0.1)
  ).initialize()
  got = tf.nest.flatten(initial.global_model_weights.trainable)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


def test_warm_start_rejects_weights_of_another_model():
  task = tiny_task()
  with pytest.raises(ValueError, match='must match the model weights'):
    public.WarmStart(task.model_builder, _weights(0)[:2])()


def test_half_size_centres_2x2_means():
  image = np.zeros((1, 28, 28), np.uint8)
  image[0, 0:2, 0:2] = [[255, 255], [0, 1]]  # Mean 127.75 -> 128.
  image[0, 26:28, 26:28] = 8
  out = public.half_size(image)
  assert out.shape == (1, 28, 28) and out.dtype == np.uint8
  assert out[0, 7, 7] == 128 and out[0, 20, 20] == 8
  assert int(out.sum()) == 128 + 8


def test_frozen_warm_start_of_the_emnist_cnn_holds_through_tff():
  # CNN-2-layers: StatelessDropout between the weighted layers.
  builder = functools.partial(models.create_cnn_2layers, (28, 28, 1), 62, 0)
  want = tuple(
    w.numpy() for w in models.create_cnn_2layers((28, 28, 1), 62, 5).weights
  )
  frozen = partial_training.TrainOnly(
    public.WarmStart(builder, want), ('logits',)
  )
  spec = (
    tf.TensorSpec([None, 28, 28, 1], tf.float32),
    tf.TensorSpec([None], tf.int32),
  )

  def model_fn():
    return tff.learning.models.from_keras_model(
      frozen(),
      input_spec=spec,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

  state = tff.learning.algorithms.build_unweighted_fed_avg(
    model_fn, tff.learning.optimizers.build_sgdm(0.1)
  ).initialize()
  weights = state.global_model_weights
  # conv1, conv2, dense1 frozen; logits trained; all at the given values.
  got = [*weights.non_trainable, *weights.trainable]
  assert [g.shape for g in got] == [w.shape for w in want]
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


def _idx_gz(array) -> bytes:
  header = bytes([0, 0, 8, array.ndim]) + b''.join(
    int(d).to_bytes(4, 'big') for d in array.shape
  )
  return gzip.compress(header + array.astype(np.uint8).tobytes(), mtime=0)


@pytest.fixture
def nist_archive(tmp_path, monkeypatch, serve_source):
  """A tiny NIST `gzip.zip` (7 raw, transposed ByClass test images, 3
  digits, 2 upper and 2 lower case) served on 127.0.0.1; no local copy
  anywhere. Returns the upright images and labels it holds."""
  rng = np.random.default_rng(3)
  upright = rng.integers(0, 256, (7, 28, 28), dtype=np.uint8)
  labels = np.array([0, 9, 10, 35, 36, 61, 5], np.uint8)
  archive = io.BytesIO()
  with zipfile.ZipFile(archive, 'w') as z:
    z.writestr(
      'gzip/emnist-byclass-test-images-idx3-ubyte.gz',
      _idx_gz(upright.transpose(0, 2, 1)),
    )
    z.writestr('gzip/emnist-byclass-test-labels-idx1-ubyte.gz', _idx_gz(labels))
    z.writestr('gzip/emnist-digits-test-labels-idx1-ubyte.gz', b'unused')
  monkeypatch.setattr(
    public,
    'EMNIST_REMOTE',
    serve_source(public.EMNIST_REMOTE, {'gzip.zip': archive.getvalue()}),
  )
  monkeypatch.setattr(public, 'EMNIST_BYCLASS_TEST_COUNTS', (7, 3, 2, 2))
  (tmp_path / 'empty').mkdir()
  monkeypatch.setenv(data_dir.DATA_DIR_ENV, str(tmp_path / 'empty'))
  monkeypatch.setenv(data_dir.CACHE_DIR_ENV, str(tmp_path / 'cache'))
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path / 'no_tfds'))
  monkeypatch.delenv(download.NO_DOWNLOAD_ENV, raising=False)
  monkeypatch.setenv('no_proxy', '127.0.0.1,localhost')
  return upright, labels


def test_emnist_byclass_is_built_from_nists_archive_then_kept(
  nist_archive, tmp_path
):
  upright, labels = nist_archive
  x, y, files = public.load_emnist_byclass_test()
  np.testing.assert_array_equal(x, upright)  # Transposed back upright.
  np.testing.assert_array_equal(y, labels)
  kept = tmp_path / 'cache' / 'emnist_byclass_test.npz'
  assert files == (str(kept),)
  with np.load(kept) as d:
    assert d['mapping'].tobytes() == (
      b'0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
    )
  # Only the split is kept (the archive is 562 MB), and it serves offline.
  assert not (tmp_path / 'cache' / 'emnist-nist' / 'gzip.zip').exists()
  with download.allowed(False):
    x2, _, files2 = public.load_emnist_byclass_test()
  np.testing.assert_array_equal(x2, upright)
  assert files2 == files


def test_emnist_byclass_of_other_counts_is_refused(nist_archive, tmp_path):
  public.EMNIST_BYCLASS_TEST_COUNTS = (7, 4, 2, 1)  # Restored by monkeypatch.
  with pytest.raises(
    download.DownloadError, match=r'\(7, 3, 2, 2\), not .*\(7, 4, 2, 1\)'
  ):
    public.load_emnist_byclass_test()
  assert not (tmp_path / 'cache' / 'emnist_byclass_test.npz').exists()


def test_a_local_emnist_file_of_other_counts_is_refused(nist_archive, tmp_path):
  upright, labels = nist_archive
  np.savez(
    tmp_path / 'empty' / 'emnist_byclass_test.npz',
    x_test=upright[:5],
    y_test=labels[:5],
  )
  with pytest.raises(
    ValueError, match=r'gives 5 images .* \(5, 2, 2, 1\), not .*\(7, 3, 2, 2\)'
  ):
    public.load_emnist_byclass_test()


def test_emnist_byclass_offline_is_one_line_naming_where_to_put_it(
  nist_archive, tmp_path
):
  with (
    download.allowed(False),
    pytest.raises(data_dir.DataNotFoundError) as error,
  ):
    public.load_emnist_byclass_test()
  message = str(error.value)
  assert '\n' not in message
  assert str(tmp_path / 'empty' / 'emnist_byclass_test.npz') in message
  assert str(tmp_path / 'cache' / 'emnist_byclass_test.npz') in message
  assert 'gzip.zip' in message and 'downloads are off' in message


def test_opt_in_clients_are_a_public_set_for_their_task():
  task = tiny_task('fashion_mnist')
  with pytest.raises(ValueError, match='public_clients=N'):
    public.load('fashion_mnist_opt_in', task)
  rng = np.random.default_rng(5)
  held = rng.integers(0, 256, (7, 4, 4, 1), dtype=np.uint8)
  task = dataclasses.replace(
    task,
    opt_in_x=held.astype(np.float32) / 255.0,
    opt_in_y=np.arange(7, dtype=np.int32) % 3,
  )
  data = public.load('fashion_mnist_opt_in', task)
  assert data.removed == 0 and data.files == ()
  np.testing.assert_array_equal(public.to_uint8(data.x), held[..., 0])
  np.testing.assert_array_equal(data.y, np.arange(7) % 3)
  assert 'opt' in data.caveat
