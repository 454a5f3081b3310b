"""One TensorFlow call per client: a learning process through MapReduceForm.

A TFF learning process built from composable parts (client work, finite
guard, DP query, secure sum, diagnostics) runs each part's client-side step
as its own TensorFlow computation: the C++ runtime calls several graphs per
client and round, each with its own fixed cost (session run, weights in and
out). TFF's MapReduce compiler
(`tff.backends.mapreduce.get_map_reduce_form_for_computation`) consolidates
all client-side work of a round into one TensorFlow graph (`work`) and the
server side into `prepare` / `zero`-`accumulate`-`merge`-`report` /
`update`; `get_computation_for_map_reduce_form` turns that form back into a
federated computation with the same type signature, which `fuse` wraps as
a `LearningProcess` with the original `initialize`, model-weight accessors
and Python container types.

The arithmetic is the same graph ops in the same order, so results are
bit-identical for a seed (tested): the MapReduce compiler's Grappler pass
runs without its arithmetic rewrites (which may reassociate float sums).
A process the compiler cannot express as one broadcast and one aggregation
a round (CMP-Fed's two phases, methods whose aggregator broadcasts) is
returned unchanged, and `fuse` says why.
"""

from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.aggregators import _tff_private


def _grappler_config() -> tf.compat.v1.ConfigProto:
  """TFF's MapReduce Grappler settings less the arithmetic rewrites."""
  config = tf.compat.v1.ConfigProto()
  rewrite = config.graph_options.rewrite_options
  rewrite.arithmetic_optimization = rewrite.OFF
  return config


def fuse(
  process: tff.learning.templates.LearningProcess,
) -> tuple[tff.learning.templates.LearningProcess, Optional[str]]:
  """`process` with its client work fused into one graph, or unchanged.

  Returns:
    The process to run, and None when fused, else the compiler's reason
    for leaving it unchanged.
  """
  tf_logger = tf.get_logger()
  level = tf_logger.level
  # Tracing the form logs "Object was never used" for the asserts that
  # clipping builds; they are pruned from the fused graph on purpose.
  tf_logger.setLevel('CRITICAL')
  try:
    form = tff.backends.mapreduce.get_map_reduce_form_for_computation(
      process.next, grappler_config=_grappler_config()
    )
  except Exception as e:  # pylint: disable=broad-except
    # The MapReduce compiler raises several error types (ValueError,
    # TypeError, its own compiler errors) for forms it cannot express.
    return process, f'{type(e).__name__}: {str(e).splitlines()[0][:200]}'
  finally:
    tf_logger.setLevel(level)
  fused = tff.backends.mapreduce.get_computation_for_map_reduce_form(form)
  param = process.next.type_signature.parameter

  # One struct parameter keeps the original's parameter names.
  @tff.federated_computation(param)
  def next_fn(arg):
    new_state, metrics = fused(arg[0], arg[1])
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  # The form drops Python container types (LearningAlgorithmState,
  # ModelWeights, ...) from the signature; the proto is the same, so give the
  # fused computation the original, assignable signature back.
  next_fn = _tff_private.with_type_signature(
    next_fn, process.next.type_signature
  )
  return (
    tff.learning.templates.LearningProcess(
      process.initialize,
      next_fn,
      process.get_model_weights,
      process.set_model_weights,
    ),
    None,
  )
