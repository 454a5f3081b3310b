import numpy as np
import pytest

from tff_dp.tasks import partition


def _labels(n_per_class=100, classes=10):
  return np.repeat(np.arange(classes), n_per_class)


def _check_disjoint_cover(parts, n):
  allidx = np.concatenate(parts)
  assert len(allidx) == n
  assert len(np.unique(allidx)) == n


def test_iid_sizes_cover_and_determinism():
  parts = partition.iid_partition(1003, 10, seed=3)
  _check_disjoint_cover(parts, 1003)
  assert sorted({len(p) for p in parts}) == [100, 101]
  again = partition.iid_partition(1003, 10, seed=3)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
  other = partition.iid_partition(1003, 10, seed=4)
  assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_labels_per_client_histogram():
  labels = _labels(600)  # 6,000 examples, 10 classes.
  parts = partition.labels_per_client_partition(labels, 600, 5, seed=0)
  _check_disjoint_cover(parts, 6000)
  hist = partition.label_histogram(labels, parts, 10)
  # Every client holds exactly 5 distinct labels ...
  assert np.all((hist > 0).sum(1) == 5)
  # ... every label is held by 600 * 5 / 10 = 300 clients ...
  assert np.all((hist > 0).sum(0) == 300)
  # ... with 600 / 300 = 2 examples of it each, so 10 examples per client.
  assert set(hist[hist > 0].ravel()) == {2}
  again = partition.labels_per_client_partition(labels, 600, 5, seed=0)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_labels_per_client_uneven_counts():
  labels = _labels(7, classes=3)
  parts = partition.labels_per_client_partition(labels, 4, 2, seed=1)
  _check_disjoint_cover(parts, 21)
  hist = partition.label_histogram(labels, parts, 3)
  assert np.all((hist > 0).sum(1) == 2)
  held = (hist > 0).sum(0)
  assert held.sum() == 8 and held.max() - held.min() <= 1


def test_dirichlet_cover_determinism_and_skew():
  labels = _labels(500)
  parts = partition.dirichlet_partition(labels, 20, 0.1, seed=0)
  _check_disjoint_cover(parts, 5000)
  again = partition.dirichlet_partition(labels, 20, 0.1, seed=0)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))

  def dominant_fraction(alpha):
    p = partition.dirichlet_partition(labels, 20, alpha, seed=0)
    hist = partition.label_histogram(labels, p, 10)
    return np.mean(hist.max(1) / hist.sum(1))

  skewed, near_iid = dominant_fraction(0.1), dominant_fraction(100.0)
  assert skewed > 0.5  # Most of a client's data is one class.
  assert near_iid < 0.2  # Close to the uniform 0.1.
  # Class totals are preserved exactly.
  hist = partition.label_histogram(labels, parts, 10)
  assert np.all(hist.sum(0) == 500)


def test_dirichlet_min_examples():
  labels = _labels(100)
  parts = partition.dirichlet_partition(
    labels, 10, 0.5, seed=1, min_examples_per_client=20
  )
  assert min(len(p) for p in parts) >= 20
  with pytest.raises(ValueError, match='No Dirichlet'):
    partition.dirichlet_partition(
      labels, 50, 0.01, seed=1, min_examples_per_client=19, max_attempts=3
    )


@pytest.mark.parametrize('alpha', [0.0, -1.0, float('nan'), float('inf')])
def test_dirichlet_rejects_bad_alpha(alpha):
  with pytest.raises(ValueError, match=r'alpha must be a finite number > 0'):
    partition.dirichlet_partition(_labels(), 10, alpha, seed=0)


@pytest.mark.parametrize(
  'fn',
  [
    lambda n: partition.iid_partition(100, n, 0),
    lambda n: partition.labels_per_client_partition(_labels(10), n, 2, 0),
    lambda n: partition.dirichlet_partition(_labels(10), n, 1.0, 0),
  ],
)
@pytest.mark.parametrize('num_clients', [0, -3])
def test_rejects_zero_clients(fn, num_clients):
  with pytest.raises(ValueError, match=r'num_clients must be an integer >= 1'):
    fn(num_clients)


def test_rejects_more_clients_than_examples():
  with pytest.raises(ValueError, match='at most the number of examples'):
    partition.iid_partition(5, 6, 0)


@pytest.mark.parametrize('lpc', [0, 11, 2.5])
def test_labels_per_client_out_of_range(lpc):
  with pytest.raises(
    ValueError,
    match=r'labels_per_client must be an integer ' r'in \[1, 10\].*Found',
  ):
    partition.labels_per_client_partition(_labels(), 10, lpc, 0)


def test_class_balanced_overlapping_clients_have_every_class_and_overlap():
  labels = np.repeat(np.arange(10), 60)
  parts = partition.class_balanced_overlapping_partition(
    labels, num_clients=30, per_class=5, seed=0
  )
  assert len(parts) == 30
  hist = partition.label_histogram(labels, parts, 10)
  np.testing.assert_array_equal(hist, np.full((30, 10), 5))
  for p in parts:
    assert len(np.unique(p)) == len(p) == 50  # No repeat within a client.
  # 30 clients x 50 from 600 examples: clients share examples.
  assert len(np.unique(np.concatenate(parts))) < 30 * 50
  again = partition.class_balanced_overlapping_partition(labels, 30, 5, 0)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))


@pytest.mark.parametrize('per_class', [0, 61, 2.5])
def test_class_balanced_overlapping_names_a_bad_per_class(per_class):
  labels = np.repeat(np.arange(10), 60)
  with pytest.raises(ValueError, match=r'per_class must be .* \[1, 60\]'):
    partition.class_balanced_overlapping_partition(labels, 3, per_class, 0)


def test_dominant_classes_counts_balance_and_no_overlap():
  labels = np.repeat(np.arange(10), 500)
  parts = partition.dominant_classes_partition(
    labels, 20, seed=1, dominant_count=23, other_count=1
  )
  hist = partition.label_histogram(labels, parts, 10)
  for row in hist:
    assert sorted(row) == [1] * 8 + [23] * 2
  # Each class is dominant on 20 * 2 / 10 = 4 clients.
  np.testing.assert_array_equal((hist == 23).sum(axis=0), np.full(10, 4))
  everything = np.concatenate(parts)
  assert len(np.unique(everything)) == len(everything) == 20 * (2 * 23 + 8)


def test_dominant_classes_names_how_many_clients_fit():
  labels = np.repeat(np.arange(10), 100)
  # The paper's counts need 500 examples a client: 1,000 hold at most 2.
  with pytest.raises(ValueError, match=r'num_clients=5 does not fit.*about 2'):
    partition.dominant_classes_partition(labels, 5, seed=0)
  with pytest.raises(ValueError, match=r'dominant_classes must be in \[1, 9\]'):
    partition.dominant_classes_partition(labels, 1, 0, dominant_classes=10)
