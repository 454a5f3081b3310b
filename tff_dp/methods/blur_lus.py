"""BLUR and LUS (Cheng et al. 2022): local training that shrinks the update
(BLUR) or sparsifies it (LUS), aggregated by DP-FedAvg; options and
entries."""

import dataclasses
import math

from tff_dp.client_works import blur
from tff_dp.client_works import lus
from tff_dp.methods import dp_fedavg
from tff_dp.methods import options
from tff_dp.methods import registry
from tff_dp.methods import style


@options.refusing(-1.0, math.inf, math.nan)
def _finite_non_negative(name, value):
  if not (
    isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
  ):
    raise ValueError(f'{name} must be a finite number >= 0. Found {value!r}.')


@dataclasses.dataclass(frozen=True)
class BlurOptions(options.Options):
  blur_lambda: float = options.option(
    0.4,
    'BLUR: lambda of the proximal hinge, >= 0 and below 1 / --client_lr.',
    check=_finite_non_negative,
  )

  def check_run(self, config) -> None:
    if self.blur_lambda * config.client_lr >= 1:
      # Cheng et al. 2022, Lemma 2 (plain SGD): the update is pulled to the
      # ball "with lambda < 1/eta_l"; above it a penalty step overshoots the
      # ball's centre. With client momentum the lemma does not apply and
      # only this necessary bound is checked.
      raise ValueError(
        'blur_lambda must be below 1 / client_lr '
        f'({1 / config.client_lr:.6g}; seed 000, Lemma 2). Found '
        f'{self.blur_lambda!r}.'
      )


@dataclasses.dataclass(frozen=True)
class LusOptions(options.Options):
  lus_sparsity: float = options.option(
    0.7,
    'LUS: sparsity c = 1 - s/d in [0, 1).',
    check=options.interval(0, 1, '[)'),
  )


@dataclasses.dataclass(frozen=True)
class BlurLusOptions(BlurOptions, LusOptions):
  pass


def _method(name, description, options_cls, build_client_work, style_):
  """Local training `build_client_work` + DP-FedAvg aggregation.

  The update is sent dense through secure sum (LUS's zeros included, as in
  Cheng et al. 2022), so it uploads the full float32 update.
  """
  return registry.Method(
    name=name,
    description=description,
    private=True,
    options=options_cls,
    build_aggregator=dp_fedavg.fixed_clip_aggregator,
    upload_bytes=registry.dense_upload,
    round_event=registry.gaussian,
    build_client_work=build_client_work,
    correlated_noise=True,
    style=style_,
    docs_page='papers/blur_lus.md',
  )


registry.register(
  _method(
    'blur',
    'BLUR (Cheng et al. 2022): proximal hinge '
    'lambda/2 max(0, ||w - w_t||^2 - S^2), S = --clip; DP-FedAvg.',
    BlurOptions,
    lambda p, model_fn, opt: blur.build_blur_client_work(
      model_fn,
      opt,
      lam=p.options.blur_lambda,
      clip_norm=p.clip,
      extra_metrics_fn=registry.client_metrics_fn(p),
    ),
    style.Style('DP-FedAvg + BLUR', style.CYAN, 'p'),
  )
)
registry.register(
  _method(
    'lus',
    'LUS (Cheng et al. 2022): per-layer top-s of |grad * delta|, '
    'sparsity --lus_sparsity; DP-FedAvg.',
    LusOptions,
    lambda p, model_fn, opt: lus.build_lus_client_work(
      model_fn,
      opt,
      sparsity=p.options.lus_sparsity,
      extra_metrics_fn=registry.client_metrics_fn(p),
    ),
    style.Style('DP-FedAvg + LUS', style.ORANGE, 'X'),
  )
)
registry.register(
  _method(
    'blur_lus',
    'BLUR and LUS together (Cheng et al. 2022, Alg. 2); DP-FedAvg.',
    BlurLusOptions,
    lambda p, model_fn, opt: lus.build_lus_client_work(
      model_fn,
      opt,
      sparsity=p.options.lus_sparsity,
      blur_lam=p.options.blur_lambda,
      clip_norm=p.clip,
      extra_metrics_fn=registry.client_metrics_fn(p),
    ),
    style.Style('DP-FedAvg + BLUR + LUS', style.PURPLE, 'P'),
  )
)
