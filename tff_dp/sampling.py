"""Client sampling: the run's Poisson or fixed-size sampling and its draws."""

import numpy as np

from tff_dp import privacy
from tff_dp.experiment_config import ExperimentConfig


def sampling_for(
  config: ExperimentConfig, num_clients: int, private: bool
) -> privacy.Sampling:
  """The client sampling of the run (see `ExperimentConfig`)."""
  if config.client_sampling_rate is not None:
    return privacy.Sampling(
      'poisson', num_clients, rate=float(config.client_sampling_rate)
    )
  if config.clients_per_round is not None:
    if config.clients_per_round > num_clients:
      raise ValueError(
        f'clients_per_round must be an integer in [1, {num_clients}] (the '
        f'number of clients). Found {config.clients_per_round!r}.'
      )
    return privacy.Sampling(
      'fixed', num_clients, clients_per_round=int(config.clients_per_round)
    )
  m = min(10, num_clients)
  if private:
    return privacy.Sampling('poisson', num_clients, rate=m / num_clients)
  return privacy.Sampling('fixed', num_clients, clients_per_round=m)


def sample_clients(
  sampling: privacy.Sampling, client_ids: list[str], rng: np.random.Generator
) -> list[str]:
  """Draws one round's cohort (possibly empty under Poisson sampling)."""
  if sampling.mode == 'poisson':
    mask = rng.random(len(client_ids)) < sampling.rate
    return [c for c, m in zip(client_ids, mask) if m]
  idx = rng.choice(len(client_ids), sampling.clients_per_round, replace=False)
  return [client_ids[i] for i in np.sort(idx)]
