"""Training only some layers: the frozen model and its errors."""

import pickle

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.tasks import models
from tff_dp.tasks import partial_training
from tff_dp.tasks import task as task_lib


def _mlp():
  return models.create_mlp(5, 3, (4,), seed=0)


def test_train_only_freezes_every_other_layer():
  model = partial_training.TrainOnly(_mlp, ('logits',))()
  assert [l.name for l in model.layers if l.trainable] == ['logits']
  # dense1: 5 x 4 + 4 frozen; logits: 4 x 3 + 3 trained.
  assert partial_training.count_weights(model) == (15, 24)


def test_task_models_name_their_weighted_layers():
  cnn = models.create_cnn_mcmahan(seed=0)
  assert partial_training.weighted_layer_names(cnn) == [
    'conv1',
    'conv2',
    'dense1',
    'logits',
  ]
  # Names do not depend on how many models the process built before.
  again = models.create_cnn_mcmahan(seed=0)
  assert [l.name for l in again.layers] == [l.name for l in cnn.layers]
  assert partial_training.weighted_layer_names(
    models.create_cnn_2layers(seed=0)
  ) == ['conv1', 'conv2', 'dense1', 'logits']
  assert partial_training.weighted_layer_names(_mlp()) == ['dense1', 'logits']


@pytest.mark.parametrize(
  'layers, message',
  [
    (('dense9',), r"\['dense9'\] not among them"),
    # A layer without weights cannot be trained.
    (('flatten',), r"\['flatten'\] not among them"),
    ((), r'at least one'),
  ],
)
def test_unknown_layers_are_named_with_the_known_ones(layers, message):
  model = models.create_cnn_mcmahan(seed=0)
  with pytest.raises(ValueError, match=message) as info:
    partial_training.freeze_all_but(model, layers)
  assert "['conv1', 'conv2', 'dense1', 'logits']" in str(info.value)


def test_train_only_rejects_a_bare_string():
  with pytest.raises(TypeError, match='sequence of layer names'):
    partial_training.TrainOnly(_mlp, 'logits')


def test_frozen_builder_pickles_and_keeps_its_zero_initialized_clone_frozen():
  import functools  # pylint: disable=g-import-not-at-top

  builder = partial_training.TrainOnly(
    functools.partial(models.create_mlp, 5, 3, (4,), 0), ('logits',)
  )
  # The evaluation process receives the builder pickled.
  copy = pickle.loads(pickle.dumps(builder))()
  assert [l.name for l in copy.layers if l.trainable] == ['logits']
  for a, b in zip(copy.get_weights(), builder().get_weights()):
    np.testing.assert_array_equal(a, b)
  clone = task_lib.zero_initialized_builder(builder)()
  assert [l.name for l in clone.layers if l.trainable] == ['logits']
  assert all(np.all(w == 0) for w in clone.get_weights())


def test_tff_sees_only_the_trained_layers():
  builder = partial_training.TrainOnly(_mlp, ('logits',))
  spec = (
    tf.TensorSpec([None, 5], tf.float32),
    tf.TensorSpec([None, 1], tf.int32),
  )
  model = tff.learning.models.from_keras_model(
    builder(),
    input_spec=spec,
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
  )
  weights = tff.learning.models.ModelWeights.from_model(model)
  assert [w.shape.as_list() for w in weights.trainable] == [[4, 3], [3]]
  assert [w.shape.as_list() for w in weights.non_trainable] == [[5, 4], [4]]
