"""`benchmarks.round_anatomy`'s arithmetic and table, flag-free.

The per-step and per-client fit, the grouping of a traced step's op events
by layer and pass, and the results markdown.
"""

import collections
from typing import Iterable, Mapping

CLIENTS = 100
MOMENTUM = 0.5


def fit_client_costs(cpu_1: float, cpu_10: float, clients: int = CLIENTS):
  """`(per_step, fixed)` CPU seconds from rounds at 1 and 10 local steps.

  A round's CPU is `clients x (fixed + steps x per_step)`: nine more steps
  a client cost `9 x clients x per_step`.

  Raises:
    ValueError: If the 10-step round took no more CPU than the 1-step one.
  """
  if cpu_10 <= cpu_1:
    raise ValueError(
      f'cpu_10 ({cpu_10}) must exceed cpu_1 ({cpu_1}): more steps, more work.'
    )
  per_step = (cpu_10 - cpu_1) / (9 * clients)
  return per_step, cpu_1 / clients - per_step


# Keras's default layer names and the ones `tasks.models` gives.
_LAYER_PREFIXES = ('conv', 'dense', 'max_pooling', 'pool', 'flatten')


def is_op_event(name: str) -> bool:
  """Whether a traced event is one op's kernel (`'op/name:OpType'`), not
  the executor's own (`'ExecutorState::Process'`)."""
  return ':' in name and '::' not in name


def op_group(name: str) -> tuple[str, str]:
  """`(layer, pass)` of a traced op event named `'op/name:OpType'`.

  Passes: `backward` (ops under `gradients/` or `gradient_tape/`),
  `update` (the optimizer's arithmetic and the weights' assignment: the
  step function's top-level ops, or under Keras's `SGD/`) and `forward`
  (inside the model's call: the layers, the loss and the metrics). Layers
  are the model's layer names (`conv2d`, `conv2d_1`, `dense`, ...), `loss
  and metrics`, or `optimizer` for the update.
  """
  op_name = name.rsplit(':', 1)[0]
  parts = op_name.split('/')
  if any(p in ('gradients', 'gradient_tape') for p in parts):
    stage = 'backward'
  elif len(parts) == 1 or parts[0] == 'SGD':
    stage = 'update'
  else:
    stage = 'forward'
  for p in parts:
    if p.startswith(_LAYER_PREFIXES):
      return p, stage
  return ('optimizer' if stage == 'update' else 'loss and metrics'), stage


def group_op_times(
  events: Iterable[tuple[str, float]], steps: int
) -> dict[str, float]:
  """Milliseconds a step per `'layer pass'`, from `(op event, ms)` pairs."""
  total = collections.Counter()
  for name, ms in events:
    layer, stage = op_group(name)
    total[f'{layer} {stage}'] += ms / steps
  return dict(total)


def render(result: Mapping, command: str, machine: str, date: str) -> str:
  """The results markdown of one run."""
  lines = [
    "# Where TFF's client work spends a round",
    '',
    f'`{command}`, {date}, {machine}. Seed 0; the McMahan CNN '
    '(1,663,370 parameters) on Fashion-MNIST, batch 10, client SGD at lr '
    f'0.05 with momentum {MOMENTUM}, as `round_speed`. Regenerated whole '
    'by each run.',
  ]
  clients = result.get('clients')
  if clients:
    lines += [
      '',
      '## Per step and per client (`floor_local`, 100 clients)',
      '',
      "Median of each run's timed rounds; CPU is the process and its TFF "
      "worker. Fit: a round's CPU = 100 x (fixed + steps x per step).",
      '',
      '| local steps | concurrent calls | s a round (wall) | CPU s a round '
      '| cores busy |',
      '|---|---|---|---|---|',
    ]
    for r in clients['runs']:
      lines.append(
        f"| {r['steps']} | {r['calls']} | {r['wall_s']:.2f} | "
        f"{r['cpu_s']:.2f} | {r['cpu_s'] / r['wall_s']:.2f} |"
      )
    lines += [
      '',
      '| concurrent calls | CPU ms a step | fixed CPU ms a client | '
      "steps' share of a 10-step round's CPU | cores busy at 10 steps |",
      '|---|---|---|---|---|',
    ]
    for calls, f in clients['fits'].items():
      lines.append(
        f"| {calls} | {f['per_step_ms']:.2f} | "
        f"{f['fixed_per_client_ms']:.1f} | {f['steps_share']:.0%} | "
        f"{f['cores']:.2f} |"
      )
  ops = result.get('ops')
  if ops:
    lines += [
      '',
      '## Per op (one TFF client step, the `tensorflow` wheel, 1 thread)',
      '',
      f"A step took {ops['cpu_ms']:.2f} ms CPU ({ops['wall_ms']:.2f} ms "
      f"wall) untraced; traced (the tracer adds its own cost), its op "
      f"kernels summed to {ops['ops_ms']:.2f} ms. Read the shares.",
      '',
      '| layer and pass | ms a step | share of the ops |',
      '|---|---|---|',
    ]
    for group, ms in ops['groups'].items():
      lines.append(f'| {group} | {ms:.3f} | {ms / ops["ops_ms"]:.1%} |')
  precision = result.get('precision')
  if precision:
    f32, bf16 = precision['float32'], precision['mixed_bfloat16']
    lines += [
      '',
      '## Precision (a Keras step, 1 thread, 3 alternated cycles)',
      '',
      '| policy | CPU ms a step (median of cycles) | cycles |',
      '|---|---|---|',
    ]
    for p in ('float32', 'mixed_bfloat16'):
      cycles = ', '.join(f'{v:.2f}' for v in precision['cycles'][p])
      lines.append(f'| {p} | {precision[p]:.2f} | {cycles} |')
    lines += ['', f'float32 / mixed_bfloat16: {f32 / bf16:.2f}.']
  return '\n'.join(lines) + '\n'
