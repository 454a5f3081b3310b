"""`factory.weighted()`: the unweighted release, whatever the weights.

The weighted form must release exactly what the unweighted factory does
(so its noise std and sensitivity are the ones the factory's own tests and
the ledger assume), and no client weight, however large or non-finite, may
carry a client past the clip.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import dpsfl_adaptive_clip
from tff_dp.aggregators import weighting

CLIP = 0.7
TYPE = tff.StructWithPythonType(
  [tff.TensorType(np.float32, (6, 4)), tff.TensorType(np.float32, (4,))], list
)
WEIGHT = tff.TensorType(np.float32)


@pytest.fixture(autouse=True, scope='module')
def _context():
  contexts.set_simulation_context()  # Simulates secure sum.


def test_weighted_form_ignores_the_weights():
  # The same updates under very different weights give the same mean.
  factory = dp_fedavg.gaussian_fixed(0.0, 2, 10.0).weighted()
  process = factory.create(
    tff.TensorType(np.float32, [2]), tff.TensorType(np.float32)
  )
  values = [np.array([1.0, 2.0], np.float32), np.array([3.0, 6.0], np.float32)]
  state = process.initialize()
  even = process.next(state, values, [1.0, 1.0]).result
  skewed = process.next(state, values, [1.0, 1000.0]).result
  np.testing.assert_allclose(even, [2.0, 4.0], rtol=1e-6)
  np.testing.assert_allclose(skewed, even, rtol=1e-6)


def test_uniformly_weighted_names_what_it_takes():
  with pytest.raises(TypeError, match='Found MeanFactory'):
    weighting.UniformlyWeighted(tff.aggregators.MeanFactory())


_Z = 1.3
_PRIVATE = {
  'gaussian_fixed': lambda: dp_fedavg.gaussian_fixed(_Z, 3, CLIP, noise_seed=5),
  'gaussian_adaptive': lambda: dp_fedavg.gaussian_adaptive(
    _Z, 3, initial_clip=CLIP, clipped_count_stddev=2.0, noise_seed=5
  ),
  'dp_randagg': lambda: dp_randagg.DPRandAggFactory(
    _Z, 3, CLIP, num_coordinates=9, seed=1, noise_seed=5
  ),
  'cmp_fed': lambda: cmp_fed.cmp_fed(
    2,
    noise_multiplier=_Z,
    clients_per_round=3,
    clip_u=CLIP,
    clip_v=0.3,
    noise_seed=5,
  ),
  'dpsfl': lambda: dpsfl.dpsfl(
    3, 16, 4, noise_multiplier=_Z, clients_per_round=3, clip=CLIP, noise_seed=5
  ),
  'dpsfl_ac': lambda: dpsfl.dpsfl_ac(
    3,
    16,
    4,
    noise_multiplier=_Z,
    clients_per_round=3,
    initial_clip=CLIP,
    adaptive=dpsfl_adaptive_clip.AdaptiveClip(bit_noise_multiplier=1.5),
    noise_seed=5,
  ),
}


def _clients():
  rng = np.random.default_rng(0)
  # Updates well past the clip, so clipping is exercised.
  return [
    [rng.normal(size=(6, 4)).astype(np.float32) * s, np.ones(4, np.float32)]
    for s in (1.0, 50.0, 1e6)
  ]


def _flat(structure):
  return np.concatenate(
    [np.ravel(np.asarray(x, np.float64)) for x in tf.nest.flatten(structure)]
  )


def _leaves(structure):
  # The state's leaves, the DP event's names (bytes) included.
  return [np.asarray(x) for x in tf.nest.flatten(structure)]


@pytest.mark.parametrize('name', sorted(_PRIVATE))
def test_weighted_releases_exactly_the_unweighted_release(name):
  # Same noise seed, same clients; weights that a weighted mean would act
  # on (huge, zero, non-finite): the release, the state (its DP event, the
  # adaptive clip) and the noise are those of the unweighted factory, bit
  # for bit, for two rounds.
  unweighted = _PRIVATE[name]().create(TYPE)
  weighted = _PRIVATE[name]().weighted().create(TYPE, WEIGHT)
  state_u, state_w = unweighted.initialize(), weighted.initialize()
  for weights in ([1e30, 0.0, 1.0], [np.inf, np.nan, -5.0]):
    out_u = unweighted.next(state_u, _clients())
    out_w = weighted.next(state_w, _clients(), weights)
    np.testing.assert_array_equal(_flat(out_w.result), _flat(out_u.result))
    leaves_w, leaves_u = _leaves(out_w.state), _leaves(out_u.state)
    assert len(leaves_w) == len(leaves_u)
    for a, b in zip(leaves_w, leaves_u):
      np.testing.assert_array_equal(a, b)
    state_u, state_w = out_u.state, out_w.state
  # The noise is there (a release of clipped updates alone is smaller).
  assert np.linalg.norm(_flat(out_u.result)) > 0


# The EMNIST CNN's size (1,206,590 parameters), one tensor.
_CNN_D = 1_206_590


@pytest.mark.parametrize(
  'name, factory',
  [
    ('dp_fedavg', lambda: dp_fedavg.gaussian_fixed(0.0, 1, CLIP)),
    (
      'dp_randagg',
      lambda: dp_randagg.DPRandAggFactory(0.0, 1, CLIP, fraction=0.01, seed=1),
    ),
  ],
)
def test_no_weight_carries_a_client_past_the_clip_at_cnn_size(name, factory):
  # One client, no noise, one expected client: the release is exactly that
  # client's contribution, whatever it sends and whatever its weight.
  del name
  process = (
    factory().weighted().create(tff.TensorType(np.float32, (_CNN_D,)), WEIGHT)
  )
  state = process.initialize()
  hot = np.zeros(_CNN_D, np.float32)
  hot[123_456] = 1e20
  nan = np.ones(_CNN_D, np.float32)
  nan[7] = np.nan
  cases = [
    (hot, 1e30),
    (np.full(_CNN_D, 3.4e38, np.float32), np.inf),
    (nan, np.nan),
    (np.random.default_rng(0).normal(size=_CNN_D).astype(np.float32), -1e9),
  ]
  for value, weight in cases:
    result = np.asarray(process.next(state, [value], [weight]).result)
    assert np.all(np.isfinite(result))
    # Secure sum quantizes within the clip: a hair of slack.
    assert np.linalg.norm(result.astype(np.float64)) <= CLIP * (1 + 1e-4)
