"""FL-TOP(-DP) and FL-BASIC(-DP) (Kerkouche et al. 2021): clients train and
send K weights (server-chosen Top-K or a random K-subset); options and
entries."""

import dataclasses
from typing import Any

import numpy as np

from tff_dp.methods import communication
from tff_dp.methods import public_data
from tff_dp.aggregators import dp_randagg
from tff_dp.client_works import fl_top
from tff_dp.methods import options
from tff_dp.methods import public_round
from tff_dp.methods import registry
from tff_dp.methods import style

# FL-BASIC-DP's public clip: the median over this many random K-subsets
# (Kerkouche et al. 2021: "the same steps are repeated for 100 times, where
# a new random set of trainable weights with size K are selected each
# time").
PUBLIC_ROUND_TRIALS = 100


@dataclasses.dataclass(frozen=True)
class TopKOptions(options.Options):
  top_k_ratio: float = options.option(
    0.005,
    'FL-TOP/FL-BASIC: fraction K/d of weights trained and sent, in (0, 1].',
    check=options.interval(0, 1, '(]'),
  )
  # FL-TOP's setup: the Top-K indices and their masks per variable.
  top_k_indices: Any = options.computed()
  top_k_masks: Any = options.computed()


@dataclasses.dataclass(frozen=True)
class NonPrivateTopKOptions(TopKOptions):
  top_k_nonprivate_clip: bool = options.option(
    False,
    'Non-private FL-TOP/FL-BASIC: clip the K values at --clip and divide by '
    'the expected cohort (the paper does not clip them). True reproduces '
    'the fl_top and fl_basic rows of benchmarks/results/seed004_fashion.md '
    'and seed004_medical.md.',
    legacy=True,
  )


def _model_shapes(task) -> list:
  return [tuple(v.shape) for v in task.model_builder().trainable_variables]


def count(p: registry.MethodParams) -> int:
  return max(1, int(round(p.options.top_k_ratio * p.num_model_params)))


def _fl_top_setup(p: registry.MethodParams, task, data_dir):
  x, y = public_data.public_batch(
    task, data_dir, mode=p.public_batch, seed=p.seed
  )
  indices = fl_top.select_top_k(
    task.model_builder(),
    task.loss_builder(),
    x,
    y,
    ratio=p.options.top_k_ratio,
  )
  p = p.replace_options(
    top_k_indices=indices,
    top_k_masks=fl_top.masks_from_indices(indices, _model_shapes(task)),
  )
  # FL-TOP-DP: "S is set to the L2-norm of the Top-K weight update obtained
  # for this single training round" (trained on the Top-K weights only).
  return public_round.clip_setup(lambda p, task: [p.options.top_k_masks])(
    p, task, data_dir
  )


def _fl_basic_public_masks(p: registry.MethodParams, task) -> list:
  # "S is set to the median of these L2-norm values" over 100 random
  # K-subsets, drawn from the public seed.
  shapes = _model_shapes(task)
  rng = np.random.default_rng(p.seed)
  return [
    fl_top.random_masks(shapes, count(p), int(s))
    for s in rng.integers(2**31, size=PUBLIC_ROUND_TRIALS)
  ]


def _noise_and_clip(p: registry.MethodParams, private: bool) -> tuple:
  """DPRandAggFactory's (noise_multiplier, clients_per_round, clip).

  The private versions clip and noise (Kerkouche et al. 2021, Alg. 3 lines
  25-26: the compressed update "is then clipped (in Line 26) to obtain ...
  with L_2-norm at most S"); the non-private ones send the unclipped
  compressed update (Alg. 1: the server "updates the common model w_t with
  the average of these compressed updates (in Line 12)", no clip), unless
  `top_k_nonprivate_clip` clips it at `clip`, without noise.
  """
  if private:
    return p.noise_multiplier, p.expected_clients_per_round, p.clip
  if p.options.top_k_nonprivate_clip:
    return 0.0, p.expected_clients_per_round, p.clip
  return None, p.expected_clients_per_round, None


def _top_k_method(
  name, private, description, aggregator, **kwargs
) -> registry.Method:
  """A method that sends K values: clipped and noised if `private`."""
  return registry.Method(
    name=name,
    description=description
    + (', clipped and noised.' if private else ' (no clip).'),
    private=private,
    options=TopKOptions if private else NonPrivateTopKOptions,
    build_aggregator=aggregator,
    upload_bytes=lambda p: 4 * count(p),
    round_event=registry.gaussian if private else None,
    public_round_clip=private,
    correlated_noise=private,
    style=_STYLES[name],
    docs_page='papers/fl_top.md',
    **kwargs,
  )


def _fl_top_method(name: str, private: bool) -> registry.Method:
  def aggregator(p: registry.MethodParams):
    return dp_randagg.DPRandAggFactory(
      *_noise_and_clip(p, private),
      num_coordinates=len(p.options.top_k_indices),
      fixed_indices=p.options.top_k_indices,
      seed=p.seed,
      noise_seed=p.noise_seed,
      # Kerkouche et al. 2021 clip the compressed update.
      clip_scope='payload',
      noise=p.noise_strategy if private else None,
    )

  return _top_k_method(
    name,
    private,
    f'{"FL-TOP-DP" if private else "FL-TOP"} (Kerkouche et al. 2021): '
    'clients train and send the K = --top_k_ratio x d weights of top '
    '|gradient| on a public batch',
    aggregator,
    # Weights outside K (and frozen layers') stay w0, so only the K
    # values come down.
    extra_download_bytes=lambda p: 4 * count(p)
    - communication.dense_float32_bytes(
      p.num_model_params + p.num_frozen_params
    ),
    setup=_fl_top_setup,
    public_selection=(
      "FL-TOP's Top-K mask is chosen on a server-held public batch"
    ),
    build_client_work=lambda p, model_fn, opt: fl_top.build_masked_client_work(
      model_fn,
      opt,
      masks=p.options.top_k_masks,
      extra_metrics_fn=registry.client_metrics_fn(p),
    ),
  )


def _fl_basic_method(name: str, private: bool) -> registry.Method:
  def aggregator(p: registry.MethodParams):
    return dp_randagg.DPRandAggFactory(
      *_noise_and_clip(p, private),
      num_coordinates=count(p),
      seed=p.seed,
      noise_seed=p.noise_seed,
      clip_scope='payload',
      noise=p.noise_strategy if private else None,
    )

  return _top_k_method(
    name,
    private,
    f'{"FL-BASIC-DP" if private else "FL-BASIC"} (Kerkouche et al. 2021): '
    'clients train and send a random K-subset (--top_k_ratio), re-drawn '
    'every round',
    aggregator,
    # The whole model comes down, and the round's K indices (int32).
    extra_download_bytes=lambda p: 4 * count(p),
    setup=public_round.clip_setup(_fl_basic_public_masks),
    public_round_clip_rule=(
      'the median over random K-subsets' if private else ''
    ),
    build_client_work=lambda p, model_fn, opt: (
      fl_top.build_random_subset_client_work(
        model_fn,
        opt,
        num_coordinates=count(p),
        seed=p.seed,
        extra_metrics_fn=registry.client_metrics_fn(p),
      )
    ),
  )


_STYLES = {
  'fl_top': style.Style('FL-TOP (no DP)', style.ORANGE, '>'),
  'fl_top_dp': style.Style('FL-TOP-DP', style.WINE, '^'),
  'fl_basic': style.Style('FL-BASIC (no DP)', style.OLIVE, '<'),
  'fl_basic_dp': style.Style('FL-BASIC-DP', style.NAVY, 'v'),
}

registry.register(_fl_top_method('fl_top', private=False))
registry.register(_fl_top_method('fl_top_dp', private=True))
registry.register(_fl_basic_method('fl_basic', private=False))
registry.register(_fl_basic_method('fl_basic_dp', private=True))
