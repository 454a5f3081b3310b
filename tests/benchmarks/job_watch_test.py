"""Tests of the memory benchmark's slope fit."""

import math

import numpy as np
import pytest

from benchmarks import job_watch


def _samples(worker, python):
  return [
    job_watch.Sample(
      round=r + 1,
      segment=1,
      round_seconds=1.0,
      sampled_clients=10,
      python_rss_mb=p,
      worker_rss_mb=w,
      python_peak_mb=0.0,
      worker_peak_mb=0.0,
      elapsed_s=float(r),
    )
    for r, (w, p) in enumerate(zip(worker, python))
  ]


def test_slope_and_its_standard_error_match_numpy():
  rng = np.random.default_rng(0)
  rounds = np.arange(1, 101)
  worker = 2000 + 0.5 * rounds + rng.normal(0, 300, rounds.size)
  python = 900 + 0.2 * rounds + rng.normal(0, 50, rounds.size)
  samples = _samples(worker, python)
  total = worker + python
  (slope, _), cov = np.polyfit(rounds, total, 1, cov='unscaled')
  residual = total - np.polyval(np.polyfit(rounds, total, 1), rounds)
  error = math.sqrt(cov[0, 0] * (residual @ residual) / (rounds.size - 2))
  fit = job_watch.slope_mb_per_round(samples, 'worker_rss_mb', 'python_rss_mb')
  assert fit == pytest.approx((slope, error), rel=1e-9)
  # Exactly linear memory: the slope, with no error.
  line = job_watch.slope_mb_per_round(
    _samples(3.0 * rounds, 0 * rounds), 'worker_rss_mb'
  )
  assert line[0] == pytest.approx(3.0) and line[1] == pytest.approx(0.0)


def test_samples_without_a_reading_are_left_out():
  samples = _samples([1.0, 2.0, 3.0, None], [0.0, 0.0, 0.0, 0.0])
  assert job_watch.slope_mb_per_round(samples, 'worker_rss_mb') == (
    pytest.approx(1.0),
    pytest.approx(0.0),
  )
  slope, error = job_watch.slope_mb_per_round(samples[:1], 'worker_rss_mb')
  assert math.isnan(slope) and math.isnan(error)
