"""Every public factory, builder and config field rejects bad values.

One table: (what is called, the bad value, the message it must give). Each
message names the parameter and its allowed range, and the call fails at
once (before any TFF computation or data is built).
"""

from unittest import mock

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp.reporting import gaussian_shift
from tff_dp.job import training
from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import count_sketch
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import dpsfl_adaptive_clip
from tff_dp.client_works import blur
from tff_dp.client_works import diagnostics
from tff_dp.client_works import fl_top
from tff_dp.client_works import lus
from tff_dp.client_works import model_clip
from tff_dp.tasks import partition


def _config(**kw):
  base = dict(task='heart_disease', method='dp_fedavg', noise_multiplier=1.0)
  base.update(kw)
  return training.ExperimentConfig.create(**base).validate()


_OPT = tff.learning.optimizers.build_sgdm(0.1)
CASES = [
  # Aggregators.
  (lambda: dp_fedavg.gaussian_fixed(-1.0, 10, 1.0), 'noise_multiplier'),
  (lambda: dp_fedavg.gaussian_fixed(1.0, 0, 1.0), 'clients_per_round'),
  (lambda: dp_fedavg.gaussian_fixed(1.0, 10, 0.0), 'clip'),
  (
    lambda: dp_fedavg.gaussian_fixed(1.0, 10, 1.0, clipped_fraction_stddev=0.0),
    r'clipped_fraction_stddev must be a finite number > 0\. Found 0\.0',
  ),
  (
    lambda: dp_fedavg.gaussian_fixed(1.0, 10, 1.0, clipped_fraction_stddev=0.5),
    r'clipped_fraction_stddev must exceed noise_multiplier / 2 = 0\.5',
  ),
  (
    lambda: _config(fraction_clipped_stddev=-1.0),
    'fraction_clipped_stddev',
  ),
  (
    lambda: dp_fedavg.gaussian_adaptive(
      1.0, 10, initial_clip=1.0, target_unclipped_quantile=1.5
    ),
    'target_unclipped_quantile',
  ),
  (
    lambda: ddgauss.ddgauss_mean(1.0, 10, 1.0, min_clients=10, bits=0),
    'bits',
  ),
  (
    lambda: dp_randagg.DPRandAggFactory(1.0, 10, 1.0, fraction=0.0),
    r'fraction must be in \(0, 1\]',
  ),
  (lambda: count_sketch.CountSketch(0, 10, 10), 'rows must be'),
  (lambda: count_sketch.CountSketch(3, 0, 10), 'columns must be'),
  (
    lambda: dpsfl.SketchAggregatorFactory(rows=3, columns=10, k=0),
    'k must be',
  ),
  (
    lambda: dpsfl.SketchAggregatorFactory(
      rows=3, columns=10, k=2, momentum=1.5
    ),
    r'momentum must be in \[0, 1\)',
  ),
  (
    lambda: dpsfl_adaptive_clip.AdaptiveClip(target_probability=0.0).check(),
    r'target_probability must be in \(0, 1\)',
  ),
  (
    lambda: dpsfl_adaptive_clip.AdaptiveClip(bit_noise_multiplier=-1.0).check(),
    'bit_noise_multiplier must be >= 0',
  ),
  (lambda: cmp_fed.CMPFedFactory(0), 'rank must be'),
  (
    lambda: cmp_fed.cmp_fed(
      2, noise_multiplier=1.0, clients_per_round=5, clip_u=1.0, clip_v=0.0
    ),
    r'clip_v \(C2\) must be > 0',
  ),
  # Client works.
  (lambda: blur.blur_penalty(-0.1, 1.0), 'lam'),
  (lambda: blur.blur_penalty(0.1, 0.0), r'clip_norm \(S\)'),
  (lambda: lus.check_sparsity(1.0), 'sparsity'),
  (lambda: fl_top.check_ratio(0.0), r'top_k_ratio must be in \(0, 1\]'),
  (lambda: model_clip.check_clip(-1.0), 'clip must be > 0'),
  (lambda: diagnostics.update_norm_metrics(0.0), 'clip must be > 0'),
  # Partitions and audit.
  (
    lambda: partition.dirichlet_partition(np.zeros(10, int), 2, 0.0, seed=0),
    'alpha must be',
  ),
  (lambda: gaussian_shift.gdp_epsilon(1.0, 1.5), r'delta must be in \(0, 1\)'),
  # Config fields (flags), checked before data is loaded.
  (lambda: _config(rounds=0), 'rounds must be'),
  (lambda: _config(client_sampling_rate=1.5), 'client_sampling_rate'),
  (lambda: _config(clip=-1.0), 'clip must be'),
  (lambda: _config(delta=2.0), r'delta must be in \(0, 1\)'),
  (lambda: _config(client_momentum=1.0), 'client_momentum'),
  (lambda: _config(method='lus', lus_sparsity=1.0), 'lus_sparsity'),
  (lambda: _config(method='fl_top_dp', top_k_ratio=0.0), 'top_k_ratio'),
  (
    lambda: _config(method='dp_randagg', randagg_fraction=2.0),
    'randagg_fraction',
  ),
  (lambda: _config(method='blur', blur_lambda=-1.0), 'blur_lambda'),
  (
    lambda: _config(method='blur_lus', blur_lambda=40.0, client_lr=0.03),
    r'blur_lambda must be below 1 / client_lr \(33.3333; seed 000, Lemma 2\)'
    r'. Found 40.0',
  ),
  (lambda: _config(method='dpsfl', sketch_rows=0), 'sketch_rows must be'),
  (lambda: _config(method='dpsfl', sketch_k=0), 'sketch_k must be'),
  (lambda: _config(method='dpsfl', sketch_lr=0.0), 'sketch_lr must be'),
  (
    lambda: _config(client_lr_decay=1.01),
    r'client_lr_decay must be in \(0, 1\]. Found 1.01',
  ),
  (
    lambda: _config(method='dpsfl', sketch_k=101, sketch_columns=100),
    r'sketch_k must be at most sketch_columns \(100\).*Found 101',
  ),
  (lambda: _config(method='dpsfl', sketch_momentum=1.0), 'sketch_momentum'),
  (
    lambda: _config(method='dpsfl', sketch_hashing='md5'),
    'hashing must be one of',
  ),
  (lambda: _config(public_batch='mnist'), 'public_batch must be one of'),
  (
    lambda: _config(method='cmp_fed', cmp_layout='oi'),
    "layout must be one of .* Found 'oi'",
  ),
  (
    lambda: _config(method='dp_randagg', randagg_clip_scope='k'),
    "clip_scope must be one of .* Found 'k'",
  ),
  (
    lambda: _config(method='cmp_fed', cmp_vectors_phase='w'),
    "vectors_phase must be one of .* Found 'w'",
  ),
  (
    lambda: _config(method='cmp_fed', cmp_dense_below=-1),
    'cmp_dense_below must be an integer >= 0. Found -1',
  ),
  (
    lambda: _config(method='fl_top', clip_from_public_round=True),
    r"clip_from_public_round is for methods .* Found method='fl_top'",
  ),
  (
    lambda: _config(clip_from_public_round=True, clip_source='probe'),
    "Set clip_from_public_round or clip_source, not both.*'probe'",
  ),
  (
    lambda: _config(method='dpsfl_ac', dpsfl_target_probability=1.0),
    'dpsfl_target_probability',
  ),
  (lambda: _config(method='dpsfl_ac', dpsfl_bit_noise=-1.0), 'dpsfl_bit_noise'),
  (
    lambda: _config(method='dpsfl_ac', dpsfl_impact_rule='ratio'),
    r"impact_rule must be one of \('relative', 'absolute'\)",
  ),
  (
    lambda: _config(method='dpsfl_ac', dpsfl_impact_threshold=1.5),
    r'impact_threshold must be in \(0, 1\) for the relative rule',
  ),
  (lambda: _config(method='cmp_fed', cmp_rank=0), 'cmp_rank must be'),
  (lambda: _config(method='cmp_fed', cmp_clip_u=0.0), 'cmp_clip_u must be'),
  (lambda: _config(accountant='moments'), 'accountant'),
  (lambda: _config(method='nope'), 'Unknown method'),
  (lambda: _config(task='nope'), 'Unknown task'),
]


@pytest.mark.parametrize('call, match', CASES)
def test_rejects_with_a_clear_message(call, match):
  with pytest.raises(ValueError, match=match) as info:
    call()
  message = str(info.value)
  # Names the parameter and shows the bad value or the allowed choices.
  assert 'Found' in message or 'choose' in message or 'must' in message


@pytest.mark.parametrize(
  'method, k, warned',
  [
    ('dpsfl', 1001, True),  # k / columns just above 0.1.
    ('fetchsgd', 5000, True),
    ('dpsfl_ac', 1000, False),  # Exactly 0.1.
    ('dp_fedavg', 5000, False),  # Not a sketching method.
  ],
)
def test_warns_when_k_is_a_large_fraction_of_the_columns(method, k, warned):
  with mock.patch.object(training.logging, 'warning') as warning:
    _config(method=method, sketch_k=k, sketch_columns=10000)
  messages = [call.args[0] % call.args[1:] for call in warning.call_args_list]
  expected = f'sketch_k / sketch_columns = {k / 10000:.2f} > 0.1'
  assert any(m.startswith(expected) for m in messages) == warned, messages
