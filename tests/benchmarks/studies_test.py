"""Tests of the study runner's clip rules (no training: fabricated runs)."""

import csv

import pytest

from benchmarks import studies

# The runner's CSV name of CMP-Fed's `client_norms` measurement: the
# aggregator's measurements under TFF's 'aggregator' key, with 'tff/' before.
_PREFIX = 'tff/aggregator/client_norms/'


def _probe(tmp_path, rows):
  fields = ['round', _PREFIX + 'u_payload', _PREFIX + 'v_payload']
  with open(tmp_path / 'metrics.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(fields)
    for i, (u, v) in enumerate(rows, start=1):
      writer.writerow([i, u, v])
  return tmp_path


def test_cmp_clips_are_medians_over_rounds_of_each_phase_payload(tmp_path):
  assert studies.CMP_CLIENT_NORMS == _PREFIX
  rows = [(0.1, 5.0), (0.3, 5.0), (0.2, 3.0), (9.0, 5.0), (0.25, 100.0)]
  run = _probe(tmp_path, rows)
  assert studies.cmp_clip_from_run(run, 'cmp_clip_u') == 0.25
  assert studies.cmp_clip_from_run(run, 'cmp_clip_v') == 5.0


def test_cmp_clip_from_a_run_without_the_measurement_or_a_bad_flag(tmp_path):
  (tmp_path / 'metrics.csv').write_text('round,train_loss\n1,0.5\n')
  with pytest.raises(ValueError, match='no CMP-Fed .*v_payload'):
    studies.cmp_clip_from_run(tmp_path, 'cmp_clip_v')
  with pytest.raises(ValueError, match="clip_flag must be one of .* 'clip'"):
    studies.cmp_clip_from_run(tmp_path, 'clip')
