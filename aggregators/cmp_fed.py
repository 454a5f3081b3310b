"""CMP-Fed and UV-Fed: low-rank updates by one power iteration (seed 001).

Guo, Hu, Gong, "Agent-Level Differentially Private Federated Learning via
Compressed Model Perturbation" (seed 001), Alg. 1. Every weight tensor of
the update is treated as a matrix Delta (m x n): a kernel of shape
(..., c_out) is reshaped to (prod(...), c_out), a dense kernel is already
(in, out). Each matrix has a rank r_l = min(rank, m, n) (a rank above
min(m, n) is reduced to it: that factorisation is already exact). Vectors
(biases, norms) are not factorised: they travel dense in the first phase,
inside its clipped payload. The server keeps V (n x r_l per matrix) in its
state as the warm start; a round is two secure-sum phases in one
`AggregationProcess.next`:

1. clients compute U_i = Delta_i V (plus their dense vectors), clipped to
   C1 over all layers together; the DP query adds N(0, (z C1)^2) to the sum
   and divides by the expected number of clients (secure sum of clipped
   values); the server orthonormalises each mean U by a reduced QR into
   U_hat and broadcasts it;
2. clients compute V_i = Delta_i^T U_hat, clipped to C2, noised
   N(0, (z C2)^2) the same way;

and the update is U_hat V^T per matrix (the dense vectors from phase 1).
The mean V of phase 2 is the next round's warm start, as in the seed's
Alg. 1 (line 15 feeds line 6; PowerSGD's reuse). V_0 is seeded i.i.d.
N(0, 1) from the public `seed`; the two phases' noise comes from
`noise_seed` (secret by default, see `dp_fedavg.gaussian_fixed`), one
independent stream per phase. Seed 001's per-agent noise
sigma_j = C_j z / sqrt(S) summed over S agents is N(0, (C_j z)^2) on the
sum: the same release, added once here. Each phase's payload is clipped by
the guarded clip of `dp_queries` (U = Delta V can overflow float32 even for
a bounded Delta).

Each round releases two Gaussians of multiplier z on the same sampled
cohort; both DP states keep their event and the ledger composes them (and
merges them exactly: one Gaussian of multiplier z / sqrt(2)).

**UV-Fed** (the seed's non-private variant): the same two phases with no
clipping and no noise, means over the participants.

Measurements: `u` and `v`, the inner aggregators'; `mean_norms` (u_norm,
v_norm): the L2 norms of the two phases' (noisy) means.
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


def _layout(value_type, rank: int):
  """Per tensor: (spec, (m, n, r) for matrices or None for vectors)."""
  specs = tff.types.type_to_tf_tensor_specs(value_type)
  flat = tf.nest.flatten(specs)
  layout = []
  for s in flat:
    if not s.dtype.is_floating:
      raise TypeError(f'CMP-Fed needs float tensors. Found {s!r}.')
    shape = s.shape.as_list()
    if len(shape) >= 2:
      m, n = int(np.prod(shape[:-1])), int(shape[-1])
      layout.append((s, (m, n, min(rank, m, n))))
    else:
      layout.append((s, None))
  return specs, layout


def payload_sizes(shapes, rank: int) -> tuple[int, int]:
  """`(phase-1 floats, phase-2 floats)` a client sends for these shapes."""
  up1 = up2 = 0
  for shape in shapes:
    shape = list(shape)
    if len(shape) >= 2:
      m, n = int(np.prod(shape[:-1])), int(shape[-1])
      r = min(rank, m, n)
      up1, up2 = up1 + m * r, up2 + n * r
    else:
      up1 += int(np.prod(shape)) if shape else 1
  return up1, up2


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


class CMPFedFactory(tff.aggregators.UnweightedAggregationFactory):
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

    Raises:
      ValueError: On a bad argument, naming it and its allowed range.
    """
    if not isinstance(rank, (int, np.integer)) or rank < 1:
      raise ValueError(f'rank must be an integer >= 1. Found {rank!r}.')
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
    d1, d2 = payload_sizes(shapes, self._rank)
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
    specs, layout = _layout(value_type, self._rank)
    matrices = [(i, mnr) for i, (_, mnr) in enumerate(layout) if mnr]
    vectors = [i for i, (_, mnr) in enumerate(layout) if not mnr]
    f32 = np.float32
    u_type = tff.StructWithPythonType(
      [tff.TensorType(f32, [m, r]) for _, (m, _, r) in matrices]
      + [tff.TensorType(f32, layout[i][0].shape) for i in vectors],
      list,
    )
    v_type = tff.StructWithPythonType(
      [tff.TensorType(f32, [n, r]) for _, (_, n, r) in matrices], list
    )
    inner_u = self._phase_factory(0).create(u_type)
    inner_v = self._phase_factory(1).create(v_type)
    rng = np.random.default_rng(self._seed)
    v0 = [rng.standard_normal((n, r)).astype(f32) for _, (_, n, r) in matrices]
    num_m = len(matrices)

    def as_matrices(value):
      flat = tf.nest.flatten(value)
      return [
        tf.reshape(tf.cast(flat[i], tf.float32), [m, n])
        for i, (m, n, _) in matrices
      ], [tf.cast(flat[i], tf.float32) for i in vectors]

    @tff.tensorflow.computation
    def initial_v():
      return [tf.constant(v) for v in v0]

    @tff.tensorflow.computation(value_type, v_type)
    def encode_u(value, v):
      mats, vecs = as_matrices(value)
      return [tf.matmul(d, vi) for d, vi in zip(mats, v)] + vecs

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
      mats, _ = as_matrices(value)
      return [tf.matmul(d, ui, transpose_a=True) for d, ui in zip(mats, u_hat)]

    @tff.tensorflow.computation(u_hat_type, v_type, u_type)
    def decode(u_hat, v, u):
      flat = [None] * len(layout)
      for (i, _), ui, vi in zip(matrices, u_hat, v):
        flat[i] = tf.matmul(ui, vi, transpose_b=True)
      for i, dense in zip(vectors, u[num_m:]):
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
          v=v_out.result, u_phase=u_out.state, v_phase=v_out.state
        )
      )
      measurements = tff.federated_zip(
        collections.OrderedDict(
          u=u_out.measurements,
          v=v_out.measurements,
          mean_norms=tff.federated_map(norms, (u_out.result, v_out.result)),
        )
      )
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
) -> CMPFedFactory:
  """CMP-Fed: two clipped, noised, secure-summed power-iteration phases."""
  return CMPFedFactory(
    rank,
    noise_multiplier=noise_multiplier,
    clients_per_round=clients_per_round,
    clip_u=clip_u,
    clip_v=clip_v,
    seed=seed,
    noise_seed=noise_seed,
  )


def uv_fed(rank: int, *, seed: int = 0) -> CMPFedFactory:
  """UV-Fed: the same low-rank power iteration without clipping or noise."""
  return CMPFedFactory(rank, seed=seed)


def upload_bytes(shapes, rank: int) -> int:
  """float32 U (and dense vectors) in phase 1, V in phase 2."""
  up1, up2 = payload_sizes(shapes, rank)
  return 4 * (up1 + up2)


def extra_download_bytes(shapes, rank: int) -> int:
  """V (phase 1) and U_hat (phase 2) broadcast besides the model."""
  total = 0
  for shape in shapes:
    shape = list(shape)
    if len(shape) >= 2:
      m, n = int(np.prod(shape[:-1])), int(shape[-1])
      total += (m + n) * min(rank, m, n)
  return 4 * total
