"""The frontier's words: what tells the configurations of a method
apart."""

import frontier_rows

from tff_dp.reporting import frontier
from tff_dp.reporting import frontier_words


def test_variant_words_say_what_differs_within_a_method(tmp_path):
  rows = {
    'r1': frontier_rows.row(
      'cmp_fed', 'CMP-Fed rank 1', 20.0, 0.5, 1.0, cmp_rank=1
    ),
    'r16': frontier_rows.row(
      'cmp_fed', 'CMP-Fed rank 16', 300.0, 0.6, 1.0, cmp_rank=16
    ),
    'c1': frontier_rows.row(
      'dp_fedavg', 'DP-FedAvg', 6000.0, 0.6, 1.0, clip=1.0
    ),
    'pub': frontier_rows.row(
      'dp_fedavg',
      'DP-FedAvg, S from one round on the public batch',
      6000.0,
      0.5,
      1.0,
      clip_from_public_round=True,
    ),
    'slr': frontier_rows.row(
      'dp_fedavg',
      'DP-FedAvg tuning: server lr 2',
      6000.0,
      0.6,
      1.0,
      server_lr=2,
    ),
    'q1': frontier_rows.row(
      'dp_fedavg',
      'DP-FedAvg, all clients',
      6000.0,
      0.6,
      1.0,
      client_sampling_rate=1,
    ),
  }
  points = frontier.frontier_points_from_results(
    frontier_rows.store(tmp_path, rows)
  )
  words, legend = frontier_words.point_words(frontier.frontier_groups(points))
  assert words['r1'] == 'rank 1' and words['r16'] == 'rank 16'
  assert words['c1'] == 'clip 1.0'
  # A public round replaced the clip: its words say so, not the clip.
  assert words['pub'] == 'S from a public round'
  assert words['slr'] == 'server lr 2'
  # Sampled otherwise than the plot's other rows: said beside it.
  assert words['q1'] == 'Poisson q = 1'
  assert legend == {'cmp_fed': '', 'dp_fedavg': ''}
