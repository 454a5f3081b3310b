"""Tests of the job watcher: the memory benchmark's slope fit, the round ends
read from the job's log."""

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


def test_round_ends_read_from_the_jobs_log_lines():
  trained = '] Round {}/3 trained; released with the checkpoint of round 3.'
  written = '] Checkpoint of round {} written'
  log = '\n'.join(
    [
      'I1205 23:59:58.500000 1 training.py:1] Starting.',
      'I1205 23:59:59.000000 1 round_finishing.py:216' + trained.format(1),
      'I1206 00:00:01.250000 1 round_finishing.py:235' + written.format(2),
      'I1206 00:00:02.000000 1 metrics_log.py:1] Round 2/3: 80.1% accuracy',
      'I1206 00:00:04.000000 1 round_finishing.py:235'
      + written.format(3)
      + ' in 0.5 s',
      # A resumed run: its later line for round 2 wins.
      'I1206 00:00:09.000000 1 round_finishing.py:216' + trained.format(2),
    ]
  )
  # Across midnight.
  assert job_watch.round_ends(log) == pytest.approx({1: 0.0, 2: 10.0, 3: 5.0})
  assert job_watch.round_ends('no round ended\n') == {}
