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

Neither needs a copy by hand: `medical_sources` finds the files above, or
downloads the challenge's and UCI's own files and builds them.

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

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from tff_dp.tasks import client_data as client_data_lib
from tff_dp.tasks import data_dir as data_dir_lib
from tff_dp.tasks import medical_sources as sources
from tff_dp.tasks import metrics as metrics_lib
from tff_dp.tasks import models
from tff_dp.tasks import task as task_lib

LEAKAGE_COLUMNS = ('SAPS-I', 'SOFA', 'Length_of_stay', 'Survival')
_AGGS = ('mean', 'min', 'max', 'last', 'log_count')


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


def physionet_features(data_dir: Optional[data_dir_lib.PathLike] = None):
  """Per-stay features and outcomes of PhysioNet 2012.

  Returns:
    `(features DataFrame indexed by RecordID, patients DataFrame)`.
  """
  pat_path, ts_path = sources.physionet_paths(data_dir)
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
  path = sources.heart_csv_path(data_dir)
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
