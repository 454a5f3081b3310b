"""Model clipping and CE-FedAvg (seed 003): clip without noise; their
registry entries (no options beyond --clip)."""

import tensorflow_federated as tff

from tff_dp.client_works import model_clip
from tff_dp.methods import registry

registry.register(
  registry.Method(
    name='model_clip',
    description=(
      'Model clipping (seed 003): each client clips its trained model to '
      '--clip; the server averages the clipped models (no noise; keep the '
      'server lr 1 and no server momentum).'
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
  )
)

registry.register(
  registry.Method(
    name='ce_fedavg',
    description=(
      'CE-FedAvg (seed 003): update-difference clipping to --clip, uniform '
      'mean over participants, no noise.'
    ),
    private=False,
    build_aggregator=lambda p: tff.aggregators.clipping_factory(
      p.clip, tff.aggregators.UnweightedMeanFactory()
    ),
    upload_bytes=registry.dense_upload,
  )
)
