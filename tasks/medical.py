"""Tabular in-hospital mortality tasks (Kerkouche et al.'s medical setting).

Kerkouche et al. 2021 use the Premier Healthcare Database, which is not
public; we use two public stand-ins, both federated by their natural sites:

* **PhysioNet/CinC 2012** (`physionet2012_patients.csv` and
  `physionet2012_timeseries.npz`): 8,000 ICU stays, target
  `In-hospital_death`; one client per ICU type (4 units), optionally split
  into `clients_per_unit` clients each. Features per stay, from the first
  48 h: the static descriptors Age, Gender, Height, Weight (at admission),
  and for each of the 37 time series its mean, min, max, last value and
  log(1 + number of measurements). Negative raw values (source errors and -1
  placeholders) count as missing. Leakage columns (SAPS-I, SOFA,
  Length_of_stay, Survival) and the client key ICUType are never features.
* **UCI Heart Disease** (`heart_disease_4sites.csv`): 920 patients at 4
  hospitals, target `num > 0`; one client per hospital. Numeric attributes
  (a `chol` of 0 counts as missing) and one-hot `cp`, `restecg`, `slope`,
  `thal`.

Neither needs a copy by hand: when the data directory and our cache
(`$TFF_DP_CACHE_DIR`) hold no copy, the challenge's sets A and B with their
outcomes (checked against PhysioNet's published SHA256SUMS.txt) and UCI's
four `processed.*.data` files (SHA-256 pinned) are downloaded into our cache
(`download`) and built into the files above, each build pinned to the data
README's copy (`PHYSIONET_PATIENTS_SHA256`, `PHYSIONET_SERIES_SHA256`,
`HEART_CSV_SHA256`).

Each site's stays are split into train and test (stratified by outcome,
seeded). With `server_batch_size` > 0, that many training patients (drawn
stratified by outcome over all sites, seeded) are held out as the server's
batch (`task.public_x`, Kerkouche et al.'s 356 server-held patients) and
given to no client. Missing values are imputed with the training mean and
flagged with an indicator column; every feature is standardised with
statistics fitted on the training clients only. The model is an MLP with
one logit; the loss weights positives by negatives/positives of the
training data; metrics are balanced accuracy (threshold 0) and AUROC.
"""

import hashlib
import io
import pathlib
import tarfile
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from tff_dp.tasks import client_data as client_data_lib
from tff_dp.tasks import data_dir as data_dir_lib
from tff_dp.tasks import download
from tff_dp.tasks import metrics as metrics_lib
from tff_dp.tasks import models
from tff_dp.tasks import task as task_lib

LEAKAGE_COLUMNS = ('SAPS-I', 'SOFA', 'Length_of_stay', 'Survival')
_HEART_SOURCE = (
  'UCI Heart Disease (Janosi, Steinbrunn, Pfisterer, Detrano '
  '1988), processed.{cleveland,hungarian,switzerland,va}.data, '
  'as heart_disease_4sites.csv with a site column.'
)
_AGGS = ('mean', 'min', 'max', 'last', 'log_count')

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


def _stratified_split(
  y: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> np.ndarray:
  """Boolean test mask with `test_fraction` of each class (rounded)."""
  test = np.zeros(len(y), bool)
  for cls in np.unique(y):
    idx = rng.permutation(np.flatnonzero(y == cls))
    test[idx[: int(round(test_fraction * len(idx)))]] = True
  return test


def _check_fraction(test_fraction: float) -> None:
  if not 0 < test_fraction < 1:
    raise ValueError(
      f'test_fraction must be in (0, 1). Found {test_fraction!r}.'
    )


def standardize(train: np.ndarray, test: np.ndarray):
  """Imputes NaNs with the train mean, adds indicators, standardises.

  Statistics come from `train` only. Indicator columns are added for every
  column with a NaN in `train` or `test`. Constant columns get std 1.

  Returns:
    `(train, test, mean, std)` float32, the indicators appended.
  """
  missing = np.isnan(train).any(0) | np.isnan(test).any(0)
  ind_tr = np.isnan(train[:, missing]).astype(np.float64)
  ind_te = np.isnan(test[:, missing]).astype(np.float64)
  train = np.concatenate([train, ind_tr], 1)
  test = np.concatenate([test, ind_te], 1)
  all_nan = np.isnan(train).all(0)
  mean = np.nanmean(np.where(all_nan, 0.0, train), 0)
  train = np.where(np.isnan(train), mean, train)
  test = np.where(np.isnan(test), mean, test)
  std = train.std(0)
  std = np.where(std > 1e-12, std, 1.0)
  return (
    ((train - mean) / std).astype(np.float32),
    ((test - mean) / std).astype(np.float32),
    mean,
    std,
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


def _physionet_paths(data_dir) -> tuple[pathlib.Path, pathlib.Path]:
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


def physionet_features(data_dir: Optional[data_dir_lib.PathLike] = None):
  """Per-stay features and outcomes of PhysioNet 2012.

  Returns:
    `(features DataFrame indexed by RecordID, patients DataFrame)`.
  """
  pat_path, ts_path = _physionet_paths(data_dir)
  data_dir_lib.record_read('PhysioNet 2012', [pat_path, ts_path])
  patients = pd.read_csv(pat_path).set_index('RecordID')
  with np.load(ts_path) as d:
    names = [str(n) for n in d['param_names']]
    ts = pd.DataFrame(
      {
        'record': d['record_id'],
        'minute': d['minute'],
        'param': d['param'],
        'value': d['value'],
      }
    )
  ts = ts[(ts['value'] >= 0) & (ts['minute'] <= 48 * 60)]
  ts = ts.sort_values(['record', 'param', 'minute'], kind='stable')
  grouped = ts.groupby(['record', 'param'])['value']
  agg = pd.DataFrame(
    {
      'mean': grouped.mean(),
      'min': grouped.min(),
      'max': grouped.max(),
      'last': grouped.last(),
      'log_count': np.log1p(grouped.size()),
    }
  )
  wide = agg.unstack('param')
  wide.columns = [f'{names[p]}_{a}' for a, p in wide.columns]
  wide = wide.reindex(
    index=patients.index, columns=[f'{n}_{a}' for n in names for a in _AGGS]
  )
  for n in names:  # No measurement at all: count is 0, the rest missing.
    wide[f'{n}_log_count'] = wide[f'{n}_log_count'].fillna(0.0)
  static = patients[['Age', 'Gender', 'Height', 'Weight']].astype(float)
  static = static.where(static >= 0)  # -1 = missing in the source.
  static.columns = [f'static_{c}' for c in static.columns]
  features = pd.concat([static, wide], axis=1)
  assert not set(LEAKAGE_COLUMNS) & set(features.columns)
  return features, patients


def _tabular_task(
  name,
  x,
  y,
  site,
  site_names,
  clients_per_site,
  test_fraction,
  seed,
  hidden_units,
  model_seed,
  description,
  feature_names,
  server_batch_size=0,
):
  hidden_units = hidden_units_from(hidden_units)
  rng = np.random.default_rng(seed)
  test = np.zeros(len(y), bool)
  for s in np.unique(site):
    rows = np.flatnonzero(site == s)
    test[rows] = _stratified_split(y[rows], test_fraction, rng)
  x_tr, y_tr, site_tr = x[~test], y[~test], site[~test]
  x_te, y_te = x[test], y[test]
  public_x = public_y = None
  num_public = 0
  if server_batch_size:
    if server_batch_size >= len(y_tr):
      raise ValueError(
        f'server_batch_size must be in [0, {len(y_tr) - 1}] (the training '
        f'patients). Found {server_batch_size!r}.'
      )
    held = _stratified_split(y_tr, server_batch_size / len(y_tr), rng)
    public_x, public_y = x_tr[held], y_tr[held].astype(np.int32)
    x_tr, y_tr, site_tr = x_tr[~held], y_tr[~held], site_tr[~held]
    x_te = np.concatenate([x_te, public_x])
    num_public = len(public_y)
  # Statistics from the clients' training data only.
  x_tr, x_te, _, _ = standardize(x_tr, x_te)
  if num_public:
    x_te, public_x = x_te[:-num_public], x_te[-num_public:]
  parts, ids = [], []
  for s in np.unique(site_tr):
    rows = rng.permutation(np.flatnonzero(site_tr == s))
    for k, chunk in enumerate(np.array_split(rows, clients_per_site)):
      parts.append(np.sort(chunk))
      ids.append(
        site_names[s] if clients_per_site == 1 else f'{site_names[s]}/{k}'
      )
  pos = max(int(y_tr.sum()), 1)
  pos_weight = (len(y_tr) - pos) / pos
  dim = x_tr.shape[1]
  train = client_data_lib.ArrayClientData(
    x_tr,
    y_tr.astype(np.int32),
    parts,
    client_ids=ids,
    element_fn=client_data_lib.float_features,
  )
  return task_lib.FederatedTask(
    name=name,
    train_data=train,
    test_x=x_te,
    test_y=y_te.astype(np.int32),
    model_builder=lambda: models.create_mlp(dim, 1, hidden_units, model_seed),
    loss_builder=lambda: metrics_lib.WeightedBinaryCrossentropy(pos_weight),
    metrics_builder=metrics_lib.binary_metrics,
    num_classes=1,
    description=(
      f'{description}: {len(ids)} clients, {len(y_tr)} train / '
      f'{len(y_te)} test, {dim} features'
      + (f', {len(public_y)} server-held' if public_y is not None else '')
    ),
    feature_names=tuple(feature_names),
    public_x=public_x,
    public_y=public_y,
    # One client per site: its held-out patients are the site's own data.
    test_held_by_clients=(clients_per_site == 1),
  )


def hidden_units_from(value) -> tuple[int, ...]:
  """MLP hidden sizes from a sequence, an int or a string like '512x256'.

  The string form is what `--task_option=hidden_units=512x256` passes.
  """
  if isinstance(value, str):
    parts = value.split('x')
  elif isinstance(value, (int, np.integer)):
    parts = [value]
  else:
    parts = list(value)
  try:
    units = tuple(int(u) for u in parts)
  except (TypeError, ValueError):
    units = ()
  if not units or any(u < 1 for u in units):
    raise ValueError(
      'hidden_units must be layer sizes >= 1, e.g. (64, 32) or "64x32". '
      f'Found {value!r}.'
    )
  return units


def _check_common(
  clients_per_site: int, test_fraction: float, server_batch_size: int = 0
) -> None:
  if (
    not isinstance(server_batch_size, (int, np.integer))
    or server_batch_size < 0
  ):
    raise ValueError(
      'server_batch_size must be an integer >= 0. Found '
      f'{server_batch_size!r}.'
    )
  if (
    not isinstance(clients_per_site, (int, np.integer)) or clients_per_site < 1
  ):
    raise ValueError(
      'clients_per_unit must be an integer >= 1. Found '
      f'{clients_per_site!r}.'
    )
  _check_fraction(test_fraction)


def load_physionet2012(
  data_dir: Optional[data_dir_lib.PathLike] = None,
  *,
  clients_per_unit: int = 1,
  test_fraction: float = 0.2,
  split_seed: int = 0,
  hidden_units: Sequence[int] = (64, 32),
  model_seed: int = 0,
  server_batch_size: int = 0,
) -> task_lib.FederatedTask:
  """PhysioNet 2012 in-hospital mortality, one client per ICU unit.

  Args:
    data_dir: Data directory (see `tff_dp.tasks.data_dir`).
    clients_per_unit: Split each unit's training stays into this many
      clients (random, equal sizes), >= 1.
    test_fraction: Fraction of each unit's stays held out for testing,
      stratified by outcome, in (0, 1).
    split_seed: Seed of the train/test and client splits.
    hidden_units: MLP hidden layer sizes (or a string like '512x256').
    model_seed: Seed of the initial weights.
    server_batch_size: Training patients held out as the server's batch
      (`task.public_x`), >= 0.
  """
  _check_common(clients_per_unit, test_fraction, server_batch_size)
  features, patients = physionet_features(data_dir)
  x = features.to_numpy(np.float64)
  y = patients['In-hospital_death'].to_numpy(np.int64)
  site = patients['ICUType'].to_numpy(np.int64) - 1
  site_names = ['coronary_care', 'cardiac_surgery', 'medical', 'surgical']
  return _tabular_task(
    'physionet2012',
    x,
    y,
    site,
    site_names,
    clients_per_unit,
    test_fraction,
    split_seed,
    hidden_units,
    model_seed,
    'PhysioNet 2012 in-hospital mortality by ICU unit',
    list(features.columns),
    server_batch_size,
  )


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


def _heart_csv_path(data_dir):
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


def load_heart_disease(
  data_dir: Optional[data_dir_lib.PathLike] = None,
  *,
  test_fraction: float = 0.25,
  split_seed: int = 0,
  hidden_units: Sequence[int] = (32,),
  model_seed: int = 0,
  server_batch_size: int = 0,
  clients_per_unit: int = 1,
) -> task_lib.FederatedTask:
  """UCI heart disease (num > 0), one client per hospital (4 clients).

  `server_batch_size` training patients (stratified) are held out as the
  server's batch, as for PhysioNet. `clients_per_unit` splits each
  hospital's training patients into that many clients (its held-out
  patients then belong to no client).
  """
  _check_common(clients_per_unit, test_fraction, server_batch_size)
  path = _heart_csv_path(data_dir)
  data_dir_lib.record_read('UCI heart disease', [path])
  df = pd.read_csv(path)
  df.loc[df['chol'] == 0, 'chol'] = np.nan
  numeric = [
    'age',
    'sex',
    'trestbps',
    'chol',
    'fbs',
    'thalach',
    'exang',
    'oldpeak',
    'ca',
  ]
  categorical = {
    'cp': [1, 2, 3, 4],
    'restecg': [0, 1, 2],
    'slope': [1, 2, 3],
    'thal': [3, 6, 7],
  }
  cols = [df[numeric].astype(float)]
  for c, values in categorical.items():
    onehot = pd.DataFrame(
      {f'{c}={v}': (df[c] == v).astype(float) for v in values}
    )
    onehot[df[c].isna()] = np.nan  # Missing stays missing (gets indicator).
    cols.append(onehot)
  feats = pd.concat(cols, axis=1)
  site_names = (
    df.drop_duplicates('site_id').sort_values('site_id')['site'].tolist()
  )
  return _tabular_task(
    'heart_disease',
    feats.to_numpy(np.float64),
    (df['num'] > 0).to_numpy(np.int64),
    df['site_id'].to_numpy(np.int64),
    site_names,
    clients_per_unit,
    test_fraction,
    split_seed,
    hidden_units,
    model_seed,
    'UCI heart disease by hospital',
    list(feats.columns),
    server_batch_size,
  )
