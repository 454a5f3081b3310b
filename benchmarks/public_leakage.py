r"""Does the public EMNIST set hold the hsf_4 writers' characters? A direct
test: one model's accuracy on those writers' test examples and on the
others', from the same weights.

The public set `emnist_byclass_test` is EMNIST's test split, NIST SD19's
test partition hsf_4 (by our reading of SD19's documentation); 75 of the
300 LEAF writers are hsf_4's. A model trained on the public set only
(`public_only`, the warm start of `tff_dp.job.public_pretrain`) is scored
on the test examples of those 75 writers and of the other 225. Two
controls trained by the same recipe on the LEAF writers' own training
examples give the scale: `leaf_all_writers` (all 300 writers seen: how
hard each group's test examples are) and `leaf_other_writers` (the 225
only: what seeing a writer's other characters is worth, here against the
hsf_4 writers). If the public set holds the hsf_4 writers' characters,
`public_only` favours the hsf_4 group the way `leaf_other_writers`
favours its own.

  python -m benchmarks.public_leakage --model=public_only --seed=0
  python -m benchmarks.public_leakage --model=leaf_all_writers --seed=0
  python -m benchmarks.public_leakage --model=leaf_other_writers --seed=0

The test examples are the writers' own (held by clients); the scores read
them as any research row does. No private training runs: epsilon 0.
"""

import time

from absl import app
from absl import flags
import numpy as np

from benchmarks import results_table
from tff_dp import tasks
from tff_dp.job import public_pretrain
from tff_dp.tasks import emnist
from tff_dp.tasks import public

MODELS = {
  'public_only': 'the public set emnist_byclass_test',
  'leaf_all_writers': "the 300 LEAF writers' training examples",
  'leaf_other_writers': 'the training examples of the 225 LEAF writers '
  'outside hsf_4',
}
_MODEL = flags.DEFINE_enum(
  'model', 'public_only', list(MODELS), 'What the model trains on.'
)
_STEPS = flags.DEFINE_integer('steps', 2000, 'SGD steps.')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Batch size.')
_LR = flags.DEFINE_float('lr', 0.05, 'Learning rate (momentum 0.9).')
_SEED = flags.DEFINE_integer('seed', 0, 'Model and shuffle seed.')
_OUTPUT = flags.DEFINE_string(
  'output', 'benchmarks/results/public_leakage.md', 'Results markdown file.'
)
COLUMNS = (
  'row',
  'trained on',
  'training examples',
  'steps',
  'test accuracy, hsf_4 writers',
  'test accuracy, other writers',
  'hsf_4 - other (points)',
  'epsilon',
  'seed',
  'date',
  'wall s',
  'command',
)


def training_set(model: str, seed: int, arrays) -> public.PublicData:
  """What `model` trains on, as a `PublicData` for `public_pretrain`
  (`arrays`: `emnist.load_emnist_arrays()`'s)."""
  if model == 'public_only':
    task = tasks.load_task('emnist', model_seed=seed, drop_nist_test_writers=1)
    return public.load('emnist_byclass_test', task)
  x_tr, y_tr, w_tr, *_ = arrays
  keep = (
    ~emnist.in_nist_test_partition(w_tr)
    if model == 'leaf_other_writers'
    else np.ones(len(y_tr), bool)
  )
  return public.PublicData(
    name=model,
    x=x_tr[keep][..., None].astype(np.float32) / 255.0,
    y=y_tr[keep].astype(np.int32),
    files=(),
    file_sha256=(),
    content_sha256='',
    removed=0,
  )


def group_accuracies(predicted, labels, in_hsf4) -> tuple[float, float]:
  """Accuracy on the hsf_4 writers' examples and on the others'."""
  right = np.asarray(predicted) == np.asarray(labels)
  in_hsf4 = np.asarray(in_hsf4, bool)
  return float(right[in_hsf4].mean()), float(right[~in_hsf4].mean())


def measure(model: str, steps: int, batch: int, lr: float, seed: int):
  """`(accuracy hsf_4, accuracy other, training examples)`."""
  arrays = emnist.load_emnist_arrays()
  data = training_set(model, seed, arrays)
  # All 300 writers' test examples (the task's, in the arrays' order), and
  # who wrote them.
  task = tasks.load_task('emnist', model_seed=seed)
  *_, w_te, _ = arrays
  if len(w_te) != len(task.test_y):
    raise ValueError("The task's test set is not load_emnist_arrays' own.")
  how = public_pretrain.Pretraining(
    steps=steps, batch_size=batch, learning_rate=lr, seed=seed
  )
  weights, _ = public_pretrain.pretrain(task, data, how)
  keras_model = task.model_builder()
  keras_model.set_weights(weights)
  logits = keras_model.predict(task.test_x, batch_size=500, verbose=0)
  hsf4, other = group_accuracies(
    np.argmax(logits, axis=1), task.test_y, emnist.in_nist_test_partition(w_te)
  )
  return hsf4, other, len(data.y)


def main(argv):
  del argv
  start = time.perf_counter()
  model, seed = _MODEL.value, _SEED.value
  hsf4, other, examples = measure(
    model, _STEPS.value, _BATCH.value, _LR.value, seed
  )
  name = f'{model}_{_STEPS.value}_seed{seed}'
  row = {
    'row': name,
    'trained on': MODELS[model],
    'training examples': examples,
    'steps': _STEPS.value,
    'test accuracy, hsf_4 writers': round(hsf4, 4),
    'test accuracy, other writers': round(other, 4),
    'hsf_4 - other (points)': round(100 * (hsf4 - other), 2),
    'epsilon': '0 (no private training)',
    'seed': seed,
    'date': results_table.today(),
    'wall s': round(time.perf_counter() - start),
    'command': results_table.command_line(),
  }
  results_table.update(
    _OUTPUT.value,
    name,
    row,
    title="The public set against the hsf_4 writers' own test examples",
    columns=COLUMNS,
    notes=(
      "Each model is trained centrally by the warm start's recipe "
      '(`tff_dp.job.public_pretrain`: Keras SGD with momentum 0.9, the '
      "command's batch size and learning rate, by default the warm "
      "start's 32 and 0.05) and scored on the test examples "
      "of the 300 LEAF writers: 1,217 of the 75 writers of NIST SD19's "
      'test partition hsf_4 and the rest of the other 225. See the module '
      "docstring (`python -m benchmarks.public_leakage`) for the controls' "
      'reading. Machine: ' + results_table.machine() + '.'
    ),
  )
  print(row)


if __name__ == '__main__':
  app.run(main)
