import collections

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import dp_events
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import linear_compression as lc
from tff_dp.aggregators import mf_strategy
from tff_dp.runtime import contexts

STRUCT = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [40, 50]), tff.TensorType(np.float32, [7])], list
)
DIM = 2007


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


def _value(rng, scale=1.0):
  return [
    (scale * rng.standard_normal([40, 50])).astype(np.float32),
    (scale * rng.standard_normal([7])).astype(np.float32),
  ]


def _flat(value):
  return np.concatenate([np.ravel(v) for v in value])


def _sts(sketch, dim, rows, x, seed):
  s = lc._Sketch(sketch, dim, rows)
  seed = tf.constant([seed, 7], tf.int64)
  return s.decode(s.encode(tf.constant(x), seed), seed).numpy()


@pytest.mark.parametrize('sketch', lc.SKETCHES)
def test_s_transpose_s_is_unbiased(sketch):
  # E[S^T S] = I: the mean over 400 seeds of S^T S x, read on three fixed
  # directions (x itself, one coordinate, a random direction), is within 4
  # standard errors of <u, x>. A missing sqrt(D / b) scale shifts the first
  # by a factor D / b = 10 (hundreds of standard errors).
  rng = np.random.default_rng(0)
  dim, rows, seeds = 3000, 300, 400
  x = rng.standard_normal(dim).astype(np.float32)
  directions = [x / np.linalg.norm(x), np.eye(dim, dtype=np.float32)[5]]
  directions.append(rng.standard_normal(dim).astype(np.float32))
  draws = np.array([_sts(sketch, dim, rows, x, s) for s in range(seeds)])
  for u in directions:
    reads = draws @ u
    se = reads.std(ddof=1) / np.sqrt(seeds)
    assert abs(reads.mean() - u @ x) < 4 * se
  # The decode's squared error matches the plan's factor (within 10%).
  err = np.mean(np.sum((draws - x) ** 2, axis=1)) / np.sum(x**2)
  assert err == pytest.approx(lc.error_factor(sketch, dim, rows), rel=0.1)


SRHTS = ('srht', 'srht_interleaved')


@pytest.mark.parametrize('sketch', SRHTS)
def test_srht_rows_are_distinct_and_its_error_is_d_over_b_minus_1(sketch):
  # At D / b = 1.46 (where separate offsets per stratum kept rows twice):
  # no row twice, for any seed, and the decode's mean squared error over
  # 300 seeds is D/b - 1 within 3%.
  dim, rows = 1024, 700
  s = lc._Sketch(sketch, dim, rows)
  for seed in range(50):
    _, kept = s._srht_parts(tf.constant([seed, 1], tf.int64))
    assert len(np.unique(kept.numpy())) == rows
  x = np.random.default_rng(4).standard_normal(dim).astype(np.float32)
  draws = np.array([_sts(sketch, dim, rows, x, seed) for seed in range(300)])
  err = np.mean(np.sum((draws - x) ** 2, axis=1)) / np.sum(x**2)
  assert err == pytest.approx(1024 / 700 - 1, rel=0.03)


@pytest.mark.parametrize(
  'sketch, share', [('srht', 1.0), ('srht_interleaved', 1 / 64)]
)
def test_where_the_decode_error_lands(sketch, share):
  # A "layer" of 1,024 consecutive coordinates carries all of x, in D =
  # 64 x 1,024; b = 64, so D / b = 1,024 is a multiple of the 64 blocks
  # (systematic sampling's lattice unpermuted would put every row in one
  # block). Consecutive blocks keep the whole decode error in that layer;
  # interleaved, the layer's share of the error is its share of the
  # coordinates, 1/64, as for the noise (within 15% over 20 seeds; 1.0
  # for the unpermuted lattice).
  dim, rows = 64 * 1024, 64
  x = np.zeros(dim, np.float32)
  x[:1024] = np.random.default_rng(2).standard_normal(1024)
  err = np.array([_sts(sketch, dim, rows, x, seed) - x for seed in range(20)])
  in_layer = np.sum(err[:, :1024] ** 2) / np.sum(err**2)
  assert in_layer == pytest.approx(share, rel=0.15)


def test_count_sketch_puts_unit_weight_on_every_coordinate():
  # diag(S^T S) = 1 exactly: each coordinate reads its one bucket, so the
  # decoded noise of a coordinate has the inner noise's variance.
  s = lc._Sketch('count_sketch', 500, 50)
  seed = tf.constant([3, 4], tf.int64)
  eye = np.eye(500, dtype=np.float32)
  diag = [
    s.decode(s.encode(tf.constant(e), seed), seed).numpy() @ e for e in eye[:50]
  ]
  np.testing.assert_array_equal(diag, 1.0)


@pytest.mark.parametrize('sketch', SRHTS)
def test_srht_rows_are_orthogonal(sketch):
  # S S^T = (D / b) I for the SRHT (distinct rows of an orthonormal
  # transform): ||S^T y|| = sqrt(D / b) ||y|| before the padding is cut.
  s = lc._Sketch(sketch, 2048, 100)
  seed = tf.constant([1, 2], tf.int64)
  y = np.random.default_rng(1).standard_normal(100).astype(np.float32)
  back = s.encode(s.decode(tf.constant(y), seed), seed).numpy()
  np.testing.assert_allclose(back, 2048 / 100 * y, rtol=1e-4, atol=1e-4)


class _Recording(tff.aggregators.UnweightedAggregationFactory):
  """The inner factory, with its b-dim result also in the measurements."""

  def __init__(self, inner):
    self._inner = inner

  def create(self, value_type):
    inner = self._inner.create(value_type)

    @tff.federated_computation(
      inner.next.type_signature.parameter[0],
      tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      out = inner.next(state, value)
      return tff.templates.MeasuredProcessOutput(
        out.state,
        out.result,
        tff.federated_zip(
          collections.OrderedDict(released=out.result, inner=out.measurements)
        ),
      )

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def test_an_adversarial_client_moves_the_compressed_release_by_at_most_c():
  # At the CNN's 1,663,370 parameters, 100x: a client that sends 1e4 times
  # its update, or the decode of a vector aimed at the release, changes the
  # b-dim release (no noise, n = 1) by at most C = 0.5.
  dim, clip = 1663370, 0.5
  value_type = tff.TensorType(np.float32, [dim])
  factory = lc.LinearCompressionFactory(
    _Recording(dp_fedavg.gaussian_fixed(0.0, 1, clip, noise_seed=0)),
    compression=100,
    seed=3,
  )
  process = factory.create(value_type)
  state = process.initialize()
  rng = np.random.default_rng(0)
  honest = (0.01 * rng.standard_normal(dim)).astype(np.float32)
  base = process.next(state, [honest]).measurements['released']
  s = lc._Sketch('srht_interleaved', dim, factory.rows(dim))
  round_seed = tf.random.experimental.stateless_split(
    tf.constant(lc.initial_seed(3)), num=2
  )[0]
  aimed = s.decode(tf.constant(1e6 * np.ones(s.rows, np.float32)), round_seed)
  for attack in (1e4 * honest, aimed.numpy(), np.full(dim, 3e3, np.float32)):
    released = process.next(state, [honest, attack]).measurements['released']
    assert np.linalg.norm(released - base) <= clip * (1 + 1e-5)
    # Unclipped, it would move it by far more than C.
    assert (
      np.linalg.norm(s.encode(tf.constant(attack), round_seed)) > 100 * clip
    )


@pytest.mark.parametrize('sketch', lc.SKETCHES)
def test_decoded_noise_energy_is_d_z2_c2_over_n2(sketch):
  # Zero updates: the decoded result is S^T (noise) / n. Its energy, over
  # 60 rounds (a fresh S and fresh noise each), is d z^2 C^2 / n^2 within
  # 4 standard errors; noise added after the decode at the wrong scale, or
  # an S^T without sqrt(D / b), is many standard errors off.
  z, clip, n = 1.5, 0.7, 4.0
  factory = lc.LinearCompressionFactory(
    dp_fedavg.gaussian_fixed(z, n, clip, noise_seed=5),
    sketch=sketch,
    compression=10,
  )
  process = factory.create(STRUCT)
  state = process.initialize()
  zero = [np.zeros([40, 50], np.float32), np.zeros([7], np.float32)]
  energies = []
  for _ in range(60):
    out = process.next(state, [zero, zero])
    state = out.state
    energies.append(np.sum(_flat(out.result) ** 2))
  expected = DIM * (z * clip / n) ** 2
  se = np.std(energies, ddof=1) / np.sqrt(len(energies))
  assert abs(np.mean(energies) - expected) < 4 * se
  assert se < 0.05 * expected


def test_zero_noise_without_clipping_decodes_s_transpose_s_of_the_mean():
  rng = np.random.default_rng(2)
  values = [_value(rng, 0.001) for _ in range(3)]
  factory = lc.LinearCompressionFactory(
    dp_fedavg.gaussian_fixed(0.0, 3, 100.0, noise_seed=0),
    sketch='count_sketch',
    rows=500,
    seed=9,
  )
  process = factory.create(STRUCT)
  out = process.next(process.initialize(), values)
  mean = np.mean([_flat(v) for v in values], axis=0)
  round_seed = tf.random.experimental.stateless_split(
    tf.constant(lc.initial_seed(9)), num=2
  )[0]
  s = lc._Sketch('count_sketch', DIM, 500)
  expected = s.decode(s.encode(tf.constant(mean), round_seed), round_seed)
  np.testing.assert_allclose(_flat(out.result), expected.numpy(), atol=1e-6)
  assert out.measurements['sketch_rows'] == 500
  assert [r.shape for r in out.result] == [(40, 50), (7,)]


def test_seed_is_fresh_each_round_unless_fixed_and_the_event_is_the_inner():
  rng = np.random.default_rng(3)
  value = _value(rng, 0.001)
  for resample in (True, False):
    factory = lc.LinearCompressionFactory(
      dp_fedavg.gaussian_fixed(0.0, 1, 100.0, noise_seed=0),
      compression=20,
      resample=resample,
    )
    process = factory.create(STRUCT)
    state = process.initialize()
    results = []
    for _ in range(2):
      out = process.next(state, [value])
      state = out.state
      results.append(_flat(out.result))
    assert np.array_equal(results[0], results[1]) == (not resample)
    assert dp_events.released_event(
      factory.weighted(), state, out.measurements
    ) == dp_accounting.GaussianDpEvent(0.0)


def test_correlated_noise_streams_in_the_compressed_space():
  strategy = mf_strategy.optimize_banded(2, 4)
  factory = lc.LinearCompressionFactory(
    dp_fedavg.gaussian_fixed(1.0, 2, 1.0, noise_seed=0, noise=strategy),
    compression=10,
    resample=False,
  )
  process = factory.create(STRUCT)
  state = process.initialize()
  seeds = [np.asarray(state['seed'])]
  for _ in range(2):
    out = process.next(state, [_value(np.random.default_rng(4))])
    state = out.state
    seeds.append(np.asarray(state['seed']))
  # One S for the run: the seed never moves, so every round's noise lives
  # in the same b-dim space.
  np.testing.assert_array_equal(seeds[0], seeds[2])
  event = dp_events.released_event(factory, out.state, out.measurements)
  assert type(event).__name__ == 'MatrixFactorizationDpEvent'


def test_measured_error_is_the_decode_error_of_the_clipped_mean():
  rng = np.random.default_rng(5)
  values = [_value(rng) for _ in range(2)]
  clip = 1.0
  factory = lc.LinearCompressionFactory(
    dp_fedavg.gaussian_fixed(1.0, 2, clip, noise_seed=0),
    compression=10,
    seed=1,
    measure_error_clip=clip,
    clients_per_round=2,
  )
  out = factory.create(STRUCT).next(factory.create(STRUCT).initialize(), values)
  clipped = [
    _flat(v) * min(1.0, clip / np.linalg.norm(_flat(v))) for v in values
  ]
  mu = np.sum(clipped, axis=0) / 2
  round_seed = tf.random.experimental.stateless_split(
    tf.constant(lc.initial_seed(1)), num=2
  )[0]
  s = lc._Sketch('srht_interleaved', DIM, factory.rows(DIM))
  decoded = s.decode(
    s.encode(tf.constant(mu.astype(np.float32)), round_seed), round_seed
  )
  assert out.measurements[lc.MEAN_SQ] == pytest.approx(np.sum(mu**2), rel=1e-5)
  assert out.measurements[lc.ERROR_SQ] == pytest.approx(
    np.sum((decoded.numpy() - mu) ** 2), rel=1e-4
  )


def test_plan_arithmetic():
  # count sketch: (d - 1) / b ||mu||^2 over d z^2 C^2 / n^2.
  share = lc.added_error_share(
    'count_sketch',
    1001,
    10,
    noise_multiplier=2.0,
    clients_per_round=10,
    norm_ratio=0.5,
  )
  assert share == pytest.approx(100 * 0.25 * 100 / (1001 * 4))
  for sketch in SRHTS:
    assert lc.padded_dim(sketch, 1025) == 2048
    assert lc.error_factor(sketch, 1025, 1024) == pytest.approx(1.0)
  assert lc.num_rows(1663370, 100) == 16634


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(compression=0.5), 'compression must be a finite number >= 1'),
    (dict(compression=float('inf')), 'compression must be a finite number'),
    (dict(compression=10, rows=5), 'exactly one of compression and rows'),
    (dict(rows=0), 'rows must be an integer >= 1'),
    (dict(compression=10, seed=1.5), 'seed must be an integer'),
    (dict(compression=10, sketch='dct'), 'sketch must be one of'),
    (
      dict(compression=10, measure_error_clip=1.0),
      'clients_per_round must be a finite number > 0',
    ),
  ],
)
def test_bad_args(kwargs, match):
  with pytest.raises(ValueError, match=match):
    lc.LinearCompressionFactory(dp_fedavg.gaussian_fixed(1.0, 2, 1.0), **kwargs)


def test_more_rows_than_the_padded_dimension_is_refused():
  factory = lc.LinearCompressionFactory(
    dp_fedavg.gaussian_fixed(1.0, 2, 1.0), rows=2048, sketch='count_sketch'
  )
  with pytest.raises(ValueError, match='b must be at most 2007'):
    factory.create(STRUCT)
  with pytest.raises(TypeError, match='inner must be'):
    lc.LinearCompressionFactory(object(), compression=2)
