import dataclasses
import hashlib
import lzma
import sqlite3

import numpy as np
import pytest
import tensorflow as tf

from tff_dp.tasks import data_dir
from tff_dp.tasks import download
from tff_dp.tasks import emnist


def test_leaf_npz_real(shared_data_dir):
  task = emnist.load_emnist(shared_data_dir)
  cd = task.train_data
  assert len(cd.client_ids) == 300
  assert int(cd.client_sizes().sum()) == 41_495
  assert task.num_classes == 62
  assert task.test_x.shape == (4763, 28, 28, 1)
  labels = np.concatenate([cd.client_arrays(c)[1] for c in cd.client_ids])
  assert set(np.unique(labels)) == set(range(62))
  x, _ = cd.client_arrays(cd.client_ids[0])
  assert x.dtype == np.uint8 and x.shape[1:] == (28, 28, 1)
  # MNIST style after inversion: background (the border) is dark.
  assert np.median(x[:, 0, :, 0]) == 0
  assert task.num_parameters() == 1_206_590


def test_the_writers_of_emnists_test_split_can_be_dropped(shared_data_dir):
  # The public set emnist_byclass_test is NIST SD19's test partition hsf_4
  # (forms f2100-f2599): 75 of the 300 LEAF writers, with their test
  # examples.
  task = emnist.load_emnist(shared_data_dir, drop_nist_test_writers=1)
  cd = task.train_data
  assert len(cd.client_ids) == 225
  assert not emnist.in_nist_test_partition(cd.client_ids).any()
  assert int(cd.client_sizes().sum()) == 41_495 - 10_611
  assert task.test_x.shape[0] == 4_763 - 1_217 == len(task.test_y)
  assert task.writers_dropped == ('hsf_4',)
  assert '75 writers of NIST partition hsf_4' in task.description
  # The kept writers' examples are unchanged, train and test alike.
  whole = emnist.load_emnist(shared_data_dir)
  assert whole.writers_dropped == ()
  kept = ~emnist.in_nist_test_partition(whole.train_data.client_ids)
  assert list(cd.client_ids) == list(
    np.asarray(whole.train_data.client_ids)[kept]
  )
  for writer in cd.client_ids[::40]:
    for a, b in zip(
      cd.client_arrays(writer), whole.train_data.client_arrays(writer)
    ):
      np.testing.assert_array_equal(a, b)
  *_, w_te, _ = emnist.load_emnist_arrays(shared_data_dir)
  out = emnist.in_nist_test_partition(w_te)
  np.testing.assert_array_equal(task.test_x, whole.test_x[~out])
  np.testing.assert_array_equal(task.test_y, whole.test_y[~out])


def test_nist_test_partition_by_writer_id():
  ids = ['f2099_49', 'f2100_50', 'f2599_99', 'f2600_00', 'f0424_27']
  np.testing.assert_array_equal(
    emnist.in_nist_test_partition(ids), [False, True, True, False, False]
  )
  with pytest.raises(ValueError, match="'client_0001' is not a NIST id"):
    emnist.in_nist_test_partition(['client_0001'])
  with pytest.raises(ValueError, match='must be 0 or 1.*Found 2'):
    emnist.load_emnist(drop_nist_test_writers=2)
  with pytest.raises(ValueError, match="needs writer ids.*source 'tfds'"):
    emnist.load_emnist(
      source='tfds',
      split='dominant_classes',
      num_clients=2,
      drop_nist_test_writers=1,
    )


def test_digits_only_real(shared_data_dir):
  task = emnist.load_emnist(shared_data_dir, only_digits=True, max_clients=50)
  cd = task.train_data
  assert len(cd.client_ids) == 50
  labels = np.concatenate([cd.client_arrays(c)[1] for c in cd.client_ids])
  assert labels.max() <= 9 and task.num_classes == 10
  assert task.test_y.max() <= 9
  # One client per writer: the test examples are the writers' own, so test
  # metrics are not post-processing of the released model.
  assert task.test_held_by_clients


def _example(pixels, label):
  return tf.train.Example(
    features=tf.train.Features(
      feature={
        'pixels': tf.train.Feature(
          float_list=tf.train.FloatList(value=pixels.ravel().tolist())
        ),
        'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
      }
    )
  ).SerializeToString()


def _write_tff_sqlite(path):
  """A tiny TFF federated EMNIST file at `path`; returns its examples by
  (split, writer)."""
  rng = np.random.default_rng(0)
  db = sqlite3.connect(path)
  db.execute(
    'CREATE TABLE examples (split_name TEXT, client_id TEXT, '
    'serialized_example_proto BLOB)'
  )
  db.execute(
    'CREATE TABLE client_metadata (client_id TEXT, split_name TEXT,'
    ' num_examples INTEGER)'
  )
  expected = {}
  for split in ('all_train', 'all_test'):
    for writer, n in (('f0001_01', 3), ('f0002_02', 2)):
      for _ in range(n):
        px = rng.integers(0, 256, (28, 28)) / 255.0
        label = int(rng.integers(0, 62))
        db.execute(
          'INSERT INTO examples VALUES (?, ?, ?)',
          (split, writer, _example(px.astype(np.float32), label)),
        )
        expected.setdefault((split, writer), []).append((px, label))
  db.commit()
  db.close()
  return expected


def test_tff_sqlite_source(tmp_path, monkeypatch):
  monkeypatch.setattr(data_dir, 'KERAS_CACHE_DIR', tmp_path / 'keras')
  monkeypatch.setattr(data_dir, 'TFF_CACHE_DIR', tmp_path / 'tff')
  expected = _write_tff_sqlite(tmp_path / 'emnist_all.sqlite')
  task = emnist.load_emnist(tmp_path, source='tff')
  cd = task.train_data
  assert cd.client_ids == ['f0001_01', 'f0002_02']
  x, y = cd.client_arrays('f0002_02')
  want = expected[('all_train', 'f0002_02')]
  np.testing.assert_array_equal(
    x[..., 0], 255 - np.rint(np.stack([p for p, _ in want]) * 255)
  )
  assert y.tolist() == [l for _, l in want]
  assert task.test_x.shape == (5, 28, 28, 1)
  assert 'TFF federated EMNIST' in task.description


@pytest.mark.parametrize('cache', ['tff', 'keras'])
def test_the_writer_set_is_the_source_option_never_the_file_found(
  tmp_path, monkeypatch, cache
):
  # TFF's file in a cache beside the data directory's LEAF file: the
  # default source reads the LEAF file, source='tff' the cache, and the
  # task's data_sources name the file actually read.
  from tff_dp import tasks  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(data_dir, 'KERAS_CACHE_DIR', tmp_path / 'keras')
  monkeypatch.setattr(data_dir, 'TFF_CACHE_DIR', tmp_path / 'tff')
  (tmp_path / cache).mkdir()
  _write_tff_sqlite(tmp_path / cache / 'emnist_all.sqlite')
  (tmp_path / 'data').mkdir()
  (tmp_path / 'data' / 'emnist_federated.npz').write_bytes(b'not an npz')
  with pytest.raises(ValueError, match='pickle|zip|not'):
    tasks.load_task('emnist', data_dir=tmp_path / 'data')
  task = tasks.load_task(
    'emnist', data_dir=tmp_path / 'data', source='tff', download=False
  )
  assert task.data_sources == (
    data_dir.DataSource(
      'TFF federated EMNIST (emnist_all.sqlite)',
      (str((tmp_path / cache / 'emnist_all.sqlite').resolve()),),
    ),
  )
  # The loader called directly records nothing (no `recording()` around it).
  assert emnist.load_emnist(tmp_path, source='tff').data_sources == ()


def test_bad_source_is_named():
  with pytest.raises(ValueError, match="Found 'leaf'"):
    emnist.load_emnist('/nonexistent', source='leaf')


def test_seed003_dominant_classes_split_real(shared_data_dir):
  task = emnist.load_emnist(
    shared_data_dir,
    only_digits=True,
    split='dominant_classes',
    num_clients=40,
    model='mlp',
  )
  cd = task.train_data
  assert len(cd.client_ids) == 40
  for c in cd.client_ids:
    counts = np.bincount(cd.client_arrays(c)[1], minlength=10)
    assert sorted(counts.tolist()) == [5] * 8 + [230] * 2
  assert '40 clients with 2 dominant classes of 230' in task.description
  # Clients are dealt training examples only: no client holds a test one.
  assert not task.test_held_by_clients
  # Seed 003's 1,920 clients of 500 do not fit in these digits.
  with pytest.raises(ValueError, match='num_clients=1920 does not fit'):
    emnist.load_emnist(
      shared_data_dir,
      only_digits=True,
      split='dominant_classes',
      num_clients=1920,
    )
  with pytest.raises(ValueError, match='num_clients is for split'):
    emnist.load_emnist(shared_data_dir, only_digits=True, num_clients=5)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
  """No local copy anywhere, downloads allowed, TFF's cache in tmp."""
  monkeypatch.setattr(data_dir, 'KERAS_CACHE_DIR', tmp_path / 'keras')
  monkeypatch.setattr(data_dir, 'TFF_CACHE_DIR', tmp_path / 'tff')
  monkeypatch.delenv(download.NO_DOWNLOAD_ENV, raising=False)
  monkeypatch.setenv('no_proxy', '127.0.0.1,localhost')
  (tmp_path / 'empty').mkdir()
  return tmp_path


def _serve_tff_emnist(serve_source, monkeypatch, workdir, unpacked_sha256=None):
  """Serves a tiny `emnist_all.sqlite.lzma`; returns the sqlite's bytes."""
  sqlite_path = workdir / 'build.sqlite'
  _write_tff_sqlite(sqlite_path)
  raw = sqlite_path.read_bytes()
  sqlite_path.unlink()
  source = serve_source(
    emnist.REMOTE, {'emnist_all.sqlite.lzma': lzma.compress(raw)}
  )
  monkeypatch.setattr(
    emnist,
    'REMOTE',
    dataclasses.replace(
      source,
      unlzma=download.Unpacked(
        'emnist_all.sqlite',
        unpacked_sha256 or hashlib.sha256(raw).hexdigest(),
        len(raw),
      ),
    ),
  )
  return raw


def test_tff_emnist_download_decompresses_into_tffs_cache(
  isolated, serve_source, monkeypatch
):
  raw = _serve_tff_emnist(serve_source, monkeypatch, isolated)
  task = emnist.load_emnist(isolated / 'empty', source='tff')
  assert task.train_data.client_ids == ['f0001_01', 'f0002_02']
  # Where tff.simulation.datasets.emnist.load_data() looks; the archive is
  # not kept, nor any staging folder.
  assert sorted(p.name for p in (isolated / 'tff').iterdir()) == [
    'emnist_all.sqlite'
  ]
  assert (isolated / 'tff' / 'emnist_all.sqlite').read_bytes() == raw


def test_tff_emnist_that_decompresses_wrong_is_not_cached(
  isolated, serve_source, monkeypatch
):
  _serve_tff_emnist(serve_source, monkeypatch, isolated, '0' * 64)
  with pytest.raises(download.DownloadError) as e:
    emnist.load_emnist(isolated / 'empty', source='tff')
  message = str(e.value)
  assert '\n' not in message
  assert (
    'TFF federated EMNIST: emnist_all.sqlite.lzma decompresses to a '
    'emnist_all.sqlite that fails its sha256 check' in message
  )
  assert list((isolated / 'tff').iterdir()) == []
