"""FetchSGD / DPSFL / DPSFL-AC sketch aggregation."""

import dp_accounting
import numpy as np
import pytest

import dpsfl_testing
from dpsfl_testing import D, TYPE

from tff_dp.runtime import contexts
from tff_dp import privacy
from tff_dp.job import training
from tff_dp.aggregators import count_sketch
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import dpsfl_adaptive_clip
from tff_dp.aggregators import mf_strategy


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


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
  mean = (_flat(dpsfl_testing.value(a)) + _flat(dpsfl_testing.value(b))) / 2
  factory = dpsfl.fetchsgd(5, 400, 4, momentum=0.5, seed=2, hashing=hashing)
  process = factory.create(TYPE)
  out = process.next(
    process.initialize(), [dpsfl_testing.value(a), dpsfl_testing.value(b)]
  )
  got = _flat(out.result)
  # Top-4 of the mean's nonzeros {1: 2, 7: -.5, 12: 1.5, 30: 2, 39: -2.5}.
  expected = mean.copy()
  expected[7] = 0.0
  np.testing.assert_allclose(got, expected, atol=1e-6)
  assert out.measurements['num_clients'] == 2
  # Error feedback keeps the unrecovered coordinate 7 (-0.5); momentum 0.5
  # adds half the last mean: next round with zero updates recovers
  # 0.5 * mean + the kept -0.5 at 7, top-4 of those.
  zero = dpsfl_testing.value({})
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
  out = process.next(process.initialize(), [dpsfl_testing.value(a)])
  np.testing.assert_allclose(
    _flat(out.result), _flat(dpsfl_testing.value(a)) / 4, atol=1e-4
  )
  # Clip 1: the sketch's norm sqrt(5) * 5 is scaled to sqrt(5) * 1.
  process = dpsfl.dpsfl(
    5, 400, 2, noise_multiplier=0.0, clients_per_round=1, clip=1.0
  ).create(TYPE)
  out = process.next(process.initialize(), [dpsfl_testing.value(a)])
  np.testing.assert_allclose(
    _flat(out.result), _flat(dpsfl_testing.value(a)) / 5, atol=1e-4
  )
  assert out.measurements['clip'] == pytest.approx(1.0)


def test_round_event_composes_the_bit():
  event = dpsfl.round_event(
    1.2, dpsfl_adaptive_clip.AdaptiveClip(bit_noise_multiplier=5.0)
  )
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
      dict(adaptive=dpsfl_adaptive_clip.AdaptiveClip(target_probability=1.0)),
      r'target_probability must be in \(0, 1\)',
    ),
    (
      dict(adaptive=dpsfl_adaptive_clip.AdaptiveClip(impact_threshold=0.0)),
      'impact_threshold must be > 0',
    ),
    (
      dict(adaptive=dpsfl_adaptive_clip.AdaptiveClip(impact_threshold=1.0)),
      r'impact_threshold must be in \(0, 1\) for the relative rule.*1.0',
    ),
    (
      dict(adaptive=dpsfl_adaptive_clip.AdaptiveClip(impact_rule='ratio')),
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
      background_evaluation=False,
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


def test_sketch_lr_reaches_the_factory_through_the_runner_params():
  # --sketch_lr is FetchSGD's step into the error sketch: at 0.5 the first
  # round recovers half of the mean's top 4 (the rest stays as error).
  from tff_dp import methods  # pylint: disable=g-import-not-at-top

  a = {1: 2.0, 7: -1.0, 30: 4.0}
  b = {1: 2.0, 12: 3.0, 39: -5.0}
  mean = (_flat(dpsfl_testing.value(a)) + _flat(dpsfl_testing.value(b))) / 2
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
  out = process.next(
    process.initialize(), [dpsfl_testing.value(a), dpsfl_testing.value(b)]
  )
  expected = 0.5 * mean
  expected[7] = 0.0
  np.testing.assert_allclose(_flat(out.result), expected, atol=1e-6)
  defaults = methods.METHODS['fetchsgd'].options()
  assert defaults.sketch_k <= 0.1 * defaults.sketch_columns


def test_correlated_noise_needs_dpsfl():
  with pytest.raises(ValueError, match='needs DPSFL or DPSFL-AC'):
    dpsfl.fetchsgd(3, 20, 2, noise=mf_strategy.identity())
