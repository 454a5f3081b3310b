"""DPSFL-AC's adaptive clip: the impact rules, its moves, the bit noise."""

import logging

import dp_accounting
import numpy as np
import pytest

import dpsfl_testing
from dpsfl_testing import D, TYPE

from tff_dp.runtime import contexts
from tff_dp import privacy
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import dpsfl_adaptive_clip


@pytest.fixture(scope='module', autouse=True)
def context():
  contexts.set_simulation_context()


def _clips_and_p_hat(entries, impact_rule, rounds=3):
  adaptive = dpsfl_adaptive_clip.AdaptiveClip(
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
    out = process.next(state, [dpsfl_testing.value(entries)] * 3)
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
    dpsfl.round_event(1.2, dpsfl_adaptive_clip.AdaptiveClip())


def test_dpsfl_ac_warns_when_bit_noise_dominates(caplog):
  # Issue 83 item 6: 10 expected clients, default sigma_b = 10 / 20 = 0.5,
  # sketch z = 1.185: merged 1 / sqrt(1.185^-2 + 0.5^-2) = 0.4607, 39% of
  # the sketch's own (below 80%).
  assert dpsfl_adaptive_clip.merged_noise_multiplier(
    1.185, 0.5
  ) == pytest.approx((1.185**-2 + 0.5**-2) ** -0.5, rel=1e-12)
  with caplog.at_level(logging.WARNING, logger='absl'):
    dpsfl.dpsfl_ac(
      3, 100, 5, noise_multiplier=1.185, clients_per_round=10, initial_clip=1.0
    )
  (record,) = (r for r in caplog.records if 'DPSFL-AC' in r.getMessage())
  assert record.levelno == logging.WARNING
  assert 'merged noise multiplier to 0.4607, 39%' in record.getMessage()
  caplog.clear()
  # 100 clients: sigma_b = 5, merged 1.153 = 97% of 1.185: no warning.
  with caplog.at_level(logging.WARNING, logger='absl'):
    dpsfl.dpsfl_ac(
      3, 100, 5, noise_multiplier=1.185, clients_per_round=100, initial_clip=1.0
    )
  assert not [r for r in caplog.records if 'DPSFL-AC' in r.getMessage()]
