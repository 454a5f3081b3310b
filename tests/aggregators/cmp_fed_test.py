"""CMP-Fed / UV-Fed: two power-iteration phases a round."""

import csv

import dp_accounting
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp import privacy
from tff_dp.job import training
from tff_dp.aggregators import cmp_fed


TYPE = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [6, 4]), tff.TensorType(np.float32, [4])], list
)


# The McMahan CNN of seed 001 (1,663,370 parameters).
_MCMAHAN_CNN = [
  (5, 5, 1, 32),
  (32,),
  (5, 5, 32, 64),
  (64,),
  (3136, 512),
  (512,),
  (512, 10),
  (10,),
]


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


def _value(seed, scale=1.0):
  rng = np.random.default_rng(seed)
  return [
    (scale * rng.normal(size=(6, 4))).astype(np.float32),
    (scale * rng.normal(size=4)).astype(np.float32),
  ]


def _noiseless(rank, clip_u, clip_v, **options):
  """CMP-Fed with the clips and no noise, one client a round."""
  return cmp_fed.cmp_fed(
    rank,
    noise_multiplier=0.0,
    clients_per_round=1,
    clip_u=clip_u,
    clip_v=clip_v,
    **options,
  )


def test_u_sits_on_the_output_side_by_default():
  # The McMahan CNN: U's rows per rank are 32 + 64 + 512 + 10 = 618 on the
  # output side (PyTorch's (out, in) layout), 4,473 on the input side.
  cnn = _MCMAHAN_CNN
  biases = 32 + 64 + 512 + 10
  assert cmp_fed.payload_sizes(cnn, 1) == (618, 4473 + biases)
  assert cmp_fed.payload_sizes(cnn, 1, 'in_out', 'u') == (4473 + biases, 618)
  assert cmp_fed.payload_sizes([(3136, 512)], 1) == (512, 3136)
  assert cmp_fed.payload_sizes([(25, 32)], 1, 'min_side') == (25, 32)
  assert cmp_fed.payload_sizes([(25, 32)], 1, 'out_in') == (32, 25)
  z, s = 1.0, 100.0
  e_u, _ = cmp_fed.cmp_fed(
    1, noise_multiplier=z, clients_per_round=s, clip_u=1.0, clip_v=1.0
  ).noise_energy(cnn)
  assert e_u == pytest.approx(618 * (z / s) ** 2)


def test_dense_below_factorises_only_the_large_kernels():
  # The McMahan CNN with only its 3136 x 512 layer factorised: rank 1 sends
  # U 512 in phase 1 and V 3136 with every other tensor dense in phase 2.
  cnn = _MCMAHAN_CNN
  rest = 800 + 32 + 51200 + 64 + 512 + 5120 + 10
  assert cmp_fed.payload_sizes(cnn, 1, dense_below=10**5) == (512, 3136 + rest)
  assert cmp_fed.payload_sizes(cnn, 1, 'out_in', 'u', 10**5) == (
    512 + rest,
    3136,
  )
  assert cmp_fed.upload_bytes(cnn, 1, 10**5) == 4 * (512 + 3136 + rest)
  assert cmp_fed.extra_download_bytes(cnn, 1, 10**5) == 4 * (3136 + 512)
  # A kernel at the threshold is factorised; one entry below, sent dense.
  assert cmp_fed.payload_sizes([(6, 4)], 1, dense_below=24) == (4, 6)
  assert cmp_fed.payload_sizes([(6, 4)], 1, dense_below=25) == (0, 24)
  assert cmp_fed.payload_sizes(cnn, 1, dense_below=0) == (
    cmp_fed.payload_sizes(cnn, 1)
  )


@pytest.mark.parametrize('vectors_phase', ['v', 'u'])
def test_a_dense_kernel_is_released_whole_under_its_phase_clip(
  vectors_phase,
):
  # A 6 x 4 kernel, its bias and a 3 x 2 kernel that rank 1 cannot carry:
  # with dense_below=7 the small kernel is sent dense, so the mean over two
  # clients comes back exactly (factorised at rank 1 it does not).
  mix = tff.StructWithPythonType(
    list(TYPE) + [tff.TensorType(np.float32, [3, 2])], list
  )
  rng = np.random.default_rng(9)
  values = [
    _value(s) + [rng.normal(size=(3, 2)).astype(np.float32)] for s in (7, 8)
  ]
  mean = [(a + b) / 2 for a, b in zip(*values)]
  options = dict(vectors_phase=vectors_phase)
  process = cmp_fed.uv_fed(1, dense_below=7, **options).create(mix)
  out = process.next(process.initialize(), values)
  np.testing.assert_allclose(out.result[1], mean[1], atol=1e-6)
  np.testing.assert_allclose(out.result[2], mean[2], atol=1e-6)
  assert [v.shape for v in process.initialize()['v']] == [(6, 1)]
  factored = cmp_fed.uv_fed(1, **options).create(mix)
  out = factored.next(factored.initialize(), values)
  assert np.abs(out.result[2] - mean[2]).max() > 0.1
  # Under adversarial scale the dense kernel and the bias together stay
  # within their phase's clip.
  c1, c2 = 0.5, 0.25
  process = _noiseless(1, c1, c2, dense_below=7, **options).create(mix)
  big = [1e5 * x for x in values[0]]
  out = process.next(process.initialize(), [big])
  dense = np.concatenate([np.ravel(out.result[1]), np.ravel(out.result[2])])
  clip = c1 if vectors_phase == 'u' else c2
  assert 0.1 * clip < np.linalg.norm(dense) <= clip * (1 + 1e-3)


@pytest.mark.parametrize('vectors_phase', ['v', 'u'])
def test_biases_ride_in_the_chosen_phase_under_its_clip(vectors_phase):
  # A small matrix part and a bias of norm 100: in phase 1 (legacy) the
  # bias shares C1 = 1 with U and drags U's clip down with it; in phase 2
  # (default, C2 = 1e3 here) U is released unclipped and the bias whole.
  value = [np.full((6, 4), 0.01, np.float32), np.zeros(4, np.float32)]
  value[1][0] = 100.0
  process = cmp_fed.cmp_fed(
    4,
    noise_multiplier=0.0,
    clients_per_round=1,
    clip_u=1.0,
    clip_v=1e3,
    vectors_phase=vectors_phase,
    secure_sum=False,
    client_norms=True,
  ).create(TYPE)
  out = process.next(process.initialize(), [value])
  norms = out.measurements['client_norms']
  assert norms['vectors'] == pytest.approx(100.0)
  released_u = out.measurements['mean_norms']['u_norm']
  # The one client's phase-1 payload is cut by C1 only when the bias is in
  # it; its phase-2 payload (||V|| <= ||value|| ~ 100) never by C2 = 1e3.
  assert norms['u_clipped'] == (1.0 if vectors_phase == 'u' else 0.0)
  assert norms['v_clipped'] == 0.0
  if vectors_phase == 'v':
    assert released_u == pytest.approx(norms['u'], rel=1e-5)  # Unclipped.
    np.testing.assert_allclose(out.result[1], value[1], rtol=1e-5)
    np.testing.assert_allclose(out.result[0], value[0], atol=1e-5)
  else:
    # U's matrices scaled by C1 / ||(U, bias)|| ~ 1 / 100.
    assert released_u == pytest.approx(1.0, rel=1e-4)
    assert np.linalg.norm(out.result[1]) <= 1.0 * (1 + 1e-4)


def test_clipped_fractions_and_payload_norms_over_a_cohort():
  # Two clients, one 100x the other: C1 sits between their phase-1
  # payloads, so half the cohort is clipped there; C2 = 1e6 clips neither.
  small = [np.full((6, 4), 0.01, np.float32), np.full(4, 0.01, np.float32)]
  big = [100 * x for x in small]
  process = cmp_fed.cmp_fed(
    4,
    noise_multiplier=0.0,
    clients_per_round=2,
    clip_u=1.0,
    clip_v=1e6,
    secure_sum=False,
    client_norms=True,
  ).create(TYPE)
  state = process.initialize()
  v0 = state['v'][0]
  out = process.next(state, [small, big])
  norms = out.measurements['client_norms']
  # The default layout puts U on the output side: M = kernel^T.
  u_small = np.linalg.norm(small[0].T @ v0)
  assert u_small < 1.0 < 100 * u_small
  assert norms['u_clipped'] == pytest.approx(0.5)
  assert norms['v_clipped'] == 0.0
  # The phase-1 payload is U alone (vectors in V): mean of the two norms.
  assert norms['u_payload'] == pytest.approx(101 * u_small / 2, rel=1e-4)
  assert norms['v_payload'] >= norms['v']


@pytest.mark.parametrize('vectors_phase', ['v', 'u'])
@pytest.mark.parametrize('layout', ['out_in', 'in_out', 'min_side'])
def test_each_phase_is_clipped_on_adversarial_inputs(layout, vectors_phase):
  c1, c2 = 0.5, 0.25
  process = _noiseless(
    2, c1, c2, layout=layout, vectors_phase=vectors_phase
  ).create(TYPE)
  out = process.next(process.initialize(), [_value(4, scale=1e5)])
  # Phase 2's mean V (the new warm start) has norm <= C2; the dense bias is
  # part of its phase's clipped payload, so its norm is <= that clip.
  v = np.concatenate([np.ravel(x) for x in out.state['v']])
  assert np.linalg.norm(v) <= c2 * (1 + 1e-3)
  clip = c1 if vectors_phase == 'u' else c2
  assert np.linalg.norm(out.result[1]) <= clip * (1 + 1e-3)
  assert out.measurements['mean_norms']['u_norm'] <= c1 * (1 + 1e-3)


def test_type_signature_and_two_composed_events():
  factory = cmp_fed.cmp_fed(
    10, noise_multiplier=1.3, clients_per_round=5, clip_u=1.0, clip_v=1.0
  )
  process = factory.create(TYPE)
  sig = process.next.type_signature
  assert sig.result.result.member.is_equivalent_to(TYPE)
  # Rank 10 > min(6, 4): reduced to 4; U on the output side (4 rows), V
  # on the input side: 6 x 4.
  assert process.initialize()['v'][0].shape == (6, 4)
  out = process.next(process.initialize(), [_value(5)])
  events = training.find_dp_events(out.state)
  assert events == [dp_accounting.GaussianDpEvent(pytest.approx(1.3))] * 2
  merged = privacy.merge_gaussians(dp_accounting.ComposedDpEvent(events))
  assert merged.noise_multiplier == pytest.approx(1.3 / np.sqrt(2))


def test_bytes():
  shapes = [(6, 4), (4,), (3, 3, 2, 5)]
  # Rank 2: U 6x2 + bias 4 + U 18x2; V 4x2 + V 5x2.
  assert cmp_fed.upload_bytes(shapes, 2) == 4 * (12 + 4 + 36 + 8 + 10)
  assert cmp_fed.extra_download_bytes(shapes, 2) == 4 * ((6 + 4) * 2 + 23 * 2)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(rank=0), 'rank must be an integer >= 1'),
    (dict(clip_u=0.0), r'clip_u \(C1\) must be > 0'),
    (dict(clip_v=-1.0), r'clip_v \(C2\) must be > 0'),
    (dict(noise_multiplier=-1.0), 'noise_multiplier must be a finite'),
    (
      dict(layout='oi'),
      r"layout must be one of \('out_in', 'in_out', 'min_side'\)",
    ),
    (dict(vectors_phase='w'), r"vectors_phase must be one of .* Found 'w'"),
    (dict(dense_below=-1), 'dense_below must be an integer >= 0. Found -1'),
    (dict(dense_below=2.5), 'dense_below must be an integer >= 0. Found 2.5'),
  ],
)
def test_bad_args(kwargs, match):
  args = dict(
    rank=2, noise_multiplier=1.0, clients_per_round=5, clip_u=1.0, clip_v=1.0
  )
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    cmp_fed.CMPFedFactory(**args)
  with pytest.raises(ValueError, match='need noise_multiplier'):
    cmp_fed.CMPFedFactory(2, clip_u=1.0)


@pytest.mark.usefixtures('shared_data_dir')
@pytest.mark.parametrize('method', ['uv_fed', 'cmp_fed'])
def test_runner_methods(tmp_path, method):
  summary = training.run_experiment(
    training.ExperimentConfig.create(
      task='heart_disease',
      method=method,
      rounds=2,
      client_sampling_rate=1.0,
      noise_multiplier=1.0,
      delta=1e-3,
      cmp_rank=2,
      batch_size=32,
      output_dir=str(tmp_path / method),
      release_non_private_metrics=True,
      background_evaluation=False,
    )
  )
  # heart_disease MLP: kernels (38, 32), (32, 1); biases 32 and 1.
  shapes = [(38, 32), (32,), (32, 1), (1,)]
  assert summary['bytes_per_client_per_round'] == {
    'down': 4 * 1281 + cmp_fed.extra_download_bytes(shapes, 2),
    'up': cmp_fed.upload_bytes(shapes, 2),
  }
  # The CSV columns `benchmarks.studies` reads to set C1 and C2, released
  # with the other non-private outputs.
  run_dir = tmp_path / method
  with open(run_dir / 'non_private' / 'metrics.csv', newline='') as f:
    last = list(csv.DictReader(f))[-1]
  prefix = 'tff/aggregator/client_norms/'
  assert float(last[prefix + 'u_payload']) > 0
  assert float(last[prefix + 'v_payload']) > 0
  if method == 'uv_fed':
    assert float(last[prefix + 'u_clipped']) == 0.0  # No clip.
    assert summary['epsilon_rdp'] is None
    return
  assert 0 <= float(last[prefix + 'v_clipped']) <= 1
  event = privacy.event_from_dict(summary['dp_events'][-1])
  assert event == dp_accounting.PoissonSampledDpEvent(
    1.0, dp_accounting.GaussianDpEvent(pytest.approx(1 / np.sqrt(2)))
  )


def test_noise_stddev_of_both_phases():
  z, c1, c2, n = 2.0, 0.5, 0.25, 4
  big = tff.StructWithPythonType(
    [tff.TensorType(np.float32, [60, 40]), tff.TensorType(np.float32, [40])],
    list,
  )
  # A fixed draw (the statistics below are over 4 rounds only).
  # The pre-#24 layout: U 60 x 8 with the bias, V 40 x 8.
  legacy = dict(layout='in_out', vectors_phase='u')
  process = cmp_fed.cmp_fed(
    8,
    noise_multiplier=z,
    clients_per_round=n,
    clip_u=c1,
    clip_v=c2,
    noise_seed=0,
    **legacy,
  ).create(big)
  state = process.initialize()
  zero = [np.zeros((60, 40), np.float32), np.zeros(40, np.float32)]
  u, v = [], []
  for _ in range(4):
    out = process.next(state, [zero, zero])
    state = out.state
    u.append(out.measurements['mean_norms']['u_norm'])
    v.append(out.measurements['mean_norms']['v_norm'])
  # Means of N(0, (z C / n)^2) entries: U is 60x8 + 40, V is 40x8.
  per_u = np.sqrt(np.mean(np.square(u)) / (60 * 8 + 40))
  per_v = np.sqrt(np.mean(np.square(v)) / (40 * 8))
  assert per_u == pytest.approx(z * c1 / n, rel=0.06)
  assert per_v == pytest.approx(z * c2 / n, rel=0.06)
  e_u, e_v = cmp_fed.cmp_fed(
    8, noise_multiplier=z, clients_per_round=n, clip_u=c1, clip_v=c2, **legacy
  ).noise_energy([(60, 40), (40,)])
  assert e_u == pytest.approx((60 * 8 + 40) * (z * c1 / n) ** 2)
  assert e_v == pytest.approx(40 * 8 * (z * c2 / n) ** 2)
  assert np.mean(np.square(u)) == pytest.approx(e_u, rel=0.12)
  assert np.mean(np.square(v)) == pytest.approx(e_v, rel=0.12)
  # Pure noise: the estimated signal share is near 0.
  assert np.median([cmp_fed.signal_share(x, e_u) for x in u]) < 0.1
  assert np.median([cmp_fed.signal_share(x, e_v) for x in v]) < 0.1


def test_noise_of_dense_kernels_rides_in_their_phase():
  # With dense_below the 5 x 4 kernel is sent dense in phase 2: its noise
  # is N(0, (z C2 / n)^2) per entry like V's, and noise_energy counts it.
  z, c1, c2, n = 2.0, 0.5, 0.25, 4
  shapes = [(60, 40), (40,), (5, 4)]
  value_type = tff.StructWithPythonType(
    [tff.TensorType(np.float32, s) for s in shapes], list
  )
  factory = cmp_fed.cmp_fed(
    8,
    noise_multiplier=z,
    clients_per_round=n,
    clip_u=c1,
    clip_v=c2,
    noise_seed=0,
    dense_below=100,
  )
  process = factory.create(value_type)
  state = process.initialize()
  zero = [np.zeros(s, np.float32) for s in shapes]
  v, dense = [], []
  for _ in range(4):
    out = process.next(state, [zero, zero])
    state = out.state
    v.append(out.measurements['mean_norms']['v_norm'])
    dense.append(np.asarray(out.result[2]))
  e_u, e_v = factory.noise_energy(shapes)
  # U 40 x 8 (output side); V 60 x 8 + the bias 40 + the dense kernel 20.
  assert e_u == pytest.approx(40 * 8 * (z * c1 / n) ** 2)
  assert e_v == pytest.approx((60 * 8 + 40 + 20) * (z * c2 / n) ** 2)
  assert np.mean(np.square(v)) == pytest.approx(e_v, rel=0.12)
  # The dense kernel's own entries: 80 draws of N(0, (z C2 / n)^2).
  assert np.std(dense) == pytest.approx(z * c2 / n, rel=0.25)


@pytest.mark.parametrize('vectors_phase', ['v', 'u'])
def test_each_phase_is_clipped_at_cnn_size_with_dense_kernels(vectors_phase):
  # The row cmp_fed_r16_dense_180's layout (only the 3136 x 512 kernel
  # factorised) on adversarial clients, one at a time, no noise: each
  # phase's release stays within its clip and finite.
  value_type = tff.StructWithPythonType(
    [tff.TensorType(np.float32, s) for s in _MCMAHAN_CNN], list
  )
  c1, c2 = 0.01, 1.0
  process = _noiseless(
    16, c1, c2, dense_below=10**5, vectors_phase=vectors_phase
  ).create(value_type)
  state = process.initialize()
  rng = np.random.default_rng(0)
  hot = [np.zeros(s, np.float32) for s in _MCMAHAN_CNN]
  hot[2][0, 0, 0, 0] = 1e20  # A dense conv kernel's one huge entry.
  cases = [
    hot,
    [np.full(s, 3.4e38, np.float32) for s in _MCMAHAN_CNN],
    [1e6 * rng.normal(size=s).astype(np.float32) for s in _MCMAHAN_CNN],
  ]
  for value in cases:
    out = process.next(state, [value])
    norms = out.measurements['mean_norms']
    assert np.isfinite(norms['u_norm']) and np.isfinite(norms['v_norm'])
    assert norms['u_norm'] <= c1 * (1 + 1e-4)
    assert norms['v_norm'] <= c2 * (1 + 1e-4)
    released = [np.asarray(x, np.float64) for x in out.result]
    assert all(np.all(np.isfinite(x)) for x in released)
    # The dense tensors (conv and output kernels, biases) are released as
    # sent in their phase: their norm is within that phase's clip.
    dense = [released[i] for i in (0, 1, 2, 3, 5, 6, 7)]
    clip = c1 if vectors_phase == 'u' else c2
    assert np.sqrt(sum(np.sum(x**2) for x in dense)) <= clip * (1 + 1e-4)


def test_signal_share_estimates_the_signal_energy():
  # A fixed mean x plus Gaussian noise of known energy, as a release is.
  rng = np.random.default_rng(3)
  d, sigma = 5000, 0.01
  energy = d * sigma**2  # 0.5
  for x_norm in (0.0, 0.5, 1.0, 3.0):
    x = rng.normal(size=d)
    x *= x_norm / np.linalg.norm(x)
    observed = [
      np.linalg.norm(x + rng.normal(scale=sigma, size=d)) for _ in range(9)
    ]
    share = np.median([cmp_fed.signal_share(o, energy) for o in observed])
    assert share == pytest.approx(x_norm**2 / (x_norm**2 + energy), abs=0.03)


def test_noise_energy_and_signal_share_bad_args():
  with pytest.raises(ValueError, match='noise_multiplier'):
    cmp_fed.uv_fed(2).noise_energy([(4, 3)])
  with pytest.raises(ValueError, match='mean_norm'):
    cmp_fed.signal_share(0.0, 1.0)
  with pytest.raises(ValueError, match='noise_energy'):
    cmp_fed.signal_share(1.0, -1.0)


def test_client_norms_are_measured_only_when_asked():
  small = [np.full((6, 4), 0.01, np.float32), np.zeros(4, np.float32)]
  kwargs = dict(
    noise_multiplier=0.0, clients_per_round=1, clip_u=1.0, clip_v=1.0
  )
  process = cmp_fed.cmp_fed(4, secure_sum=False, **kwargs).create(TYPE)
  out = process.next(process.initialize(), [small])
  assert 'client_norms' not in out.measurements
  assert set(out.measurements) == {'u', 'v', 'mean_norms'}


def test_correlated_noise_needs_cmp_fed_and_a_strategy():
  from tff_dp.aggregators import mf_strategy  # pylint: disable=g-import-not-at-top

  with pytest.raises(ValueError, match='needs CMP-Fed: pass noise_multiplier'):
    cmp_fed.uv_fed(2, noise=mf_strategy.banded([1.0, 0.5]))
  with pytest.raises(ValueError, match='noise must be None or an mf_strat'):
    cmp_fed.cmp_fed(
      2,
      noise_multiplier=1.0,
      clients_per_round=5,
      clip_u=1.0,
      clip_v=1.0,
      noise='banded',
    )
