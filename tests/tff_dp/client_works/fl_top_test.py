import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.runtime import contexts
from tff_dp.aggregators import dp_randagg
from tff_dp.client_works import fl_top
from tff_dp.tasks import medical
from tff_dp.tasks import task as task_lib


def test_select_top_k_by_accumulated_gradient():
  # A linear model y = w . x with squared loss: at w0 = 0 the gradient is
  # -2 x y, so |grad| ranks the coordinates by |x|: 4 > 3 > 2 > 1.
  model = tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        1, use_bias=False, kernel_initializer='zeros', input_shape=(4,)
      )
    ]
  )
  x = np.array([[1.0, -4.0, 2.0, 3.0]], np.float32)
  y = np.array([[1.0]], np.float32)
  idx = fl_top.select_top_k(
    model,
    tf.keras.losses.MeanSquaredError(),
    x,
    y,
    ratio=0.5,
    init_steps=1,
    learning_rate=0.01,
  )
  np.testing.assert_array_equal(idx, [1, 3])


def test_masks_from_indices():
  masks = fl_top.masks_from_indices(np.array([0, 4, 5]), [(2, 2), (2,)])
  np.testing.assert_array_equal(masks[0], [[1, 0], [0, 0]])
  np.testing.assert_array_equal(masks[1], [1, 1])


@pytest.mark.parametrize('ratio', [0.0, 1.5])
def test_bad_ratio(ratio):
  with pytest.raises(ValueError, match=r'top_k_ratio must be in \(0, 1\]'):
    fl_top.check_ratio(ratio)


def test_bad_init_steps():
  model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
  with pytest.raises(ValueError, match='init_steps must be an integer >= 1'):
    fl_top.select_top_k(
      model,
      tf.keras.losses.MeanSquaredError(),
      np.zeros((1, 2)),
      np.zeros((1, 1)),
      ratio=0.5,
      init_steps=0,
    )


@pytest.mark.usefixtures('shared_data_dir')
def test_untrained_weights_stay_w0_bit_for_bit(shared_data_dir):
  contexts.set_simulation_context()
  task = medical.load_heart_disease(shared_data_dir)
  model = task.model_builder()
  shapes = [tuple(v.shape) for v in model.trainable_variables]
  d = sum(int(np.prod(s)) for s in shapes)
  indices = np.arange(0, d, 7)  # Every 7th weight is trained.
  masks = fl_top.masks_from_indices(indices, shapes)
  work = fl_top.build_masked_client_work(
    task.model_fn,
    tff.learning.optimizers.build_sgdm(0.1, momentum=0.9),
    masks=masks,
  )
  initial = tff.learning.models.ModelWeights(
    trainable=[w.numpy() for w in model.trainable_variables], non_trainable=[]
  )
  preprocess = task_lib.client_preprocess_fn(32, seed=0)
  data = [preprocess(task.train_data.create_tf_dataset_for_client('va'))]
  out = work.next(work.initialize(), [initial], data)
  flat = np.concatenate([np.ravel(u) for u in out.result[0].update])
  untrained = np.setdiff1d(np.arange(d), indices)
  # Exactly zero update outside K: the weights there equal w0 bit for bit.
  assert np.all(flat[untrained] == 0.0)
  assert np.count_nonzero(flat[indices]) > 0.9 * len(indices)
  # The aggregator carries exactly the K values and decodes them back.
  factory = dp_randagg.DPRandAggFactory(
    0.0, 1, 10.0, num_coordinates=len(indices), fixed_indices=indices
  )
  value_type = tff.StructWithPythonType(
    [tff.TensorType(np.float32, s) for s in shapes], list
  )
  process = factory.create(value_type)
  agg = process.next(process.initialize(), [out.result[0].update])
  assert agg.measurements['num_coordinates'] == len(indices)
  for a, b in zip(agg.result, out.result[0].update):
    # Secure sum quantizes within +-clip: error far below the values.
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize(
  'method',
  # The same masked path without noise: `make test-slow`.
  [pytest.param('fl_top', marks=pytest.mark.slow), 'fl_top_dp'],
)
def test_runner_fl_top_keeps_w0_outside_k(shared_data_dir, tmp_path, method):
  from tff_dp import tasks  # pylint: disable=g-import-not-at-top
  from tff_dp.job import training  # pylint: disable=g-import-not-at-top

  out = tmp_path / method
  summary = training.run_experiment(
    training.ExperimentConfig.create(
      task='fashion_mnist_iid',
      method=method,
      rounds=1,
      clients_per_round=5,
      noise_multiplier=0.5,
      delta=1e-4,
      top_k_ratio=0.01,
      local_epochs=2,
      local_steps=2,
      data_dir=str(shared_data_dir),
      output_dir=str(out),
      background_evaluation=False,
    )
  )
  k = round(0.01 * 1_663_370)
  assert summary['bytes_per_client_per_round'] == {'down': 4 * k, 'up': 4 * k}
  w0 = tasks.load_task('fashion_mnist_iid').model_builder().get_weights()
  with np.load(out / 'final_model_weights.npz') as d:
    final = [d[f'trainable_{i}'] for i in range(len(w0))]
  changed = sum(int(np.sum(a != b)) for a, b in zip(final, w0))
  assert 0 < changed <= k  # Only Top-K weights ever move.
  assert (summary['epsilon_rdp'] is None) == (method == 'fl_top')


def test_public_round_norm_by_hand_with_momentum_and_mask():
  # y = w . x, squared loss, two steps of SGD with momentum 0.5 on one
  # example, weight 1 masked out. By hand: g = 2 (w.x - y) x.
  model = tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        1, use_bias=False, kernel_initializer='zeros', input_shape=(3,)
      )
    ]
  )
  x = np.array([[1.0, 2.0, -1.0]], np.float32)
  y = np.array([[1.0]], np.float32)
  batches = tf.data.Dataset.from_tensors((x, y)).repeat(2)
  mask = np.array([[1.0], [0.0], [1.0]], np.float32)
  norm = fl_top.public_round_norm(
    model,
    tf.keras.losses.MeanSquaredError(),
    batches,
    tff.learning.optimizers.build_sgdm(0.1, momentum=0.5),
    masks=[mask],
  )
  w, acc = np.zeros(3), np.zeros(3)
  for _ in range(2):
    g = 2 * (w @ x[0] - 1.0) * x[0]
    acc = 0.5 * acc + g
    w = np.where(mask[:, 0] > 0, w - 0.1 * acc, 0.0)
  assert norm == pytest.approx(np.linalg.norm(w), rel=1e-6)
  assert model.get_weights()[0][1, 0] == 0.0  # Outside the mask: w0.


@pytest.mark.usefixtures('shared_data_dir')
def test_public_round_norm_is_a_clients_update_norm(shared_data_dir):
  # The same batches through TFF's masked client work and through the
  # public round: the same update norm (so the public clip measures what
  # a client would send, had it held the public batch).
  contexts.set_simulation_context()
  task = medical.load_heart_disease(shared_data_dir)
  model = task.model_builder()
  shapes = [tuple(v.shape) for v in model.trainable_variables]
  d = sum(int(np.prod(s)) for s in shapes)
  masks = fl_top.masks_from_indices(np.arange(0, d, 3), shapes)
  optimizer = tff.learning.optimizers.build_sgdm(0.05, momentum=0.5)
  preprocess = task_lib.client_preprocess_fn(16, num_epochs=2, seed=0)
  data = preprocess(task.train_data.create_tf_dataset_for_client('va'))
  work = fl_top.build_masked_client_work(task.model_fn, optimizer, masks=masks)
  initial = tff.learning.models.ModelWeights(
    trainable=[w.numpy() for w in model.trainable_variables], non_trainable=[]
  )
  out = work.next(work.initialize(), [initial], [data])
  client_norm = np.sqrt(
    sum(np.sum(np.square(u.astype(np.float64))) for u in out.result[0].update)
  )
  # A fresh Keras model (building TFF computations invalidates `model`'s
  # graph state), at the same seeded w0.
  fresh = task.model_builder()
  for a, b in zip(fresh.get_weights(), initial.trainable):
    np.testing.assert_array_equal(a, b)
  pairs = data.map(lambda batch: (batch['x'], batch['y']))
  public = fl_top.public_round_norm(
    fresh, task.loss_builder(), pairs, optimizer, masks=masks
  )
  assert public == pytest.approx(client_norm, rel=1e-5)


def test_random_masks():
  masks = fl_top.random_masks([(4, 5), (3,)], 6, seed=1)
  assert sum(int(m.sum()) for m in masks) == 6
  again = fl_top.random_masks([(4, 5), (3,)], 6, seed=1)
  assert all(np.array_equal(a, b) for a, b in zip(masks, again))
  with pytest.raises(ValueError, match=r'k must be in \[1, 23\]. Found 24'):
    fl_top.random_masks([(4, 5), (3,)], 24, seed=1)


def _public_pairs(task, data_dir, config):
  from tff_dp.methods import public_data  # pylint: disable=g-import-not-at-top

  x, y = public_data.public_batch(task, data_dir, seed=config.seed)
  preprocess = task_lib.client_preprocess_fn(
    config.batch_size,
    num_epochs=config.local_epochs,
    max_steps=config.local_steps,
    seed=config.seed,
  )
  return preprocess(tf.data.Dataset.from_tensor_slices((x, y)))


def _public_config(shared_data_dir, tmp_path, method):
  from tff_dp.job import training  # pylint: disable=g-import-not-at-top

  return training.ExperimentConfig.create(
    task='fashion_mnist_iid',
    method=method,
    rounds=1,
    clients_per_round=3,
    noise_multiplier=0.5,
    delta=1e-4,
    top_k_ratio=0.001,
    local_epochs=3,
    local_steps=3,
    client_lr=0.05,
    client_momentum=0.5,
    seed=2,
    clip_from_public_round=True,
    data_dir=str(shared_data_dir),
    output_dir=str(tmp_path / method),
    background_evaluation=False,
  )


def test_runner_fl_top_dp_clip_from_public_round(shared_data_dir, tmp_path):
  # Seed 004: S = the norm of the Top-K update of one local round on the
  # public batch. Computed here from the pieces (the seeded public batch,
  # select_top_k, the run's local schedule) and compared with what the
  # runner used: the summary, every round's clip and the privacy section.
  from tff_dp.reporting import run_folders  # pylint: disable=g-import-not-at-top
  from tff_dp.methods import public_data  # pylint: disable=g-import-not-at-top
  from tff_dp import tasks  # pylint: disable=g-import-not-at-top
  from tff_dp.job import training  # pylint: disable=g-import-not-at-top

  config = _public_config(shared_data_dir, tmp_path, 'fl_top_dp')
  task = tasks.load_task(
    'fashion_mnist_iid', str(shared_data_dir), model_seed=2
  )
  x, y = public_data.public_batch(task, shared_data_dir, seed=2)
  indices = fl_top.select_top_k(
    task.model_builder(), task.loss_builder(), x, y, ratio=0.001
  )
  model = task.model_builder()
  shapes = [tuple(v.shape) for v in model.trainable_variables]
  expected = fl_top.public_round_norm(
    model,
    task.loss_builder(),
    _public_pairs(task, shared_data_dir, config),
    tff.learning.optimizers.build_sgdm(0.05, momentum=0.5),
    masks=fl_top.masks_from_indices(indices, shapes),
  )
  summary = training.run_experiment(config)
  assert summary['clip'] == pytest.approx(expected, rel=1e-6)
  assert summary['clip'] != config.clip
  rows = run_folders.read_rows(tmp_path / 'fl_top_dp')
  assert rows[-1]['clip'] == pytest.approx(expected, rel=1e-6)
  ledger = ' '.join(summary['privacy']['tuning_outside_ledger'])
  assert "one local round on the server's public batch" in ledger


@pytest.mark.parametrize(
  'method',
  # FL-BASIC-DP's (the same setup over its K coordinates): make test-slow.
  [pytest.param('fl_basic_dp', marks=pytest.mark.slow), 'dp_fedavg'],
)
def test_public_round_clip_setup(
  shared_data_dir, tmp_path, method, monkeypatch
):
  # FL-BASIC-DP: the median over random K-subsets (100 by default; 8 here),
  # each trained like a client of that subset; FL-STD-DP (DP-FedAvg): all
  # weights trained.
  from tff_dp import methods  # pylint: disable=g-import-not-at-top
  from tff_dp import tasks  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(methods.top_k, 'PUBLIC_ROUND_TRIALS', 8)
  config = _public_config(shared_data_dir, tmp_path, method)
  task = tasks.load_task(
    'fashion_mnist_iid', str(shared_data_dir), model_seed=2
  )
  num_params = task.num_parameters()
  p = methods.MethodParams.from_config(
    config.to_dict(), num_model_params=num_params, expected_clients_per_round=3
  )
  clip = methods.METHODS[method].setup(p, task, str(shared_data_dir)).clip
  model = task.model_builder()
  w0 = model.get_weights()
  shapes = [tuple(v.shape) for v in model.trainable_variables]
  if method == 'dp_fedavg':
    trials = [None]
  else:
    k = round(0.001 * num_params)
    seeds = np.random.default_rng(2).integers(2**31, size=8)
    trials = [fl_top.random_masks(shapes, k, int(s)) for s in seeds]
    distinct = {b''.join(a.tobytes() for a in m) for m in trials}
    assert len(distinct) == 8  # A new subset each trial.
  norms = []
  for masks in trials:
    model.set_weights(w0)
    norms.append(
      fl_top.public_round_norm(
        model,
        task.loss_builder(),
        _public_pairs(task, shared_data_dir, config),
        tff.learning.optimizers.build_sgdm(0.05, momentum=0.5),
        masks=masks,
      )
    )
  assert clip == pytest.approx(float(np.median(norms)), rel=1e-6)
  if method == 'fl_basic_dp':
    # Fewer weights trained: a far smaller norm than the full update's.
    assert (
      max(norms)
      < 0.5
      * methods.METHODS['dp_fedavg'].setup(p, task, str(shared_data_dir)).clip
    )
