"""CMP-Fed and UV-Fed (Guo, Hu, Gong): low-rank factors by power iteration;
their options and registry entries."""

import dataclasses
from typing import Optional

import dp_accounting

from tff_dp.aggregators import cmp_fed
from tff_dp.methods import options
from tff_dp.methods import registry
from tff_dp.methods import style


@dataclasses.dataclass(frozen=True)
class LowRankOptions(options.Options):
  cmp_rank: int = options.option(
    4, 'CMP-Fed / UV-Fed rank r per layer (>= 1).', check=options.integer(1)
  )
  # U's side of each kernel and the phase carrying the vectors.
  cmp_layout: str = options.option(
    'out_in',
    "CMP-Fed/UV-Fed: U on each kernel's output side (out_in, PyTorch's and "
    "PowerSGD's), input side (in_out) or smaller side (min_side). in_out "
    'reproduces the 30-round CMP-Fed and UV-Fed rows of '
    'benchmarks/results/seed001_iid.md and seed001_5labels.md.',
    choices=cmp_fed.LAYOUTS,
    legacy='in_out',
  )
  cmp_vectors_phase: str = options.option(
    'v',
    'CMP-Fed/UV-Fed: the phase whose payload carries the biases, v (under '
    '--cmp_clip_v) or u (under --cmp_clip_u). u reproduces the 30-round '
    'CMP-Fed and UV-Fed rows of benchmarks/results/seed001_iid.md and '
    'seed001_5labels.md.',
    choices=cmp_fed.VECTOR_PHASES,
    legacy='u',
  )
  cmp_dense_below: int = options.option(
    0,
    'CMP-Fed/UV-Fed: kernels with fewer entries than this are sent dense '
    "with the biases, not factorised (ours, not the paper's; an integer "
    '>= 0; 0: every kernel factorised).',
    check=options.integer(0),
  )
  # The model's trainable shapes (setup).
  model_shapes: tuple = options.computed(())


@dataclasses.dataclass(frozen=True)
class CMPFedOptions(LowRankOptions):
  cmp_clip_u: Optional[float] = options.option(
    None,
    'CMP-Fed phase-1 clip C1 (> 0; default --clip).',
    check=options.number(positive=True),
  )
  cmp_clip_v: Optional[float] = options.option(
    None,
    'CMP-Fed phase-2 clip C2 (> 0; default --clip).',
    check=options.number(positive=True),
  )

  def clips(self, clip: float) -> tuple[float, float]:
    """(C1, C2): each phase's clip, `clip` where not set."""
    return tuple(
      clip if c is None else c for c in (self.cmp_clip_u, self.cmp_clip_v)
    )

  def clip_words(self, clip: float) -> str:
    c1, c2 = self.clips(clip)
    return f'clips C1 {c1:.6g}, C2 {c2:.6g}'


def _with_model_shapes(p: registry.MethodParams, task, data_dir):
  del data_dir
  shapes = tuple(
    tuple(v.shape.as_list()) for v in task.model_builder().trainable_variables
  )
  return p.replace_options(model_shapes=shapes)


def _method(name: str) -> registry.Method:
  private = name == 'cmp_fed'

  def aggregator(p: registry.MethodParams):
    o = p.options
    layout = dict(
      layout=o.cmp_layout,
      vectors_phase=o.cmp_vectors_phase,
      dense_below=o.cmp_dense_below,
      # Exact cohort norms: only when the run releases non-private metrics.
      client_norms=p.release_non_private_metrics,
    )
    if not private:
      return cmp_fed.CMPFedFactory(o.cmp_rank, seed=p.seed, **layout)
    clip_u, clip_v = o.clips(p.clip)
    return cmp_fed.CMPFedFactory(
      o.cmp_rank,
      noise_multiplier=p.noise_multiplier,
      clients_per_round=p.expected_clients_per_round,
      clip_u=clip_u,
      clip_v=clip_v,
      seed=p.seed,
      noise_seed=p.noise_seed,
      noise=p.noise_strategy,
      **layout,
    )

  return registry.Method(
    name=name,
    description=(
      'CMP-Fed (Guo et al.): rank --cmp_rank factors U then V, each '
      'clipped, noised and secure-summed (two phases a round).'
      if private
      else 'UV-Fed (Guo et al.): the rank --cmp_rank factors of CMP-Fed, '
      'no clip or noise.'
    ),
    private=private,
    options=CMPFedOptions if private else LowRankOptions,
    build_aggregator=aggregator,
    upload_bytes=lambda p: cmp_fed.upload_bytes(
      p.options.model_shapes, p.options.cmp_rank, p.options.cmp_dense_below
    ),
    extra_download_bytes=lambda p: cmp_fed.extra_download_bytes(
      p.options.model_shapes, p.options.cmp_rank, p.options.cmp_dense_below
    ),
    round_event=(
      (
        lambda z, p: dp_accounting.ComposedDpEvent(
          [registry.gaussian(z, p)] * 2
        )
      )
      if private
      else None
    ),
    setup=_with_model_shapes,
    correlated_noise=private,
    style=(
      style.Style('CMP-Fed', style.GREEN, '^')
      if private
      else style.Style('UV-Fed (no DP)', style.BROWN, '<')
    ),
    docs_page='papers/cmp_fed.md',
  )


registry.register(_method('cmp_fed'))
registry.register(_method('uv_fed'))
