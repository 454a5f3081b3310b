"""DDGauss in stock TFF builders, as a user drops it in (`dropin_model`'s
model, clients and 2 rounds, as in dropin_test.py).

DDGauss needs pure-Python protobuf inside a learning process
(`ddgauss.protobuf_supports_ddgauss`), so its drop-in runs in a subprocess
under `make test-slow`; its round's DP event reads back from the
measurements, not the state (`tff_dp.aggregators.dp_events`).
"""

import os
import subprocess
import sys

import pytest
import tensorflow_federated as tff
import dropin_model

from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import ddgauss_accounting
from tff_dp.aggregators import dp_events


@pytest.fixture(autouse=True, scope='module')
def _tff_test_context():
  tff.backends.test.set_sync_test_cpp_execution_context()


def test_ddgauss_in_both_builders_in_process():
  """Run by `test_ddgauss_drop_in` in a pure-Python-protobuf subprocess."""
  if not ddgauss.protobuf_supports_ddgauss():
    pytest.skip('needs PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python')
  factory = ddgauss.ddgauss_mean(
    dropin_model.Z, dropin_model.CLIENTS, 1.0, min_clients=2, bits=16
  )
  for process in (
    tff.learning.algorithms.build_unweighted_fed_avg(
      dropin_model.model_fn,
      client_optimizer_fn=dropin_model.sgd(0.1),
      server_optimizer_fn=dropin_model.sgd(1.0),
      model_aggregator=factory,
    ),
    tff.learning.algorithms.build_weighted_fed_avg(
      dropin_model.model_fn,
      client_optimizer_fn=dropin_model.sgd(0.1),
      server_optimizer_fn=dropin_model.sgd(1.0),
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      model_aggregator=factory.weighted(),
    ),
  ):
    state, metrics = dropin_model.run_two_rounds(process)
    # TFF's state holds an UnsupportedDpEvent: the state reader refuses it
    # and names the measurements reader.
    with pytest.raises(ValueError, match='round_event_from_measurements'):
      dp_events.round_event(state.aggregator)
    measurements = metrics['aggregator']
    assert measurements['released'] == 1
    event = ddgauss_accounting.round_event_from_measurements(measurements)
    assert isinstance(event, ddgauss_accounting.DiscreteGaussianSumDpEvent)
    assert event.local_stddev >= 1 and event.l2_sensitivity > 0


@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_ddgauss_drop_in():
  env = dict(
    os.environ,
    TF_CPP_MIN_LOG_LEVEL='3',
    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION='python',
  )
  done = subprocess.run(
    [
      sys.executable,
      '-m',
      'pytest',
      '-q',
      '-p',
      'no:cacheprovider',
      f'{__file__}::test_ddgauss_in_both_builders_in_process',
    ],
    capture_output=True,
    text=True,
    timeout=1200,
    env=env,
  )
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
  assert '1 passed' in done.stdout
