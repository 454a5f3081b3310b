"""CMP-Fed and UV-Fed: low-rank updates by one power iteration.

Guo et al. (CMP-Fed), Alg. 1: each kernel is a matrix Delta (m x n) of rank
r_l = min(rank, m, n), and a round is two secure-sum phases. Phase 1:
U = (sum_i clip_C1(Delta_i V) + N(0, (z C1)^2)) / S, U_hat = qr(U). Phase
2: V' = (sum_i clip_C2(Delta_i^T U_hat) + N(0, (z C2)^2)) / S. The update
is U_hat V'^T per matrix (dense tensors: their noisy mean) and V' is the
next round's V (V_0 ~ N(0, 1) from the public seed). UV-Fed: the same
phases as plain means over the participants, no clip and no noise.

This module holds the factory, its options, payload sizes and builders;
how a value's kernels become matrices and the round's TF computations
(encoders, QR, decoder) are in `cmp_fed_encoding`.
See docs/papers/cmp_fed.md for the paper's reading and derivations.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow_federated as tff

from tff_dp.aggregators import cmp_fed_encoding
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import mf_strategy
from tff_dp.aggregators import weighting


LAYOUTS = ('out_in', 'in_out', 'min_side')
VECTOR_PHASES = ('v', 'u')


def _check_dense_below(dense_below: int) -> None:
  if not isinstance(dense_below, (int, np.integer)) or dense_below < 0:
    raise ValueError(
      f'dense_below must be an integer >= 0. Found {dense_below!r}.'
    )


def check_options(
  layout: str, vectors_phase: str, dense_below: int = 0
) -> None:
  """Raises ValueError unless the layout options are allowed.

  Args:
    layout: One of `LAYOUTS`.
    vectors_phase: One of `VECTOR_PHASES`.
    dense_below: An integer >= 0.

  Raises:
    ValueError: Naming the first bad option (`dense_below` first) and its
      allowed values.
  """
  _check_dense_below(dense_below)
  if layout not in LAYOUTS:
    raise ValueError(f'layout must be one of {LAYOUTS}. Found {layout!r}.')
  if vectors_phase not in VECTOR_PHASES:
    raise ValueError(
      f'vectors_phase must be one of {VECTOR_PHASES}. Found '
      f'{vectors_phase!r}.'
    )


def _check_rank(rank: int) -> None:
  if not isinstance(rank, (int, np.integer)) or rank < 1:
    raise ValueError(f'rank must be an integer >= 1. Found {rank!r}.')


def _check_dp_args(noise_multiplier, clients_per_round, clip_u, clip_v):
  """Checks CMP-Fed's DP arguments, or that UV-Fed was given no clip."""
  if noise_multiplier is None:
    if clip_u is not None or clip_v is not None:
      raise ValueError('clip_u and clip_v need noise_multiplier (CMP-Fed).')
    return
  for name, c in (('clip_u (C1)', clip_u), ('clip_v (C2)', clip_v)):
    if c is None or not c > 0:
      raise ValueError(f'{name} must be > 0. Found {c!r}.')
  # The checks of the phases' DP query (`dp_fedavg.gaussian_fixed`), here
  # at construction; C1 is checked as its `clip` (a finite number).
  dp_fedavg._check('noise_multiplier', noise_multiplier, positive=False)
  dp_fedavg._check('clients_per_round', clients_per_round, positive=True)
  dp_fedavg._check('clip', clip_u, positive=True)


def payload_sizes(
  shapes,
  rank: int,
  layout: str = 'out_in',
  vectors_phase: str = 'v',
  dense_below: int = 0,
) -> tuple[int, int]:
  """`(phase-1 floats, phase-2 floats)` a client sends for these shapes."""
  check_options(layout, vectors_phase, dense_below)
  up1 = up2 = vecs = 0
  for shape in shapes:
    dims = cmp_fed_encoding.matrix_dims(shape, rank, layout, dense_below)
    if dims:
      m, n, r, _ = dims
      up1, up2 = up1 + m * r, up2 + n * r
    else:
      vecs += int(np.prod(shape)) if list(shape) else 1
  if vectors_phase == 'u':
    return up1 + vecs, up2
  return up1, up2 + vecs


def signal_share(mean_norm: float, noise_energy: float) -> float:
  """Estimated share of a released mean's energy that is not noise.

  For noise n independent of the clipped mean x, E||x + n||^2 = ||x||^2 +
  E||n||^2, so 1 - E||n||^2 / ||x + n||^2 estimates ||x||^2 / ||x + n||^2
  from one measured norm (clamped at 0; one round's estimate is noisy, so
  take a median over rounds). Near 0, the phase released mostly noise: for
  phase 1, U_hat then spans a nearly random subspace.
  """
  if not noise_energy >= 0:
    raise ValueError(f'noise_energy must be >= 0. Found {noise_energy!r}.')
  if not mean_norm > 0:
    raise ValueError(f'mean_norm must be > 0. Found {mean_norm!r}.')
  return max(0.0, 1.0 - noise_energy / mean_norm**2)


def _process(
  value_type,
  inner_u: tff.templates.AggregationProcess,
  inner_v: tff.templates.AggregationProcess,
  comps: cmp_fed_encoding.Computations,
  measure_client_norms: bool,
) -> tff.templates.AggregationProcess:
  """The round: the two phases, the result, the state and the release."""

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(
      collections.OrderedDict(
        v=tff.federated_eval(comps.initial_v, tff.SERVER),
        u_phase=inner_u.initialize(),
        v_phase=inner_v.initialize(),
      )
    )

  @tff.federated_computation(
    init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS)
  )
  def next_fn(state, value):
    u_payload = tff.federated_map(
      comps.encode_u, (value, tff.federated_broadcast(state.v))
    )
    u_out = inner_u.next(state.u_phase, u_payload)
    u_hat = tff.federated_map(comps.orthogonalize, u_out.result)
    v_payload = tff.federated_map(
      comps.encode_v, (value, tff.federated_broadcast(u_hat))
    )
    v_out = inner_v.next(state.v_phase, v_payload)
    result = tff.federated_map(
      comps.decode, (u_hat, v_out.result, u_out.result)
    )
    new_state = tff.federated_zip(
      collections.OrderedDict(
        v=tff.federated_map(comps.v_matrices, v_out.result),
        u_phase=u_out.state,
        v_phase=v_out.state,
      )
    )
    measured = collections.OrderedDict(
      u=u_out.measurements,
      v=v_out.measurements,
      mean_norms=tff.federated_map(comps.norms, (u_out.result, v_out.result)),
    )
    if measure_client_norms:
      # Not private: the cohort's mean pre-clip norms of U_i, V_i and the
      # vectors, to set C1 and C2 by the paper's median rule.
      measured['client_norms'] = tff.federated_mean(
        tff.federated_map(comps.client_norms, (u_payload, v_payload))
      )
    measurements = tff.federated_zip(measured)
    return tff.templates.MeasuredProcessOutput(new_state, result, measurements)

  return tff.templates.AggregationProcess(init_fn, next_fn)


class CMPFedFactory(
  tff.aggregators.UnweightedAggregationFactory, weighting.Weightable
):
  """CMP-Fed (private) or UV-Fed (non-private), unweighted.

  The value is a structure of float tensors. Each kernel (2 or more
  dimensions and at least `dense_below` entries) is a matrix Delta (m x n;
  `cmp_fed_encoding.matrix_dims`, U's side set by `layout`) of rank
  r_l = min(rank, m, n); every other tensor (biases, small kernels) is sent
  dense. The server's state holds V (n x r_l per matrix), V_0 i.i.d.
  N(0, 1) from the public `seed`. A round is two phases in one `next`; a
  client sends:
    1. U_i = Delta_i V per matrix (m x r_l), with the dense tensors if
       `vectors_phase='u'`;
    2. V_i = Delta_i^T U_hat per matrix (n x r_l), with the dense tensors
       if `vectors_phase='v'`, after the server broadcast U_hat, the
       reduced QR (orthonormal factor) of each matrix of phase 1's mean.
  CMP-Fed clips each phase's whole payload to L2 norm C_j (C1 = `clip_u`,
  C2 = `clip_v`; the guarded clip of `dp_queries`), sums it (with
  `secure_sum`, `tff.aggregators.SecureSumFactory` of bounds +-C_j), adds
  N(0, (z C_j)^2) to every coordinate of the sum and divides by
  `clients_per_round` (`dp_fedavg.gaussian_fixed`; each phase's noise its
  own stream of `noise_seed`). UV-Fed takes each phase's plain mean over
  the participants (`tff.aggregators.UnweightedMeanFactory`).

  Released: the two phases' (noisy) means. The result, U_hat V^T per
  matrix and the dense tensors' mean in the value's own type, the next
  state's V (the phase-2 mean's matrices) and `mean_norms` are
  post-processing of them.

  DP event (CMP-Fed): each phase's `DPAggregatorState` (state `u_phase`,
  `v_phase`) records `GaussianDpEvent(z)`; the round's event
  (`dp_events.released_event`, before sampling) is
  `ComposedDpEvent([GaussianDpEvent(z)] * 2)`, the two Gaussians on one
  cohort (the privacy ledger merges them exactly: one Gaussian of
  multiplier z / sqrt(2)). Neighbouring relation: add/remove-one client
  (client level: one client's two clipped payloads added or removed), the
  L2 sensitivity of phase j's sum C_j (replace-one, for fixed-size
  cohorts: 2 C_j, which `tff_dp.privacy` applies). UV-Fed releases no
  event.

  State: `OrderedDict(v=[V per matrix], u_phase=..., v_phase=...)`, V and
  the two phases' inner states.

  Measurements (`OrderedDict`):
    * `u`, `v`: each phase's inner measurements (CMP-Fed: the DP
      aggregator's `dp_query_metrics` and `dp`, the inner sum's; UV-Fed:
      the mean's `mean_value` and `mean_count`);
    * `mean_norms`: `u_norm` and `v_norm`, the L2 norms of the two
      phases' (noisy) means (`noise_energy` and `signal_share` turn them
      into each release's share of signal);
    * `client_norms` (only with `client_norms=True`; not private, outside
      the DP event): the cohort's means of the pre-clip L2 norms `u` and
      `v` (the matrices of U_i and V_i), `vectors` (the dense tensors; 0
      if none), `u_payload` and `v_payload` (each phase's whole payload),
      and `u_clipped` and `v_clipped`, the fractions of the cohort whose
      payload each clip cut (0 for UV-Fed).

  Legacy switches: `layout='in_out'` with `vectors_phase='u'` is what the
  30-round CMP-Fed and UV-Fed rows of benchmarks/results/seed001_iid.md and
  seed001_5labels.md (ranks 1-16, no `_180` or `_smoke` suffix) and
  seed001_iid.md's `cmp_fed_r4_in_out_smoke` were recorded with.

  Args:
    rank: r, an integer >= 1 (per matrix, reduced to min(m, n) where
      larger).
    noise_multiplier: z, a finite number >= 0 (CMP-Fed); None: UV-Fed (no
      clip, no noise).
    clients_per_round: The expected clients a round S (the DP mean's
      denominator), a finite number > 0; required by CMP-Fed.
    clip_u: C1 > 0 (finite), phase 1's clip over all its tensors;
      required by CMP-Fed, None for UV-Fed.
    clip_v: C2 > 0, phase 2's clip; required by CMP-Fed, None for UV-Fed.
    seed: Seeds V_0 (public randomness).
    noise_seed: Seeds the two phases' noise: None (default) draws a
      secret; an int s gives streams s + 1 and s + 2 (keep it secret).
    secure_sum: Sum the clipped payloads with
      `tff.aggregators.SecureSumFactory` (bounds +-C_j).
    layout: The side of each (in, out) kernel U sits on, one of `LAYOUTS`:
      'out_in' (U has the output side's rows; the default), 'in_out' (the
      input side's; the legacy rows above) or 'min_side' (the smaller
      one).
    vectors_phase: The phase whose clipped payload carries the dense
      tensors, one of `VECTOR_PHASES`: 'v' (under C2; the default) or 'u'
      (under C1; the legacy rows above).
    dense_below: An integer >= 0: kernels with fewer entries travel dense
      with the vectors, under that phase's clip (ours, not the paper's; 0,
      the default, factorises every kernel).
    client_norms: Also measure `client_norms` (not private: for tuning C1
      and C2 in simulation; off by default).
    noise: None (default): noise independent across rounds. An
      `mf_strategy.Strategy`: each phase's noise correlated across rounds
      in its own stream (`dp_fedavg.gaussian_fixed(noise=...)`), CMP-Fed
      only; each phase's state records `MatrixFactorizationDpEvent(z,
      strategy)`, and the ledger merges the two as it merges Gaussians
      (`tff_dp.privacy.merge_gaussians`).

  Raises:
    ValueError: At construction, on a bad argument, naming it and its
      allowed range, or if `clip_u` or `clip_v` is given without
      `noise_multiplier`; at `create`, if no tensor is a kernel to
      factorise, or if C2 is not a finite number; `noise_energy`, for
      UV-Fed.
    TypeError: At `create`, if the value has a non-float tensor.
  """

  def __init__(
    self,
    rank: int,
    *,
    noise_multiplier: Optional[float] = None,
    clients_per_round: Optional[float] = None,
    clip_u: Optional[float] = None,
    clip_v: Optional[float] = None,
    seed: int = 0,
    noise_seed: dp_queries.NoiseSeed = None,
    secure_sum: bool = True,
    layout: str = 'out_in',
    vectors_phase: str = 'v',
    dense_below: int = 0,
    client_norms: bool = False,
    noise: Optional[mf_strategy.Strategy] = None,
  ):
    """Checks the arguments; see the class docstring."""
    _check_rank(rank)
    correlated_noise.check_noise(
      noise,
      private=noise_multiplier is not None,
      needs='CMP-Fed: pass noise_multiplier and the clips',
    )
    self._noise = noise
    check_options(layout, vectors_phase, dense_below)
    _check_dp_args(noise_multiplier, clients_per_round, clip_u, clip_v)
    self._dense_below = int(dense_below)
    self._layout = layout
    self._vectors_phase = vectors_phase
    self._rank = int(rank)
    self._private = noise_multiplier is not None
    self._z = noise_multiplier
    self._clients = clients_per_round
    self._clips = (clip_u, clip_v)
    self._seed = int(seed)
    # Resolved now: every process this factory creates draws the same noise.
    self._noise_seeds = tuple(
      dp_queries.resolve_seed(dp_queries.offset_seed(noise_seed, 1 + phase))
      for phase in (0, 1)
    )
    self._secure_sum = bool(secure_sum)
    self._client_norms = bool(client_norms)

  def noise_energy(self, shapes) -> tuple[float, float]:
    """Expected squared L2 norm of the noise in each phase's released mean.

    Phase j adds N(0, (z C_j)^2) to each of its d_j sums and divides by the
    expected cohort S, so E||noise_j||^2 = d_j (z C_j / S)^2 (d_1, d_2 from
    `payload_sizes`). Compare with the `mean_norms` measurements through
    `signal_share`.

    Raises:
      ValueError: For UV-Fed, which adds no noise.
    """
    if not self._private:
      raise ValueError('noise_energy needs noise_multiplier (CMP-Fed).')
    d1, d2 = payload_sizes(
      shapes, self._rank, self._layout, self._vectors_phase, self._dense_below
    )
    scale = self._z / self._clients
    clip_u, clip_v = self._clips
    return d1 * (scale * clip_u) ** 2, d2 * (scale * clip_v) ** 2

  def _phase_factory(self, phase: int):
    if not self._private:
      return tff.aggregators.UnweightedMeanFactory()
    clip = self._clips[phase]
    return dp_fedavg.gaussian_fixed(
      self._z,
      self._clients,
      clip,
      noise_seed=self._noise_seeds[phase],
      noise=self._noise,
      record_aggregation_factory=(
        tff.aggregators.SecureSumFactory(clip, -clip)
        if self._secure_sum
        else None
      ),
    )

  def create(self, value_type) -> tff.templates.AggregationProcess:
    plan = cmp_fed_encoding.make_plan(
      value_type,
      self._rank,
      self._layout,
      self._dense_below,
      self._vectors_phase,
    )
    inner_u = self._phase_factory(0).create(plan.u_type)
    inner_v = self._phase_factory(1).create(plan.v_type)
    # Each phase's clip (inf without DP: nothing is clipped).
    clips = self._clips if self._private else (np.inf, np.inf)
    comps = cmp_fed_encoding.computations(plan, value_type, self._seed, clips)
    return _process(value_type, inner_u, inner_v, comps, self._client_norms)


def cmp_fed(
  rank: int,
  *,
  noise_multiplier: float,
  clients_per_round: float,
  clip_u: float,
  clip_v: float,
  seed: int = 0,
  noise_seed: dp_queries.NoiseSeed = None,
  **options,
) -> CMPFedFactory:
  """CMP-Fed: two clipped, noised, secure-summed power-iteration phases.

  Args:
    rank: r, an integer >= 1 per matrix.
    noise_multiplier: z, a finite number >= 0.
    clients_per_round: The expected clients a round (the DP mean's
      denominator), a finite number > 0.
    clip_u: C1 > 0, phase 1's clip.
    clip_v: C2 > 0, phase 2's clip.
    seed: Seeds V_0 (public randomness).
    noise_seed: Seeds the two phases' noise (None: a secret).
    **options: `layout`, `vectors_phase`, `dense_below`, `secure_sum`,
      `client_norms`, `noise` (see `CMPFedFactory`).

  Returns:
    The `CMPFedFactory`, whose round releases
    `ComposedDpEvent([GaussianDpEvent(z)] * 2)` (add/remove-one; with
    `noise`, two `MatrixFactorizationDpEvent(z, strategy)`).

  Raises:
    ValueError: On a bad argument (see `CMPFedFactory`).
  """
  return CMPFedFactory(
    rank,
    noise_multiplier=noise_multiplier,
    clients_per_round=clients_per_round,
    clip_u=clip_u,
    clip_v=clip_v,
    seed=seed,
    noise_seed=noise_seed,
    **options,
  )


def uv_fed(rank: int, *, seed: int = 0, **options) -> CMPFedFactory:
  """UV-Fed: the same low-rank power iteration without clipping or noise.

  Args:
    rank: r, an integer >= 1 per matrix.
    seed: Seeds V_0 (public randomness).
    **options: `layout`, `vectors_phase`, `dense_below`, `client_norms`
      (see `CMPFedFactory`; `secure_sum` is unused).

  Returns:
    The non-private `CMPFedFactory` (means over the participants; it
    releases no DP event).

  Raises:
    ValueError: On a bad argument (see `CMPFedFactory`).
  """
  return CMPFedFactory(rank, seed=seed, **options)


def upload_bytes(shapes, rank: int, dense_below: int = 0) -> int:
  """float32 U and V, and the dense tensors, over the two phases."""
  up1, up2 = payload_sizes(shapes, rank, dense_below=dense_below)
  return 4 * (up1 + up2)


def extra_download_bytes(shapes, rank: int, dense_below: int = 0) -> int:
  """V (phase 1) and U_hat (phase 2) broadcast besides the model."""
  _check_dense_below(dense_below)
  total = 0
  for shape in shapes:
    dims = cmp_fed_encoding.matrix_dims(shape, rank, 'out_in', dense_below)
    if dims:
      m, n, r, _ = dims
      total += (m + n) * r
  return 4 * total
