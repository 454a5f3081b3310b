"""Tests of a round's progress line."""

import pytest

from tff_dp.job import metrics_log

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def test_progress_line_omits_a_pld_epsilon_that_is_not_computed():
  row = {'round': 3, 'epsilon_rdp': 1.5, 'bytes_up_per_client': 2000}
  nan = dict(row, epsilon_pld=float('nan'))
  assert metrics_log.progress_line(nan, 10) == (
    'round 3/10 | eps_rdp 1.500 | up 2.0 KB/client'
  )
  assert metrics_log.progress_line(dict(row, epsilon_pld=1.25), 10) == (
    'round 3/10 | eps_rdp 1.500 eps_pld 1.250 | up 2.0 KB/client'
  )
