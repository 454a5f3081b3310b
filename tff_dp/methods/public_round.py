"""Kerkouche et al. 2021's clip rule: the clip is the update norm of one
local round on the server's public batch (`--clip_from_public_round`)."""

import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.methods import public_data
from tff_dp import tasks as tasks_lib
from tff_dp.client_works import fl_top
from tff_dp.methods import registry


def public_round_norms(
  p: registry.MethodParams, task, data_dir, masks_list
) -> list:
  """Update norms of one local round on public data, one per mask set.

  For each entry of `masks_list` (None: every weight trained), runs the
  run's local schedule (`batch_size`, `local_epochs`, `local_steps`,
  `client_lr`, `client_momentum`: the preprocessing and optimizer a client
  gets) on the server's public batch from w0, and returns the update's L2
  norm (`fl_top.public_round_norm`). The batch is public, so the clip it
  gives is not tuning on client data.
  """
  x, y = public_data.public_batch(
    task, data_dir, mode=p.public_batch, seed=p.seed
  )
  preprocess = tasks_lib.client_preprocess_fn(
    p.batch_size,
    num_epochs=p.local_epochs,
    max_steps=p.local_steps,
    seed=p.seed,
  )
  batches = preprocess(tf.data.Dataset.from_tensor_slices((x, y)))
  public_round = fl_top.PublicRound(
    task.model_builder(),
    task.loss_builder(),
    tff.learning.optimizers.build_sgdm(
      p.client_lr, momentum=p.client_momentum or None
    ),
  )
  return [public_round.norm(batches, masks) for masks in masks_list]


def clip_setup(masks_fn):
  """A setup that sets `clip` by the public-round rule when asked.

  `masks_fn(p, task) -> list of masks` (one entry per trial; the clip is
  their median norm).
  """

  def setup(p: registry.MethodParams, task, data_dir):
    if not p.clip_from_public_round:
      return p
    norms = public_round_norms(p, task, data_dir, masks_fn(p, task))
    return dataclasses.replace(p, clip=float(np.median(norms)))

  return setup
