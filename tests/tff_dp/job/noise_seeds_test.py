"""A --noise_seed is refused for a second configuration in one output tree."""

import json
import os

import pytest

from tff_dp.job import noise_seeds

_CONFIG = {'method': 'dp_fedavg', 'clip': 1.0, 'noise_multiplier': 1.0}


def _other(**kwargs):
  return {**_CONFIG, **kwargs}


def test_reuse_for_another_configuration_is_refused(tmp_path):
  assert noise_seeds.check_and_register(tmp_path / 'a', 7, _CONFIG) is None
  with pytest.raises(ValueError) as e:
    noise_seeds.check_and_register(
      tmp_path / 'b', 7, _other(noise_multiplier=2.0)
    )
  message = str(e.value)
  assert str(tmp_path / 'a') in message
  assert 'differs in: noise_multiplier' in message
  assert '--allow_noise_seed_reuse' in message
  # Nothing registered for the refused run.
  registry = json.loads((tmp_path / noise_seeds.REGISTRY_NAME).read_text())
  assert [r['run'] for r in registry['runs']] == ['a']


def test_a_resume_a_rerun_and_other_seeds_are_allowed(tmp_path):
  noise_seeds.check_and_register(tmp_path / 'a', 7, _CONFIG)
  # The same folder again (a resume), whatever it records.
  assert noise_seeds.check_and_register(tmp_path / 'a', 7, _CONFIG) is None
  # The same configuration elsewhere: identical releases.
  assert noise_seeds.check_and_register(tmp_path / 'c', 7, _CONFIG) is None
  # Another seed, another configuration.
  assert (
    noise_seeds.check_and_register(tmp_path / 'd', 8, _other(clip=0.5)) is None
  )
  # Where and how fast it runs does not count.
  assert (
    noise_seeds.check_and_register(
      tmp_path / 'e', 7, _other(workers='h:1', release_non_private_metrics=1)
    )
    is None
  )


def test_registries_above_the_tree_are_read(tmp_path):
  noise_seeds.check_and_register(tmp_path / 'a', 7, _CONFIG)
  with pytest.raises(ValueError, match='differs in: clip'):
    noise_seeds.check_and_register(
      tmp_path / 'deeper' / 'b', 7, _other(clip=2.0)
    )


def test_the_tree_top_bounds_the_search(tmp_path, monkeypatch):
  # The test suite bounds its own search under this name (tests/conftest.py).
  assert noise_seeds.TREE_TOP_ENV == 'TFF_DP_NOISE_SEED_TREE_TOP'
  assert os.environ[noise_seeds.TREE_TOP_ENV] != ''
  noise_seeds.check_and_register(tmp_path / 'a', 7, _CONFIG)
  project = tmp_path / 'project'
  monkeypatch.setenv(noise_seeds.TREE_TOP_ENV, str(project))
  # The registry above the top is not read: another configuration passes.
  assert (
    noise_seeds.check_and_register(project / 'runs' / 'b', 7, _other(clip=2.0))
    is None
  )
  # Registries between the tree and the top still are.
  with pytest.raises(ValueError, match='differs in: clip'):
    noise_seeds.check_and_register(
      project / 'runs' / 'deeper' / 'c', 7, _other(clip=3.0)
    )
  # A top that does not hold the tree bounds nothing.
  monkeypatch.setenv(noise_seeds.TREE_TOP_ENV, str(tmp_path / 'elsewhere'))
  with pytest.raises(ValueError, match='differs in: clip'):
    noise_seeds.check_and_register(tmp_path / 'd', 7, _other(clip=4.0))


def test_allow_reuse_returns_the_clash(tmp_path):
  noise_seeds.check_and_register(tmp_path / 'a', 7, _CONFIG)
  clash = noise_seeds.check_and_register(
    tmp_path / 'b', 7, _other(clip=2.0), allow_reuse=True
  )
  assert clash == str(tmp_path / 'a')


def test_no_seed_or_no_folder_writes_nothing(tmp_path):
  assert noise_seeds.check_and_register(tmp_path / 'a', None, _CONFIG) is None
  assert noise_seeds.check_and_register(None, 7, _CONFIG) is None
  assert not (tmp_path / noise_seeds.REGISTRY_NAME).exists()


def test_the_registry_holds_a_salted_digest_not_the_seed(tmp_path):
  seed = 123456789123
  noise_seeds.check_and_register(tmp_path / 'a', seed, _CONFIG)
  text = (tmp_path / noise_seeds.REGISTRY_NAME).read_text()
  assert str(seed) not in text
  data = json.loads(text)
  assert len(data['salt']) == 32 and len(data['runs'][0]['digest']) == 64


def test_an_unreadable_registry_is_an_error(tmp_path):
  (tmp_path / noise_seeds.REGISTRY_NAME).write_text('not json')
  with pytest.raises(ValueError, match='unreadable'):
    noise_seeds.check_and_register(tmp_path / 'a', 7, _CONFIG)


def test_one_folder_rerun_with_another_configuration_is_refused(tmp_path):
  # The folder may have been deleted and its first outputs published.
  noise_seeds.check_and_register(tmp_path / 'a', 7, _CONFIG)
  with pytest.raises(ValueError, match='differs in: clip'):
    noise_seeds.check_and_register(tmp_path / 'a', 7, _other(clip=2.0))


def test_another_data_folder_counts_as_another_configuration(tmp_path):
  noise_seeds.check_and_register(tmp_path / 'a', 7, _other(data_dir='/x'))
  with pytest.raises(ValueError, match='differs in: data_dir'):
    noise_seeds.check_and_register(tmp_path / 'b', 7, _other(data_dir='/y'))


def test_a_new_tree_is_created_and_locked(tmp_path):
  out = tmp_path / 'new' / 'tree' / 'run'
  assert noise_seeds.check_and_register(out, 7, _CONFIG) is None
  assert (out.parent / noise_seeds.REGISTRY_NAME).is_file()
  assert (out.parent / (noise_seeds.REGISTRY_NAME + '.lock')).is_file()


def test_a_setting_added_since_counts_at_the_value_that_run_had(tmp_path):
  # A cyclic run registered before --participation_partition existed dealt
  # its groups the legacy way ('balanced'): resuming it under today's code,
  # which records the setting, is the same configuration.
  from tff_dp.job.experiment_config import ExperimentConfig  # pylint: disable=g-import-not-at-top

  def config(**kwargs):
    return ExperimentConfig(
      method='dp_fedavg', participation='cyclic', noise='banded', **kwargs
    ).to_dict()

  old = config(participation_partition='balanced')
  del old['participation_partition']
  noise_seeds.check_and_register(tmp_path / 'a', 7, old)
  assert (
    noise_seeds.check_and_register(
      tmp_path / 'a', 7, config(participation_partition='balanced')
    )
    is None
  )
  # Today's default deals other groups: another configuration.
  with pytest.raises(ValueError, match='differs in: participation_partition'):
    noise_seeds.check_and_register(
      tmp_path / 'b', 7, config(participation_partition='by_client_id')
    )
