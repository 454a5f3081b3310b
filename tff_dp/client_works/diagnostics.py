"""Update-norm diagnostics: the pre-clip distribution of client updates.

Each client reports, as metrics summed over the cohort, its update's L2
norm, its square, whether it exceeds the clip and a one-hot over log-spaced
norm buckets (optionally its cosine to the last global step);
`summarize` turns the round's sums into the mean, standard deviation,
fraction clipped and histogram quantiles. These sums are NOT differentially
private: simulation diagnostics, off by default in the library's client
works. See docs/papers/clipping.md for the papers' reading.
"""

import collections
from typing import Mapping

import numpy as np
import tensorflow as tf

# Bucket edges: 10^-4 .. 10^3, 8 per decade; below and above go to the ends.
EDGES = np.logspace(-4.0, 3.0, 7 * 8 + 1)
PREFIX = 'client_work/extra/'


def check_clip(clip: float) -> None:
  """Raises ValueError unless `clip` is a number > 0."""
  if not (isinstance(clip, (int, float)) and clip > 0):
    raise ValueError(f'clip must be > 0. Found {clip!r}.')


ANGLE_BUCKETS = 20  # Cosine in [-1, 1], 0.1 wide.


def update_norm_metrics(clip: float, with_angle: bool = False):
  """Per-client values to be summed over the cohort (`extra_metrics_fn`).

  The function's keys: `clients` (1), `update_norm`, `update_norm_sq`,
  `clipped` (1 if the norm exceeds `clip`), `norm_hist` (one-hot over the
  `EDGES` buckets: bucket i holds norms in [EDGES[i-1], EDGES[i]), bucket 0
  below EDGES[0], the last at or above EDGES[-1]); with angles also
  `cosine` (the cosine between the update and the last global step, 0 when
  undefined), `cosine_defined` (1 when the step and the update are
  nonzero) and `joint_hist` (norm bucket x cosine bucket, a one-hot
  matrix; undefined cosines count in the joint histogram only when
  defined).

  Args:
    clip: The clip the norms are compared with, > 0.
    with_angle: Also the cosine to the last global step.

  Returns:
    `fn(delta)` or, with `with_angle`, `fn(delta, last_global_step)` (for
    a client work built with `track_global_update=True`).

  Raises:
    ValueError: If clip is not a number > 0.
  """
  check_clip(clip)
  num_buckets = len(EDGES) + 1

  def norm_part(delta):
    edges = tf.constant(EDGES, tf.float32)  # Built in the caller's graph.
    flat = [tf.cast(t, tf.float32) for t in tf.nest.flatten(delta)]
    norm = tf.linalg.global_norm(flat)
    bucket = tf.searchsorted(edges, norm[None], side='right')[0]
    out = collections.OrderedDict(
      clients=tf.constant(1.0),
      update_norm=norm,
      update_norm_sq=tf.square(norm),
      clipped=tf.cast(norm > clip, tf.float32),
      norm_hist=tf.one_hot(bucket, num_buckets, dtype=tf.float32),
    )
    return out, flat, norm, bucket

  if not with_angle:
    return lambda delta: norm_part(delta)[0]

  def fn(delta, step):
    out, flat, norm, bucket = norm_part(delta)
    step = [tf.cast(t, tf.float32) for t in tf.nest.flatten(step)]
    step_norm = tf.linalg.global_norm(step)
    dot = tf.add_n([tf.reduce_sum(a * b) for a, b in zip(flat, step)])
    defined = tf.logical_and(norm > 0, step_norm > 0)
    cosine = tf.where(defined, dot / tf.maximum(norm * step_norm, 1e-30), 0.0)
    cosine = tf.clip_by_value(cosine, -1.0, 1.0)
    angle_bucket = tf.minimum(
      tf.cast(tf.floor((cosine + 1.0) / 2.0 * ANGLE_BUCKETS), tf.int32),
      ANGLE_BUCKETS - 1,
    )
    cell = (
      tf.one_hot(bucket, num_buckets)[:, None]
      * tf.one_hot(angle_bucket, ANGLE_BUCKETS)[None, :]
    )
    defined_f = tf.cast(defined, tf.float32)
    out['cosine'] = cosine * defined_f
    out['cosine_defined'] = defined_f
    out['joint_hist'] = cell * defined_f
    return out

  return fn


def _quantile(counts: np.ndarray, q: float) -> float:
  """Histogram quantile, log-linear inside the bucket."""
  total = counts.sum()
  if total <= 0:
    return float('nan')
  target = q * total
  cum = np.cumsum(counts)
  i = int(np.searchsorted(cum, target, side='left'))
  lo = EDGES[i - 1] if i >= 1 else EDGES[0] / 10
  hi = EDGES[i] if i < len(EDGES) else EDGES[-1] * 10
  before = cum[i - 1] if i >= 1 else 0.0
  frac = (target - before) / counts[i] if counts[i] > 0 else 0.5
  return float(np.exp(np.log(lo) + frac * (np.log(hi) - np.log(lo))))


def summarize(metrics: Mapping[str, float]) -> dict[str, float]:
  """Round statistics from the flattened measurements (empty if absent)."""
  n = metrics.get(PREFIX + 'clients')
  if not n:
    return {}
  mean = metrics[PREFIX + 'update_norm'] / n
  var = max(metrics[PREFIX + 'update_norm_sq'] / n - mean**2, 0.0)
  counts = np.asarray(metrics.get(PREFIX + 'norm_hist', np.zeros(1)))
  out = {
    'update_norm_mean': mean,
    'update_norm_std': float(np.sqrt(var)),
    'fraction_clipped': metrics[PREFIX + 'clipped'] / n,
  }
  if counts.size == len(EDGES) + 1:
    for q in (0.1, 0.5, 0.9):
      out[f'update_norm_q{int(q * 100):02d}'] = _quantile(counts, q)
  defined = metrics.get(PREFIX + 'cosine_defined')
  if defined:
    out['update_cosine_mean'] = metrics[PREFIX + 'cosine'] / defined
  return {k: float(v) for k, v in out.items()}


def histograms(metrics: Mapping[str, object]) -> dict[str, object]:
  """The round's histograms, sparse: {name: {index: count}} (JSON-ready).

  `norm_hist` is indexed by norm bucket; `joint_hist` by
  'normbucket,cosinebucket'. Bucket edges: `EDGES` and `ANGLE_BUCKETS`.
  """
  out = {}
  for name in ('norm_hist', 'joint_hist'):
    value = metrics.get(PREFIX + name)
    if value is None:
      continue
    arr = np.asarray(value)
    nz = np.argwhere(arr > 0)
    out[name] = {
      ','.join(str(int(i)) for i in idx): float(arr[tuple(idx)]) for idx in nz
    }
  return out
