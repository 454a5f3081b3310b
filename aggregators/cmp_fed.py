"""CMP-Fed and UV-Fed: low-rank updates by one power iteration (seed 001).

Guo, Hu, Gong, "Agent-Level Differentially Private Federated Learning via
Compressed Model Perturbation" (seed 001), Alg. 1. Every weight tensor of the
update is treated as a matrix Delta (m x n), "a set of weight matrices, each
corresponding to a layer", with "subspace U is an m by r matrix, model
embedding V is an n by r matrix". Which side of a layer is m the seed does not
say. A TF kernel of shape (..., c_out) is the (in, out) matrix K with in =
prod(...). By default (`layout='out_in'`) M = K^T, so U has the output side's
rows, as on a PyTorch weight (out, in): the seed's code is in PyTorch ("All
the algorithms are implemented in PyTorch") and it cites PowerSGD [9], whose P
= M Q sits on the output side. This is our reading, by inference. It matters:
U is the release that picks the subspace and its noise energy grows with its
coordinates (618 r rows for the McMahan CNN against 4,473 r on the input
side). `layout='in_out'` (U on the input side) is what runs before issue #24
used; `'min_side'` puts U on the smaller side of each matrix. Each matrix has
a rank r_l = min(rank, m, n) (a rank above min(m, n) is reduced to it: that
factorisation is already exact). Vectors (biases, norms) are not factorised:
they travel dense in the clipped payload of one phase, the second by default
(`vectors_phase='v'`, under C2); the seed says nothing about them. Sent in the
first phase (`'u'`, runs before issue #24) they share C1 with U, and a client
whose biases alone exceed C1 scales its U down with them.
`dense_below=N` (ours, not the seed's; default 0) treats every kernel with
fewer than N entries as a vector too: only the large layers are factorised,
and the small ones travel dense, clipped and noised with the biases. The
`client_norms` measurement reports the cohort's mean pre-clip norms of U_i,
V_i and the vectors. The server keeps V (n x r_l per matrix) in its state
as the warm start; a round is two secure-sum phases in one
`AggregationProcess.next`:

1. clients compute U_i = Delta_i V, clipped to C1 over all layers together
   (with the vectors if `vectors_phase='u'`); the DP query adds
   N(0, (z C1)^2) to the sum and divides by the expected number of clients
   (secure sum of clipped values); the server orthonormalises each mean U
   by a reduced QR into U_hat and broadcasts it;
2. clients compute V_i = Delta_i^T U_hat (with the vectors by default),
   clipped to C2, noised N(0, (z C2)^2) the same way;

and the update is U_hat V^T per matrix, with the vectors' noisy mean.
The mean V of phase 2 is the next round's warm start, as in the seed's
Alg. 1 (line 15 feeds line 6; PowerSGD's reuse). V_0 is seeded i.i.d.
N(0, 1) from the public `seed`; the two phases' noise comes from
`noise_seed` (secret by default, see `dp_fedavg.gaussian_fixed`), one
independent stream per phase. Seed 001's per-agent noise
sigma_j = C_j z / sqrt(S) summed over S agents is N(0, (C_j z)^2) on the
sum: the same release, added once here. Each phase's payload is clipped by
the guarded clip of `dp_queries` (U = Delta V can overflow float32 even for
a bounded Delta).

C1 and C2 are the caller's. The seed's rule for them is "the clipping
parameter is selected according to the median of the l2-norm of the
subspace/embedding/model to be clipped" (Sec. V); `client_norms` below
measures those norms, and `benchmarks.studies.cmp_clip_from_run` applies
the rule to a probe run (tuning outside the privacy ledger unless the probe
runs on public data).

Each round releases two Gaussians of multiplier z on the same sampled
cohort; both DP states keep their event and the ledger composes them (and
merges them exactly: one Gaussian of multiplier z / sqrt(2)).

**UV-Fed** (the seed's non-private variant): the same two phases with no
clipping and no noise, means over the participants.

Measurements: `u` and `v`, the inner aggregators'; `mean_norms` (u_norm,
v_norm): the L2 norms of the two phases' (noisy) means; `client_norms` (u,
v, vectors, u_payload, v_payload, u_clipped, v_clipped): the cohort's mean
pre-clip norms of U_i, V_i (matrices), of the vectors and of each phase's
whole payload, and the fraction of the cohort whose phase-1 and phase-2
payloads each clip cut (not private: a diagnostic beside the update
diagnostics).
`CMPFedFactory.noise_energy` and `signal_share` turn them into how much of
each release was signal.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import dp_fedavg
from tff_dp.aggregators import dp_queries
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
  _check_dense_below(dense_below)
  if layout not in LAYOUTS:
    raise ValueError(f'layout must be one of {LAYOUTS}. Found {layout!r}.')
  if vectors_phase not in VECTOR_PHASES:
    raise ValueError(
      f'vectors_phase must be one of {VECTOR_PHASES}. Found '
      f'{vectors_phase!r}.'
    )


def matrix_dims(shape, rank: int, layout: str, dense_below: int = 0):
  """`(m, n, r, transpose)` of a kernel's matrix M (m x n), or None.

  A kernel of shape (..., c_out) is the (in, out) matrix K with
  in = prod(...); M is K ('in_out'), K^T ('out_in': U on the output side)
  or whichever puts the smaller side first ('min_side'). None (sent dense)
  for vectors and for kernels with fewer than `dense_below` entries.
  """
  shape = list(shape)
  if len(shape) < 2 or int(np.prod(shape)) < dense_below:
    return None
  k_in, k_out = int(np.prod(shape[:-1])), int(shape[-1])
  transpose = layout == 'out_in' or (layout == 'min_side' and k_in > k_out)
  m, n = (k_out, k_in) if transpose else (k_in, k_out)
  return m, n, min(rank, m, n), transpose


def _layout(value_type, rank: int, layout: str, dense_below: int):
  """Per tensor: (spec, matrix_dims or None for dense tensors)."""
  specs = tff.types.type_to_tf_tensor_specs(value_type)
  flat = tf.nest.flatten(specs)
  out = []
  for s in flat:
    if not s.dtype.is_floating:
      raise TypeError(f'CMP-Fed needs float tensors. Found {s!r}.')
    out.append((s, matrix_dims(s.shape.as_list(), rank, layout, dense_below)))
  return specs, out


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
    dims = matrix_dims(shape, rank, layout, dense_below)
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


class CMPFedFactory(
  tff.aggregators.UnweightedAggregationFactory, weighting.Weightable
):
  """CMP-Fed (private) or UV-Fed (see the module docstring)."""

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
  ):
    """Checks the arguments.

    Args:
      rank: r >= 1 (per matrix, reduced to min(m, n) where larger).
      noise_multiplier: z >= 0 (CMP-Fed); None: UV-Fed (no clip, no noise).
      clients_per_round: Expected clients a round, > 0 (CMP-Fed).
      clip_u: C1 > 0, the phase-1 clip over all layers (CMP-Fed).
      clip_v: C2 > 0, the phase-2 clip (CMP-Fed).
      seed: Seeds V_0 (public randomness).
      noise_seed: Seeds the two phases' noise: None (default) draws a
        secret; an int s gives streams s + 1 and s + 2 (keep it secret).
      secure_sum: Sum clipped payloads with `tff.aggregators.
        SecureSumFactory` (bounds +-C).
      layout: Which side of each (in, out) kernel U sits on: 'out_in' (U
        has the output side's rows, the default), 'in_out' (the input
        side's; runs before issue #24) or 'min_side' (the smaller one).
      vectors_phase: The phase whose clipped payload carries the vectors
        (biases): 'v' (under C2, the default) or 'u' (under C1; runs
        before issue #24).
      dense_below: Kernels with fewer entries than this are not factorised:
        they travel dense with the vectors, under that phase's clip (ours,
        not the seed's; 0, the default, factorises every kernel).
      client_norms: Also measure `client_norms`, the cohort's exact mean
        pre-clip norms and clipped fractions (not private: for tuning C1
        and C2 in simulation; off by default).

    Raises:
      ValueError: On a bad argument, naming it and its allowed range.
    """
    if not isinstance(rank, (int, np.integer)) or rank < 1:
      raise ValueError(f'rank must be an integer >= 1. Found {rank!r}.')
    check_options(layout, vectors_phase, dense_below)
    self._dense_below = int(dense_below)
    self._layout = layout
    self._vectors_phase = vectors_phase
    private = noise_multiplier is not None
    if private:
      for name, c in (('clip_u (C1)', clip_u), ('clip_v (C2)', clip_v)):
        if c is None or not c > 0:
          raise ValueError(f'{name} must be > 0. Found {c!r}.')
      # Validates noise_multiplier and clients_per_round.
      dp_fedavg.gaussian_fixed(noise_multiplier, clients_per_round, clip_u)
    elif clip_u is not None or clip_v is not None:
      raise ValueError('clip_u and clip_v need noise_multiplier (CMP-Fed).')
    self._rank = int(rank)
    self._private = private
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
      record_aggregation_factory=(
        tff.aggregators.SecureSumFactory(clip, -clip)
        if self._secure_sum
        else None
      ),
    )

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, layout = _layout(
      value_type, self._rank, self._layout, self._dense_below
    )
    matrices = [(i, dims) for i, (_, dims) in enumerate(layout) if dims]
    if not matrices:
      raise ValueError(
        f'CMP-Fed needs a kernel to factorise: none of {value_type} has 2 '
        f'or more dimensions and at least dense_below={self._dense_below} '
        'entries (DP-FedAvg sends every tensor dense).'
      )
    vectors = [i for i, (_, dims) in enumerate(layout) if not dims]
    f32 = np.float32
    vec_types = [tff.TensorType(f32, layout[i][0].shape) for i in vectors]
    in_u = self._vectors_phase == 'u'
    u_type = tff.StructWithPythonType(
      [tff.TensorType(f32, [m, r]) for _, (m, _, r, _) in matrices]
      + (vec_types if in_u else []),
      list,
    )
    v_type = tff.StructWithPythonType(
      [tff.TensorType(f32, [n, r]) for _, (_, n, r, _) in matrices]
      + ([] if in_u else vec_types),
      list,
    )
    v_state_type = tff.StructWithPythonType(
      [tff.TensorType(f32, [n, r]) for _, (_, n, r, _) in matrices], list
    )
    inner_u = self._phase_factory(0).create(u_type)
    inner_v = self._phase_factory(1).create(v_type)
    rng = np.random.default_rng(self._seed)
    v0 = [
      rng.standard_normal((n, r)).astype(f32) for _, (_, n, r, _) in matrices
    ]
    num_m = len(matrices)

    def as_matrices(value):
      flat = tf.nest.flatten(value)
      mats = []
      for i, (m, n, _, transpose) in matrices:
        k = tf.reshape(
          tf.cast(flat[i], tf.float32), [n, m] if transpose else [m, n]
        )
        mats.append(tf.transpose(k) if transpose else k)
      return mats, [tf.cast(flat[i], tf.float32) for i in vectors]

    @tff.tensorflow.computation
    def initial_v():
      return [tf.constant(v) for v in v0]

    @tff.tensorflow.computation(value_type, v_state_type)
    def encode_u(value, v):
      mats, vecs = as_matrices(value)
      return [tf.matmul(d, vi) for d, vi in zip(mats, v)] + (
        vecs if in_u else []
      )

    @tff.tensorflow.computation(u_type)
    def orthogonalize(u):
      return [tf.linalg.qr(ui)[0] for ui in u[:num_m]]

    @tff.tensorflow.computation(u_type, v_type)
    def norms(u, v):
      return collections.OrderedDict(
        u_norm=tf.linalg.global_norm(tf.nest.flatten(u)),
        v_norm=tf.linalg.global_norm(tf.nest.flatten(v)),
      )

    u_hat_type = orthogonalize.type_signature.result

    @tff.tensorflow.computation(value_type, u_hat_type)
    def encode_v(value, u_hat):
      mats, vecs = as_matrices(value)
      return [
        tf.matmul(d, ui, transpose_a=True) for d, ui in zip(mats, u_hat)
      ] + ([] if in_u else vecs)

    @tff.tensorflow.computation(v_type)
    def v_matrices(v):
      return list(v[:num_m])

    # Each phase's clip (inf without DP: nothing is clipped).
    clip_u, clip_v = self._clips if self._private else (np.inf, np.inf)
    measure_client_norms = self._client_norms

    @tff.tensorflow.computation(u_type, v_type)
    def client_norms(u, v):
      vecs = list(u[num_m:]) if in_u else list(v[num_m:])

      u_payload = tf.linalg.global_norm(tf.nest.flatten(u))
      v_payload = tf.linalg.global_norm(tf.nest.flatten(v))
      return collections.OrderedDict(
        u=tf.linalg.global_norm(list(u[:num_m])),
        v=tf.linalg.global_norm(list(v[:num_m])),
        vectors=tf.linalg.global_norm(vecs) if vecs else tf.constant(0.0),
        # Each phase's whole payload (what its clip sees).
        u_payload=u_payload,
        v_payload=v_payload,
        # The fraction of the cohort each phase's clip cut: 0.5 when the
        # clip sits at the median, as the seed's rule asks.
        u_clipped=tf.cast(u_payload > clip_u, tf.float32),
        v_clipped=tf.cast(v_payload > clip_v, tf.float32),
      )

    @tff.tensorflow.computation(u_hat_type, v_type, u_type)
    def decode(u_hat, v, u):
      flat = [None] * len(layout)
      for (i, (_, _, _, transpose)), ui, vi in zip(matrices, u_hat, v):
        m_hat = tf.matmul(ui, vi, transpose_b=True)
        flat[i] = tf.transpose(m_hat) if transpose else m_hat
      for i, dense in zip(vectors, u[num_m:] if in_u else v[num_m:]):
        flat[i] = dense
      return tf.nest.pack_sequence_as(
        specs,
        [
          tf.cast(tf.reshape(t, s.shape), s.dtype)
          for t, (s, _) in zip(flat, layout)
        ],
      )

    @tff.federated_computation()
    def init_fn():
      return tff.federated_zip(
        collections.OrderedDict(
          v=tff.federated_eval(initial_v, tff.SERVER),
          u_phase=inner_u.initialize(),
          v_phase=inner_v.initialize(),
        )
      )

    @tff.federated_computation(
      init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS)
    )
    def next_fn(state, value):
      u_payload = tff.federated_map(
        encode_u, (value, tff.federated_broadcast(state.v))
      )
      u_out = inner_u.next(state.u_phase, u_payload)
      u_hat = tff.federated_map(orthogonalize, u_out.result)
      v_payload = tff.federated_map(
        encode_v, (value, tff.federated_broadcast(u_hat))
      )
      v_out = inner_v.next(state.v_phase, v_payload)
      result = tff.federated_map(decode, (u_hat, v_out.result, u_out.result))
      new_state = tff.federated_zip(
        collections.OrderedDict(
          v=tff.federated_map(v_matrices, v_out.result),
          u_phase=u_out.state,
          v_phase=v_out.state,
        )
      )
      measured = collections.OrderedDict(
        u=u_out.measurements,
        v=v_out.measurements,
        mean_norms=tff.federated_map(norms, (u_out.result, v_out.result)),
      )
      if measure_client_norms:
        # Not private: the cohort's mean pre-clip norms of U_i, V_i and the
        # vectors, to set C1 and C2 by the seed's median rule.
        measured['client_norms'] = tff.federated_mean(
          tff.federated_map(client_norms, (u_payload, v_payload))
        )
      measurements = tff.federated_zip(measured)
      return tff.templates.MeasuredProcessOutput(
        new_state, result, measurements
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


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

  `options`: `layout`, `vectors_phase`, `dense_below`, `secure_sum` (see
  the factory).
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
  """UV-Fed: the same low-rank power iteration without clipping or noise."""
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
    dims = matrix_dims(shape, rank, 'out_in', dense_below)
    if dims:
      m, n, r, _ = dims
      total += (m + n) * r
  return 4 * total
