"""Planted bugs the audit must catch.

Planted bugs (`PLANTED_BUGS`, `planted_dp_fedavg`, `planted_method`,
`with_half_noise`) are DP-FedAvg queries that report the event of the
correct mechanism while they skip the clip, add half the noise or never
advance their noise seed, and any private method built with half its
noise multiplier while declaring the full one: the audit's calibration
(`tests/tff_dp/reporting/planted_bugs_test.py`,
`benchmarks/privacy_audit.py`). `planted_correlated_reuse` repeats one
draw of a correlated noise stream (what `noise_reuse.noise_reuse_check`
with its `strategy` must catch), and `DeclaredEventFactory` declares one
event whatever ran (the ledger bug of `with_half_noise`).
"""

import dataclasses

import dp_accounting
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp import methods as methods_lib
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import mf_strategy


PLANTED_BUGS = ('no_clip', 'half_noise', 'reused_noise')


class DeclaredEventFactory(tff.aggregators.UnweightedAggregationFactory):
  """`inner`'s aggregation, declaring `event` as each round's release
  (`dp_events.released_event`) whatever ran: a planted ledger bug."""

  def __init__(self, inner, event: dp_accounting.DpEvent):
    self._inner, self._event = inner, event

  def create(self, value_type) -> tff.templates.AggregationProcess:
    return self._inner.create(value_type)

  def released_event(self, state, measurements) -> dp_accounting.DpEvent:
    del state, measurements
    return self._event


class _PlantedGaussianSumQuery(dp_queries.SeededGaussianSumQuery):
  """DP-FedAvg's sum query with one planted bug; its event is the correct
  mechanism's, `GaussianDpEvent(stddev / l2_norm_clip)`."""

  def __init__(self, bug: str, l2_norm_clip: float, stddev: float, seed):
    if bug not in PLANTED_BUGS:
      raise ValueError(f'bug must be one of {PLANTED_BUGS}. Found {bug!r}.')
    super().__init__(l2_norm_clip, stddev, seed)
    self._bug = bug

  def preprocess_record_impl(self, params, record):
    if self._bug != 'no_clip':
      return super().preprocess_record_impl(params, record)
    return record, tf.linalg.global_norm(tf.nest.flatten(record))

  def get_noised_result(self, sample_state, global_state):
    if self._bug == 'half_noise':
      result, new_state, _ = super().get_noised_result(
        sample_state, global_state._replace(stddev=global_state.stddev / 2)
      )
      event = dp_accounting.GaussianDpEvent(
        global_state.stddev / global_state.l2_norm_clip
      )
      return result, new_state._replace(stddev=global_state.stddev), event
    result, new_state, event = super().get_noised_result(
      sample_state, global_state
    )
    if self._bug == 'reused_noise':
      new_state = global_state  # The seed never advances.
    return result, new_state, event


def planted_dp_fedavg(
  bug: str,
  noise_multiplier: float,
  clients_per_round: float,
  clip: float,
  *,
  noise_seed: dp_queries.NoiseSeed = None,
) -> dp_fedavg.DPFactory:
  """A broken `dp_fedavg.gaussian_fixed` whose state holds the correct event.

  Args:
    bug: One of `PLANTED_BUGS`: 'no_clip' (noise for `clip`, nothing
      clipped), 'half_noise' (noise multiplier / 2 added) or
      'reused_noise' (the noise seed never advances: the same noise every
      round).
    noise_multiplier: The multiplier the event reports, >= 0.
    clients_per_round: The mean's denominator, > 0.
    clip: The clip the noise is calibrated to, > 0.
    noise_seed: As for `dp_fedavg.gaussian_fixed`.

  Raises:
    ValueError: On an unknown bug or a bad argument.
  """
  # Validates the numbers.
  dp_fedavg.gaussian_fixed(noise_multiplier, clients_per_round, clip)
  query = tfp.NormalizedQuery(
    _PlantedGaussianSumQuery(bug, clip, clip * noise_multiplier, noise_seed),
    denominator=float(clients_per_round),
  )
  return dp_fedavg.DPFactory(query)


class _ReusedCorrelatedQuery(correlated_noise.CorrelatedGaussianSumQuery):
  """The correlated-noise query with its seed never advanced: the same
  draw `w` every round, correlated by `C^-1` as a correct stream is."""

  def get_noised_result(self, sample_state, global_state):
    result, new_state, event = super().get_noised_result(
      sample_state, global_state
    )
    return result, new_state._replace(seed=global_state.seed), event


class _PlantedCorrelatedFactory(dp_fedavg.CorrelatedDPFactory):
  def _build_query(self, specs):
    clip, stddev, strategy, seed = self._mf_args
    return tfp.NormalizedQuery(
      _ReusedCorrelatedQuery(clip, stddev, strategy, specs, seed),
      denominator=self._denominator,
    )


def planted_correlated_reuse(
  strategy: mf_strategy.Strategy,
  noise_multiplier: float,
  clients_per_round: float,
  clip: float,
  *,
  noise_seed: dp_queries.NoiseSeed = None,
) -> dp_fedavg.DPFactory:
  """`dp_fedavg.gaussian_fixed(..., noise=strategy)` whose noise seed
  never advances (one draw repeated through `C^-1`), its event the correct
  one: what `noise_reuse.noise_reuse_check(..., strategy=strategy)` must
  catch.

  Raises:
    ValueError: On a bad argument (as `gaussian_fixed`).
  """
  dp_fedavg.gaussian_fixed(
    noise_multiplier, clients_per_round, clip, noise=strategy
  )
  return _PlantedCorrelatedFactory(
    clip,
    clip * noise_multiplier,
    strategy,
    clients_per_round,
    noise_seed,
    None,
  )


def planted_method(bug: str) -> methods_lib.Method:
  """DP-FedAvg with a planted bug, its event read from its state (as
  `dp_fedavg`'s is); not registered."""
  if bug not in PLANTED_BUGS:
    raise ValueError(f'bug must be one of {PLANTED_BUGS}. Found {bug!r}.')
  dp_fedavg_method = methods_lib.METHODS['dp_fedavg']
  return dataclasses.replace(
    dp_fedavg_method,
    name=f'dp_fedavg_planted_{bug}',
    description=f'DP-FedAvg with a planted bug ({bug}).',
    build_aggregator=lambda p: planted_dp_fedavg(
      bug,
      p.noise_multiplier,
      p.expected_clients_per_round,
      p.clip,
      noise_seed=p.noise_seed,
    ),
    setup=None,
  )


def with_half_noise(method: methods_lib.Method) -> methods_lib.Method:
  """`method` built with half its noise multiplier, declaring the full one.

  Its factory declares `method.round_event(z, params)` (the params' z) as
  its release (`DeclaredEventFactory`), so the ledger claims twice the
  noise that runs. Not registered.

  Raises:
    ValueError: If the method declares no round event (not private).
  """
  if method.round_event is None:
    raise ValueError(f'Method {method.name!r} declares no round event.')

  def build(p: methods_lib.MethodParams):
    return DeclaredEventFactory(
      method.build_aggregator(
        dataclasses.replace(p, noise_multiplier=p.noise_multiplier / 2)
      ),
      method.round_event(p.noise_multiplier, p),
    )

  return dataclasses.replace(
    method,
    name=f'{method.name}_planted_half_noise',
    description=f'{method.description} Planted bug: half the noise.',
    build_aggregator=build,
  )
