"""CMP-Fed's factor encoding: kernels as matrices, and a round's computations.

A kernel of shape (..., c_out) is a matrix M (m x n) of rank
r = min(rank, m, n) (`matrix_dims`); the plan of a value fixes which of its
tensors are factorised and which travel dense, and the two phases' payload
types (`make_plan`). `computations` builds a round's TF computations from
it: V_0 from the public seed, the client encoders U_i = Delta_i V (phase 1)
and V_i = Delta_i^T U_hat (phase 2), U_hat = qr(mean U), the norms the
round measures, and the decoder of the result U_hat V^T in the value's
type. The factory is `cmp_fed.CMPFedFactory`.
"""

import collections
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


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


class _Plan(NamedTuple):
  """How a value's tensors travel (fixed by `create`'s value type)."""

  specs: Any  # The value's `tf.TensorSpec` structure.
  layout: list  # Per flat tensor: (spec, matrix_dims or None).
  matrices: list  # (flat index, (m, n, r, transpose)) per factorised kernel.
  vectors: list  # Flat indices of the tensors sent dense.
  in_u: bool  # Whether the dense tensors travel in phase 1.
  u_type: Any  # Phase 1's client payload.
  v_type: Any  # Phase 2's client payload.
  v_state_type: Any  # V, the server's warm start.

  @property
  def num_matrices(self) -> int:
    return len(self.matrices)


def make_plan(value_type, rank, layout, dense_below, vectors_phase) -> _Plan:
  """The value's layout and the two phases' payload types."""
  specs, layout = _layout(value_type, rank, layout, dense_below)
  matrices = [(i, dims) for i, (_, dims) in enumerate(layout) if dims]
  if not matrices:
    raise ValueError(
      f'CMP-Fed needs a kernel to factorise: none of {value_type} has 2 '
      f'or more dimensions and at least dense_below={dense_below} '
      'entries (DP-FedAvg sends every tensor dense).'
    )
  vectors = [i for i, (_, dims) in enumerate(layout) if not dims]
  f32 = np.float32
  vec_types = [tff.TensorType(f32, layout[i][0].shape) for i in vectors]
  in_u = vectors_phase == 'u'
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
  return _Plan(
    specs, layout, matrices, vectors, in_u, u_type, v_type, v_state_type
  )


def _as_matrices(plan: _Plan, value):
  """`(the kernels as float32 matrices M, the dense tensors)` of a value."""
  flat = tf.nest.flatten(value)
  mats = []
  for i, (m, n, _, transpose) in plan.matrices:
    k = tf.reshape(
      tf.cast(flat[i], tf.float32), [n, m] if transpose else [m, n]
    )
    mats.append(tf.transpose(k) if transpose else k)
  return mats, [tf.cast(flat[i], tf.float32) for i in plan.vectors]


class Computations(NamedTuple):
  """The TF computations of one round (client, server and release)."""

  initial_v: Any  # Server: V_0.
  encode_u: Any  # Client, phase 1: U_i = Delta_i V (+ dense tensors).
  orthogonalize: Any  # Server: U_hat = qr(mean U).
  norms: Any  # Release: `mean_norms`.
  encode_v: Any  # Client, phase 2: V_i = Delta_i^T U_hat (+ dense tensors).
  v_matrices: Any  # Server: the next V, the phase-2 mean's matrices.
  client_norms: Any  # Release: a client's `client_norms` (not private).
  decode: Any  # Server: the result U_hat V^T, in the value's type.


def _phase_one(plan: _Plan, value_type, seed: int):
  """V_0 (public `seed`), the phase-1 client encoder and U_hat, the
  orthonormalised phase-1 mean."""
  rng = np.random.default_rng(seed)
  v0 = [
    rng.standard_normal((n, r)).astype(np.float32)
    for _, (_, n, r, _) in plan.matrices
  ]
  in_u, num_m = plan.in_u, plan.num_matrices

  @tff.tensorflow.computation
  def initial_v():
    return [tf.constant(v) for v in v0]

  @tff.tensorflow.computation(value_type, plan.v_state_type)
  def encode_u(value, v):
    mats, vecs = _as_matrices(plan, value)
    return [tf.matmul(d, vi) for d, vi in zip(mats, v)] + (vecs if in_u else [])

  @tff.tensorflow.computation(plan.u_type)
  def orthogonalize(u):
    return [tf.linalg.qr(ui)[0] for ui in u[:num_m]]

  return initial_v, encode_u, orthogonalize


def _mean_norms(plan: _Plan):
  """The release's `mean_norms`: the L2 norms of the two noisy means."""

  @tff.tensorflow.computation(plan.u_type, plan.v_type)
  def norms(u, v):
    return collections.OrderedDict(
      u_norm=tf.linalg.global_norm(tf.nest.flatten(u)),
      v_norm=tf.linalg.global_norm(tf.nest.flatten(v)),
    )

  return norms


def _phase_two(plan: _Plan, value_type, u_hat_type):
  """The phase-2 client encoder and the next state's V."""
  in_u, num_m = plan.in_u, plan.num_matrices

  @tff.tensorflow.computation(value_type, u_hat_type)
  def encode_v(value, u_hat):
    mats, vecs = _as_matrices(plan, value)
    return [
      tf.matmul(d, ui, transpose_a=True) for d, ui in zip(mats, u_hat)
    ] + ([] if in_u else vecs)

  @tff.tensorflow.computation(plan.v_type)
  def v_matrices(v):
    return list(v[:num_m])

  return encode_v, v_matrices


def _client_norms(plan: _Plan, clip_u: float, clip_v: float):
  """A client's pre-clip norms and whether each phase's clip cut it."""
  in_u, num_m = plan.in_u, plan.num_matrices

  @tff.tensorflow.computation(plan.u_type, plan.v_type)
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
      # clip sits at the median, as the paper's rule asks.
      u_clipped=tf.cast(u_payload > clip_u, tf.float32),
      v_clipped=tf.cast(v_payload > clip_v, tf.float32),
    )

  return client_norms


def _decoder(plan: _Plan, u_hat_type):
  """The server's result: U_hat V^T per matrix and the dense tensors, in
  the value's structure and dtypes."""
  in_u, num_m = plan.in_u, plan.num_matrices

  @tff.tensorflow.computation(u_hat_type, plan.v_type, plan.u_type)
  def decode(u_hat, v, u):
    flat = [None] * len(plan.layout)
    for (i, (_, _, _, transpose)), ui, vi in zip(plan.matrices, u_hat, v):
      m_hat = tf.matmul(ui, vi, transpose_b=True)
      flat[i] = tf.transpose(m_hat) if transpose else m_hat
    for i, dense in zip(plan.vectors, u[num_m:] if in_u else v[num_m:]):
      flat[i] = dense
    return tf.nest.pack_sequence_as(
      plan.specs,
      [
        tf.cast(tf.reshape(t, s.shape), s.dtype)
        for t, (s, _) in zip(flat, plan.layout)
      ],
    )

  return decode


def computations(plan: _Plan, value_type, seed: int, clips) -> Computations:
  """Every TF computation of a round, built in one fixed order."""
  initial_v, encode_u, orthogonalize = _phase_one(plan, value_type, seed)
  norms = _mean_norms(plan)
  u_hat_type = orthogonalize.type_signature.result
  encode_v, v_matrices = _phase_two(plan, value_type, u_hat_type)
  client_norms = _client_norms(plan, *clips)
  decode = _decoder(plan, u_hat_type)
  return Computations(
    initial_v,
    encode_u,
    orthogonalize,
    norms,
    encode_v,
    v_matrices,
    client_norms,
    decode,
  )
