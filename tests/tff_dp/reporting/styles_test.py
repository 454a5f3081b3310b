"""The method style table: one colour and marker per method and
correlated-noise variant, the same in every plot."""

import pytest
import frontier_rows

from tff_dp.reporting import frontier
from tff_dp.reporting import frontier_plot
from tff_dp.reporting import styles
from tff_dp.methods import style


def _marker_of(fig, colour):
  return {
    (l.get_color(), l.get_marker())
    for l in fig.axes[0].get_lines()
    if l.get_color() == colour and l.get_marker() not in ('None', '', '_')
  }


def test_a_method_keeps_its_colour_and_marker_in_every_plot(tmp_path):
  dp = styles.METHOD_STYLES['dp_fedavg']
  first = frontier.frontier_points_from_results(
    frontier_rows.store(tmp_path, frontier_rows.STUDY), ['dp', 'top', 'fedavg']
  )
  second = frontier.frontier_points_from_results(
    frontier_rows.store(tmp_path, frontier_rows.STUDY),
    ['cmp_r1', 'cmp_r16', 'dp'],
  )
  figs = [
    frontier_plot.frontier_figure(p, paper_words='T') for p in (first, second)
  ]
  for fig in figs:
    # Drawn in the table's colour and marker, whatever else is on the plot.
    assert _marker_of(fig, dp.color) == {(dp.color, dp.marker)}
    frontier_plot.plt.close(fig)
  # The table is the registry's: every method, each correlated-noise
  # variant and each linear-compression variant, by its key (their pairs
  # differ: registry_test).
  from tff_dp import methods  # pylint: disable=g-import-not-at-top

  correlated = {n for n, m in methods.METHODS.items() if m.correlated_noise}
  keys = set(methods.METHODS) | {
    f'{name}+{noise}' for name in correlated for noise in ('banded', 'blt')
  }
  keys |= {
    f'{name}+compressed'
    for name in ('dp_fedavg', 'dp_fedavg_adaptive', 'ddgauss')
  }
  assert (
    styles.method_key({'method': 'dp_fedavg', 'compression': '100'})
    == 'dp_fedavg+compressed'
  )
  assert styles.METHOD_STYLES['dp_fedavg+compressed'] == style.Style(
    'DP-FedAvg, linear compression', style.BLUE, 'X'
  )
  assert keys == set(styles.METHOD_STYLES)
  for name, method in methods.METHODS.items():
    assert styles.METHOD_STYLES[name] == method.style
  assert styles.METHOD_STYLES['dp_fedavg+blt'] == style.Style(
    'DP-FedAvg, BLT noise', style.SKY, 'H'
  )
  assert styles.METHOD_STYLES['cmp_fed+banded'] == style.Style(
    'CMP-Fed, banded MF noise', style.GREEN, 'h'
  )
  assert styles.method_key({'method': 'dp_fedavg', 'noise': 'banded'}) == (
    'dp_fedavg+banded'
  )
  assert styles.method_key({'method': 'lus'}) == 'lus'
  assert styles.is_ceiling('fedavg')
  assert not styles.is_ceiling('dp_fedavg') and not styles.is_ceiling('nope')
  with pytest.raises(ValueError, match="No style for method 'nope'"):
    styles.method_style('nope')
