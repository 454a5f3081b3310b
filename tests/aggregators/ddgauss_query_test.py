"""DDGauss's noise: the discrete Gaussian sampler, the nonces and the query."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import ddgauss_query


@pytest.fixture(scope='module')
def context():
  contexts.set_simulation_context()


def _client_noise(query, clients):
  """Each client's noised record of zeros (int32[1000]), as returned."""
  spec = tff.TensorType(np.int32, [1000])

  @tff.tensorflow.computation(spec)
  def client(record):
    params = query.derive_sample_params(query.initial_global_state())
    return query.preprocess_record(params, record)

  @tff.federated_computation(tff.FederatedType(spec, tff.CLIENTS))
  def noised(records):
    return tff.federated_map(client, records)

  return noised([np.zeros(1000, np.int32)] * clients)


def test_identical_clients_get_distinct_noise(context):
  # Two clients of one round, identical records, one state seed: each
  # folds in its own nonce, so their noise differs.
  query = ddgauss_query.SeededDiscreteGaussianSumQuery(1e9, 100, (3, 4))
  first, second = _client_noise(query, 2)
  assert not np.array_equal(first, second)
  # Independent, not merely different: the two clients' noise is
  # uncorrelated (|r| < 4 / sqrt(1000) at 4 standard errors).
  assert abs(np.corrcoef(first, second)[0, 1]) < 4 / np.sqrt(1000)
  # Each is N_Z(0, 100^2) noise (1,000 draws: the std's standard error is
  # 2.2%; 10% is 4.5 of them).
  for noise in (first, second):
    assert np.std(noise) == pytest.approx(100, rel=0.1)


def test_noise_is_a_function_of_the_seed_and_the_client_nonce(
  context, monkeypatch
):
  # With the clients' nonce fixed, a client's noise is a function of the
  # state's seed: the same seed gives bit-identical noise, another seed
  # other noise. (A whole round also depends on TFF's rotation seed and
  # rounding draws, which are not privacy noise.)
  monkeypatch.setattr(
    ddgauss_query, '_client_nonce', lambda: tf.constant([11, 12], tf.int64)
  )

  def noise(seed):
    (out,) = _client_noise(
      ddgauss_query.SeededDiscreteGaussianSumQuery(1e9, 100, seed), 1
    )
    return out

  np.testing.assert_array_equal(noise((7, 0)), noise((7, 0)))
  assert not np.array_equal(noise((7, 0)), noise((8, 0)))
  # The factory's seed: noise_seed as given, else a fresh 128-bit secret
  # for every factory.
  seeds = [
    ddgauss.ddgauss_mean(1.0, 2, 1.0, min_clients=2, noise_seed=s)._seed
    for s in (7, 7, None, None)
  ]
  assert seeds[0] == seeds[1] == (7, 0)
  assert seeds[2] != seeds[3]


def test_sampler_is_the_discrete_gaussian_and_stateless():
  seed = tf.constant([21, 22], tf.int64)
  draws = ddgauss_query.sample_discrete_gaussian(3, [40_000], seed).numpy()
  again = ddgauss_query.sample_discrete_gaussian(3, [40_000], seed).numpy()
  np.testing.assert_array_equal(draws, again)
  other = ddgauss_query.sample_discrete_gaussian(
    3, [40_000], tf.constant([21, 23], tf.int64)
  ).numpy()
  assert not np.array_equal(draws, other)
  # N_Z(0, 9): P(x) = exp(-x^2 / 18) / sum_y exp(-y^2 / 18). Each of the
  # frequencies of -8..8 within 4 standard errors of its probability.
  ys = np.arange(-60, 61)
  pmf = np.exp(-(ys**2) / 18.0)
  pmf /= pmf.sum()
  for x in range(-8, 9):
    p = pmf[ys == x][0]
    freq = np.mean(draws == x)
    assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / draws.size), x
  var = float(np.sum(pmf * ys**2))  # Just under 9.
  assert np.var(draws) == pytest.approx(var, rel=0.03)


def test_client_nonces_come_from_the_os_not_tfs_process_rng(
  context, monkeypatch, tmp_path
):
  del context
  # Read from the entropy file inside the client's computation: a file of
  # fixed content gives a fixed nonce (so TF's RNG plays no part) ...
  fixed = tmp_path / 'entropy'
  fixed.write_bytes(b''.join(bytes([i]) * 50 + b'\n' for i in range(1, 20)))
  monkeypatch.setattr(ddgauss_query, 'OS_ENTROPY_FILE', str(fixed))
  nonce = tff.tensorflow.computation(ddgauss_query._client_nonce)  # pylint: disable=protected-access
  assert np.array_equal(nonce(), nonce())
  monkeypatch.undo()
  # ... and /dev/urandom gives a fresh one each call, filling both words'
  # 63 bits.
  nonce = tff.tensorflow.computation(ddgauss_query._client_nonce)  # pylint: disable=protected-access
  draws = np.array([nonce() for _ in range(200)])
  assert len({tuple(d) for d in draws}) == 200
  assert draws.min() >= 0 and draws.max() > 2**62
