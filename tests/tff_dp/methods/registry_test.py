"""The method registry: every method's options, their flags and the
config that carries them."""

import dataclasses
import json

from absl import logging
import pytest

from tff_dp.job import experiment_config
from tff_dp import methods
from tff_dp.methods import options
from tff_dp.methods import registry


def test_every_method_option_is_declared_once_with_help():
  fields = methods.option_fields()  # Raises on a name declared twice.
  users = {name: sorted(u) for name, (_, u) in fields.items()}
  assert users['sketch_k'] == ['dpsfl', 'dpsfl_ac', 'fetchsgd']
  assert users['blur_lambda'] == ['blur', 'blur_lus']
  assert users['lus_sparsity'] == ['blur_lus', 'lus']
  assert users['cmp_clip_u'] == ['cmp_fed']
  assert users['top_k_nonprivate_clip'] == ['fl_basic', 'fl_top']
  for name, (field, _) in fields.items():
    assert options.help_of(field), name
  # No option shadows a setting every run has.
  common = {
    f.name for f in dataclasses.fields(experiment_config.ExperimentConfig)
  }
  assert not set(fields) & common


def test_a_second_declaration_of_an_option_name_is_refused(monkeypatch):
  @dataclasses.dataclass(frozen=True)
  class Clash(options.Options):
    sketch_k: int = options.option(5, 'Another k.')

  monkeypatch.setitem(
    registry.METHODS,
    'clash',
    dataclasses.replace(methods.METHODS['fedavg'], name='clash', options=Clash),
  )
  with pytest.raises(ValueError, match=r"Option 'sketch_k' is declared twice"):
    methods.option_fields()


def test_register_refuses_a_duplicate_and_options_that_are_not_options():
  with pytest.raises(ValueError, match="'fedavg' is already registered"):
    methods.register(methods.METHODS['fedavg'])
  with pytest.raises(TypeError, match='options must be an options.Options'):
    methods.register(
      dataclasses.replace(methods.METHODS['fedavg'], name='x', options=dict)
    )
  assert 'x' not in methods.METHODS


def test_config_takes_options_by_flag_name_and_saves_them_flat():
  config = experiment_config.ExperimentConfig.create(
    method='dpsfl', sketch_k=20, sketch_columns=400, clip=0.3
  )
  assert isinstance(config.options, methods.sketching.SketchOptions)
  assert (config.options.sketch_k, config.clip) == (20, 0.3)
  saved = json.loads(json.dumps(config.to_dict()))
  assert (saved['sketch_k'], saved['sketch_columns'], saved['clip']) == (
    20,
    400,
    0.3,
  )
  # Only the chosen method's options are recorded.
  assert 'cmp_rank' not in saved and 'dpsfl_impact_rule' not in saved
  params = methods.MethodParams.from_config(
    saved, num_model_params=10, expected_clients_per_round=2.0
  )
  assert params.options == config.options


def test_another_methods_option_is_ignored_with_a_warning(monkeypatch):
  warnings = []
  monkeypatch.setattr(
    logging, 'warning', lambda msg, *args: warnings.append(msg % args)
  )
  config = experiment_config.ExperimentConfig.create(
    method='dp_fedavg', sketch_k=5, top_k_ratio=0.1
  )
  assert config.options == methods.dp_fedavg.FixedClipOptions()
  assert warnings == [
    'sketch_k is an option of dpsfl, dpsfl_ac, fetchsgd, not of method '
    "'dp_fedavg': ignored.",
    'top_k_ratio is an option of fl_basic, fl_basic_dp, fl_top, fl_top_dp, '
    "not of method 'dp_fedavg': ignored.",
  ]


def test_an_unknown_setting_and_mismatched_options_raise():
  with pytest.raises(ValueError, match=r"Unknown setting\(s\) \['sketch_K'\]"):
    experiment_config.ExperimentConfig.create(method='dpsfl', sketch_K=5)
  with pytest.raises(ValueError, match='takes options SketchOptions'):
    experiment_config.ExperimentConfig(
      method='dpsfl', options=methods.low_rank.LowRankOptions()
    )


def test_replace_keeps_the_options_the_new_method_shares():
  config = experiment_config.ExperimentConfig.create(
    method='dpsfl', sketch_k=20, noise_multiplier=1.0
  )
  ac = config.replace(method='dpsfl_ac', dpsfl_clip_lr=0.3)
  assert (ac.options.sketch_k, ac.options.dpsfl_clip_lr) == (20, 0.3)
  assert ac.noise_multiplier == 1.0
  plain = config.replace(method='fedavg')
  assert plain.options == options.Options()
