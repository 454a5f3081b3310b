"""The method registry: every method's options, their flags and the
config that carries them."""

import ast
import dataclasses
import json
import pathlib
import re

from absl import logging
import pytest

from tff_dp.job import experiment_config
from tff_dp import methods
from tff_dp.methods import options
from tff_dp.methods import registry
from tff_dp.methods import linear_compression
from tff_dp.methods import style
from tff_dp import privacy
from tff_dp.aggregators import mf_strategy


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


# What the house needs from every technique, read from its registry entry
# alone (docs/architecture.md, "Adding a technique"): a new method that
# supplies these needs no list elsewhere to pass the suite.
_ROOT = pathlib.Path(__file__).absolute().parents[3]
_Z = 1.3


def _params(method: registry.Method, **kw) -> registry.MethodParams:
  params = registry.MethodParams.from_config(
    {'method': method.name},
    num_model_params=1000,
    expected_clients_per_round=20.0,
    noise_multiplier=_Z,
    **kw,
  )
  if method.resolve is not None:
    sampling = privacy.Sampling('poisson', 1000, 0.02)
    params = method.resolve(params, sampling)
  return params


@pytest.mark.parametrize('name', sorted(methods.METHODS))
def test_every_method_supplies_what_the_house_needs(name):
  method = methods.METHODS[name]
  # Words: a one-line description and a docs page that names it.
  assert method.description and '\n' not in method.description
  assert method.docs_page, name
  page = _ROOT / 'docs' / method.docs_page
  assert re.search(rf'\b{name}\b', page.read_text()), (name, page)
  # A style of its own (the pairs are checked together below).
  assert isinstance(method.style, style.Style), name
  # Options: each flag field has help, and a check or choices whose
  # refused values it refuses, naming itself.
  for field in options.flag_fields(method.options):
    assert options.help_of(field), field.name
    if isinstance(field.default, bool):
      continue
    check = field.metadata['check']
    choices = options.choices_of(field)
    bad = options.refused(check) if check is not None else ()
    if choices is not None:
      bad += ('no_such_choice',)
    assert bad, f'{name}: option {field.name} has no check or choices'
    for value in bad:
      with pytest.raises(ValueError, match=field.name):
        method.options(**{field.name: value})
  # Privacy: a private method plans its round's DP event, which the ledger
  # can serialise and account; a non-private one plans none.
  assert (method.round_event is not None) == method.private, name
  if not method.private:
    assert not method.correlated_noise
    return
  params = _params(method)
  try:
    event = method.round_event(_Z, params)
  except (AttributeError, TypeError, KeyError):
    # Its event needs what its setup computes from the task (e.g. CMP-Fed's
    # layer shapes): the drop-in and runner tests build it.
    pytest.skip(f'{name} plans its event after its setup')
  privacy.check_event(event)
  assert privacy.event_from_dict(privacy.event_to_dict(event)) == event
  # A round that reveals its cohort's size says so in its entry.
  public = privacy.events.contains(event, privacy.PUBLIC_COUNT_EVENTS)
  assert method.reveals_cohort_size == public, name
  if method.correlated_noise:
    strategy = mf_strategy.banded([1.0, 0.5])
    event = method.round_event(_Z, _params(method, noise_strategy=strategy))
    found = json.dumps(privacy.event_to_dict(event))
    assert 'MatrixFactorizationDpEvent' in found, name


def test_every_method_and_noise_variant_has_its_own_colour_and_marker():
  styles = {name: m.style for name, m in methods.METHODS.items()}
  for name, method in methods.METHODS.items():
    if method.correlated_noise:
      for noise in style.NOISE_VARIANTS:
        key = style.variant_key(name, noise)
        styles[key] = style.noise_variant(method.style, noise)
    if issubclass(method.options, linear_compression.CompressionOptions):
      key = style.variant_key(name, 'iid', compressed=True)
      styles[key] = style.compressed_variant(method.style)
  assert 'dp_fedavg+compressed' in styles
  pairs = [(s.color, s.marker) for s in styles.values()]
  assert len(set(pairs)) == len(pairs)
  assert style.variant_key('dp_fedavg', 'iid') == 'dp_fedavg'
  assert styles['dp_fedavg+banded'].name == 'DP-FedAvg, banded MF noise'
  # Exactly one method draws the non-private ceiling, and it is not private.
  ceilings = [m for m in methods.METHODS.values() if m.ceiling]
  assert [m.name for m in ceilings] == ['fedavg']
  assert not ceilings[0].private


def test_the_house_test_catches_what_a_method_lacks():
  bare = dataclasses.replace(methods.METHODS['dp_fedavg'], style=None)
  assert not isinstance(bare.style, style.Style)
  with pytest.raises(ValueError, match='lus_sparsity'):
    methods.METHODS['lus'].options(lus_sparsity=1.0)
  # A check that declares no refused values is reported.
  assert options.refused(lambda name, value: None) == ()
  assert options.refused(options.integer(1)) == (0, 1.5, True)


def test_the_job_and_reporting_compare_no_method_name():
  # What differs by method comes from its registry entry: no module of the
  # job or of reporting tests `method == 'name'` or `startswith('name')`.
  names = set(methods.METHODS)
  found = []
  folders = [_ROOT / 'tff_dp' / 'job', _ROOT / 'tff_dp' / 'reporting']
  for path in sorted(p for f in folders for p in f.glob('*.py')):
    for node in ast.walk(ast.parse(path.read_text())):
      strings = []
      if isinstance(node, ast.Compare):
        strings = [node.left, *node.comparators]
        strings += [
          e
          for c in node.comparators
          if isinstance(c, ast.Tuple)
          for e in c.elts
        ]
      elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == 'startswith'
      ):
        strings = list(node.args)
      for s in strings:
        if not (isinstance(s, ast.Constant) and isinstance(s.value, str)):
          continue
        if s.value in names or (
          isinstance(node, ast.Call)
          and any(n.startswith(s.value) for n in names)
        ):
          found.append(f'{path.name}:{node.lineno}: {s.value!r}')
  assert not found, found
