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
  from tff_dp.methods import public_data  # pylint: disable=g-import-not-at-top

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
