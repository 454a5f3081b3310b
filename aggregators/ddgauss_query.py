"""DDGauss's noise: the stateless discrete Gaussian sampler and its DP query.

`sample_discrete_gaussian` draws N_Z(0, sigma^2) as a function of a seed
(Canonne, Kamath, Steinke 2020). `SeededDiscreteGaussianSumQuery`, the
query that `ddgauss.ddgauss_mean` nests, has each client add one such share
to its integer vector, drawn from the round's seed folded with a nonce the
client reads from the OS (`_client_nonce`, `OS_ENTROPY_FILE`), so that the
server, which holds the seed, cannot regenerate it.
"""

from typing import NamedTuple

import dp_accounting
import tensorflow as tf
import tensorflow_privacy as tfp


def sample_discrete_gaussian(scale, shape, seed) -> tf.Tensor:
  """Stateless draws from the discrete Gaussian N_Z(0, scale^2), int64.

  Canonne, Kamath, Steinke 2020 (https://arxiv.org/abs/2004.00010), as
  tensorflow-privacy vectorizes it (discrete Laplace proposals of scale
  `scale`, accepted with probability exp(-(|y| - scale)^2 / (2 scale^2)))
  but with every uniform drawn statelessly from `seed` (one fold per
  rejection pass), so the draws are a function of the seed alone.

  Args:
    scale: Integer scale >= 1 (int64 scalar tensor).
    shape: Output shape.
    seed: int64 `[2]` stateless seed.

  Returns:
    An int64 tensor of `shape`.
  """
  scale = tf.cast(scale, tf.int64)
  t = tf.cast(scale, tf.float64)
  n = tf.cast(tf.reduce_prod(shape), tf.int64)

  def geometric(uniform):
    # Failures before the first success at p = 1 - exp(-1 / t): inverse
    # CDF floor(log(U) / log(1 - p)), U in (0, 1].
    return tf.cast(tf.floor(-t * tf.math.log1p(-uniform)), tf.int64)

  def body(i, result):
    draws = tf.maximum(
      tf.cast(
        1.5 * tf.cast(n - tf.size(result, tf.int64), tf.float64), tf.int64
      ),
      1000,
    )
    seeds = tf.random.experimental.stateless_split(
      tf.random.experimental.stateless_fold_in(seed, i), num=3
    )
    u = [
      tf.random.stateless_uniform([draws], seed=s, dtype=tf.float64)
      for s in tf.unstack(seeds)
    ]
    y = geometric(u[0]) - geometric(u[1])
    d = tf.cast(tf.abs(y) - scale, tf.float64)
    accept = u[2] < tf.exp(-(d * d) / (2.0 * t * t))
    return i + 1, tf.concat([result, tf.boolean_mask(y, accept)], 0)

  _, result = tf.while_loop(
    lambda i, result: tf.size(result, tf.int64) < n,
    body,
    (tf.constant(0, tf.int64), tf.zeros([0], tf.int64)),
    shape_invariants=(tf.TensorShape([]), tf.TensorShape([None])),
  )
  return tf.reshape(result[:n], shape)


# The client's OS entropy source, read inside its computation.
OS_ENTROPY_FILE = '/dev/urandom'
_NONCE_LINES = 16  # About 4 KB of OS entropy (lines average 256 bytes).


def _client_nonce() -> tf.Tensor:
  """About 126 bits of the client's own randomness (distinct per client).

  Read from the OS (`OS_ENTROPY_FILE`) each time the client computation
  runs: 16 newline-separated chunks of /dev/urandom, joined and hashed by
  two keyed SipHashes (`tf.strings.to_hash_bucket_strong`) into two int64s
  of 63 bits each. TF's own random ops do not serve: an unseeded kernel
  draws its seed from one process-wide `std::mt19937_64` that TF seeds
  with 32 bits of `std::random_device`, so every nonce of a process would
  be a function of those 32 bits, and whoever holds the round seed could
  regenerate each client's noise in about 2^32 guesses.
  """
  lines = tf.data.TextLineDataset(OS_ENTROPY_FILE, buffer_size=4096)
  chunk = lines.take(_NONCE_LINES).reduce(
    tf.constant(''), lambda joined, line: joined + line
  )
  buckets = tf.int64.max
  return tf.stack(
    [
      tf.strings.to_hash_bucket_strong(chunk, buckets, [1, 2]),
      tf.strings.to_hash_bucket_strong(chunk, buckets, [3, 4]),
    ]
  )


class SeededDiscreteGaussianSumQuery(tfp.SumAggregationDPQuery):
  """tensorflow-privacy's DDGauss query with stateless, per-client noise.

  As `tfp.DistributedDiscreteGaussianSumQuery`, except for the noise's
  randomness. Record: a client's int32 vector (structure), whose L2 norm
  must be at most `l2_norm_bound` (an assertion fails otherwise). Each
  client adds one discrete Gaussian share N_Z(0, local_stddev^2) to it
  (none at `local_stddev` 0), drawn statelessly from the round's seed
  folded with the client's own nonce (`_client_nonce`); the sum of the
  noised records is the release, and `get_noised_result` advances the
  seed. The DpEvent it returns is `UnsupportedDpEvent`: the factory
  accounts the round (`ddgauss._DDGaussMeanFactory`).

  Args:
    l2_norm_bound: Delta_2, the bound on a record's L2 norm, > 0.
    local_stddev: The sampler's integer scale sigma, >= 0.
    seed: The initial int64 seed pair.
  """

  class _GlobalState(NamedTuple):
    """Broadcast to the clients as the sample params."""

    l2_norm_bound: tf.Tensor  # float32.
    local_stddev: tf.Tensor  # float32.
    seed: tf.Tensor  # int64 [2]: this round's seed.

  def __init__(
    self, l2_norm_bound: float, local_stddev: int, seed: tuple[int, int]
  ):
    self._l2_norm_bound = l2_norm_bound
    self._local_stddev = local_stddev
    self._seed = seed

  def initial_global_state(self):
    return self._GlobalState(
      tf.constant(self._l2_norm_bound, tf.float32),
      tf.constant(self._local_stddev, tf.float32),
      tf.constant(self._seed, tf.int64),
    )

  def derive_sample_params(self, global_state):
    return global_state

  def preprocess_record(self, params, record):
    flat = tf.nest.flatten(record)
    for v in flat:
      tf.debugging.assert_type(v, tf.int32)
    norm_check = tf.debugging.assert_less_equal(
      tf.linalg.global_norm([tf.cast(v, tf.float32) for v in flat]),
      params.l2_norm_bound,
      message='DDGauss: a client vector exceeds the L2 norm bound.',
    )
    nonce = _client_nonce()
    seed = tf.random.experimental.stateless_fold_in(params.seed, nonce[0])
    seed = tf.random.experimental.stateless_fold_in(seed, nonce[1])
    seeds = tf.random.experimental.stateless_split(seed, num=len(flat))
    scale = tf.cast(params.local_stddev, tf.int64)

    def noised():
      return [
        v + tf.cast(sample_discrete_gaussian(scale, tf.shape(v), s), v.dtype)
        for v, s in zip(flat, tf.unstack(seeds))
      ]

    with tf.control_dependencies([norm_check]):
      out = tf.cond(
        tf.equal(scale, 0), lambda: [tf.identity(v) for v in flat], noised
      )
    return tf.nest.pack_sequence_as(record, out)

  def get_noised_result(self, sample_state, global_state):
    next_seed = tf.random.experimental.stateless_split(global_state.seed, 1)[0]
    return (
      sample_state,
      global_state._replace(seed=next_seed),
      dp_accounting.UnsupportedDpEvent(),
    )
