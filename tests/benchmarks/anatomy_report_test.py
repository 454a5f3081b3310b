"""The client-work anatomy's fit, op grouping and table (no timing)."""

import pytest

from benchmarks import anatomy_report


def test_fit_recovers_per_step_and_fixed_costs():
  # 100 clients x (13 ms fixed + steps x 7 ms).
  cpu_1 = 100 * (0.013 + 1 * 0.007)
  cpu_10 = 100 * (0.013 + 10 * 0.007)
  per_step, fixed = anatomy_report.fit_client_costs(cpu_1, cpu_10)
  assert per_step == pytest.approx(0.007)
  assert fixed == pytest.approx(0.013)


def test_fit_rejects_rounds_that_got_cheaper_with_more_steps():
  with pytest.raises(ValueError, match=r'cpu_10 \(1.0\) must exceed cpu_1'):
    anatomy_report.fit_client_costs(2.0, 1.0)


# Event names as TF 2.14's profiler writes them for TFF's client step.
_FORWARD_CONV = (
  'StatefulPartitionedCall/StatefulPartitionedCall/cnn_mcmahan/conv2d_1/'
  'Relu:_MklNativeFusedConv2D'
)
_BACKWARD_DENSE = (
  'PartitionedCall/gradients/StatefulPartitionedCall_grad/PartitionedCall/'
  'gradients/cnn_mcmahan/dense/MatMul_grad/MatMul_1:_MklMatMul'
)
_LOSS = (
  'StatefulPartitionedCall/sparse_categorical_crossentropy/'
  'SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits:'
  'SparseSoftmaxCrossEntropyWithLogits'
)


@pytest.mark.parametrize(
  'name, group',
  [
    (_FORWARD_CONV, ('conv2d_1', 'forward')),
    (_BACKWARD_DENSE, ('dense', 'backward')),
    (_LOSS, ('loss and metrics', 'forward')),
    # TFF's SGD with momentum: the step function's top-level ops.
    ('mul_9:Mul', ('optimizer', 'update')),
    ('AssignVariableOp_4:AssignVariableOp', ('optimizer', 'update')),
    # Keras's SGD, as the precision part's step names it.
    ('SGD/AssignAddVariableOp_4:AssignAddVariableOp', ('optimizer', 'update')),
    (
      'gradient_tape/cnn_mcmahan/conv2d/Conv2D/Conv2DBackpropInput:X',
      ('conv2d', 'backward'),
    ),
  ],
)
def test_op_group(name, group):
  assert anatomy_report.op_group(name) == group


def test_only_kernels_are_op_events():
  assert anatomy_report.is_op_event('mul_9:Mul')
  assert not anatomy_report.is_op_event('ExecutorState::Process')
  assert not anatomy_report.is_op_event('ExecutorDoneCallback')


def test_group_op_times_averages_over_steps():
  events = [
    (_BACKWARD_DENSE, 4.0),
    (_BACKWARD_DENSE, 2.0),
    ('mul_9:Mul', 1.0),
    ('add_4:AddV2', 3.0),
  ]
  assert anatomy_report.group_op_times(events, steps=2) == {
    'dense backward': 3.0,
    'optimizer update': 2.0,
  }


def test_render_shows_the_fit_and_the_shares():
  result = {
    'clients': {
      'runs': [
        {'steps': 1, 'calls': 3, 'wall_s': 2.0, 'cpu_s': 3.0},
        {'steps': 10, 'calls': 3, 'wall_s': 6.0, 'cpu_s': 11.1},
      ],
      'fits': {
        '3': {
          'per_step_ms': 9.0,
          'fixed_per_client_ms': 21.0,
          'steps_share': 0.81,
          'cores': 1.85,
        }
      },
    },
    'ops': {
      'cpu_ms': 8.0,
      'wall_ms': 8.1,
      'ops_ms': 10.0,
      'groups': {'dense backward': 4.0, 'optimizer update': 6.0},
    },
    'precision': {
      'float32': 9.0,
      'mixed_bfloat16': 7.5,
      'cycles': {'float32': [9.0] * 3, 'mixed_bfloat16': [7.5] * 3},
    },
  }
  text = anatomy_report.render(result, 'python -m x', 'machine', '2026-12-05')
  assert '| 10 | 3 | 6.00 | 11.10 | 1.85 |' in text
  assert '| 3 | 9.00 | 21.0 | 81% | 1.85 |' in text
  assert '| optimizer update | 6.000 | 60.0% |' in text
  assert 'float32 / mixed_bfloat16: 1.20.' in text
