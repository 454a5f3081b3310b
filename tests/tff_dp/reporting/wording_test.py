"""The words the plots share: rates and deltas as a reader writes
them."""

from tff_dp.reporting import wording


def test_probabilities_read_as_a_reader_writes_them():
  assert wording.format_probability(0.0166667) == '1/60'
  assert wording.format_probability(0.00333333) == '1/300'
  assert wording.format_probability(1e-4) == '1e-4'
  assert wording.format_probability(1e-5) == '1e-5'
  assert wording.format_probability(0.1) == '0.1'
  assert wording.format_probability(1.0) == '1'
  assert wording.format_probability(0.0123) == '0.0123'
