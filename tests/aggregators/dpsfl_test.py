"""FetchSGD / DPSFL / DPSFL-AC sketch aggregation."""

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp import privacy
from tff_dp.job import training
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import count_sketch
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import mf_strategy

D = 40
TYPE = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [4, 5]), tff.TensorType(np.float32, [20])], list
)


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


def _value(entries):
  flat = np.zeros(D, np.float32)
  for i, v in entries.items():
    flat[i] = v
  return [flat[:20].reshape(4, 5), flat[20:]]


def _flat(result):
  return np.concatenate([np.ravel(r) for r in result])


@pytest.mark.parametrize('hashing', ['murmur', 'block'])
def test_fetchsgd_exact_at_zero_noise_with_momentum_and_error_feedback(
  hashing,
):
  # Two clients with 3 nonzeros each (5 in their mean); a wide sketch
  # recovers the top 4 of the mean exactly and keeps the 5th as error.
  a = {1: 2.0, 7: -1.0, 30: 4.0}
  b = {1: 2.0, 12: 3.0, 39: -5.0}
  mean = (_flat(_value(a)) + _flat(_value(b))) / 2
  factory = dpsfl.fetchsgd(5, 400, 4, momentum=0.5, seed=2, hashing=hashing)
  process = factory.create(TYPE)
  out = process.next(process.initialize(), [_value(a), _value(b)])
  got = _flat(out.result)
  # Top-4 of the mean's nonzeros {1: 2, 7: -.5, 12: 1.5, 30: 2, 39: -2.5}.
  expected = mean.copy()
  expected[7] = 0.0
  np.testing.assert_allclose(got, expected, atol=1e-6)
  assert out.measurements['num_clients'] == 2
  # Error feedback keeps the unrecovered coordinate 7 (-0.5); momentum 0.5
  # adds half the last mean: next round with zero updates recovers
  # 0.5 * mean + the kept -0.5 at 7, top-4 of those.
  zero = _value({})
  out2 = process.next(out.state, [zero, zero])
  carried = 0.5 * mean
  carried[7] += -0.5
  top = np.sort(np.argsort(-np.abs(carried), kind='stable')[:4])
  expected2 = np.zeros(D)
  expected2[top] = carried[top]
  np.testing.assert_allclose(_flat(out2.result), expected2, atol=1e-6)


def test_dpsfl_zero_noise_divides_by_expected_clients_and_clips_the_sketch():
  a = {3: 3.0, 25: 4.0}  # Norm 5.
  # Clip 100: unclipped; mean over the expected 4 clients.
  process = dpsfl.dpsfl(
    5, 400, 2, noise_multiplier=0.0, clients_per_round=4, clip=100.0
  ).create(TYPE)
  out = process.next(process.initialize(), [_value(a)])
  np.testing.assert_allclose(_flat(out.result), _flat(_value(a)) / 4, atol=1e-4)
  # Clip 1: the sketch's norm sqrt(5) * 5 is scaled to sqrt(5) * 1.
  process = dpsfl.dpsfl(
    5, 400, 2, noise_multiplier=0.0, clients_per_round=1, clip=1.0
  ).create(TYPE)
  out = process.next(process.initialize(), [_value(a)])
  np.testing.assert_allclose(_flat(out.result), _flat(_value(a)) / 5, atol=1e-4)
  assert out.measurements['clip'] == pytest.approx(1.0)


def test_dpsfl_noise_stddev_per_counter():
  rows, cols, z, clip, n = 3, 2000, 1.5, 0.4, 10
  process = dpsfl.dpsfl(
    rows,
    cols,
    1,
    noise_multiplier=z,
    clients_per_round=n,
    clip=clip,
    noise_seed=3,
  ).create(TYPE)
  state = process.initialize()
  norms = []
  for _ in range(3):
    out = process.next(state, [_value({}), _value({})])
    state = out.state
    norms.append(out.measurements['sketch_norm'])
  # The mean sketch is N(0, (z sqrt(rows) clip / n)^2) per counter.
  per_counter = np.array(norms) / np.sqrt(rows * cols)
  np.testing.assert_allclose(
    per_counter, z * np.sqrt(rows) * clip / n, rtol=0.05
  )
  # An int noise seed: a fresh process draws the same noise; the default
  # (a secret seed) draws other noise.
  for noise_seed, same in ((3, True), (None, False)):
    again = dpsfl.dpsfl(
      rows,
      cols,
      1,
      noise_multiplier=z,
      clients_per_round=n,
      clip=clip,
      noise_seed=noise_seed,
    ).create(TYPE)
    first = again.next(again.initialize(), [_value({}), _value({})])
    assert (first.measurements['sketch_norm'] == norms[0]) == same


def _clips_and_p_hat(entries, impact_rule, rounds=3):
  adaptive = dpsfl.AdaptiveClip(
    target_probability=0.5,
    impact_threshold=0.1,
    bit_noise_multiplier=0.0,
    learning_rate=0.2,
    impact_rule=impact_rule,
  )
  process = dpsfl.dpsfl_ac(
    5,
    400,
    2,
    noise_multiplier=0.0,
    clients_per_round=3,
    initial_clip=1.0,
    adaptive=adaptive,
  ).create(TYPE)
  state = process.initialize()
  clips = []
  for _ in range(rounds):
    out = process.next(state, [_value(entries)] * 3)
    state = out.state
    clips.append(float(state['server']['clip']))
  return clips, float(out.measurements['unclipped_probability'])


@pytest.mark.parametrize(
  'entries, impact_rule, direction',
  [
    # Coordinate 0 is in the first round's "previous top-k" (zeros), and
    # carries a small value next to a huge one at 5, clipped at 1 (f ~ 1%).
    # Absolute: (1 - f) x 0.01 ~ 0.0099 <= 0.1, bit 1, the clip shrinks
    # although 99% of the update is clipped away (the collapse of the old
    # study). Relative: (1 - f) ~ 0.99 > 0.1, bit 0, the clip grows.
    ({0: 0.01, 5: 100.0}, 'absolute', 'down'),
    ({0: 0.01, 5: 100.0}, 'relative', 'up'),
    # g_T = 0 (nothing at coordinate 0): the relative rule reads 1 - f.
    ({5: 100.0}, 'relative', 'up'),
    ({5: 1e-3}, 'relative', 'down'),
  ],
)
def test_impact_rules_disagree_where_the_top_k_part_is_small(
  entries, impact_rule, direction
):
  clips, p_hat = _clips_and_p_hat(entries, impact_rule, rounds=1)
  if direction == 'up':
    assert p_hat == 0.0 and clips[0] == pytest.approx(np.exp(0.1))
  else:
    assert p_hat == 1.0 and clips[0] == pytest.approx(np.exp(-0.1))


@pytest.mark.parametrize('impact_rule', ['relative', 'absolute'])
@pytest.mark.parametrize(
  'entries, direction', [({0: 100.0}, 'up'), ({0: 1e-3}, 'down')]
)
def test_adaptive_clip_moves_the_right_way(entries, direction, impact_rule):
  # Bit noise 0. Coordinate 0 is in the initial "previous top-k" (zeros).
  # A huge update clipped at 1 has impact ~99 (relative: 0.99) > gamma on
  # it: bits 0, p_hat 0 < target, the clip grows; a tiny one is unclipped:
  # bits 1, p_hat 1 > target, the clip shrinks.
  clips, p_hat = _clips_and_p_hat(entries, impact_rule)
  if direction == 'up':
    assert p_hat == pytest.approx(0.0)
    np.testing.assert_allclose(clips, np.exp(0.1 * np.arange(1, 4)), rtol=1e-5)
  else:
    assert p_hat == pytest.approx(1.0)
    np.testing.assert_allclose(clips, np.exp(-0.1 * np.arange(1, 4)), rtol=1e-5)


def test_round_event_composes_the_bit():
  event = dpsfl.round_event(1.2, dpsfl.AdaptiveClip(bit_noise_multiplier=5.0))
  assert event == dp_accounting.ComposedDpEvent(
    [dp_accounting.GaussianDpEvent(1.2), dp_accounting.GaussianDpEvent(5.0)]
  )
  merged = privacy.merge_gaussians(event)
  assert merged.noise_multiplier == pytest.approx((1.2**-2 + 5.0**-2) ** -0.5)
  assert dpsfl.round_event(1.2, None) == dp_accounting.GaussianDpEvent(1.2)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(rows=0), 'rows must be an integer >= 1'),
    (dict(columns=0), 'columns must be an integer >= 1'),
    (dict(k=0), 'k must be an integer >= 1'),
    (dict(momentum=1.0), r'momentum must be in \[0, 1\)'),
    (dict(noise_multiplier=-1.0), 'noise_multiplier must be >= 0'),
    (dict(clip=0.0), 'clip must be > 0'),
    (dict(clients_per_round=0), 'clients_per_round must be > 0'),
    (
      dict(adaptive=dpsfl.AdaptiveClip(target_probability=1.0)),
      r'target_probability must be in \(0, 1\)',
    ),
    (
      dict(adaptive=dpsfl.AdaptiveClip(impact_threshold=0.0)),
      'impact_threshold must be > 0',
    ),
    (
      dict(adaptive=dpsfl.AdaptiveClip(impact_threshold=1.0)),
      r'impact_threshold must be in \(0, 1\) for the relative rule.*1.0',
    ),
    (
      dict(adaptive=dpsfl.AdaptiveClip(impact_rule='ratio')),
      r"impact_rule must be one of \('relative', 'absolute'\). Found 'ratio'",
    ),
    (dict(hashing='sha1'), r"hashing must be one of \('murmur', 'block'\)"),
  ],
)
def test_bad_args(kwargs, match):
  args = dict(
    rows=3, columns=10, k=2, noise_multiplier=1.0, clients_per_round=5, clip=1.0
  )
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    dpsfl.SketchAggregatorFactory(**args)


def test_k_larger_than_dimension_and_clip_without_noise():
  with pytest.raises(ValueError, match=r'k must be in \[1, 40\]'):
    dpsfl.fetchsgd(3, 10, 41).create(TYPE)
  with pytest.raises(ValueError, match='need noise_multiplier'):
    dpsfl.SketchAggregatorFactory(rows=3, columns=10, k=2, clip=1.0)


def test_bytes():
  assert dpsfl.upload_bytes(5, 1000) == 20000
  assert dpsfl.upload_bytes(5, 1000, adaptive=True) == 20004
  assert dpsfl.download_bytes(100) == 800
  assert count_sketch.CountSketch(5, 1000, 10).num_counters == 5000


@pytest.mark.usefixtures('shared_data_dir')
@pytest.mark.parametrize(
  'method, hashing',
  [
    ('fetchsgd', 'murmur'),
    ('dpsfl', 'murmur'),
    ('dpsfl_ac', 'murmur'),
    ('dpsfl', 'block'),
  ],
)
def test_runner_methods(tmp_path, method, hashing):
  summary = training.run_experiment(
    training.ExperimentConfig.create(
      task='heart_disease',
      method=method,
      rounds=2,
      client_sampling_rate=1.0,
      noise_multiplier=1.0,
      delta=1e-3,
      sketch_rows=3,
      sketch_columns=100,
      sketch_k=50,
      sketch_hashing=hashing,
      dpsfl_bit_noise=10.0,
      batch_size=32,
      output_dir=str(tmp_path / method),
    )
  )
  ac = method == 'dpsfl_ac'
  assert summary['bytes_per_client_per_round'] == {
    'down': dpsfl.download_bytes(50, ac),
    'up': dpsfl.upload_bytes(3, 100, ac),
  }
  if method == 'fetchsgd':
    assert summary['epsilon_rdp'] is None
    return
  event = privacy.event_from_dict(summary['dp_events'][-1])
  # DPSFL-AC: the sketch's and the bit's Gaussians, merged exactly by the
  # ledger into one of multiplier (1/1^2 + 1/10^2)^(-1/2).
  z = (1.0 + 10.0**-2) ** -0.5 if ac else 1.0
  assert event == dp_accounting.PoissonSampledDpEvent(
    1.0, dp_accounting.GaussianDpEvent(pytest.approx(z))
  )
  if ac:  # The bit's share of the round's 1/z^2: 0.01 / 1.01.
    assert summary['round_event_shares'] == pytest.approx(
      [1 / 1.01, 0.01 / 1.01]
    )
  else:
    assert summary['round_event_shares'] is None


def test_dpsfl_ac_bit_noise_is_sigma_b_normal_over_expected_clients():
  # Zero updates: every bit is 1 (no clipping impact), so p_hat - 1 is the
  # bit sum's noise over the expected clients. The noise is a stateless
  # draw from the round's seed (the second of three split from the
  # state's), so its exact value is known: sigma_b x N(0, 1) / n. An exact
  # check catches a wrong sigma_b, n or seed stream where a sample std over
  # a few dozen rounds could not.
  sigma_b, n = 3.0, 5
  process = dpsfl.dpsfl_ac(
    3,
    20,
    2,
    noise_multiplier=0.0,
    clients_per_round=n,
    initial_clip=1.0,
    adaptive=dpsfl.AdaptiveClip(
      bit_noise_multiplier=sigma_b, learning_rate=1e-9
    ),
  ).create(TYPE)
  state = process.initialize()
  draws, expected = [], []
  for _ in range(8):
    seeds = tf.random.experimental.stateless_split(
      state['server']['seed'], num=3
    )
    expected.append(
      float(tf.random.stateless_normal([], seed=seeds[1])) * sigma_b / n
    )
    out = process.next(state, [_value({})] * n)
    state = out.state
    draws.append(out.measurements['unclipped_probability'] - 1.0)
  # The bits' secure sum is exact for 0/1 (quantisation at 2^-20 scale).
  np.testing.assert_allclose(draws, expected, rtol=0, atol=1e-5)
  assert len(set(np.round(draws, 6))) == len(draws)  # A fresh draw a round.


def test_bit_noise_defaults_to_expected_clients_over_20():
  # Andrew et al.'s sigma_b = m / 20: 40 expected clients give 2.0, and
  # its share of the round's merged 1/z^2 is reported.
  from tff_dp import methods  # pylint: disable=g-import-not-at-top

  method = methods.METHODS['dpsfl_ac']
  p = methods.MethodParams(
    num_model_params=D,
    expected_clients_per_round=40.0,
    noise_multiplier=1.2,
    options=method.options(),
  )
  event = method.round_event(1.2, p)
  assert event == dp_accounting.ComposedDpEvent(
    [dp_accounting.GaussianDpEvent(1.2), dp_accounting.GaussianDpEvent(2.0)]
  )
  shares = privacy.gaussian_shares(event)
  bit = 2.0**-2 / (1.2**-2 + 2.0**-2)
  assert shares == pytest.approx([1 - bit, bit])
  factory = method.build_aggregator(p)
  assert factory.round_event() == event
  explicit = p.replace_options(dpsfl_bit_noise=10.0)
  assert method.round_event(1.2, explicit).events[1] == (
    dp_accounting.GaussianDpEvent(10.0)
  )
  with pytest.raises(ValueError, match='round_event needs the bit noise'):
    dpsfl.round_event(1.2, dpsfl.AdaptiveClip())


def test_sketch_lr_reaches_the_factory_through_the_runner_params():
  # --sketch_lr is FetchSGD's step into the error sketch: at 0.5 the first
  # round recovers half of the mean's top 4 (the rest stays as error).
  from tff_dp import methods  # pylint: disable=g-import-not-at-top

  a = {1: 2.0, 7: -1.0, 30: 4.0}
  b = {1: 2.0, 12: 3.0, 39: -5.0}
  mean = (_flat(_value(a)) + _flat(_value(b))) / 2
  p = methods.MethodParams(
    num_model_params=D,
    expected_clients_per_round=2.0,
    options=methods.METHODS['fetchsgd'].options(
      sketch_rows=5,
      sketch_columns=400,
      sketch_k=4,
      sketch_momentum=0.5,
      sketch_lr=0.5,
    ),
    seed=2,
  )
  process = methods.METHODS['fetchsgd'].build_aggregator(p).create(TYPE)
  out = process.next(process.initialize(), [_value(a), _value(b)])
  expected = 0.5 * mean
  expected[7] = 0.0
  np.testing.assert_allclose(_flat(out.result), expected, atol=1e-6)
  defaults = methods.METHODS['fetchsgd'].options()
  assert defaults.sketch_k <= 0.1 * defaults.sketch_columns


def _ac_run(noise, rounds=6, z=1.5, sigma_b=3.0, n=5, rows=3, cols=20):
  """DPSFL-AC on zero updates: each round's (unit draws of the sketch and
  the bit, measurements), the draws read from the state's seed as
  `_unit_noise` draws them."""
  process = dpsfl.dpsfl_ac(
    rows,
    cols,
    2,
    noise_multiplier=z,
    clients_per_round=n,
    initial_clip=1.0,
    adaptive=dpsfl.AdaptiveClip(
      bit_noise_multiplier=sigma_b, learning_rate=1e-9
    ),
    noise_seed=4,
    noise=noise,
  ).create(TYPE)
  state = process.initialize()
  out_rounds = []
  for _ in range(rounds):
    seeds = tf.random.experimental.stateless_split(
      state['server']['seed'], num=3
    )
    table = np.asarray(
      tf.random.stateless_normal([rows, cols], seed=seeds[0]), np.float64
    )
    bit = float(tf.random.stateless_normal([], seed=seeds[1]))
    out = process.next(state, [_value({})] * n)
    state = out.state
    out_rounds.append((table, bit, out.measurements))
  return out_rounds, state


def test_correlated_noise_of_one_unit_band_releases_iid_bits():
  iid, _ = _ac_run(None)
  one_band, state = _ac_run(mf_strategy.identity())
  for (_, _, a), (_, _, b) in zip(iid, one_band):
    assert a['sketch_norm'] == b['sketch_norm']
    assert a['unclipped_probability'] == b['unclipped_probability']
  assert state['server']['noise_memory']['table'] == ()


@pytest.mark.parametrize(
  'strategy',
  [mf_strategy.banded([1.0, 0.5, 0.25]), mf_strategy.blt([0.9], [0.4])],
  ids=['banded3', 'blt'],
)
def test_correlated_sketch_and_bit_noise_are_c_inverse_of_the_unit_draws(
  strategy,
):
  # Zero updates: the mean sketch is z sqrt(rows) C_t y_t / n and p_hat - 1
  # is sigma_b v_t / n, with y = C^-1 (the sketch's unit draws) and v = C^-1
  # (the bit's), each its own stream; the state keeps y_t and v_t.
  z, sigma_b, n, rows = 1.5, 3.0, 5, 3
  runs, state = _ac_run(strategy, z=z, sigma_b=sigma_b, n=n, rows=rows)
  y = strategy.noise(np.stack([t for t, _, _ in runs]))
  v = strategy.noise(np.array([b for _, b, _ in runs]))
  for t, (_, _, m) in enumerate(runs):
    scale = z * np.sqrt(rows) * float(m['clip']) / n
    assert float(m['sketch_norm']) == pytest.approx(
      scale * np.linalg.norm(y[t]), rel=1e-5
    )
    # The bits' secure sum is exact for 0/1 (quantisation at 2^-20 scale).
    assert float(m['unclipped_probability']) - 1.0 == pytest.approx(
      sigma_b * v[t] / n, abs=1e-5
    )
  if strategy.kind == mf_strategy.BANDED:
    np.testing.assert_allclose(
      state['server']['noise_memory']['table'][-1], y[-1], rtol=1e-5
    )
  event = dpsfl.round_event(
    z, dpsfl.AdaptiveClip(bit_noise_multiplier=sigma_b), strategy
  )
  merged = privacy.merge_gaussians(event)
  assert merged == correlated_noise.MatrixFactorizationDpEvent(
    pytest.approx((z**-2 + sigma_b**-2) ** -0.5),
    correlated_noise.strategy_json(strategy),
  )


def test_correlated_noise_needs_dpsfl():
  with pytest.raises(ValueError, match='needs DPSFL or DPSFL-AC'):
    dpsfl.fetchsgd(3, 20, 2, noise=mf_strategy.identity())
