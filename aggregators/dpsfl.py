"""FetchSGD, DPSFL and DPSFL-AC: count-sketched updates (seed 002).

One aggregation factory, three settings:

* **FetchSGD** (Rothchild et al. 2020, Alg. 1, no privacy): each client
  sends the count sketch S(g) of its update g; the server averages them
  (mean over participants), keeps a momentum sketch S_u <- rho S_u + S and
  an error-feedback sketch S_e <- S_e + lr S_u, recovers the k coordinates
  with the largest median estimate from S_e (`CountSketch.top_k`), outputs
  that k-sparse vector Delta, and removes it from the error sketch:
  S_e <- S_e - S(Delta). The state persists across rounds. Reading chosen:
  the one-round variant (values estimated from the sketch; no second round
  for exact values) and momentum kept in sketch space without zeroing.
* **DPSFL** (seed 002, Alg. 1-2): as FetchSGD, but each client's sketch is
  clipped and the sum gets Gaussian noise. Clip what you noise: the sketch
  itself is scaled so that ||S||_F <= sqrt(rows) * clip (for a sketch
  without collisions ||S(g)||_F = sqrt(rows) ||g||, so `clip` reads as a
  clip of the update's norm); its L2 sensitivity is then sqrt(rows) * clip
  and N(0, (z sqrt(rows) clip)^2) is added to every counter of the sum (a
  client-level Gaussian event of multiplier z). The seed's own sensitivity
  formula was lost in extraction; this bound follows from the code path.
  The sum is a secure sum of the clipped sketches divided by
  sqrt(rows) * clip (entries in [-1, 1]); the mean divides by the expected
  number of clients, as DP-FedAvg does.
* **DPSFL-AC** (seed 002, Alg. 3-4): the clip adapts. The server broadcasts
  the clip C_t and the previous round's top-k indices T; each client, with
  f = its sketch's clipping factor, computes the clipping impact on T and
  sends the bit b = 1[impact <= gamma]. The seed's Eq. (6) was lost in
  extraction; around it the seed defines "the norm of top-k coordinates"
  and "the clipping error of top-k coordinates" separately, which points
  to a relative test, our default (`impact_rule='relative'`):
  ||(1 - f) g_T||_2 / ||g_T||_2 <= gamma. Our clip scales the whole sketch
  (and so the update) by f, so this ratio is 1 - f whatever T is: under
  norm clipping the relative test does not depend on the top-k set, and
  DPSFL-AC becomes a quantile controller on the sketch norm, like Andrew
  et al.'s: the clip settles where a fraction p of the clients have
  ||S(g)||_F <= sqrt(rows) C / (1 - gamma); the seed's emphasis on the top-k
  coordinates only matters for a clip that is not a uniform scale. It is
  computed literally from the gathered values (1 - f where g_T = 0, e.g.
  in the first round). `impact_rule='absolute'`, ||(1 - f) g_T||_2 <=
  gamma, is what rows before issue #24 ran: it shrinks the clip whenever
  the top-k part of an update is small, and our clip collapsed under it
  (0.3 -> 0.016 in the EMNIST study). The bit's noise defaults to
  sigma_b = expected clients / 20 (Andrew et al. 2021's choice; the seed
  gives none and says only that the bit "requires only a negligible
  fraction of the privacy budget"). The server
  adds N(0, sigma_b^2) to the sum of bits, estimates the probability
  p_hat = noisy sum / expected clients and updates
  C_{t+1} = C_t exp(eta_C (p - p_hat)) (geometric, as Andrew et al.): too
  few clients within the impact bound raises the clip. Each round releases
  two Gaussians on the same sampled cohort, the sketch's (multiplier z)
  and the bit's (multiplier sigma_b, sensitivity 1), composed in the event
  (`round_event`), which the ledger merges exactly.

Adjacency and sensitivity. The seed's neighbours are record level
(Def. 1: "two adjacent datasets ... that differ by only one record") and
its sketch sensitivity is taken over vectors that "differ by at most one
coordinate" (Def. 4): one counter per row moves, by at most 2C once each
coordinate is bounded by clipping, so its L2 sensitivity is at most
2C sqrt(rows). Ours is client level: one client's whole clipped update is
added or removed. A count-sketch row of a g with ||g|| <= C can reach
C sqrt(b) (b: the largest number of coordinates hashed to one counter,
about d / columns, with g aligned to the bucket's signs), so noising a
sketch of clipped updates with the per-coordinate bound would under-noise
by up to sqrt(d / columns) (about 9x for the 1.66M-weight CNN at 20,000
columns, 4x at 100,000). We clip the sketch itself
(||S||_F <= sqrt(rows) C), so the noise meets the client-level bound,
which is larger than the seed's. The seed's client "adds DP noise to the
sketch before transmitting it to the server" (local noise, Alg. 1); we add
it once to the secure sum of the clipped sketches (central noise behind
secure aggregation, as DP-FedAvg): the same client-level guarantee for the
released sum, with the noise of one client instead of n.

Noise is seeded and stateless (the seed is in the state), from `noise_seed`
(secret by default), never from the hashes' public `seed`; each clipped
sketch is guarded (`finite_guard`): NaN counters or a float32 norm overflow
never lift a client past the clip. The output is the
k-sparse Delta in the value's own structure, so the factory drops into
`tff.learning` algorithms as an unweighted aggregator; apply it with server
SGD at learning rate 1 and no server momentum (momentum lives here).
Measurements: `clip`, `unclipped_probability` (p_hat, DPSFL-AC),
`num_clients` (FetchSGD) and `sketch_norm` of the aggregate.

Length: the module runs past ~500 lines because the three methods share
one aggregator (the sketch, its clip and guard, the server's momentum and
top-k; only the noise and the clip rule differ) and because the docstrings
carry the sensitivity argument above (about 140 lines); splitting them
would put one mechanism's privacy reasoning in two files.
"""

import collections
import dataclasses
import math
from typing import Optional

from absl import logging
import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import _tff_private
from tff_dp.aggregators import count_sketch
from tff_dp.aggregators import dp_queries
from tff_dp.aggregators import finite_guard
from tff_dp.aggregators import weighting

_EVENT_NAMES = ('sketch', 'clip_bit')
IMPACT_RULES = ('relative', 'absolute')


# DPSFL-AC logs a warning when its clip bit's noise lowers the round's
# merged noise multiplier below this fraction of the sketch's own.
BIT_NOISE_WARNING_RATIO = 0.8


def merged_noise_multiplier(noise_multiplier: float, bit_noise: float) -> float:
  """The sketch and clip bit as one Gaussian: 1/z^2 = 1/z_s^2 + 1/sigma_b^2.

  (What the ledger's `privacy.merge_gaussians` records for the round.)
  """
  if noise_multiplier == 0 or bit_noise == 0:
    return 0.0
  return 1.0 / math.sqrt(noise_multiplier**-2 + bit_noise**-2)


def _warn_if_bit_noise_dominates(
  noise_multiplier: float, adaptive: 'AdaptiveClip', clients_per_round: float
) -> None:
  if noise_multiplier == 0:
    return
  bit_noise = adaptive.bit_noise_multiplier
  merged = merged_noise_multiplier(noise_multiplier, bit_noise)
  if merged < BIT_NOISE_WARNING_RATIO * noise_multiplier:
    logging.warning(
      "DPSFL-AC: the clip bit's noise (sigma_b = %.4g; the default is the "
      "expected cohort / 20 = %.4g) lowers the round's merged noise "
      "multiplier to %.4g, %.0f%% of the sketch's own %.4g (below %.0f%%): "
      'the bit, not the sketch, dominates the privacy cost. Raise '
      '--dpsfl_bit_noise or the cohort.',
      bit_noise,
      default_bit_noise(clients_per_round),
      merged,
      100 * merged / noise_multiplier,
      noise_multiplier,
      100 * BIT_NOISE_WARNING_RATIO,
    )


def default_bit_noise(expected_clients_per_round: float) -> float:
  """sigma_b = expected clients / 20 (Andrew et al. 2021's choice)."""
  return expected_clients_per_round / 20.0


@dataclasses.dataclass(frozen=True)
class AdaptiveClip:
  """DPSFL-AC's adaptive clip.

  Attributes:
    target_probability: p in (0, 1): the wanted fraction of clients whose
      clipping impact on the previous top-k is at most `impact_threshold`.
    impact_threshold: gamma > 0 (< 1 for the relative rule).
    bit_noise_multiplier: sigma_b >= 0, the bit sum's noise stddev; None
      (default): expected clients per round / 20 (`default_bit_noise`),
      resolved by the factory from its `clients_per_round`.
    learning_rate: eta_C > 0 of the geometric update.
    impact_rule: 'relative' (||clip error on T|| / ||g_T||, the default) or
      'absolute' (||clip error on T||; rows before issue #24).
  """

  target_probability: float = 0.5
  impact_threshold: float = 0.1
  bit_noise_multiplier: Optional[float] = None
  learning_rate: float = 0.2
  impact_rule: str = 'relative'

  def resolved(self, clients_per_round: float) -> 'AdaptiveClip':
    """A copy with the default bit noise filled in from the cohort."""
    if self.bit_noise_multiplier is not None:
      return self
    return dataclasses.replace(
      self, bit_noise_multiplier=default_bit_noise(clients_per_round)
    )

  def check(self) -> None:
    if self.impact_rule not in IMPACT_RULES:
      raise ValueError(
        f'impact_rule must be one of {IMPACT_RULES}. Found '
        f'{self.impact_rule!r}.'
      )
    if self.impact_rule == 'relative' and not self.impact_threshold < 1:
      raise ValueError(
        'impact_threshold must be in (0, 1) for the relative rule (a '
        'relative clipping error is at most 1, so gamma >= 1 always '
        f'passes). Found {self.impact_threshold!r}.'
      )
    p = self.target_probability
    if not (isinstance(p, (int, float)) and 0 < p < 1):
      raise ValueError(f'target_probability must be in (0, 1). Found {p!r}.')
    if not self.impact_threshold > 0:
      raise ValueError(
        f'impact_threshold must be > 0. Found {self.impact_threshold!r}.'
      )
    if (
      self.bit_noise_multiplier is not None
      and not self.bit_noise_multiplier >= 0
    ):
      raise ValueError(
        'bit_noise_multiplier must be >= 0. Found '
        f'{self.bit_noise_multiplier!r}.'
      )
    if not self.learning_rate > 0:
      raise ValueError(
        f'learning_rate must be > 0. Found {self.learning_rate!r}.'
      )


def _flat_spec(value_type):
  return _tff_private.flat_float_specs(value_type, 'Sketching')


def round_event(
  noise_multiplier: float, adaptive: Optional[AdaptiveClip]
) -> dp_accounting.DpEvent:
  """One round's release before sampling: the sketch's and the bit's."""
  sketch = dp_accounting.GaussianDpEvent(noise_multiplier)
  if adaptive is None:
    return sketch
  if adaptive.bit_noise_multiplier is None:
    raise ValueError(
      'round_event needs the bit noise: pass adaptive.resolved('
      'clients_per_round).'
    )
  return dp_accounting.ComposedDpEvent(
    [sketch, dp_accounting.GaussianDpEvent(adaptive.bit_noise_multiplier)]
  )


class SketchAggregatorFactory(
  tff.aggregators.UnweightedAggregationFactory, weighting.Weightable
):
  """FetchSGD / DPSFL / DPSFL-AC (see the module docstring)."""

  def __init__(
    self,
    *,
    rows: int,
    columns: int,
    k: int,
    momentum: float = 0.9,
    learning_rate: float = 1.0,
    noise_multiplier: Optional[float] = None,
    clients_per_round: Optional[float] = None,
    clip: Optional[float] = None,
    adaptive: Optional[AdaptiveClip] = None,
    seed: int = 0,
    noise_seed: dp_queries.NoiseSeed = None,
    hashing: str = 'murmur',
  ):
    """Checks the arguments (k against d at `create`).

    Args:
      rows: Sketch rows, >= 1.
      columns: Sketch columns, >= 1.
      k: Coordinates recovered a round, in [1, d].
      momentum: rho in [0, 1).
      learning_rate: lr > 0 scaling the momentum into the error sketch.
      noise_multiplier: z >= 0 (DPSFL / DPSFL-AC); None: FetchSGD.
      clients_per_round: Expected clients a round (the DP mean's
        denominator), > 0; required with `noise_multiplier`.
      clip: The (initial, with `adaptive`) clip, > 0; required with
        `noise_multiplier`.
      adaptive: DPSFL-AC's adaptive clip; None: a fixed clip.
      seed: Seeds the hashes (public randomness).
      noise_seed: Seeds the noise of the sketch and of DPSFL-AC's bit: None
        (default) draws a secret; an int s starts the stream (s, 7) (keep
        it secret).
      hashing: The count sketch's hash family, 'murmur' or 'block' (see
        `count_sketch`; 'block' needs d <= 1024 x columns).

    Raises:
      ValueError: On a bad argument, naming it and its allowed range.
    """
    # The sketch checks rows, columns and hashing; dim 1 is a placeholder.
    count_sketch.CountSketch(rows, columns, 1, hashing=hashing)
    if not isinstance(k, (int, np.integer)) or k < 1:
      raise ValueError(f'k must be an integer >= 1. Found {k!r}.')
    if not (isinstance(momentum, (int, float)) and 0 <= momentum < 1):
      raise ValueError(f'momentum must be in [0, 1). Found {momentum!r}.')
    if not learning_rate > 0:
      raise ValueError(f'learning_rate must be > 0. Found {learning_rate!r}.')
    private = noise_multiplier is not None
    if private:
      if not noise_multiplier >= 0:
        raise ValueError(
          f'noise_multiplier must be >= 0. Found {noise_multiplier!r}.'
        )
      if clients_per_round is None or not clients_per_round > 0:
        raise ValueError(
          f'clients_per_round must be > 0. Found {clients_per_round!r}.'
        )
      if clip is None or not clip > 0:
        raise ValueError(f'clip must be > 0. Found {clip!r}.')
    elif adaptive is not None or clip is not None:
      raise ValueError(
        'clip and adaptive need noise_multiplier (DPSFL); FetchSGD has none.'
      )
    if adaptive is not None:
      adaptive.check()
      adaptive = adaptive.resolved(clients_per_round)
      _warn_if_bit_noise_dominates(
        float(noise_multiplier), adaptive, float(clients_per_round)
      )
    self._rows, self._columns, self._k = int(rows), int(columns), int(k)
    self._momentum, self._lr = float(momentum), float(learning_rate)
    self._private = private
    self._z = float(noise_multiplier) if private else 0.0
    self._clients = float(clients_per_round) if private else None
    self._clip = float(clip) if private else None
    self._adaptive = adaptive
    self._seed = int(seed)
    if isinstance(noise_seed, (int, np.integer)):
      noise_seed = (int(noise_seed), 7)
    self._noise_seed = dp_queries.resolve_seed(noise_seed)
    self._hashing = hashing

  @property
  def private(self) -> bool:
    return self._private

  def round_event(self) -> dp_accounting.DpEvent:
    if not self._private:
      raise ValueError('FetchSGD releases no DP event.')
    return round_event(self._z, self._adaptive)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, flat_specs, sizes = _flat_spec(value_type)
    dim = sum(sizes)
    if self._k > dim:
      raise ValueError(
        f'k must be in [1, {dim}] (the number of scalars in the value). '
        f'Found {self._k!r}.'
      )
    sk = count_sketch.CountSketch(
      self._rows, self._columns, dim, self._seed, hashing=self._hashing
    )
    rows, cols, k = self._rows, self._columns, self._k
    rho, lr = self._momentum, self._lr
    private, z, adaptive = self._private, self._z, self._adaptive
    clients = self._clients
    sqrt_rows = math.sqrt(rows)
    table_type = tff.TensorType(np.float32, [rows, cols])
    noise_seed = self._noise_seed

    def flatten(value):
      return tf.concat(
        [
          tf.reshape(tf.cast(v, tf.float32), [-1])
          for v in tf.nest.flatten(value)
        ],
        axis=0,
      )

    @tff.tensorflow.computation
    def initial_server():
      return collections.OrderedDict(
        momentum=tf.zeros([rows, cols]),
        error=tf.zeros([rows, cols]),
        clip=tf.constant(self._clip or 0.0, tf.float32),
        top_k=tf.zeros([k], tf.int32),
        seed=tf.constant(noise_seed, tf.int64),
      )

    server_type = initial_server.type_signature.result

    @tff.tensorflow.computation
    def make_hashes():
      return sk.hashes()

    hashes_type = make_hashes.type_signature.result

    @tff.tensorflow.computation(
      value_type, hashes_type, tff.TensorType(np.float32), server_type.top_k
    )
    def encode(value, hashes, clip, top_k):
      g = flatten(value)
      table = sk.sketch(g, hashes)
      if not private:
        return collections.OrderedDict(table=table, bit=tf.constant(0.0))
      bound = sqrt_rows * clip
      norm = tf.norm(table)

      def fast():
        factor = tf.minimum(1.0, bound / tf.maximum(norm, 1e-30))
        return table * factor / bound, factor

      def slow():  # NaN/Inf counters (zeroed) or a float32 norm overflow.
        (bounded,), _, norm64 = finite_guard.bound_in_float64([table], bound)
        factor = tf.minimum(
          tf.constant(1.0, tf.float64), tf.cast(bound, tf.float64) / norm64
        )
        return bounded / bound, tf.cast(factor, tf.float32)

      # In [-1, 1] entrywise: the clipped sketch over its norm bound.
      scaled, factor = tf.cond(tf.math.is_finite(norm), fast, slow)
      bit = tf.constant(0.0)
      if adaptive is not None:
        top_norm = tf.norm(tf.gather(g, top_k))
        impact = (1.0 - factor) * top_norm
        if adaptive.impact_rule == 'relative':
          impact = tf.where(
            top_norm > 0, impact / tf.maximum(top_norm, 1e-30), 1.0 - factor
          )
        bit = tf.cast(impact <= adaptive.impact_threshold, tf.float32)
      return collections.OrderedDict(table=scaled, bit=bit)

    payload_type = encode.type_signature.result

    @tff.tensorflow.computation(
      server_type, payload_type, hashes_type, tff.TensorType(np.float32)
    )
    def server_update(state, total, hashes, num_clients):
      seeds = tf.random.experimental.stateless_split(state['seed'], num=3)
      clip = state['clip']
      if private:
        bound = sqrt_rows * clip
        noise = tf.random.stateless_normal(
          [rows, cols], seed=seeds[0], stddev=z * bound
        )
        mean = (total['table'] * bound + noise) / clients
      else:
        mean = total['table'] / tf.maximum(num_clients, 1.0)
      new_clip = clip
      p_hat = tf.constant(float('nan'))
      if adaptive is not None:
        bit_noise = tf.random.stateless_normal(
          [], seed=seeds[1], stddev=adaptive.bit_noise_multiplier
        )
        p_hat = (total['bit'] + bit_noise) / clients
        new_clip = clip * tf.exp(
          adaptive.learning_rate * (adaptive.target_probability - p_hat)
        )
      momentum = rho * state['momentum'] + mean
      error = state['error'] + lr * momentum
      idx, values = sk.top_k(error, k, hashes)
      delta = tf.scatter_nd(idx[:, None], values, [dim])
      error = error - sk.sketch(delta, hashes)
      parts = tf.split(delta, sizes)
      result = tf.nest.pack_sequence_as(
        specs,
        [
          tf.cast(tf.reshape(p, s.shape), s.dtype)
          for p, s in zip(parts, flat_specs)
        ],
      )
      new_state = collections.OrderedDict(
        momentum=momentum,
        error=error,
        clip=new_clip,
        top_k=idx,
        seed=seeds[2],
      )
      measurements = collections.OrderedDict(
        clip=clip if private else tf.constant(float('nan')),
        unclipped_probability=p_hat,
        num_clients=num_clients,
        sketch_norm=tf.norm(mean),
      )
      return new_state, result, measurements

    if private:
      table_sum = tff.aggregators.SecureSumFactory(1.0, -1.0).create(table_type)
      bit_sum = tff.aggregators.SecureSumFactory(1.0, 0.0).create(
        tff.TensorType(np.float32)
      )
    else:
      table_sum = tff.aggregators.SumFactory().create(table_type)
      bit_sum = tff.aggregators.SumFactory().create(tff.TensorType(np.float32))

    @tff.tensorflow.computation
    def one():
      return tf.constant(1.0)

    @tff.federated_computation()
    def init_fn():
      return tff.federated_zip(
        collections.OrderedDict(
          server=tff.federated_eval(initial_server, tff.SERVER),
          table_sum=table_sum.initialize(),
          bit_sum=bit_sum.initialize(),
        )
      )

    @tff.federated_computation(
      init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS)
    )
    def next_fn(state, value):
      server = state.server
      hashes = tff.federated_eval(make_hashes, tff.SERVER)
      payload = tff.federated_map(
        encode,
        (
          value,
          tff.federated_broadcast(hashes),
          tff.federated_broadcast(server.clip),
          tff.federated_broadcast(server.top_k),
        ),
      )
      tables = table_sum.next(state.table_sum, payload.table)
      bits = bit_sum.next(state.bit_sum, payload.bit)
      num_clients = tff.federated_sum(tff.federated_eval(one, tff.CLIENTS))
      total = tff.federated_zip(
        collections.OrderedDict(table=tables.result, bit=bits.result)
      )
      new_server, result, measurements = tff.federated_map(
        server_update, (server, total, hashes, num_clients)
      )
      new_state = tff.federated_zip(
        collections.OrderedDict(
          server=new_server, table_sum=tables.state, bit_sum=bits.state
        )
      )
      return tff.templates.MeasuredProcessOutput(
        new_state, result, measurements
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


def fetchsgd(
  rows: int, columns: int, k: int, **options
) -> SketchAggregatorFactory:
  """FetchSGD: sketched updates, momentum and error feedback, no DP.

  `options`: `momentum`, `learning_rate`, `seed`, `noise_seed`, `hashing` (see
  `SketchAggregatorFactory`).
  """
  return SketchAggregatorFactory(rows=rows, columns=columns, k=k, **options)


def dpsfl(
  rows: int,
  columns: int,
  k: int,
  *,
  noise_multiplier: float,
  clients_per_round: float,
  clip: float,
  **options,
) -> SketchAggregatorFactory:
  """DPSFL: clipped sketches, Gaussian noise on their sum, FetchSGD server.

  `options` as for `fetchsgd`.
  """
  return SketchAggregatorFactory(
    rows=rows,
    columns=columns,
    k=k,
    noise_multiplier=noise_multiplier,
    clients_per_round=clients_per_round,
    clip=clip,
    **options,
  )


def dpsfl_ac(
  rows: int,
  columns: int,
  k: int,
  *,
  noise_multiplier: float,
  clients_per_round: float,
  initial_clip: float,
  adaptive: Optional[AdaptiveClip] = None,
  **options,
) -> SketchAggregatorFactory:
  """DPSFL-AC: DPSFL with the clip adapted from noisy clipping-impact bits.

  `adaptive` defaults to `AdaptiveClip()`; `options` as for `fetchsgd`.
  """
  return dpsfl(
    rows,
    columns,
    k,
    noise_multiplier=noise_multiplier,
    clients_per_round=clients_per_round,
    clip=initial_clip,
    adaptive=adaptive if adaptive is not None else AdaptiveClip(),
    **options,
  )


def upload_bytes(rows: int, columns: int, adaptive: bool = False) -> int:
  """The float32 sketch (and DPSFL-AC's bit, as a float32)."""
  return 4 * rows * columns + (4 if adaptive else 0)


def download_bytes(k: int, adaptive: bool = False) -> int:
  """The top-k values and int32 indices (and DPSFL-AC's clip)."""
  return 8 * k + (4 if adaptive else 0)
