"""Where the medical tasks' files come from: found, or downloaded and built.

`medical` reads `physionet2012_patients.csv` with
`physionet2012_timeseries.npz`, and `heart_disease_4sites.csv`. When the
data directory and our cache (`$TFF_DP_CACHE_DIR`) hold no copy, the
challenge's sets A and B with their outcomes (checked against PhysioNet's
published SHA256SUMS.txt) and UCI's four `processed.*.data` files (SHA-256
pinned) are downloaded into our cache (`download`) and built into those
files, each build pinned to the data README's copy
(`PHYSIONET_PATIENTS_SHA256`, `PHYSIONET_SERIES_SHA256`,
`HEART_CSV_SHA256`).
"""

import hashlib
import io
import pathlib
import tarfile

import numpy as np

from tff_dp.tasks import data_dir as data_dir_lib
from tff_dp.tasks import download

_HEART_SOURCE = (
  'UCI Heart Disease (Janosi, Steinbrunn, Pfisterer, Detrano '
  '1988), processed.{cleveland,hungarian,switzerland,va}.data, '
  'as heart_disease_4sites.csv with a site column.'
)
_PHYSIONET = 'https://physionet.org/files/challenge-2012/1.0.0/'
# The challenge's training sets A and B with their outcomes. PhysioNet
# publishes each file's SHA-256 in the project's SHA256SUMS.txt, read at
# download time; the files built from them are pinned below.
PHYSIONET_REMOTE = download.Source(
  dataset='PhysioNet/CinC Challenge 2012',
  files=tuple(
    download.RemoteFile(name, _PHYSIONET + name, '', 'sha256', None)
    for name in (
      'set-a.tar.gz',
      'set-b.tar.gz',
      'Outcomes-a.txt',
      'Outcomes-b.txt',
    )
  ),
  folder='physionet-challenge-2012',
  root='tff_dp',
  sums_url=_PHYSIONET + 'SHA256SUMS.txt',
)
# physionet2012_patients.csv and the arrays of physionet2012_timeseries.npz
# (`arrays_sha256`) as `physionet_files` builds them from those files:
# exactly the data README's copies.
PHYSIONET_PATIENTS_SHA256 = (
  '0ed32e815a03919310134c752069691301baaf8f594eb29c8291d97821f2fe3a'
)
PHYSIONET_SERIES_SHA256 = (
  'd0af00d9d43431f84620a4e65c9f86382a6aef0ff217f461f339090c8003d281'
)
_STATIC = ('RecordID', 'Age', 'Gender', 'Height', 'ICUType', 'Weight')
ICU_TYPES = {
  '1': 'Coronary Care Unit',
  '2': 'Cardiac Surgery Recovery Unit',
  '3': 'Medical ICU',
  '4': 'Surgical ICU',
}
_PATIENT_COLUMNS = (
  'RecordID,set,Age,Gender,Height,ICUType,ICUType_name,Weight,SAPS-I,SOFA,'
  'Length_of_stay,Survival,In-hospital_death'
).split(',')

HEART_SITES = ('cleveland', 'hungarian', 'switzerland', 'va')
HEART_COLUMNS = (
  'age,sex,cp,trestbps,chol,fbs,restecg,thalach,exang,oldpeak,slope,ca,thal,'
  'num'
).split(',')
_UCI_HEART = (
  'https://archive.ics.uci.edu/ml/machine-learning-databases/heart-disease/'
)
# UCI publishes no digest: these SHA-256s are of the four files at UCI's
# canonical sizes (18,461, 10,263, 4,109 and 6,737 bytes), as copied
# byte-identical in several public repositories (data README).
HEART_REMOTE = download.Source(
  dataset='UCI Heart Disease',
  files=tuple(
    download.RemoteFile(
      f'processed.{site}.data',
      f'{_UCI_HEART}processed.{site}.data',
      digest,
      'sha256',
      size,
    )
    for site, digest, size in (
      (
        'cleveland',
        'a74b7efa387bc9d108d7d0115d831fe9b414b29ae7124f331b622b4efa0427c8',
        18461,
      ),
      (
        'hungarian',
        'd1ad108f785768cd3d7e82dc522e6f5a61eea93cccfb3a46ee8076f73fc3d796',
        10263,
      ),
      (
        'switzerland',
        '834a405ccf5b66ab4056bb77794adc8df0b7125186454c0a1d002d33c6c3b314',
        4109,
      ),
      (
        'va',
        'e7c93d8d0d2acdadfa4c5e8de768e2191e7f618b952e29623f1f0d5949ff6b8f',
        6737,
      ),
    )
  ),
  folder='uci-heart-disease',
  root='tff_dp',
)
# heart_disease_4sites.csv as `heart_csv` builds it from those four files:
# byte for byte the data README's copy.
HEART_CSV_SHA256 = (
  '19ff3923402938926357935efa2dc94bdb2b574efb16498480f537bb87dff2f5'
)


def arrays_sha256(arrays: dict) -> str:
  """SHA-256 of named arrays: names, dtypes, shapes and bytes, by name."""
  digest = hashlib.sha256()
  for name in sorted(arrays):
    a = np.ascontiguousarray(arrays[name])
    digest.update(f'{name}:{a.dtype.str}:{a.shape};'.encode())
    digest.update(a.tobytes())
  return digest.hexdigest()


def physionet_files(folder: pathlib.Path) -> tuple[bytes, dict]:
  """`(physionet2012_patients.csv, physionet2012_timeseries arrays)` from
  the challenge's `set-{a,b}.tar.gz` and `Outcomes-{a,b}.txt` in `folder`.

  As the data README describes them: one CSV row per stay, in the outcome
  files' order, with the first 00:00 line of each static descriptor (`-1`
  when absent) and the outcomes as written; every other measurement line in
  long format, in file order (minutes since admission, an index into the
  sorted parameter names, the value as a float).
  """
  stays = []
  names = set()
  for set_name in ('a', 'b'):
    outcome_lines = (folder / f'Outcomes-{set_name}.txt').read_text()
    header, *lines = (l for l in outcome_lines.splitlines() if l.strip())
    # Read in the archive's order: a gzip stream cannot seek back cheaply.
    with tarfile.open(folder / f'set-{set_name}.tar.gz', 'r:gz') as tar:
      records = {
        pathlib.PurePosixPath(m.name).stem: tar.extractfile(m).read().decode()
        for m in tar
        if m.isfile() and m.name.endswith('.txt')
      }
    for line in lines:
      outcome = dict(zip(header.split(','), line.split(',')))
      text = records[outcome['RecordID']]
      static, series = {}, []
      for row in text.splitlines()[1:]:
        if not row.strip():
          continue
        time, param, value = row.split(',')
        if time == '00:00' and param in _STATIC and param not in static:
          static[param] = value
          continue
        hours, minutes = time.split(':')
        series.append((60 * int(hours) + int(minutes), param, float(value)))
        names.add(param)
      stays.append((set_name, outcome, static, series))
  names = sorted(names)
  index = {n: i for i, n in enumerate(names)}
  csv_lines = [','.join(_PATIENT_COLUMNS)]
  columns = {k: [] for k in ('record_id', 'minute', 'param', 'value')}
  for set_name, outcome, static, series in stays:
    values = [outcome['RecordID'], set_name]
    values += [static.get(k, '-1') for k in ('Age', 'Gender', 'Height')]
    values += [static['ICUType'], ICU_TYPES[static['ICUType']]]
    values += [static.get('Weight', '-1')]
    values += [outcome[c] for c in _PATIENT_COLUMNS[8:]]
    csv_lines.append(','.join(values))
    for minute, param, value in series:
      columns['record_id'].append(int(outcome['RecordID']))
      columns['minute'].append(minute)
      columns['param'].append(index[param])
      columns['value'].append(value)
  arrays = {
    'record_id': np.array(columns['record_id'], np.int32),
    'minute': np.array(columns['minute'], np.int16),
    'param': np.array(columns['param'], np.uint8),
    'value': np.array(columns['value'], np.float64),
    'param_names': np.array(names),
  }
  return ''.join(l + '\n' for l in csv_lines).encode(), arrays


def physionet_paths(data_dir) -> tuple[pathlib.Path, pathlib.Path]:
  """The two files: found (data directory, then our cache), else built
  from the challenge files, downloaded when missing."""
  cache = data_dir_lib.resolve_cache_dir()
  names = ('physionet2012_patients.csv', 'physionet2012_timeseries.npz')
  tried = []
  for directory in (data_dir_lib.resolve_data_dir(data_dir), cache):
    tried += [str(directory / n) for n in names]
    if all((directory / n).exists() for n in names):
      return directory / names[0], directory / names[1]
  folder = download.fetch(PHYSIONET_REMOTE, tried)
  csv, arrays = physionet_files(folder)
  made_from = f'the challenge files in {folder}'
  got = arrays_sha256(arrays)
  if PHYSIONET_SERIES_SHA256 is not None and got != PHYSIONET_SERIES_SHA256:
    raise download.DownloadError(
      f'{PHYSIONET_REMOTE.dataset}: the time series built from {made_from} '
      f'have SHA-256 {got}, not the pinned {PHYSIONET_SERIES_SHA256}: not '
      'cached.'
    )
  patients = download.write_derived(
    cache / names[0],
    csv,
    PHYSIONET_PATIENTS_SHA256,
    PHYSIONET_REMOTE.dataset,
    made_from,
  )
  buffer = io.BytesIO()
  np.savez_compressed(buffer, **arrays)
  series = download.write_derived(
    cache / names[1],
    buffer.getvalue(),
    None,  # Pinned above, by its arrays (a zip's bytes carry times).
    PHYSIONET_REMOTE.dataset,
    made_from,
  )
  return patients, series


def heart_csv(folder) -> bytes:
  """`heart_disease_4sites.csv` from UCI's four `processed.*.data` files.

  Columns `site`, `site_id` (0-3, in `HEART_SITES` order), then
  `HEART_COLUMNS`; values as in the source text, `?` (missing) empty.
  """
  lines = [','.join(['site', 'site_id'] + HEART_COLUMNS)]
  for site_id, site in enumerate(HEART_SITES):
    text = (folder / f'processed.{site}.data').read_text()
    for line in text.splitlines():
      if not line.strip():
        continue
      values = ['' if v == '?' else v for v in line.strip().split(',')]
      if len(values) != len(HEART_COLUMNS):
        raise ValueError(
          f'processed.{site}.data: a row of {len(values)} values, expected '
          f'{len(HEART_COLUMNS)}. Found {line!r}.'
        )
      lines.append(','.join([site, str(site_id)] + values))
  return ''.join(line + '\n' for line in lines).encode()


def heart_csv_path(data_dir):
  """The CSV: found (data directory, then our cache), else built from
  UCI's files, downloaded when missing."""
  cache = data_dir_lib.resolve_cache_dir()
  try:
    return data_dir_lib.find_file(
      data_dir,
      ['heart_disease_4sites.csv'],
      source_hint=_HEART_SOURCE,
      extra_dirs=(cache,),
    )
  except data_dir_lib.DataNotFoundError as error:
    folder = download.fetch(HEART_REMOTE, error.tried)
  return download.write_derived(
    cache / 'heart_disease_4sites.csv',
    heart_csv(folder),
    HEART_CSV_SHA256,
    HEART_REMOTE.dataset,
    f'{", ".join(f.name for f in HEART_REMOTE.files)} in {folder}',
  )
