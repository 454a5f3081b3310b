"""Model clipping and CE-FedAvg (Zhang et al. 2022): clip without noise; their
registry entries (no options beyond --clip)."""

import tensorflow_federated as tff

from tff_dp.client_works import model_clip
from tff_dp.methods import registry
from tff_dp.methods import style

registry.register(
  registry.Method(
    name='model_clip',
    description=(
      'Model clipping (Zhang et al. 2022): the mean of the client models '
      'clipped to --clip, no noise; use server lr 1, no server momentum.'
    ),
    private=False,
    build_aggregator=lambda p: tff.aggregators.UnweightedMeanFactory(),
    upload_bytes=registry.dense_upload,
    build_client_work=lambda p, model_fn, opt: (
      model_clip.build_model_clip_client_work(
        model_fn,
        opt,
        clip=p.clip,
        extra_metrics_fn=registry.client_metrics_fn(p),
      )
    ),
    style=style.Style('model clipping (no DP)', style.BROWN, 'p'),
    docs_page='papers/clipping.md',
  )
)

registry.register(
  registry.Method(
    name='ce_fedavg',
    description=(
      'CE-FedAvg (Zhang et al. 2022): the uniform mean of updates clipped '
      'to --clip, no noise.'
    ),
    private=False,
    build_aggregator=lambda p: tff.aggregators.clipping_factory(
      p.clip, tff.aggregators.UnweightedMeanFactory()
    ),
    upload_bytes=registry.dense_upload,
    style=style.Style('CE-FedAvg (no DP)', style.OLIVE, 'X'),
    docs_page='papers/clipping.md',
  )
)
