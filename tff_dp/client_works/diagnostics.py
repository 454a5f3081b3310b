"""Update-norm diagnostics: the pre-clip distribution of client updates.

Seed 000 (Fig. 2) and seed 003 study the distribution of client update
norms before clipping. Each client reports, as metrics summed over the
cohort, its update's L2 norm, its square, whether it exceeds the clip, and
a one-hot over log-spaced norm buckets; `summarize` turns the round's sums
into the mean, standard deviation, fraction clipped and histogram quantiles.

These sums are NOT differentially private (they are exact cohort sums of a
function of each client's data): they are simulation diagnostics, on by
default in `python -m tff_dp.run` (`--noupdate_diagnostics` turns them off)
and off by default in the library's client works.
"""

import collections
from typing import Mapping

import numpy as np
import tensorflow as tf

# Bucket edges: 10^-4 .. 10^3, 8 per decade; below and above go to the ends.
EDGES = np.logspace(-4.0, 3.0, 7 * 8 + 1)
PREFIX = 'client_work/extra/'


def check_clip(clip: float) -> None:
  if not (isinstance(clip, (int, float)) and clip > 0):
    raise ValueError(f'clip must be > 0. Found {clip!r}.')


def update_norm_metrics(clip: float):
  """`delta -> OrderedDict` of per-client scalars to be summed.

  Keys: `clients` (1), `update_norm`, `update_norm_sq`, `clipped` (1 if the
  norm exceeds `clip`) and `norm_hist_NN` (one-hot over `EDGES` buckets:
  bucket i holds norms in [EDGES[i-1], EDGES[i]); bucket 0 below EDGES[0],
  the last at or above EDGES[-1]).
  """
  check_clip(clip)
  num_buckets = len(EDGES) + 1

  def fn(delta):
    edges = tf.constant(EDGES, tf.float32)  # Built in the caller's graph.
    norm = tf.linalg.global_norm(
      [tf.cast(t, tf.float32) for t in tf.nest.flatten(delta)]
    )
    bucket = tf.searchsorted(edges, norm[None], side='right')[0]
    onehot = tf.one_hot(bucket, num_buckets, dtype=tf.float32)
    out = collections.OrderedDict(
      clients=tf.constant(1.0),
      update_norm=norm,
      update_norm_sq=tf.square(norm),
      clipped=tf.cast(norm > clip, tf.float32),
    )
    for i in range(num_buckets):
      out[f'norm_hist_{i:02d}'] = onehot[i]
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
  counts = np.array(
    [
      metrics.get(f'{PREFIX}norm_hist_{i:02d}', 0.0)
      for i in range(len(EDGES) + 1)
    ]
  )
  out = {
    'update_norm_mean': mean,
    'update_norm_std': float(np.sqrt(var)),
    'fraction_clipped': metrics[PREFIX + 'clipped'] / n,
  }
  for q in (0.1, 0.5, 0.9):
    out[f'update_norm_q{int(q * 100):02d}'] = _quantile(counts, q)
  return out
