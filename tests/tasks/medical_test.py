import numpy as np
import pytest

from tff_dp.tasks import medical


def test_physionet_real(shared_data_dir):
  task = medical.load_physionet2012(shared_data_dir)
  cd = task.train_data
  assert cd.client_ids == [
    'coronary_care',
    'cardiac_surgery',
    'medical',
    'surgical',
  ]
  sizes = cd.client_sizes()
  assert int(sizes.sum()) + len(task.test_y) == 8000
  assert len(task.test_y) == pytest.approx(1600, abs=4)
  # Per-unit sizes of the data README, 80% of each kept for training.
  np.testing.assert_allclose(
    sizes, np.array([1167, 1656, 2917, 2260]) * 0.8, atol=2
  )
  for leak in medical.LEAKAGE_COLUMNS + ('ICUType', 'In-hospital_death'):
    assert not any(leak in f for f in task.feature_names)
  x = np.concatenate([cd.client_arrays(c)[0] for c in cd.client_ids])
  # Normalisation fitted on the training clients only.
  np.testing.assert_allclose(x.mean(0), 0.0, atol=1e-4)
  assert np.all(np.isfinite(x)) and np.all(np.isfinite(task.test_x))
  stds = x.std(0)
  assert np.all((np.abs(stds - 1) < 1e-3) | (stds < 1e-6))
  assert abs(task.test_x.mean()) > 1e-6  # Test data not re-centred.
  labels = np.concatenate([cd.client_arrays(c)[1] for c in cd.client_ids])
  assert set(np.unique(labels)) == {0, 1}
  assert (labels.sum() + task.test_y.sum()) == 1122  # Deaths in the README.
  assert task.num_classes == 1


def test_physionet_clients_per_unit(shared_data_dir):
  task = medical.load_physionet2012(shared_data_dir, clients_per_unit=3)
  # Held-out patients belong to no client once a site is split; with one
  # client per site they are that client's own.
  assert not task.test_held_by_clients
  assert medical.load_physionet2012(shared_data_dir).test_held_by_clients
  assert len(task.train_data.client_ids) == 12
  assert task.train_data.client_ids[:3] == [
    'coronary_care/0',
    'coronary_care/1',
    'coronary_care/2',
  ]


def test_physionet_deterministic(shared_data_dir):
  a = medical.load_physionet2012(shared_data_dir, split_seed=5)
  b = medical.load_physionet2012(shared_data_dir, split_seed=5)
  np.testing.assert_array_equal(a.test_x, b.test_x)


def test_heart_disease_real(shared_data_dir):
  task = medical.load_heart_disease(shared_data_dir)
  cd = task.train_data
  assert cd.client_ids == ['cleveland', 'hungarian', 'switzerland', 'va']
  assert int(cd.client_sizes().sum()) + len(task.test_y) == 920
  positives = sum(int(cd.client_arrays(c)[1].sum()) for c in cd.client_ids)
  assert positives + int(task.test_y.sum()) == 139 + 106 + 115 + 149


@pytest.mark.parametrize(
  'kwargs, match',
  [
    ({'clients_per_unit': 0}, r'clients_per_unit must be an integer >= 1'),
    ({'test_fraction': 0.0}, r'test_fraction must be in \(0, 1\)'),
    ({'test_fraction': 1.0}, r'test_fraction must be in \(0, 1\)'),
  ],
)
def test_physionet_bad_args(shared_data_dir, kwargs, match):
  with pytest.raises(ValueError, match=match):
    medical.load_physionet2012(shared_data_dir, **kwargs)


def test_standardize_uses_train_statistics():
  train = np.array([[1.0, np.nan], [3.0, 2.0]])
  test = np.array([[5.0, np.nan]])
  tr, te, mean, std = medical.standardize(train, test)
  # Column 1 has a NaN, so an indicator column is appended.
  assert tr.shape == (2, 3) and te.shape == (1, 3)
  np.testing.assert_allclose(mean[:2], [2.0, 2.0])
  np.testing.assert_allclose(te[0, 0], (5 - 2) / 1.0)
  assert te[0, 1] == 0.0  # Imputed with the train mean.


def test_physionet_server_batch_is_given_to_no_client(shared_data_dir):
  from tff_dp import public_data  # pylint: disable=g-import-not-at-top

  plain = medical.load_physionet2012(shared_data_dir, clients_per_unit=2)
  task = medical.load_physionet2012(
    shared_data_dir, clients_per_unit=2, server_batch_size=356
  )
  assert task.public_x.shape == (len(task.public_y), task.test_x.shape[1])
  assert abs(len(task.public_y) - 356) <= 2  # Stratified, rounded per class.
  assert 0 < task.public_y.sum() < len(task.public_y)
  held = len(task.public_y)
  sizes = task.train_data.client_sizes()
  assert sizes.sum() + held == plain.train_data.client_sizes().sum()
  np.testing.assert_array_equal(task.test_y, plain.test_y)
  cd = task.train_data
  train = np.concatenate([cd.client_arrays(c)[0] for c in cd.client_ids])
  rows = {r.tobytes() for r in train}
  assert not any(r.tobytes() in rows for r in task.public_x)
  x, y = public_data.public_batch(task)
  assert x is task.public_x and y is task.public_y
  with pytest.raises(ValueError, match='server_batch_size > 0'):
    public_data.public_batch(plain)


@pytest.mark.parametrize('size', [-1, 10**6])
def test_physionet_bad_server_batch(shared_data_dir, size):
  with pytest.raises(ValueError, match='server_batch_size must be'):
    medical.load_physionet2012(shared_data_dir, server_batch_size=size)


@pytest.mark.parametrize(
  'value, units',
  [('512x256', (512, 256)), ('64', (64,)), (64, (64,)), ([8, 4], (8, 4))],
)
def test_hidden_units_from(value, units):
  assert medical.hidden_units_from(value) == units


@pytest.mark.parametrize('value', ['', 'x', '64x0', 'wide', 0, [3, -1]])
def test_hidden_units_from_rejects(value):
  with pytest.raises(ValueError, match='hidden_units must be layer sizes'):
    medical.hidden_units_from(value)


def test_physionet_wide_mlp_from_a_task_option(shared_data_dir):
  # Seed 004's medical K (r x n) needs a wider MLP than ours: the runner's
  # --task_option=hidden_units=512x256 reaches the loader as a string.
  from tff_dp import run  # pylint: disable=g-import-not-at-top

  options = dict(run.parse_task_options(['hidden_units=512x256']))
  task = medical.load_physionet2012(shared_data_dir, **options)
  dim = task.test_x.shape[1]
  assert task.num_parameters() == dim * 512 + 512 + 512 * 256 + 256 + 257


@pytest.fixture
def isolated(tmp_path, monkeypatch):
  """No local copy anywhere, downloads allowed, our cache in tmp."""
  from tff_dp.tasks import data_dir  # pylint: disable=g-import-not-at-top
  from tff_dp.tasks import download  # pylint: disable=g-import-not-at-top

  monkeypatch.setenv(data_dir.CACHE_DIR_ENV, str(tmp_path / 'cache'))
  monkeypatch.delenv(download.NO_DOWNLOAD_ENV, raising=False)
  monkeypatch.setenv('no_proxy', '127.0.0.1,localhost')
  (tmp_path / 'empty').mkdir()
  return tmp_path


def _serve_heart(serve_source, monkeypatch, rows_per_site=12):
  """Serves four tiny `processed.*.data` files in UCI's format."""
  rng = np.random.default_rng(3)
  payloads = {}
  for remote, site in zip(medical.HEART_REMOTE.files, medical.HEART_SITES):
    rows = []
    for i in range(rows_per_site):
      values = [str(int(v)) for v in rng.integers(1, 200, 13)]
      values[4 if site == 'switzerland' else 11] = '?'
      rows.append(','.join(values + [str(i % 3)]))
    payloads[remote.name] = ('\n'.join(rows) + '\n').encode()
  monkeypatch.setattr(
    medical, 'HEART_REMOTE', serve_source(medical.HEART_REMOTE, payloads)
  )


def test_heart_disease_download_builds_the_csv_in_the_cache(
  isolated, local_server, serve_source, monkeypatch
):
  served, _ = local_server
  _serve_heart(serve_source, monkeypatch)
  first_row = (served / 'processed.hungarian.data').read_text().split('\n')[0]
  monkeypatch.setattr(medical, 'HEART_CSV_SHA256', None)
  task = medical.load_heart_disease(isolated / 'empty')
  assert len(task.train_data.client_ids) == 4
  assert int(task.train_data.client_sizes().sum()) + len(task.test_y) == 48
  csv = (isolated / 'cache' / 'heart_disease_4sites.csv').read_text()
  lines = csv.split('\n')
  assert lines[0] == (
    'site,site_id,age,sex,cp,trestbps,chol,fbs,restecg,thalach,exang,'
    'oldpeak,slope,ca,thal,num'
  )
  # Values as in the source text, '?' empty, after the site columns.
  assert lines[13] == 'hungarian,1,' + first_row.replace('?', '')
  assert len(lines) == 1 + 48 + 1 and lines[-1] == ''
  # The UCI files stay in our cache, beside the CSV built from them.
  assert sorted(p.name for p in (isolated / 'cache').iterdir()) == [
    'heart_disease_4sites.csv',
    'uci-heart-disease',
  ]


def test_heart_csv_that_is_not_the_pinned_one_is_refused(
  isolated, serve_source, monkeypatch
):
  from tff_dp.tasks import download  # pylint: disable=g-import-not-at-top

  _serve_heart(serve_source, monkeypatch)
  with pytest.raises(download.DownloadError) as e:
    medical.load_heart_disease(isolated / 'empty')
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(
    'UCI Heart Disease: heart_disease_4sites.csv built from '
    'processed.cleveland.data'
  )
  assert f'not the pinned {medical.HEART_CSV_SHA256}: not cached' in message
  assert not (isolated / 'cache' / 'heart_disease_4sites.csv').exists()


def _serve_physionet(served, base, monkeypatch, sums=None):
  """Serves tiny sets A and B in the challenge's format, with a
  SHA256SUMS.txt (`sums` edits its digests by file name)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import hashlib  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  import tarfile  # pylint: disable=g-import-not-at-top

  record = 1000
  for set_name in ('a', 'b'):
    outcomes = [
      'RecordID,SAPS-I,SOFA,Length_of_stay,Survival,In-hospital_death'
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w:gz') as tar:
      for i in range(3):
        record += 1
        text = (
          'Time,Parameter,Value\n'
          f'00:00,RecordID,{record}\n00:00,Age,{50 + i}\n00:00,Gender,1\n'
          f'00:00,ICUType,{1 + i}\n00:00,Weight,80.5\n'
          '00:07,HR,73\n00:07,Weight,81\n01:30,pH,7.35\n'
        )
        data = text.encode()
        info = tarfile.TarInfo(f'set-{set_name}/{record}.txt')
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        outcomes.append(f'{record},6,1,5,-1,{i % 2}')
    (served / f'set-{set_name}.tar.gz').write_bytes(buf.getvalue())
    (served / f'Outcomes-{set_name}.txt').write_text('\n'.join(outcomes) + '\n')
  lines = []
  for f in medical.PHYSIONET_REMOTE.files:
    digest = hashlib.sha256((served / f.name).read_bytes()).hexdigest()
    if sums is not None:
      digest = sums(f.name, digest)
    if digest is not None:
      lines.append(f'{digest} {f.name}')
  (served / 'SHA256SUMS.txt').write_text('\n'.join(lines) + '\n')
  monkeypatch.setattr(
    medical,
    'PHYSIONET_REMOTE',
    dataclasses.replace(
      medical.PHYSIONET_REMOTE,
      files=tuple(
        dataclasses.replace(f, url=base + f.name)
        for f in medical.PHYSIONET_REMOTE.files
      ),
      sums_url=base + 'SHA256SUMS.txt',
    ),
  )


def test_physionet_download_checks_the_published_sums_and_builds_the_files(
  isolated, local_server, monkeypatch
):
  served, base = local_server
  _serve_physionet(served, base, monkeypatch)
  monkeypatch.setattr(medical, 'PHYSIONET_PATIENTS_SHA256', None)
  monkeypatch.setattr(medical, 'PHYSIONET_SERIES_SHA256', None)
  features, patients = medical.physionet_features(isolated / 'empty')
  assert patients.index.tolist() == [1001, 1002, 1003, 1004, 1005, 1006]
  cache = isolated / 'cache'
  csv = (cache / 'physionet2012_patients.csv').read_text().split('\n')
  # Static descriptors from the first 00:00 lines (Height absent: -1), the
  # outcomes as written.
  assert (
    csv[2] == '1002,a,51,1,-1,2,Cardiac Surgery Recovery Unit,80.5,6,1,5,-1,1'
  )
  assert csv[4].startswith('1004,b,50,')
  with np.load(cache / 'physionet2012_timeseries.npz') as d:
    assert d['param_names'].tolist() == ['HR', 'Weight', 'pH']
    # Every other line, in file order: the later Weight stays a series.
    assert d['record_id'][:3].tolist() == [1001] * 3
    assert d['minute'][:3].tolist() == [7, 7, 90]
    assert d['param'][:3].tolist() == [0, 1, 2]
    assert d['value'][:3].tolist() == [73.0, 81.0, 7.35]
  assert len(features) == 6
  # The challenge files stay in our cache; the sums file does not.
  assert sorted(
    p.name for p in (cache / 'physionet-challenge-2012').iterdir()
  ) == sorted(f.name for f in medical.PHYSIONET_REMOTE.files)


@pytest.mark.parametrize(
  'sums, words',
  [
    (
      lambda name, d: '0' * 64 if name == 'set-b.tar.gz' else d,
      'the downloaded set-b.tar.gz from',
    ),
    (
      lambda name, d: None if name == 'Outcomes-a.txt' else d,
      'lists no SHA-256 for Outcomes-a.txt; nothing downloaded',
    ),
  ],
  ids=['digest_differs', 'not_listed'],
)
def test_physionet_file_not_matching_its_published_sum_is_refused(
  isolated, local_server, monkeypatch, sums, words
):
  from tff_dp.tasks import download  # pylint: disable=g-import-not-at-top

  served, base = local_server
  _serve_physionet(served, base, monkeypatch, sums=sums)
  with pytest.raises(download.DownloadError) as e:
    medical.physionet_features(isolated / 'empty')
  assert '\n' not in str(e.value)
  assert words in str(e.value)
  assert sorted(p.name for p in (isolated / 'cache').iterdir()) == []


def test_uci_files_placed_by_hand_serve_with_downloads_off(
  isolated, local_server, serve_source, monkeypatch
):
  from tff_dp.tasks import download  # pylint: disable=g-import-not-at-top

  served, _ = local_server
  _serve_heart(serve_source, monkeypatch)
  folder = isolated / 'cache' / 'uci-heart-disease'
  folder.mkdir(parents=True)
  for f in medical.HEART_REMOTE.files:
    (folder / f.name).write_bytes((served / f.name).read_bytes())
    (served / f.name).unlink()
  monkeypatch.setenv(download.NO_DOWNLOAD_ENV, '1')
  monkeypatch.setattr(medical, 'HEART_CSV_SHA256', None)
  task = medical.load_heart_disease(isolated / 'empty')
  assert len(task.train_data.client_ids) == 4
  # A file that fails its digest is not used: downloads are off, so it is
  # refused, naming the dataset.
  (isolated / 'cache' / 'heart_disease_4sites.csv').unlink()
  (folder / 'processed.va.data').write_text('1,2\n')
  with pytest.raises(download.DownloadError, match='UCI Heart Disease is not'):
    medical.load_heart_disease(isolated / 'empty')
