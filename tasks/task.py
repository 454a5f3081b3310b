"""`FederatedTask`: a task's federated data, test data, model, loss, metrics.

In the spirit of `tff.simulation.baselines.BaselineTask`: one object carries
everything a learning process needs, and `to_baseline_task` converts to it.
"""

import collections
import dataclasses
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.tasks import client_data as client_data_lib
from tff_dp.tasks import data_dir as data_dir_lib

ModelBuilder = Callable[[], tf.keras.Model]
LossBuilder = Callable[[], tf.keras.losses.Loss]
MetricsBuilder = Callable[[], list[tf.keras.metrics.Metric]]


def check_batching(
  batch_size: int, num_epochs: int, max_steps: Optional[int]
) -> None:
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(
      f'batch_size must be an integer >= 1. Found {batch_size!r}.'
    )
  if not isinstance(num_epochs, (int, np.integer)) or num_epochs < 1:
    raise ValueError(
      f'num_epochs must be an integer >= 1. Found {num_epochs!r}.'
    )
  if max_steps is not None and (
    not isinstance(max_steps, (int, np.integer)) or max_steps < 1
  ):
    raise ValueError(
      f'max_steps must be None or an integer >= 1. Found {max_steps!r}.'
    )


def client_preprocess_fn(
  batch_size: int,
  *,
  num_epochs: int = 1,
  max_steps: Optional[int] = None,
  shuffle_buffer: int = 1000,
  seed: Optional[int] = None,
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """Local-training preprocessing: repeat, shuffle (seeded), batch, cap steps.

  Args:
    batch_size: Examples per local step.
    num_epochs: Passes over the client's data.
    max_steps: If set, at most this many local steps (batches).
    shuffle_buffer: Shuffle buffer size (0 or 1 disables shuffling).
    seed: Shuffle seed; `None` draws a fresh order (not reproducible).
  """
  check_batching(batch_size, num_epochs, max_steps)

  def preprocess(ds: tf.data.Dataset) -> tf.data.Dataset:
    if shuffle_buffer > 1:
      ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat(num_epochs).batch(batch_size)
    if max_steps is not None:
      ds = ds.take(max_steps)
    return ds

  return preprocess


def _zero_initializers(config):
  if isinstance(config, dict):
    return {
      k: (
        {'class_name': 'Zeros', 'config': {}}
        if k.endswith('_initializer') and v is not None
        else _zero_initializers(v)
      )
      for k, v in config.items()
    }
  if isinstance(config, list):
    return [_zero_initializers(v) for v in config]
  return config


def zero_initialized_builder(builder: ModelBuilder) -> ModelBuilder:
  """The same architecture with every Keras initializer replaced by zeros.

  Client work assigns the broadcast global weights to its model before
  training, so the client model's own initial values are never used; drawing
  them (Glorot for 1.66M parameters, per client, per round) was a measured
  ~20% of a 1-step round's time. The global model keeps `builder`'s seeded
  initialisation.
  """
  model = builder()
  cls, config = type(model), _zero_initializers(model.get_config())
  return lambda: cls.from_config(config)


@dataclasses.dataclass(frozen=True)
class FederatedTask:
  """A federated learning task.

  Attributes:
    name: Registry name, e.g. 'fashion_mnist_iid'.
    train_data: Federated training data (client id -> unbatched
      `tf.data.Dataset` of `OrderedDict(x=..., y=...)`).
    test_x: Centralized test inputs, model-ready float32.
    test_y: Centralized test labels, int32.
    model_builder: Returns a fresh, uncompiled Keras model (logits output);
      deterministic initial weights.
    loss_builder: Returns the Keras loss.
    metrics_builder: Returns fresh Keras metrics.
    num_classes: Number of classes (1 for a single-logit binary task).
    description: Human-readable summary of the data and split.
    feature_names: Names of the input columns of tabular tasks (before the
      missing-value indicators), else empty.
    public_x: A server-held batch never given to a client (FL-TOP's Top-K
      selection on the medical tasks), model-ready; None if not held out.
    public_y: Its labels.
    opt_in_x: The examples of the clients who opted in to share their data
      (public data by their choice; the public set `fashion_mnist_opt_in`),
      held out of training, model-ready; None if none did.
    opt_in_y: Their labels.
    test_held_by_clients: True when the test examples belong to training
      clients (EMNIST's writers' own held-out examples): test metrics are
      then not post-processing of the released model, and a run keeps them
      with its non-private outputs.
    data_sources: What was read to build it (`data_dir.DataSource`s, in
      reading order; `tasks.load_task` fills them in), empty when unknown.
    writers_dropped: The writer partitions left out of clients and test set
      because a public set holds their data (EMNIST's `('hsf_4',)`, NIST
      SD19's test partition), else empty.
  """

  name: str
  train_data: client_data_lib.ArrayClientData
  test_x: np.ndarray
  test_y: np.ndarray
  model_builder: ModelBuilder
  loss_builder: LossBuilder
  metrics_builder: MetricsBuilder
  num_classes: int
  description: str = ''
  feature_names: tuple[str, ...] = ()
  public_x: Optional[np.ndarray] = None
  public_y: Optional[np.ndarray] = None
  opt_in_x: Optional[np.ndarray] = None
  opt_in_y: Optional[np.ndarray] = None
  test_held_by_clients: bool = False
  data_sources: tuple[data_dir_lib.DataSource, ...] = ()
  writers_dropped: tuple[str, ...] = ()

  @property
  def element_spec(self):
    return self.train_data.element_type_structure

  def batched_input_spec(self):
    return tf.nest.map_structure(
      lambda s: tf.TensorSpec([None] + list(s.shape), s.dtype),
      self.element_spec,
    )

  def test_dataset(self) -> tf.data.Dataset:
    """Unbatched centralized test data, same element structure as training."""
    return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=self.test_x, y=self.test_y)
    )

  def model_fn(self) -> tff.learning.models.VariableModel:
    """A `tff.learning` model function (call it inside TFF computations)."""
    return self._as_tff_model(self.model_builder())

  def client_model_fn(
    self, device: Optional[str] = None
  ) -> Callable[[], tff.learning.models.VariableModel]:
    """A model function for client work: zero initializers, optional device.

    Its initial values are never used (client work assigns the broadcast
    weights first), so they are zeros, which are free to create.

    Args:
      device: A TF device for the client model and its training ops (e.g.
        '/GPU:0'); None leaves placement to TF.
    """
    builder = zero_initialized_builder(self.model_builder)

    def model_fn():
      if device is None:
        return self._as_tff_model(builder())
      with tf.device(device):
        return self._as_tff_model(builder())

    return model_fn

  def _as_tff_model(self, keras_model) -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
      keras_model,
      loss=self.loss_builder(),
      input_spec=self.batched_input_spec(),
      metrics=self.metrics_builder(),
    )

  def to_baseline_task(
    self,
    batch_size: int = 10,
    train_preprocess_fn=None,
    eval_preprocess_fn=None,
  ) -> tff.simulation.baselines.BaselineTask:
    """This task as a `tff.simulation.baselines.BaselineTask`.

    The model takes batches, so the preprocessing defaults batch by
    `batch_size` (training: `client_preprocess_fn(batch_size)`, one epoch).
    """
    if train_preprocess_fn is None:
      train_preprocess_fn = client_preprocess_fn(batch_size)
    if eval_preprocess_fn is None:
      eval_preprocess_fn = lambda ds: ds.batch(batch_size)
    datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=self.train_data,
      test_data=self.test_dataset(),
      train_preprocess_fn=train_preprocess_fn,
      eval_preprocess_fn=eval_preprocess_fn,
    )
    return tff.simulation.baselines.BaselineTask(datasets, self.model_fn)

  def num_parameters(self) -> int:
    """The model's scalar weights, trainable and frozen."""
    return int(sum(np.prod(v.shape) for v in self.model_builder().weights))

  def num_trainable_parameters(self) -> int:
    """The scalar weights the clients train (all but frozen layers')."""
    model = self.model_builder()
    return int(sum(np.prod(v.shape) for v in model.trainable_weights))
