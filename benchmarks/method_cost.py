r"""Per-method round cost against DP-FedAvg, measured in the same run.

Each method's round is timed exactly as `benchmarks.round_speed` times ours
(one Fashion-MNIST round: 100 clients x 10 steps x batch 10, McMahan CNN,
noise 1.185, clip 1, update diagnostics off, each method with its default
hyperparameters unless the row names an override such as
`fetchsgd:sketch_hashing=block`), every method in its own process, one
after the other, DP-FedAvg first; `x dp_fedavg` is the ratio of medians
(target: <= 1.10).

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

_METHODS = flags.DEFINE_list(
  'methods',
  'blur,lus,blur_lus,dp_randagg,fl_top_dp,fl_basic_dp,fetchsgd,dpsfl,'
  'dpsfl_ac,cmp_fed,uv_fed',
  'Methods to time besides dp_fedavg.',
)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds after warm-up.')
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


def main(argv):
  del argv
  methods = ['dp_fedavg'] + [m for m in _METHODS.value if m != 'dp_fedavg']
  start = time.perf_counter()
  results = {}
  for m in methods:
    results[m] = _time(m)
    med = statistics.median(results[m]['seconds'])
    print(f'{m}: median {med:.2f} s', flush=True)
  wall = time.perf_counter() - start
  base = statistics.median(results['dp_fedavg']['seconds'])
  command = (
    f'python -m benchmarks.method_cost --rounds={_ROUNDS.value} '
    f'--methods={",".join(_METHODS.value)}'
  )
  for m, r in results.items():
    med = statistics.median(r['seconds'])
    row = {
      'method': m,
      'median s/round': round(med, 2),
      'x dp_fedavg': round(med / base, 2),
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
    results_table.update(
      _OUTPUT.value,
      m,
      row,
      title='Per-method round cost (x DP-FedAvg, same run)',
      columns=list(row),
      notes=__doc__.split('\n\n')[1].replace('\n', ' ')
      + f' Machine: {results_table.machine()}.',
    )


if __name__ == '__main__':
  app.run(main)
