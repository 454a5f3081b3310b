"""Glyph shapes compared across renderings (`benchmarks.public_overlap`).

Flag-free, so tests import it beside modules that define flags.
"""

import numpy as np
from PIL import Image


def glyph_vector(image: np.ndarray) -> np.ndarray:
  """A uint8 glyph (ink high) cropped to its ink (> 40), scaled to 20 x 20,
  zero-mean and unit-norm; zeros for a blank image."""
  rows, cols = np.nonzero(image > 40)
  if len(rows) == 0:
    return np.zeros(400, np.float32)
  box = image[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
  v = np.asarray(
    Image.fromarray(box).resize((20, 20), Image.BILINEAR), np.float32
  ).ravel()
  v -= v.mean()
  norm = np.linalg.norm(v)
  return v / norm if norm > 0 else np.zeros(400, np.float32)


def nearest_scores(queries, labels, refs, ref_labels, skip=None) -> np.ndarray:
  """Each query's highest correlation with a reference glyph of its class
  (`skip[i]`: a reference index query i may not match, or -1)."""
  out = np.empty(len(queries), np.float32)
  for i, (q, c) in enumerate(zip(queries, labels)):
    same = np.flatnonzero(ref_labels == c)
    scores = refs[same] @ q
    if skip is not None and skip[i] >= 0:
      scores = scores[same != skip[i]]
    out[i] = scores.max()
  return out
