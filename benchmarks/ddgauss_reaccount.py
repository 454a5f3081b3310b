"""Issue 83: the committed DDGauss rows re-accounted by their theorem.

Until issue 83 every DDGauss round was recorded as `GaussianDpEvent(z_eff)`
and amplified by sampling as a continuous Gaussian, which Kairouz et al.'s
theorem (Prop. 14 / Eq. 17) does not give: it gives an RDP curve only. This
re-accounts each DDGauss row of the study tables (the rows of
`benchmarks/results/*.md` whose command runs `--method=ddgauss`) from what
it ran: every round's measurements in the row's committed run folder
(`metrics.csv` under `results/runs/<study>/<row>/`: min_clients, the
integer noise scale, the scaled inflated norm bound, the padded dimension)
become that round's `DiscreteGaussianSumDpEvent`, and the ledger of
`tff_dp.privacy` composes them under the run's sampling and delta (its
`summary.json`) with the generic subsampling bounds. It writes
`results/ddgauss_reaccounting.md` and changes no study table.

  python -m benchmarks.ddgauss_reaccount
"""

import json
import math
import pathlib
import re
import shlex

from benchmarks import results_table
from tff_dp.reporting import run_folders
from tff_dp import privacy
from tff_dp.aggregators import ddgauss_accounting

RESULTS = pathlib.Path(__file__).parent / 'results'
OUT = RESULTS / 'ddgauss_reaccounting.md'
_MEASUREMENTS = (
  'min_clients',
  'scaled_local_stddev',
  'scaled_inflated_l2',
  'padded_dim',
)
COLUMNS = (
  'study',
  'row',
  'command',
  'epsilon RDP (published)',
  'epsilon PLD (published)',
  'epsilon RDP (theorem, generic subsampling)',
  'epsilon PLD (theorem)',
  'sampling',
  'rests on the Poisson-count assumption',
  'date',
)


def _table_rows(md: pathlib.Path) -> list[dict[str, str]]:
  """The rows of the markdown table in `md`, by column name."""
  lines = [ln for ln in md.read_text().splitlines() if ln.startswith('|')]
  if len(lines) < 2:
    return []

  def cells(line):
    return [c.strip() for c in re.split(r'(?<!\\)\|', line)[1:-1]]

  header = cells(lines[0])
  return [dict(zip(header, cells(ln))) for ln in lines[2:]]


def ddgauss_rows() -> list[tuple[str, dict[str, str]]]:
  """(study, row) of every committed DDGauss row."""
  out = []
  for md in sorted(RESULTS.glob('*.md')):
    if md == OUT:
      continue
    for row in _table_rows(md):
      if '--method=ddgauss' in row.get('command', ''):
        out.append((md.stem, row))
  return out


def _run_dir(study: str, row: dict[str, str]) -> pathlib.Path:
  flags = dict(
    a[2:].split('=', 1)
    for a in shlex.split(row['command'].strip('`'))
    if a.startswith('--') and '=' in a
  )
  run = RESULTS / 'runs' / study / pathlib.Path(flags['root_output_dir']).name
  if not (run / 'metrics.csv').exists():
    raise FileNotFoundError(
      f'{study}/{row["row"]}: no committed run folder {run} to read the '
      'rounds from.'
    )
  return run


def reaccount(study: str, row: dict[str, str]) -> dict:
  """The row's epsilon from its rounds' `DiscreteGaussianSumDpEvent`s."""
  run = _run_dir(study, row)
  summary = json.loads((run / 'summary.json').read_text())
  # The measurements: non_private/metrics.csv for runs after issue 83.
  rounds = run_folders.read_rows(run)
  sampling = privacy.Sampling.from_dict(summary['sampling'])
  delta = float(summary['delta'])
  ledger = privacy.PrivacyLedger(sampling, delta)
  # What the server of the pre-issue-83 code saw: a withheld round's
  # secure sum was computed anyway, with n - 1 shares besides the target.
  server = privacy.PrivacyLedger(sampling, delta)
  withheld = []
  events = set()
  for r in rounds:
    m = {k: float(r[f'tff/aggregator/{k}']) for k in _MEASUREMENTS}
    event = ddgauss_accounting.round_event_from_measurements(m)
    events.add(event)
    ledger.record(event)
    n = int(float(r['tff/aggregator/actual_num_clients']))
    if float(r['tff/aggregator/released']) == 0:
      withheld.append((int(r['round']), n))
      event = ddgauss_accounting.DiscreteGaussianSumDpEvent(
        event.l2_sensitivity, event.local_stddev, n - 1, event.dim
      )
    server.record(event)
  eps_rdp, eps_pld = ledger.epsilon()
  config = summary['config']
  z_target = None
  if config.get('target_epsilon') is not None:
    p = summary
    z_target = privacy.calibrate_noise_multiplier(
      float(config['target_epsilon']),
      delta,
      len(rounds),
      sampling,
      round_event_fn=lambda z: ddgauss_accounting.planned_round_event(
        z,
        float(p['clip']),
        sampling.expected_clients_per_round,
        int(p['num_model_params']),
        int(config['ddgauss_bits']),
        min_clients=int(m['min_clients']),
      ),
    )
  return {
    'study': study,
    'row': row['row'],
    'command': row['command'].strip('`'),
    'epsilon RDP (published)': row['epsilon RDP'],
    'epsilon PLD (published)': row['epsilon PLD'],
    'epsilon RDP (theorem, generic subsampling)': f'{eps_rdp:.4f}',
    'epsilon PLD (theorem)': 'none (NaN)' if math.isnan(eps_pld) else eps_pld,
    'sampling': (
      f'Poisson q = {sampling.rate} of N = {sampling.num_clients}'
      if sampling.mode == 'poisson'
      else f'fixed m = {sampling.clients_per_round} of N = '
      f'{sampling.num_clients}'
    ),
    'rests on the Poisson-count assumption': (
      'yes' if ledger.assumptions() else 'no'
    ),
    'date': results_table.today(),
    # For the notes.
    '_events': events,
    '_rounds': len(rounds),
    '_delta': delta,
    '_published_event': summary['dp_events'][-1],
    '_noise_multiplier': summary['noise_multiplier'],
    '_withheld': withheld,
    '_server_rdp': server.epsilon()[0],
    '_z_target': z_target,
    '_target': config.get('target_epsilon'),
    '_pld_reason': ledger.pld_unavailable_reason(),
  }


def _cell(v) -> str:
  return str(v).replace('|', '\\|')


def render(results: list[dict]) -> str:
  lines = [
    '# DDGauss rows re-accounted by their theorem (issue 83)',
    '',
    (__doc__.split('\n\n')[1]).replace('\n', ' '),
    '',
    'Old: as published in the study table (`GaussianDpEvent(z_eff)`, '
    "dp_accounting's subsampled-Gaussian RDP and PLD). New: Kairouz et "
    "al.'s RDP curve alpha c^2 / 2 of the h = min_clients - 1 counted "
    'shares, amplified by Zhu & Wang 2019 Theorem 6 (Poisson) or Wang, '
    'Balle & Kasiviswanathan 2019 Theorem 9 (fixed-size, replace-one), '
    "converted by dp_accounting's `compute_epsilon`; no PLD follows from an "
    'RDP bound. Regenerate: `python -m benchmarks.ddgauss_reaccount`.',
    '',
    '| ' + ' | '.join(COLUMNS) + ' |',
    '|' + '---|' * len(COLUMNS),
  ]
  for r in results:
    cells = [_cell(r[c]) for c in COLUMNS]
    cells[2] = f'`{cells[2]}`'
    lines.append('| ' + ' | '.join(cells) + ' |')
  lines.append('')
  for r in results:
    (event,) = r['_events']
    c = math.sqrt(event.rdp_coefficient())
    lines += [
      f'`{r["study"]}/{r["row"]}`: {r["_rounds"]} rounds at delta '
      f'{r["_delta"]}, every round '
      f'`DiscreteGaussianSumDpEvent(l2_sensitivity={event.l2_sensitivity}, '
      f'local_stddev={event.local_stddev}, num_shares={event.num_shares}, '
      f'dim={event.dim})` (c = {c:.4f}, the published z_eff = 1 / c = '
      f'{1 / c:.4f}; published event '
      f'`{json.dumps(r["_published_event"])}`). Its noise multiplier '
      f'{r["_noise_multiplier"]:.4f} was calibrated to epsilon '
      f'{r["_target"]} through the Gaussian reading; through the theorem '
      f'that epsilon needs {r["_z_target"]:.4f}. Withheld rounds (round, '
      f'participants): {r["_withheld"] or "none"}. The code of the run '
      'still secure-summed a withheld round, so its server saw that sum '
      "with n - 1 shares besides a target's; charging those rounds so "
      f'gives {r["_server_rdp"]:.4f} RDP against the server (the table '
      'charges every round as a released one, the bound for anyone who '
      'sees only the model). Its noise came from TF-Privacy\'s sampler '
      "(TF's process RNG), not today's seeded, per-client-nonce sampler; "
      'no accounting covers that. PLD: ' + r['_pld_reason'],
      '',
    ]
    if r['rests on the Poisson-count assumption'] == 'yes':
      lines += [
        'Poisson-count assumption (`privacy.POISSON_COUNT_ASSUMPTION`): '
        + privacy.POISSON_COUNT_ASSUMPTION,
        '',
      ]
  return '\n'.join(lines)


def main() -> None:
  results = [reaccount(study, row) for study, row in ddgauss_rows()]
  OUT.write_text(render(results))
  for r in results:
    print(
      r['study'],
      r['row'],
      'old',
      r['epsilon RDP (published)'],
      r['epsilon PLD (published)'],
      'new',
      r['epsilon RDP (theorem, generic subsampling)'],
      r['epsilon PLD (theorem)'],
    )


if __name__ == '__main__':
  main()
