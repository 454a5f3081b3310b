"""The medical tasks' files downloaded from a local server on 127.0.0.1 and
built (`local_server`, `serve_source`: tests/conftest.py)."""

import numpy as np
import pytest

from tff_dp.tasks import medical
from tff_dp.tasks import medical_sources as sources


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
  for remote, site in zip(sources.HEART_REMOTE.files, sources.HEART_SITES):
    rows = []
    for i in range(rows_per_site):
      values = [str(int(v)) for v in rng.integers(1, 200, 13)]
      values[4 if site == 'switzerland' else 11] = '?'
      rows.append(','.join(values + [str(i % 3)]))
    payloads[remote.name] = ('\n'.join(rows) + '\n').encode()
  monkeypatch.setattr(
    sources, 'HEART_REMOTE', serve_source(sources.HEART_REMOTE, payloads)
  )


def test_heart_disease_download_builds_the_csv_in_the_cache(
  isolated, local_server, serve_source, monkeypatch
):
  served, _ = local_server
  _serve_heart(serve_source, monkeypatch)
  first_row = (served / 'processed.hungarian.data').read_text().split('\n')[0]
  monkeypatch.setattr(sources, 'HEART_CSV_SHA256', None)
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
  assert f'not the pinned {sources.HEART_CSV_SHA256}: not cached' in message
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
  for f in sources.PHYSIONET_REMOTE.files:
    digest = hashlib.sha256((served / f.name).read_bytes()).hexdigest()
    if sums is not None:
      digest = sums(f.name, digest)
    if digest is not None:
      lines.append(f'{digest} {f.name}')
  (served / 'SHA256SUMS.txt').write_text('\n'.join(lines) + '\n')
  monkeypatch.setattr(
    sources,
    'PHYSIONET_REMOTE',
    dataclasses.replace(
      sources.PHYSIONET_REMOTE,
      files=tuple(
        dataclasses.replace(f, url=base + f.name)
        for f in sources.PHYSIONET_REMOTE.files
      ),
      sums_url=base + 'SHA256SUMS.txt',
    ),
  )


def test_physionet_download_checks_the_published_sums_and_builds_the_files(
  isolated, local_server, monkeypatch
):
  served, base = local_server
  _serve_physionet(served, base, monkeypatch)
  monkeypatch.setattr(sources, 'PHYSIONET_PATIENTS_SHA256', None)
  monkeypatch.setattr(sources, 'PHYSIONET_SERIES_SHA256', None)
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
  ) == sorted(f.name for f in sources.PHYSIONET_REMOTE.files)


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
  for f in sources.HEART_REMOTE.files:
    (folder / f.name).write_bytes((served / f.name).read_bytes())
    (served / f.name).unlink()
  monkeypatch.setenv(download.NO_DOWNLOAD_ENV, '1')
  monkeypatch.setattr(sources, 'HEART_CSV_SHA256', None)
  task = medical.load_heart_disease(isolated / 'empty')
  assert len(task.train_data.client_ids) == 4
  # A file that fails its digest is not used: downloads are off, so it is
  # refused, naming the dataset.
  (isolated / 'cache' / 'heart_disease_4sites.csv').unlink()
  (folder / 'processed.va.data').write_text('1,2\n')
  with pytest.raises(download.DownloadError, match='UCI Heart Disease is not'):
    medical.load_heart_disease(isolated / 'empty')
