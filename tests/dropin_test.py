"""Every public factory and client work in stock TFF builders, as a user
drops them in: a model of the user's own (a 1-D conv net on 24-step series,
which the project never uses), 3 clients a round, TFF's test context.

Each process runs 2 rounds; the test checks that the model moved, stayed
finite, and that the round's DP event reads back as documented
(`tff_dp.aggregators.dp_events`). The model, its clients and the 2-round
run are `dropin_model`'s; DDGauss's drop-in is dropin_ddgauss_test.py's.
"""

import functools

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
import dropin_model

from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import dp_events
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import dpsfl_adaptive_clip
from tff_dp.aggregators import linear_compression
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import mf_strategy
from tff_dp.client_works import blur
from tff_dp.client_works import fl_top
from tff_dp.client_works import lus
from tff_dp.client_works import model_clip


def _shapes():
  return [
    tuple(v.shape) for v in dropin_model.keras_model().trainable_variables
  ]


@pytest.fixture(autouse=True, scope='module')
def _tff_test_context():
  tff.backends.test.set_sync_test_cpp_execution_context()


def _gaussian(z=dropin_model.Z):
  return dp_accounting.GaussianDpEvent(z)


def _in_state(state, metrics, factory):
  """`dp_events.round_event`, the documented reader, for a private factory
  whose state holds its event; [] (and a refusal) for a non-private one."""
  del metrics
  try:
    return [dp_events.round_event(state.aggregator)]
  except ValueError as e:
    assert 'holds no DP state' in str(e)
    assert dp_events.events_in_state(state.aggregator) == []
    return []


def _declared(state, metrics, factory):
  del metrics
  # DPSFL keeps no DP state: the state reader refuses, the factory states it.
  with pytest.raises(ValueError, match='factory.round_event'):
    dp_events.round_event(state.aggregator)
  return [factory.round_event()]


def _adaptive_merged(state, metrics, factory):
  # Andrew et al.'s two releases (the sum and the clipped count) merge to
  # the effective multiplier the factory was given.
  (event,) = _in_state(state, metrics, factory)
  inverse_squares = [1 / e.noise_multiplier**2 for e in event.events]
  return [dp_accounting.GaussianDpEvent(sum(inverse_squares) ** -0.5)]


_BANDED = mf_strategy.optimize_banded(2, 10)
_BLT = mf_strategy.optimize_blt(2, 10, separation=2)


def _mf(z, strategy):
  return correlated_noise.MatrixFactorizationDpEvent(
    z, correlated_noise.strategy_json(strategy)
  )


# One builder per method: the (z, noise, method-specific sizes) a test
# varies, the rest fixed. Every entry below is one of these.
def _fixed(z, noise=None, **kw):
  return dp_fedavg.gaussian_fixed(
    z, dropin_model.CLIENTS, 1.0, noise=noise, **kw
  )


def _randagg(z, noise=None, **kw):
  return dp_randagg.DPRandAggFactory(
    z, dropin_model.CLIENTS, 1.0, fraction=0.5, noise=noise, **kw
  )


def _fl_top_dp(z, indices, noise=None, **kw):
  return dp_randagg.DPRandAggFactory(
    z,
    dropin_model.CLIENTS,
    1.0,
    num_coordinates=len(indices),
    fixed_indices=indices,
    clip_scope='payload',
    noise=noise,
    **kw,
  )


def _cmp(z, rank, clip, noise=None, **kw):
  return cmp_fed.cmp_fed(
    rank,
    noise_multiplier=z,
    clients_per_round=dropin_model.CLIENTS,
    clip_u=clip,
    clip_v=clip,
    noise=noise,
    **kw,
  )


def _dpsfl(z, columns, k, noise=None, **kw):
  return dpsfl.dpsfl(
    3,
    columns,
    k,
    noise_multiplier=z,
    clients_per_round=dropin_model.CLIENTS,
    clip=1.0,
    noise=noise,
    **kw,
  )


def _dpsfl_ac(z, columns, k, bit_noise, noise=None, **kw):
  return dpsfl.dpsfl_ac(
    3,
    columns,
    k,
    noise_multiplier=z,
    clients_per_round=dropin_model.CLIENTS,
    initial_clip=1.0,
    adaptive=dpsfl_adaptive_clip.AdaptiveClip(bit_noise_multiplier=bit_noise),
    noise=noise,
    **kw,
  )


def _linear(z, rows=None, noise=None, **kw):
  # A quarter of the coordinates, or `rows`; its event is the inner sum's.
  return linear_compression.LinearCompressionFactory(
    _fixed(z, noise, **kw),
    compression=None if rows else 4,
    rows=rows,
    resample=noise is None,
  )


# name: (factory, event reader, the events that must come back).
_FACTORIES = {
  'gaussian_fixed_banded_mf': (
    lambda z: _fixed(z, _BANDED, noise_seed=1),
    _in_state,
    [_mf(dropin_model.Z, _BANDED)],
  ),
  'gaussian_fixed_blt': (
    lambda z: _fixed(z, _BLT, noise_seed=1),
    _in_state,
    [_mf(dropin_model.Z, _BLT)],
  ),
  'gaussian_fixed': (
    lambda z: _fixed(z, noise_seed=1),
    _in_state,
    [_gaussian()],
  ),
  # DP-RandAgg's random coordinates: noise streamed in the full space,
  # projected; fixed coordinates (FL-TOP-DP): streamed in the k-dim space.
  'dp_randagg_banded_mf': (
    lambda z: _randagg(z, _BANDED, noise_seed=1),
    _in_state,
    [_mf(dropin_model.Z, _BANDED)],
  ),
  'fl_top_dp_blt': (
    lambda z: _fl_top_dp(z, [0, 2, 5], _BLT, noise_seed=1),
    _in_state,
    [_mf(dropin_model.Z, _BLT)],
  ),
  'cmp_fed_banded_mf': (
    lambda z: _cmp(z, 1, 1.0, _BANDED, noise_seed=1),
    _in_state,
    [
      dp_accounting.ComposedDpEvent(
        [_mf(dropin_model.Z, _BANDED), _mf(dropin_model.Z, _BANDED)]
      )
    ],
  ),
  'dpsfl_banded_mf': (
    lambda z: _dpsfl(z, 20, 5, _BANDED, noise_seed=1),
    _declared,
    [_mf(dropin_model.Z, _BANDED)],
  ),
  'dpsfl_ac_blt': (
    lambda z: _dpsfl_ac(z, 20, 5, 2.0, _BLT, noise_seed=1),
    _declared,
    [
      dp_accounting.ComposedDpEvent([_mf(dropin_model.Z, _BLT), _mf(2.0, _BLT)])
    ],
  ),
  'gaussian_adaptive': (
    lambda z: dp_fedavg.gaussian_adaptive(
      z,
      dropin_model.CLIENTS,
      initial_clip=0.5,
      clipped_count_stddev=1.0,
      noise_seed=1,
    ),
    _adaptive_merged,
    [_gaussian()],
  ),
  'dp_randagg': (
    lambda z: _randagg(z, noise_seed=1),
    _in_state,
    [_gaussian()],
  ),
  'randagg_nonprivate': (
    lambda z: dp_randagg.DPRandAggFactory(
      None, dropin_model.CLIENTS, None, fraction=0.5
    ),
    _in_state,
    [],
  ),
  'cmp_fed': (
    lambda z: _cmp(z, 1, 1.0, noise_seed=1),
    _in_state,
    # Both phases release on one cohort in one round: one composed event.
    [dp_accounting.ComposedDpEvent([_gaussian(), _gaussian()])],
  ),
  'uv_fed': (lambda z: cmp_fed.uv_fed(1), _in_state, []),
  'linear_compression': (
    lambda z: _linear(z, noise_seed=1),
    _in_state,
    [_gaussian()],
  ),
  'fetchsgd': (lambda z: dpsfl.fetchsgd(3, 20, 5), _in_state, []),
  'dpsfl': (
    lambda z: _dpsfl(z, 20, 5, noise_seed=1),
    _declared,
    [_gaussian()],
  ),
  'dpsfl_ac': (
    lambda z: _dpsfl_ac(z, 20, 5, 2.0, noise_seed=1),
    _declared,
    [
      dp_accounting.ComposedDpEvent(
        [_gaussian(), dp_accounting.GaussianDpEvent(2.0)]
      )
    ],
  ),
}


def _check_events(read, factory, state, metrics, want):
  got = read(state, metrics, factory)
  assert len(got) == len(want), got
  for g, w in zip(got, want):
    if isinstance(w, dp_accounting.GaussianDpEvent):
      assert isinstance(g, dp_accounting.GaussianDpEvent), g
      assert g.noise_multiplier == pytest.approx(w.noise_multiplier, rel=1e-6)
    else:
      assert g == w


@pytest.mark.parametrize('name', sorted(_FACTORIES))
def test_factory_in_build_unweighted_fed_avg(name):
  make, read, want = _FACTORIES[name]
  factory = make(dropin_model.Z)
  process = tff.learning.algorithms.build_unweighted_fed_avg(
    dropin_model.model_fn,
    client_optimizer_fn=dropin_model.sgd(0.1),
    server_optimizer_fn=dropin_model.sgd(1.0),
    model_aggregator=factory,
  )
  state, metrics = dropin_model.run_two_rounds(process)
  _check_events(read, factory, state, metrics, want)


@pytest.mark.parametrize('name', sorted(_FACTORIES))
def test_factory_weighted_in_build_weighted_fed_avg(name):
  make, read, want = _FACTORIES[name]
  factory = make(dropin_model.Z)
  weighted = factory.weighted()
  assert isinstance(weighted, tff.aggregators.WeightedAggregationFactory)
  assert weighted.unweighted is factory
  process = tff.learning.algorithms.build_weighted_fed_avg(
    dropin_model.model_fn,
    client_optimizer_fn=dropin_model.sgd(0.1),
    server_optimizer_fn=dropin_model.sgd(1.0),
    client_weighting=tff.learning.ClientWeighting.UNIFORM,
    model_aggregator=weighted,
  )
  state, metrics = dropin_model.run_two_rounds(process)
  _check_events(read, factory, state, metrics, want)


def _one_round_update(process, weights, data):
  """The global update of one round from `weights` (a flat vector)."""
  state = process.set_model_weights(process.initialize(), weights)
  state = process.next(state, data).state
  after = process.get_model_weights(state).trainable
  return np.concatenate(
    [np.ravel(a - b) for a, b in zip(after, weights.trainable)]
  )


# Without noise, and with no clip binding, what each factory must release
# after one round, given the plain mean of the same clients' updates:
# 'mean': the mean itself (dense; and CMP-Fed / UV-Fed at full rank, where
# power iteration reconstructs every layer); 'kept': the mean on the k
# shared coordinates, zero elsewhere (DP-RandAgg); 'top_k': the mean on its
# k largest coordinates (the sketch methods' first round, with enough
# columns that no counter is shared). An aggregator that dropped or
# distorted the clients' updates fails its check.
_K = 5


def _every_other_coordinate():
  return np.arange(0, _num_params(), 2)


# name: (the factory at multiplier 0 given its noise, the release's kind).
# Each private method is checked with independent noise and, where a row
# of _FACTORIES names it, with correlated noise: at multiplier 0 that adds
# nothing, so the release is its iid twin's kind (FL-TOP-DP's: every other
# coordinate, fixed).
_NOISELESS_BY_METHOD = {
  'gaussian_fixed': (lambda noise: _fixed(0.0, noise), 'mean'),
  'dp_randagg': (lambda noise: _randagg(0.0, noise), 'kept'),
  'fl_top_dp': (
    lambda noise: _fl_top_dp(0.0, _every_other_coordinate(), noise),
    'kept',
  ),
  'cmp_fed': (lambda noise: _cmp(0.0, 10, 1e3, noise), 'mean'),
  'dpsfl': (lambda noise: _dpsfl(0.0, 10_000, _K, noise), 'top_k'),
  'dpsfl_ac': (lambda noise: _dpsfl_ac(0.0, 10_000, _K, 0.0, noise), 'top_k'),
  # Every row of the SRHT (b = D): S^T S = I, the mean itself.
  'linear_compression': (
    lambda noise: _linear(
      0.0,
      linear_compression.padded_dim('srht_interleaved', _num_params()),
      noise,
    ),
    'mean',
  ),
}
_NOISE = {'banded_mf': _BANDED, 'blt': _BLT}
_NOISELESS = {
  'gaussian_adaptive': (
    lambda: dp_fedavg.gaussian_adaptive(
      0.0, dropin_model.CLIENTS, initial_clip=1.0, clipped_count_stddev=1.0
    ),
    'mean',
  ),
  'randagg_nonprivate': (
    lambda: dp_randagg.DPRandAggFactory(
      None, dropin_model.CLIENTS, None, fraction=0.5
    ),
    'kept',
  ),
  'uv_fed': (lambda: cmp_fed.uv_fed(10), 'mean'),
  'fetchsgd': (lambda: dpsfl.fetchsgd(3, 10_000, _K), 'top_k'),
}
for _method, (_make, _kind) in _NOISELESS_BY_METHOD.items():
  for _suffix, _noise in [('', None)] + [
    (f'_{n}', s) for n, s in _NOISE.items()
  ]:
    if _method + _suffix in _FACTORIES:
      _NOISELESS[_method + _suffix] = (functools.partial(_make, _noise), _kind)


def _num_params() -> int:
  return sum(
    int(np.prod(v.shape)) for v in dropin_model.keras_model().trainable_weights
  )


def test_every_factory_has_a_noiseless_check():
  assert set(_NOISELESS) == set(_FACTORIES)


@pytest.mark.parametrize('name', sorted(_NOISELESS))
def test_noiseless_factory_releases_the_mean_update(name):
  make, kind = _NOISELESS[name]
  reference = tff.learning.algorithms.build_unweighted_fed_avg(
    dropin_model.model_fn,
    client_optimizer_fn=dropin_model.sgd(0.1),
    server_optimizer_fn=dropin_model.sgd(1.0),
    model_aggregator=tff.aggregators.UnweightedMeanFactory(),
  )
  process = tff.learning.algorithms.build_unweighted_fed_avg(
    dropin_model.model_fn,
    client_optimizer_fn=dropin_model.sgd(0.1),
    server_optimizer_fn=dropin_model.sgd(1.0),
    model_aggregator=make(),
  )
  weights = reference.get_model_weights(reference.initialize())
  data = dropin_model.client_data()
  mean = _one_round_update(reference, weights, data)
  ours = _one_round_update(process, weights, data)
  assert np.all(mean != 0)
  if kind == 'mean':
    kept = np.ones(mean.size, bool)
  elif kind == 'kept':
    kept = ours != 0
    assert kept.sum() == round(0.5 * mean.size)
  else:
    kept = np.zeros(mean.size, bool)
    kept[np.argsort(-np.abs(mean))[:_K]] = True
  np.testing.assert_allclose(ours[kept], mean[kept], rtol=1e-3, atol=1e-7)
  assert np.all(ours[~kept] == 0)


def test_weighted_builder_with_example_weights_still_weights_uniformly():
  # Clients of 4, 8 and 12 examples: TFF's default NUM_EXAMPLES weighting
  # hands the aggregator unequal weights, which weighted() ignores.
  rng = np.random.default_rng(1)
  data = []
  for n in (4, 8, 12):
    x = rng.normal(size=(n, dropin_model.STEPS, dropin_model.FEATURES)).astype(
      np.float32
    )
    y = rng.integers(0, dropin_model.CLASSES, size=n).astype(np.int32)
    data.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))

  def build(client_weighting):
    return tff.learning.algorithms.build_weighted_fed_avg(
      dropin_model.model_fn,
      client_optimizer_fn=dropin_model.sgd(0.1),
      server_optimizer_fn=dropin_model.sgd(1.0),
      client_weighting=client_weighting,
      model_aggregator=dp_fedavg.gaussian_fixed(0.0, 3, 100.0).weighted(),
    )

  by_examples = build(tff.learning.ClientWeighting.NUM_EXAMPLES)
  uniform = build(tff.learning.ClientWeighting.UNIFORM)
  weights = uniform.get_model_weights(uniform.initialize())
  a = _one_round_update(by_examples, weights, data)
  b = _one_round_update(uniform, weights, data)
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
  # And an example-weighted mean would have been another update.
  weighted_mean = tff.learning.algorithms.build_weighted_fed_avg(
    dropin_model.model_fn,
    client_optimizer_fn=dropin_model.sgd(0.1),
    server_optimizer_fn=dropin_model.sgd(1.0),
    model_aggregator=tff.aggregators.MeanFactory(),
  )
  c = _one_round_update(weighted_mean, weights, data)
  assert np.max(np.abs(c - b)) > 1e-4


def test_unweighted_factory_is_refused_by_the_weighted_builder():
  # Why `weighted()` exists: TFF's own error, before any round runs.
  with pytest.raises(TypeError):
    tff.learning.algorithms.build_weighted_fed_avg(
      dropin_model.model_fn,
      client_optimizer_fn=dropin_model.sgd(0.1),
      model_aggregator=dp_fedavg.gaussian_fixed(
        dropin_model.Z, dropin_model.CLIENTS, 1.0
      ),
    )


def _compose(client_work, aggregator_factory):
  @tff.tensorflow.computation
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(dropin_model.model_fn())

  weights_type = initial_model_weights_fn.type_signature.result
  return tff.learning.templates.compose_learning_process(
    initial_model_weights_fn,
    tff.learning.templates.build_broadcast_process(weights_type),
    client_work,
    aggregator_factory.create(
      weights_type.trainable, tff.TensorType(np.float32)
    ),
    tff.learning.templates.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_sgdm(1.0), weights_type
    ),
  )


def _optimizer():
  return tff.learning.optimizers.build_sgdm(0.1)


_K = 20  # Of the model's 43 trainable scalars.
_CLIENT_WORKS = {
  'blur': lambda: blur.build_blur_client_work(
    dropin_model.model_fn, _optimizer(), lam=0.4, clip_norm=1.0
  ),
  'lus': lambda: lus.build_lus_client_work(
    dropin_model.model_fn, _optimizer(), sparsity=0.5
  ),
  'blur_lus': lambda: lus.build_lus_client_work(
    dropin_model.model_fn,
    _optimizer(),
    sparsity=0.5,
    blur_lam=0.4,
    clip_norm=1.0,
  ),
  'fl_top': lambda: fl_top.build_masked_client_work(
    dropin_model.model_fn,
    _optimizer(),
    masks=fl_top.random_masks(_shapes(), _K, seed=3),
  ),
  'fl_basic': lambda: fl_top.build_random_subset_client_work(
    dropin_model.model_fn, _optimizer(), num_coordinates=_K, seed=3
  ),
  'model_clip': lambda: model_clip.build_model_clip_client_work(
    dropin_model.model_fn, _optimizer(), clip=1.0
  ),
}


@pytest.mark.parametrize('name', sorted(_CLIENT_WORKS))
def test_client_work_in_compose_learning_process(name):
  # Each client work with the DP mean it is run with (weighted form).
  factory = dp_fedavg.gaussian_fixed(
    dropin_model.Z, dropin_model.CLIENTS, 1.0, noise_seed=1
  )
  process = _compose(_CLIENT_WORKS[name](), factory.weighted())
  state, _ = dropin_model.run_two_rounds(process)
  (event,) = dp_events.events_in_state(state.aggregator)
  assert event == _gaussian()


def test_client_work_with_tff_mean():
  # And with a stock TFF aggregator, no DP.
  process = _compose(_CLIENT_WORKS['blur'](), tff.aggregators.MeanFactory())
  state, _ = dropin_model.run_two_rounds(process)
  assert dp_events.events_in_state(state.aggregator) == []
