"""The warm start on public data: what it trains, keeps and costs."""

import dataclasses
import functools

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

from tff_dp import tasks
from tff_dp.job import preparation
from tff_dp.job import public_pretrain
from tff_dp.job import training
from tff_dp.tasks import client_data
from tff_dp.tasks import download
from tff_dp.tasks import metrics
from tff_dp.tasks import models
from tff_dp.tasks import public

import job_testing

pytestmark = pytest.mark.usefixtures('shared_data_dir')


def _register(monkeypatch):
  """A 3-class task of 6x6 images on 8 clients, and a public set for it
  with 2 images a client also holds."""
  rng = np.random.default_rng(1)
  x = rng.integers(0, 256, (40, 6, 6, 1), dtype=np.uint8)
  y = rng.integers(0, 3, 40)
  task = tasks.FederatedTask(
    name='tiny_images',
    train_data=client_data.ArrayClientData(x, y, np.split(np.arange(40), 8)),
    test_x=rng.random((9, 6, 6, 1)).astype(np.float32),
    test_y=rng.integers(0, 3, 9).astype(np.int32),
    model_builder=functools.partial(
      models.create_image_mlp, (6, 6, 1), 3, (4,), 0
    ),
    loss_builder=lambda: tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True
    ),
    metrics_builder=metrics.classification_metrics,
    num_classes=3,
    description='tiny images',
  )
  monkeypatch.setitem(
    tasks.TASKS, 'tiny_images', lambda data_dir=None, **kw: task
  )
  public_x = np.concatenate(
    [rng.integers(0, 256, (300, 6, 6), np.uint8), x[[3, 30], ..., 0]]
  )
  public_y = np.arange(302) % 3
  monkeypatch.setitem(
    public.SETS,
    'tiny_public',
    public.PublicSet(('tiny_images',), lambda d, t: (public_x, public_y, ())),
  )
  return task


def _config(tmp_path, name, **kwargs):
  return job_testing.config(
    tmp_path,
    name,
    task='tiny_images',
    rounds=1,
    batch_size=5,
    client_sampling_rate=0.5,
    **kwargs,
  )


WARM = dict(
  public_data='tiny_public',
  public_pretrain_steps=20,
  public_pretrain_batch_size=8,
)


def test_round_one_starts_from_the_public_model_at_no_privacy_cost(
  tmp_path, monkeypatch
):
  task = _register(monkeypatch)
  warm = training.run_experiment(_config(tmp_path, 'warm', **WARM))
  report = warm['public_pretrain']
  assert report['public_data']['examples'] == 300
  assert report['public_data']['removed_as_overlapping'] == 2
  assert (report['steps'], report['examples_seen']) == (20, 160)
  # The rounds' events alone, as without a warm start: one Poisson-sampled
  # Gaussian round (job_testing's q = 0.5 here, z = 0.5, delta 1e-3).
  event = dp_accounting.PoissonSampledDpEvent(
    0.5, dp_accounting.GaussianDpEvent(0.5)
  )
  want = dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(1e-3)
  assert warm['epsilon_rdp'] == pytest.approx(want, rel=1e-9)
  # The process starts from the kept weights, not the seeded ones.
  prepared = preparation.prepare(_config(tmp_path, 'warm', **WARM))
  start = prepared.process.get_model_weights(prepared.process.initialize())
  with np.load(tmp_path / 'warm' / public_pretrain.WEIGHTS_FILE) as kept:
    pretrained = [kept[f'w{i}'] for i in range(len(kept.files))]
  for got, want in zip(start.trainable, pretrained):
    np.testing.assert_array_equal(got, want)
  seeded = task.model_builder().get_weights()
  assert not np.allclose(pretrained[0], seeded[0])


def test_a_resumed_run_reuses_the_kept_weights(tmp_path, monkeypatch):
  _register(monkeypatch)
  config = _config(tmp_path, 'warm', **WARM)
  first = preparation.prepare(config).public_pretrain

  def no_training(*args):
    raise AssertionError('pretrained again')

  monkeypatch.setattr(public_pretrain, 'pretrain', no_training)
  assert preparation.prepare(config).public_pretrain == first


def test_pretraining_is_reproducible_and_learns(monkeypatch):
  task = _register(monkeypatch)
  data = public.load('tiny_public', task)
  how = public_pretrain.Pretraining(
    steps=60, batch_size=10, learning_rate=0.1, seed=3
  )
  w1, r1 = public_pretrain.pretrain(task, data, how)
  w2, _ = public_pretrain.pretrain(task, data, how)
  for a, b in zip(w1, w2):
    np.testing.assert_array_equal(a, b)
  model = task.model_builder()
  model.set_weights(w1)
  logits = model(data.x).numpy()
  trained = tf.keras.losses.sparse_categorical_crossentropy(
    data.y, logits, from_logits=True
  )
  initial = tf.keras.losses.sparse_categorical_crossentropy(
    data.y, task.model_builder()(data.x), from_logits=True
  )
  assert float(np.mean(trained)) < float(np.mean(initial))
  assert r1['public_train_loss'] > 0


def test_pretraining_needs_public_data(tmp_path, monkeypatch):
  _register(monkeypatch)
  with pytest.raises(ValueError, match='set --public_data'):
    _config(tmp_path, 'x', public_pretrain_steps=5).validate()


def test_a_public_set_of_another_task_is_a_config_error(tmp_path):
  config = job_testing.config(
    tmp_path, 'x', public_data='emnist_byclass_test', public_pretrain_steps=5
  )
  with pytest.raises(
    training.ConfigError, match="for task\\(s\\) \\['emnist'\\]"
  ):
    preparation.prepare(config)


def test_the_privacy_summary_names_the_warm_start(tmp_path, monkeypatch):
  from tff_dp import methods  # pylint: disable=g-import-not-at-top
  from tff_dp.job import privacy_summary  # pylint: disable=g-import-not-at-top

  _register(monkeypatch)
  config = _config(tmp_path, 'x', **WARM)
  (step,) = privacy_summary.tuning_outside_ledger(
    config, methods.METHODS['dp_fedavg']
  )
  assert "public set 'tiny_public' (not client data" in step


def test_a_kept_warm_start_with_other_settings_is_refused(
  tmp_path, monkeypatch
):
  _register(monkeypatch)
  preparation.prepare(_config(tmp_path, 'warm', **WARM))
  changed = dict(WARM, public_pretrain_steps=21)
  with pytest.raises(training.ConfigError, match='other public data or'):
    preparation.prepare(_config(tmp_path, 'warm', **changed))


def test_public_data_without_a_warm_start_is_refused(tmp_path, monkeypatch):
  _register(monkeypatch)
  with pytest.raises(ValueError, match='set --public_pretrain_steps'):
    _config(tmp_path, 'x', public_data='tiny_public').validate()


def test_the_clip_probe_and_its_run_share_one_pretraining(
  tmp_path, monkeypatch
):
  _register(monkeypatch)
  calls = []
  real = public_pretrain.pretrain

  def counted(*args):
    calls.append(args[2])
    return real(*args)

  monkeypatch.setattr(public_pretrain, 'pretrain', counted)
  monkeypatch.setattr(public_pretrain, '_LAST', [None, None, None])
  probe = training.ClipProbe(clip_from_fedavg_rounds=1, clip_fraction=0.5)
  summary = training.run_experiment(
    _config(tmp_path, 'probed', **WARM), clip_probe=probe
  )
  assert len(calls) == 1
  assert 'FedAvg' in summary['config']['clip_source']
  assert (tmp_path / 'probed' / public_pretrain.WEIGHTS_FILE).exists()
  # Other settings train again.
  training.run_experiment(
    _config(tmp_path, 'other', **dict(WARM, public_pretrain_steps=21))
  )
  assert [how.steps for how in calls] == [20, 21]


def _saved(tmp_path, task, suffix, scale=0.01):
  """The task model's weights, changed, saved as `suffix`; and them."""
  model = task.model_builder()
  weights = [w + scale * (i + 1) for i, w in enumerate(model.get_weights())]
  model.set_weights(weights)
  path = tmp_path / f'mine{suffix}'
  if suffix == '.npz':
    np.savez(path, **{f'w{i}': w for i, w in enumerate(weights)})
  elif suffix == '.keras':
    model.save(path)
  else:
    model.save_weights(path)
  return path, weights


@pytest.mark.parametrize('suffix', ['.npz', '.weights.h5', '.keras'])
def test_a_run_starts_from_the_users_saved_weights(
  tmp_path, monkeypatch, suffix
):
  task = _register(monkeypatch)
  path, want = _saved(tmp_path, task, suffix)
  config = _config(tmp_path, 'mine', initial_weights=str(path))
  summary = training.run_experiment(config)
  report = summary['public_pretrain']
  assert report['initial_weights']['sha256'] == (
    tasks.data_dir.file_sha256(path)
  )
  prepared = preparation.prepare(config)  # A resume: the kept weights.
  start = prepared.process.get_model_weights(prepared.process.initialize())
  for got, w in zip(start.trainable, want):
    np.testing.assert_array_equal(got, w)
  # No privacy cost: the rounds' event alone.
  event = dp_accounting.PoissonSampledDpEvent(
    0.5, dp_accounting.GaussianDpEvent(0.5)
  )
  want_eps = dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(1e-3)
  assert summary['epsilon_rdp'] == pytest.approx(want_eps, rel=1e-9)
  assert any(
    'loaded from' in s and str(path) in s
    for s in summary['privacy']['tuning_outside_ledger']
  )


def test_a_resume_refuses_saved_weights_that_changed(tmp_path, monkeypatch):
  task = _register(monkeypatch)
  path, _ = _saved(tmp_path, task, '.npz')
  config = _config(tmp_path, 'mine', initial_weights=str(path))
  preparation.prepare(config)
  _saved(tmp_path, task, '.npz', scale=0.02)
  with pytest.raises(training.ConfigError, match='choose a new'):
    preparation.prepare(config)


@pytest.mark.parametrize(
  'name, message',
  [
    ('mine.txt', r"ending in one of \['.npz', '.h5', '.keras'\]"),
    ('absent.npz', 'does not exist'),
    ('short.npz', r'holds weights of shapes \[\(36, 4\)\]'),
  ],
)
def test_bad_saved_weights_are_named(tmp_path, monkeypatch, name, message):
  _register(monkeypatch)
  (tmp_path / 'mine.txt').write_text('weights')
  np.savez(tmp_path / 'short.npz', w0=np.zeros((36, 4)))
  config = _config(tmp_path, 'x', initial_weights=str(tmp_path / name))
  with pytest.raises(
    training.ConfigError, match=f'--initial_weights.*{message}'
  ):
    preparation.prepare(config)


def test_one_warm_start_at_a_time(tmp_path, monkeypatch):
  _register(monkeypatch)
  config = _config(tmp_path, 'x', initial_weights='w.npz', **WARM)
  with pytest.raises(ValueError, match='Set one warm start'):
    config.validate()


def test_adapters_start_from_the_warm_start_where_tff_builds_the_model(
  tmp_path, monkeypatch
):
  _register(monkeypatch)
  config = _config(
    tmp_path,
    'lora',
    adapter_layers=('dense1',),
    adapter_rank=2,
    train_layers=('logits',),
    **WARM,
  )
  prepared = preparation.prepare(config)
  process = prepared.process
  state = process.initialize()  # TFF builds the weights in a graph.
  start = process.get_model_weights(state)
  with np.load(tmp_path / 'lora' / public_pretrain.WEIGHTS_FILE) as kept:
    warm = [kept[f'w{i}'] for i in range(len(kept.files))]
  # dense1 (36 x 4 + 4) frozen at its warm start; A, B, then logits train.
  for got, want in zip(start.non_trainable, warm[:2]):
    np.testing.assert_array_equal(got, want)
  a, b, kernel, bias = start.trainable
  assert a.shape == (36, 2) and not np.any(b)
  np.testing.assert_array_equal(kernel, warm[2])
  np.testing.assert_array_equal(bias, warm[3])
  # A round through the client models TFF rebuilds from the config.
  ids = prepared.task.train_data.client_ids
  state = process.next(state, prepared.round_data(config, ids, 0)).state
  after = process.get_model_weights(state)
  for got, want in zip(after.non_trainable, warm[:2]):
    np.testing.assert_array_equal(got, want)
  assert np.any(after.trainable[1])


def test_the_first_run_starts_from_the_saved_weights_frozen_part_too(
  tmp_path, monkeypatch
):
  task = _register(monkeypatch)
  path, want = _saved(tmp_path, task, '.npz')
  config = _config(
    tmp_path, 'mine', initial_weights=str(path), train_layers=('logits',)
  )
  prepared = preparation.prepare(config)
  start = prepared.process.get_model_weights(prepared.process.initialize())
  for got, w in zip(start.non_trainable + start.trainable, want):
    np.testing.assert_array_equal(got, w)


def test_the_clip_probe_of_a_resume_reads_the_kept_warm_start(
  tmp_path, monkeypatch
):
  task = _register(monkeypatch)
  path, _ = _saved(tmp_path, task, '.npz')
  config = _config(tmp_path, 'mine', initial_weights=str(path))
  preparation.prepare(config)  # Keeps the weights in the run folder.
  path.unlink()  # A resume need not find the file again.
  assert training.clip_from_fedavg(config, 1, 0.5) > 0
  with pytest.raises(training.ConfigError, match='does not exist'):
    preparation.prepare(config.replace(output_dir=None))


def test_the_pretraining_memo_trains_again_for_another_model(monkeypatch):
  task = _register(monkeypatch)
  data = public.load('tiny_public', task)
  how = public_pretrain.Pretraining(
    steps=5, batch_size=8, learning_rate=0.1, seed=0
  )
  calls = []
  real = public_pretrain.pretrain
  monkeypatch.setattr(
    public_pretrain, 'pretrain', lambda *a: calls.append(1) or real(*a)
  )
  monkeypatch.setattr(public_pretrain, '_LAST', [None, None, None])
  wider = dataclasses.replace(
    task,
    model_builder=functools.partial(
      models.create_image_mlp, (6, 6, 1), 3, (5,), 0
    ),
  )
  first, _ = public_pretrain._pretrained(task, data, how)  # pylint: disable=protected-access
  public_pretrain._pretrained(task, data, how)  # pylint: disable=protected-access
  assert len(calls) == 1
  first[0][...] = 0  # A caller's copy: the memo keeps its own.
  again, _ = public_pretrain._pretrained(task, data, how)  # pylint: disable=protected-access
  assert np.any(again[0])
  public_pretrain._pretrained(wider, data, how)  # pylint: disable=protected-access
  assert len(calls) == 2


def test_the_privacy_summary_names_the_opt_in_clients(tmp_path):
  from tff_dp import methods  # pylint: disable=g-import-not-at-top
  from tff_dp.job import privacy_summary  # pylint: disable=g-import-not-at-top

  config = job_testing.config(
    tmp_path,
    'x',
    task='fashion_mnist_iid',
    task_kwargs=(('public_clients', 60),),
    public_data='fashion_mnist_opt_in',
    public_pretrain_steps=10,
  )
  steps = privacy_summary.tuning_outside_ledger(
    config, methods.METHODS['dp_fedavg']
  )
  assert steps[0].startswith('60 clients opted in to share their data')
  assert 'covers the other clients' in steps[0]
  assert "the opt-in clients' data, public by their choice" in steps[1]


def test_nodownload_holds_for_the_public_set(
  tmp_path, monkeypatch, shared_data_dir
):
  # The task's data found, the public set's not: --nodownload must stop
  # the archive's download (an unreachable URL would fail otherwise).
  (tmp_path / 'data').mkdir()
  (tmp_path / 'data' / 'emnist_federated.npz').symlink_to(
    shared_data_dir / 'emnist_federated.npz'
  )
  monkeypatch.setenv(tasks.data_dir.CACHE_DIR_ENV, str(tmp_path / 'cache'))
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path / 'no_tfds'))
  monkeypatch.delenv(download.NO_DOWNLOAD_ENV, raising=False)
  monkeypatch.setattr(
    public,
    'EMNIST_REMOTE',
    dataclasses.replace(
      public.EMNIST_REMOTE,
      files=tuple(
        dataclasses.replace(f, url='http://127.0.0.1:9/gzip.zip')
        for f in public.EMNIST_REMOTE.files
      ),
    ),
  )
  config = job_testing.config(
    tmp_path,
    'x',
    task='emnist',
    data_dir=str(tmp_path / 'data'),
    download=False,
    task_kwargs=(('drop_nist_test_writers', 1),),
    public_data='emnist_byclass_test',
    public_pretrain_steps=1,
  )
  with pytest.raises(tasks.DataNotFoundError, match='downloads are off'):
    preparation.prepare(config)
