"""The glyph comparison behind benchmarks/results/public_overlap.md."""

import numpy as np
import pytest

from benchmarks import glyph_match


def test_a_glyph_matches_itself_at_any_scale_and_not_when_skipped():
  rng = np.random.default_rng(0)
  glyphs = np.zeros((3, 28, 28), np.uint8)
  for g in glyphs:
    g[6:22, 6:22] = rng.integers(0, 256, (16, 16))
  refs = np.stack([glyph_match.glyph_vector(g) for g in glyphs])
  np.testing.assert_allclose(np.linalg.norm(refs, axis=1), 1.0, rtol=1e-5)
  labels = np.array([1, 1, 2])
  scores = glyph_match.nearest_scores(refs, labels, refs, labels)
  np.testing.assert_allclose(scores, 1.0, rtol=1e-5)
  # Left out, glyph 0's best is glyph 1 (its class), far from 1.
  skipped = glyph_match.nearest_scores(
    refs[:1], labels[:1], refs, labels, skip=np.array([0])
  )
  assert skipped[0] == pytest.approx(refs[1] @ refs[0], abs=1e-6)
  assert skipped[0] < 0.5
  # Ink moved and scaled keeps its shape: the crop undoes it.
  moved = np.zeros((28, 28), np.uint8)
  moved[2:18, 10:26] = glyphs[0][6:22, 6:22]
  assert glyph_match.glyph_vector(moved) @ refs[0] > 0.999
  assert not glyph_match.glyph_vector(np.zeros((28, 28), np.uint8)).any()
