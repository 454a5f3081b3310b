"""Tests of the study runner's clip rules (no training: fabricated runs)."""

import csv
import json

import pytest

from benchmarks import studies

_PREFIX = 'tff/aggregator/client_norms/'


def _probe(tmp_path, rows, vectors_phase='v'):
  (tmp_path / 'config.json').write_text(
    json.dumps({'method': 'cmp_fed', 'cmp_vectors_phase': vectors_phase})
  )
  fields = ['round'] + [_PREFIX + k for k in ('u', 'v', 'vectors')]
  with open(tmp_path / 'metrics.csv', 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    for i, (u, v, vectors) in enumerate(rows, start=1):
      writer.writerow(
        {
          'round': i,
          _PREFIX + 'u': u,
          _PREFIX + 'v': v,
          _PREFIX + 'vectors': vectors,
        }
      )
  return tmp_path


def test_cmp_clips_are_medians_over_rounds_with_vectors_in_their_phase(
  tmp_path,
):
  # Five rounds; the vectors' norm 3 rides with V (default phase): V's
  # payload norms are hypot(4, 3) = 5 and hypot(v, 3) for the others.
  rows = [(0.1, 4.0, 3.0), (0.3, 4.0, 3.0), (0.2, 0.0, 3.0), (9.0, 4.0, 3.0)]
  rows.append((0.25, 100.0, 3.0))
  run = _probe(tmp_path, rows)
  assert studies.cmp_clip_from_run(run, 'cmp_clip_u') == 0.25
  assert studies.cmp_clip_from_run(run, 'cmp_clip_v') == 5.0


def test_cmp_clip_u_counts_the_vectors_when_they_ride_in_u(tmp_path):
  run = _probe(tmp_path, [(4.0, 1.0, 3.0)] * 3, vectors_phase='u')
  assert studies.cmp_clip_from_run(run, 'cmp_clip_u') == 5.0
  assert studies.cmp_clip_from_run(run, 'cmp_clip_v') == 1.0


def test_cmp_clip_from_a_run_without_the_measurement_or_a_bad_flag(tmp_path):
  (tmp_path / 'config.json').write_text(json.dumps({'method': 'dp_fedavg'}))
  (tmp_path / 'metrics.csv').write_text('round,train_loss\n1,0.5\n')
  with pytest.raises(ValueError, match='no CMP-Fed client_norms'):
    studies.cmp_clip_from_run(tmp_path, 'cmp_clip_v')
  with pytest.raises(ValueError, match="clip_flag must be one of .* 'clip'"):
    studies.cmp_clip_from_run(tmp_path, 'clip')
