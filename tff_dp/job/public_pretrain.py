"""A warm start: central, non-private training on public data before round 1.

`--public_data=NAME --public_pretrain_steps=N` trains the task's model on
the public set (`tff_dp.tasks.public`) with Keras SGD for N batches, and
the learning process starts from the result (`public.WarmStart`): the
private rounds, the ledger and the noise calibration are unchanged (no
client's data is read, so the release costs no privacy), and the run's
summary says which public data, how much training and what it cost. The
weights are kept in the run folder (`public_pretrain_weights.npz`; public,
derived from public data only), so a resumed run starts from the same ones
without training again. The clip probe (`--clip_from_fedavg_rounds`) starts
from its run's warm start: the kept one on a resume (`reading_kept`), else
the same pretraining, done once a process.

`--initial_weights=PATH` starts instead from a user's saved weights (a
Keras `.weights.h5` / `.h5` / `.keras` file, or an `.npz` of `w0`, `w1`,
... in `model.weights` order), which the user states are public: no
client's data of this run went into them. They are kept in the run folder
the same way, with the file's SHA-256; a resume refuses a file that
changed.
"""

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import pathlib
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_dp.tasks import data_dir as data_dir_lib
from tff_dp.tasks import public as public_lib
from tff_dp.tasks import task as task_lib

WEIGHTS_FILE = 'public_pretrain_weights.npz'
REPORT_FILE = 'public_pretrain.json'
MOMENTUM = 0.9


class OtherPublicData(ValueError):
  """A run folder's kept warm start came from other public data."""


@dataclasses.dataclass(frozen=True)
class Pretraining:
  """How to pretrain (the `--public_pretrain_*` settings)."""

  steps: int
  batch_size: int
  learning_rate: float
  seed: int


def pretrain(
  task: task_lib.FederatedTask,
  public: public_lib.PublicData,
  how: Pretraining,
) -> tuple[tuple[np.ndarray, ...], dict]:
  """`(weights, report)`: the task's model after `how.steps` SGD steps on
  `public` (shuffled by `how.seed`, public randomness), in `model.weights`
  order."""
  start = time.perf_counter()
  model = task.model_builder()
  model.compile(
    optimizer=tf.keras.optimizers.SGD(how.learning_rate, momentum=MOMENTUM),
    loss=task.loss_builder(),
    metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
  )
  data = (
    tf.data.Dataset.from_tensor_slices((public.x, public.y))
    .shuffle(len(public.y), seed=how.seed, reshuffle_each_iteration=True)
    .repeat()
    .batch(how.batch_size)
    .take(how.steps)
  )
  history = model.fit(data, epochs=1, verbose=0)
  report = {
    'public_data': public.summary(),
    **dataclasses.asdict(how),
    'momentum': MOMENTUM,
    'examples_seen': how.steps * how.batch_size,
    # Keras's running mean over the steps, on the public data.
    'public_train_loss': float(history.history['loss'][-1]),
    'public_train_accuracy': float(history.history['accuracy'][-1]),
    'seconds': time.perf_counter() - start,
  }
  return tuple(w.numpy() for w in model.weights), report


WEIGHT_FILE_SUFFIXES = ('.npz', '.h5', '.keras')

# A run folder whose kept warm start a run without one (the clip probe)
# reads, never writes (`reading_kept`).
_KEPT = contextvars.ContextVar('kept_warm_start', default=None)


@contextlib.contextmanager
def reading_kept(run_dir):
  """Inside the block, a warm start with no run folder of its own starts
  from the one kept in `run_dir` (if any), and writes nothing."""
  token = _KEPT.set(pathlib.Path(run_dir) if run_dir else None)
  try:
    yield
  finally:
    _KEPT.reset(token)


def _kept_paths(run_dir) -> tuple:
  """`(weights, report)` paths to read: the run's, else `reading_kept`'s."""
  read_dir = run_dir or _KEPT.get()
  if read_dir is None:
    return None, None
  return read_dir / WEIGHTS_FILE, read_dir / REPORT_FILE


def load_weights(
  task: task_lib.FederatedTask, path: pathlib.Path
) -> tuple[np.ndarray, ...]:
  """The weights in `path`, in the task model's `model.weights` order.

  Raises:
    ValueError: If the file's type is not one of `WEIGHT_FILE_SUFFIXES`,
      or its weights do not fit the task's model (naming both shapes).
    FileNotFoundError: If it does not exist.
  """
  if path.suffix not in WEIGHT_FILE_SUFFIXES:
    raise ValueError(
      f'initial_weights must be a file ending in one of '
      f'{list(WEIGHT_FILE_SUFFIXES)} (Keras weights or a saved model, or '
      f'an npz of w0, w1, ...). Found {str(path)!r}.'
    )
  if not path.is_file():
    raise FileNotFoundError(f'initial_weights {str(path)!r} does not exist.')
  model = task.model_builder()
  want = [tuple(w.shape) for w in model.weights]
  if path.suffix == '.npz':
    with np.load(path) as saved:
      names = [f'w{i}' for i in range(len(saved.files))]
      if sorted(saved.files) != sorted(names):
        raise ValueError(
          f'initial_weights {str(path)!r} must hold arrays w0 ... '
          f'w{len(want) - 1}. Found {sorted(saved.files)}.'
        )
      weights = tuple(saved[n] for n in names)
  else:  # Keras matches the file's layers to the model's, in order.
    try:
      model.load_weights(path)
    except (ValueError, OSError, KeyError) as e:
      raise ValueError(
        f'initial_weights {str(path)!r} does not fit the task model '
        f'{model.name!r} ({want}): {" ".join(str(e).split())}'
      ) from None
    weights = tuple(w.numpy() for w in model.weights)
  got = [tuple(w.shape) for w in weights]
  if got != want:
    raise ValueError(
      f'initial_weights {str(path)!r} holds weights of shapes {got}; the '
      f'task model {model.name!r} has {want}.'
    )
  return weights


def from_file(
  task: task_lib.FederatedTask,
  path: pathlib.Path,
  run_dir: Optional[pathlib.Path] = None,
) -> tuple[task_lib.FederatedTask, dict]:
  """`task` with its model starting from the weights in `path`, and the
  report for the summary; kept in `run_dir` (a resume reads them there, and
  refuses a `path` whose SHA-256 changed).

  Raises:
    OtherPublicData: The run folder's kept weights came from elsewhere.
    ValueError, FileNotFoundError: As `load_weights`.
  """
  weights_path, report_path = _kept_paths(run_dir)
  sha256 = data_dir_lib.file_sha256(path) if path.is_file() else None
  if weights_path is not None and weights_path.exists():
    report = json.loads(report_path.read_text())
    kept = report.get('initial_weights', {}).get('sha256')
    if kept is None or (sha256 is not None and sha256 != kept):
      source = report.get('initial_weights') or 'a public pretraining'
      raise OtherPublicData(
        f'{weights_path} came from {source}, not from {str(path)!r} '
        f'(SHA-256 {sha256}); choose a new --root_output_dir.'
      )
    with np.load(weights_path) as saved:
      weights = tuple(saved[f'w{i}'] for i in range(len(saved.files)))
  else:
    weights = load_weights(task, path)
    report = {
      'initial_weights': {'path': str(path), 'sha256': sha256},
      'public': 'stated by the user: no client data of this run',
    }
    if run_dir is not None:
      _keep(run_dir, weights, report)
  builder = public_lib.WarmStart(task.model_builder, weights)
  return dataclasses.replace(task, model_builder=builder), report


def _keep(run_dir: pathlib.Path, weights, report: dict) -> None:
  """The report first, the weights last: weights on disk mean both are."""
  run_dir.mkdir(parents=True, exist_ok=True)
  _write_atomically(run_dir / REPORT_FILE, json.dumps(report, indent=2) + '\n')
  partial = run_dir / (WEIGHTS_FILE + '.partial.npz')
  np.savez(partial, **{f'w{i}': w for i, w in enumerate(weights)})
  partial.replace(run_dir / WEIGHTS_FILE)


# This process's last pretraining: (what determines it, weights, report).
# Pretraining is deterministic; the clip probe and its run share it.
_LAST: list = [None, None, None]


def _unnamed(config):
  """A Keras config less its names (Keras numbers unnamed layers afresh on
  every build: `flatten_3`, `flatten_4`)."""
  if isinstance(config, dict):
    return {k: _unnamed(v) for k, v in config.items() if k != 'name'}
  if isinstance(config, list):
    return [_unnamed(v) for v in config]
  return config


def _determined_by(task, public, how) -> tuple:
  """What fixes a pretraining's result: the task, the public examples, the
  settings, the model (its config, loss and initial weights)."""
  model = task.model_builder()
  digest = hashlib.sha256()
  digest.update(json.dumps(_unnamed(model.get_config()), default=str).encode())
  loss = task.loss_builder()
  digest.update(
    json.dumps(tf.keras.losses.serialize(loss), default=str).encode()
  )
  for w in model.weights:
    digest.update(f'{w.dtype.name}{tuple(w.shape)};'.encode())
    digest.update(w.numpy().tobytes())
  return (task.name, public.content_sha256, how, digest.hexdigest())


def _pretrained(task, public, how) -> tuple[tuple[np.ndarray, ...], dict]:
  """`pretrain`'s result, once per process for the same inputs."""
  key = _determined_by(task, public, how)
  if _LAST[0] != key:
    _LAST[:] = [key, *pretrain(task, public, how)]
  return tuple(w.copy() for w in _LAST[1]), json.loads(json.dumps(_LAST[2]))


# What a kept warm start must match to be reused.
_SETTINGS = ('steps', 'batch_size', 'learning_rate', 'seed')


def _write_atomically(path: pathlib.Path, text: str) -> None:
  partial = path.with_name(path.name + '.partial')
  partial.write_text(text)
  partial.replace(path)


def warm_started(
  task: task_lib.FederatedTask,
  public: public_lib.PublicData,
  how: Pretraining,
  run_dir: Optional[pathlib.Path] = None,
) -> tuple[task_lib.FederatedTask, dict]:
  """`task` with its model starting from `public`'s pretraining, and the
  report for the summary; reused from `run_dir` where a run kept them."""
  weights_path, report_path = _kept_paths(run_dir)
  if weights_path is not None and weights_path.exists():
    report = json.loads(report_path.read_text())
    kept = (report.get('public_data', {}).get('content_sha256'),) + tuple(
      report.get(k) for k in _SETTINGS
    )
    wanted = (public.content_sha256,) + tuple(
      dataclasses.asdict(how)[k] for k in _SETTINGS
    )
    if kept != wanted:
      raise OtherPublicData(
        f'{weights_path} was pretrained with other public data or settings '
        f'(content hash, {", ".join(_SETTINGS)}: {kept}) than this run '
        f'asks for ({wanted}); choose a new --root_output_dir.'
      )
    with np.load(weights_path) as saved:
      weights = tuple(saved[f'w{i}'] for i in range(len(saved.files)))
  else:
    weights, report = _pretrained(task, public, how)
    if run_dir is not None:
      _keep(run_dir, weights, report)
  builder = public_lib.WarmStart(task.model_builder, weights)
  return dataclasses.replace(task, model_builder=builder), report
