r"""Per-method round cost against DP-FedAvg, measured in the same run.

Each method's round is timed exactly as `benchmarks.round_speed` times ours
(one Fashion-MNIST round: 100 clients x 10 steps x batch 10, McMahan CNN,
noise 1.185, clip 1, update diagnostics off, each method with its default
hyperparameters unless the row names an override such as
`fetchsgd:sketch_hashing=block`, or DP-FedAvg with banded or BLT noise,
`CORRELATED`), every method in its own process, one after the other. The
cost is the CPU seconds a round takes (this process and the TFF worker):
on a shared VM the wall time also counts the time the hypervisor gave our
cores to others (the same DP-FedAvg round took 16.3 and 40.4 s in two
superseded runs an hour apart here, 2026-11-22), while CPU time counts
the work. Wall time is reported beside it.
DP-FedAvg is timed first, again after every `--every` methods, and last;
each method's `x dp_fedavg` divides its median by the mean of the
DP-FedAvg medians just before and after it (target: <= 1.10); the
DP-FedAvg row gives the median of its medians.

  python -m benchmarks.method_cost --methods=blur,lus,fl_top_dp
"""

import json
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

from benchmarks import results_table

# DP-FedAvg with noise correlated across rounds (issue #86): banded MF (4
# bands, cyclic Poisson at the round's expected cohort) and BLT (2
# buffers, min-separation over 2 groups). The timed cohort is the same 100
# clients; what differs is the aggregator's noise and its state.
CORRELATED = (
  'dp_fedavg:participation=cyclic_poisson+client_sampling_rate=0.0667+'
  'clients_per_round=null+noise=banded+bands=4',
  'dp_fedavg:participation=cyclic+client_sampling_rate=0.0667+'
  'clients_per_round=null+participation_groups=2+noise=blt',
)
_METHODS = flags.DEFINE_list(
  'methods',
  'blur,lus,blur_lus,dp_randagg,fl_top_dp,fl_basic_dp,fetchsgd,dpsfl,'
  'dpsfl_ac,cmp_fed,uv_fed,' + ','.join(CORRELATED),
  'Methods to time besides dp_fedavg (`round_speed.parse_method` specs).',
)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds after warm-up.')
_EVERY = flags.DEFINE_integer(
  'every', 3, 'Time DP-FedAvg again after this many methods.'
)
_OUTPUT = flags.DEFINE_string(
  'output', 'benchmarks/results/method_cost.md', 'Results markdown file.'
)


def _time(method: str) -> dict:
  cmd = [
    sys.executable,
    '-m',
    'benchmarks.round_speed',
    '--mode=ours',
    f'--method={method}',
    f'--rounds={_ROUNDS.value}',
  ]
  done = subprocess.run(cmd, capture_output=True, text=True, check=False)
  line = [l for l in done.stdout.splitlines() if l.startswith('RESULT ')]
  if done.returncode != 0 or not line:
    raise RuntimeError(f'{method} failed:\n{done.stderr[-3000:]}')
  return json.loads(line[-1][len('RESULT ') :])


def schedule(methods: list[str], every: int) -> list[str]:
  """DP-FedAvg first, after every `every` methods, and last."""
  order = ['dp_fedavg']
  for i, m in enumerate(methods):
    order.append(m)
    if (i + 1) % every == 0 or i + 1 == len(methods):
      order.append('dp_fedavg')
  return order


def local_bases(order: list[str], medians: list[float]) -> list[float]:
  """For each run, the mean of the DP-FedAvg medians just before and after."""
  base_at = [i for i, m in enumerate(order) if m == 'dp_fedavg']
  out = []
  for i in range(len(order)):
    before = max(j for j in base_at if j <= i)
    after = min((j for j in base_at if j >= i), default=before)
    out.append(0.5 * (medians[before] + medians[after]))
  return out


def main(argv):
  del argv
  methods = [m for m in _METHODS.value if m != 'dp_fedavg']
  order = schedule(methods, _EVERY.value)
  start = time.perf_counter()
  runs = []
  for m in order:
    runs.append(_time(m))
    med = statistics.median(runs[-1]['seconds'])
    cpu = statistics.median(runs[-1]['cpu_seconds'])
    print(f'{m}: median {med:.2f} s, {cpu:.2f} CPU s', flush=True)
  wall = time.perf_counter() - start
  walls = [statistics.median(r['seconds']) for r in runs]
  cpus = [statistics.median(r['cpu_seconds']) for r in runs]
  wall_bases = local_bases(order, walls)
  cpu_bases = local_bases(order, cpus)
  is_base = [m == 'dp_fedavg' for m in order]
  base_walls = [w for w, b in zip(walls, is_base) if b]
  base_cpus = [c for c, b in zip(cpus, is_base) if b]
  command = (
    f'python -m benchmarks.method_cost --rounds={_ROUNDS.value} '
    f'--every={_EVERY.value} --methods={",".join(_METHODS.value)}'
  )
  if _OUTPUT.value != _OUTPUT.default:
    command += f' --output={_OUTPUT.value}'
  rows = {}
  for i, m in enumerate(order):
    if m != 'dp_fedavg':
      rows[m] = (runs[i], cpus[i], cpu_bases[i], walls[i], wall_bases[i])
  median_cpu = statistics.median(base_cpus)
  median_wall = statistics.median(base_walls)
  rows['dp_fedavg'] = (
    runs[0],
    median_cpu,
    median_cpu,
    median_wall,
    median_wall,
  )
  table = {}
  for m, (r, cpu, cpu_base, med, base) in rows.items():
    table[m] = {
      'method': m,
      'CPU s/round': round(cpu, 2),
      'x dp_fedavg (CPU)': round(cpu / cpu_base, 2),
      'wall s/round': round(med, 2),
      'x dp_fedavg (wall)': round(med / base, 2),
      'rounds timed': len(r['seconds']),
      'peak RSS GiB': (
        round(r['peak_rss'] / 2**30, 2) if r.get('peak_rss') else ''
      ),
      'KB up / client': r['cost']['up'] / 1000,
      'KB down / client': r['cost']['down'] / 1000,
      'seed': 0,
      'date': results_table.today(),
      'bench wall s': round(wall, 1),
      'command': command,
    }
  # One table from one run: rows of earlier runs are dropped (their files
  # are kept under dated names).
  results_table.replace_all(
    _OUTPUT.value,
    table,
    title='Per-method round cost (x DP-FedAvg, same run)',
    columns=list(next(iter(table.values()))),
    notes=notes(base_cpus, base_walls),
  )


def notes(base_cpus, base_walls) -> str:
  """The table's notes: how it was measured, and this run's DP-FedAvg."""
  return (
    __doc__.split('\n\n')[1].replace('\n', ' ')
    + ' DP-FedAvg in this run (each time it was timed): '
    + ', '.join(f'{c:.1f}' for c in base_cpus)
    + ' CPU s/round; '
    + ', '.join(f'{w:.1f}' for w in base_walls)
    + f' wall s/round. Machine: {results_table.machine()}.'
  )


if __name__ == '__main__':
  app.run(main)
