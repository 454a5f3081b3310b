r"""Seconds to load each task's federation (in a fresh process each).

  python -m benchmarks.load_time --output=benchmarks/results/load_time.md

Each row is one `tff_dp.tasks.load_task(name)` in its own process (after
TF/TFF import, which is not counted), file system cache warm.
"""

import json
import os
import subprocess
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from benchmarks import results_table  # noqa: E402

_TASKS = flags.DEFINE_list(
  'tasks',
  'fashion_mnist_iid,fashion_mnist_5labels,emnist,'
  'cifar10_dirichlet,physionet2012,heart_disease',
  'Tasks to time.',
)
_ONE = flags.DEFINE_string('one', None, 'Worker: time this task only.')
_OUTPUT = flags.DEFINE_string(
  'output', 'benchmarks/results/load_time.md', 'Results markdown file.'
)


def main(argv):
  del argv
  if _ONE.value:
    from tff_dp import tasks  # pylint: disable=g-import-not-at-top

    start = time.perf_counter()
    task = tasks.load_task(_ONE.value)
    seconds = time.perf_counter() - start
    print(
      'RESULT '
      + json.dumps(
        {
          'seconds': seconds,
          'clients': len(task.train_data.client_ids),
          'description': task.description,
        }
      )
    )
    return
  for name in _TASKS.value:
    done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.load_time', f'--one={name}'],
      capture_output=True,
      text=True,
      check=True,
    )
    line = [l for l in done.stdout.splitlines() if l.startswith('RESULT ')]
    r = json.loads(line[-1][len('RESULT ') :])
    print(name, f"{r['seconds']:.2f} s", flush=True)
    row = {
      'task': name,
      'clients': r['clients'],
      'load s': round(r['seconds'], 2),
      'description': r['description'],
      'date': results_table.today(),
      'command': f'python -m benchmarks.load_time --tasks={name}',
    }
    results_table.update(
      _OUTPUT.value,
      name,
      row,
      title='Seconds to load a federation',
      columns=list(row),
      notes=(
        '`tff_dp.tasks.load_task(name)` in a fresh process, TF and TFF '
        'already imported, file cache warm (CIFAR-10: from the decoded '
        f'cache). Machine: {results_table.machine()}.'
      ),
    )


if __name__ == '__main__':
  app.run(main)
