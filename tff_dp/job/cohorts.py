"""Client sampling: the run's sampling (`privacy.Sampling`) and its draws.

Poisson and fixed-size sampling draw from all clients. The cyclic modes
(`cyclic_poisson`, `cyclic`: the participation schemas of correlated noise,
`tff_dp.privacy.correlated`) split the clients into `groups` fixed groups by a
public seed (`partition`) and draw round t's cohort from group
`(t - 1) mod groups`, each member with the within-group probability.
"""

import hashlib

import numpy as np

from tff_dp import privacy
from tff_dp.job.experiment_config import ExperimentConfig

# Mixed into the partition's seed, so the groups are not a function of the
# same stream as the model's initialisation.
_PARTITION_STREAM = 0x70617274


def sampling_for(
  config: ExperimentConfig, num_clients: int, private: bool, groups=None
) -> privacy.Sampling:
  """The client sampling of the run (see `ExperimentConfig`).

  Args:
    config: The run's settings.
    num_clients: The population N.
    private: Whether the method is private (Poisson by default).
    groups: The cyclic modes' number of groups (`config.participation` not
      'independent'); `client_sampling_rate` (or the default 10 / N) is then
      the overall rate q, and each member of a round's group joins with
      probability q * groups (`privacy.group_rate`).

  Raises:
    ValueError: On a cohort larger than the population, or a cyclic rate
      above 1.
  """
  if config.participation != 'independent':
    rate = config.client_sampling_rate
    if rate is None:
      rate = min(10, num_clients) / num_clients
    return privacy.Sampling(
      config.participation,
      num_clients,
      rate=privacy.group_rate(float(rate), int(groups)),
      groups=int(groups),
      partition=config.participation_partition,
    )
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


def partition(
  client_ids, groups: int, seed: int, how: str = 'by_client_id'
) -> np.ndarray:
  """The group (0..groups-1) of each client, public (a function of `seed`).

  Args:
    client_ids: Every client's id, in the task's order.
    groups: The number of groups b, in [1, len(client_ids)].
    seed: The public seed of the groups.
    how: One of `privacy.PARTITIONS`. 'by_client_id': a client's group is
      SHA-256 of (`seed`, its id) mod b, a function of its own id alone, so
      adding or removing a client leaves every other client's group as it
      was (add/remove-one neighbouring); group sizes are binomial.
      'balanced': a seeded permutation of all clients dealt round-robin, so
      sizes differ by at most one but every group depends on the whole
      population (zero-out neighbouring only; `privacy.Sampling`).

  Raises:
    ValueError: On `groups` outside [1, number of clients] or an unknown
      `how`.
  """
  n = len(client_ids)
  if not isinstance(groups, (int, np.integer)) or not 1 <= groups <= n:
    raise ValueError(
      f'groups must be an integer in [1, {n}] (the number of clients). '
      f'Found {groups!r}.'
    )
  if how == 'by_client_id':
    prefix = f'{int(seed)}:{_PARTITION_STREAM}:'.encode()
    return np.array(
      [
        int.from_bytes(
          hashlib.sha256(prefix + str(c).encode()).digest()[:8], 'big'
        )
        % groups
        for c in client_ids
      ],
      np.int64,
    )
  if how != 'balanced':
    raise ValueError(
      f'partition must be one of {privacy.PARTITIONS}. Found {how!r}.'
    )
  order = np.random.default_rng([int(seed), _PARTITION_STREAM]).permutation(n)
  out = np.empty(n, np.int64)
  out[order] = np.arange(n) % groups
  return out


def round_group(round_num: int, groups: int) -> int:
  """The group round `round_num` (1-based) draws from."""
  return (round_num - 1) % groups


def sample_clients(
  sampling: privacy.Sampling,
  client_ids: list[str],
  rng: np.random.Generator,
  *,
  round_num: int = 1,
  partition_seed: int = 0,
) -> list[str]:
  """Draws one round's cohort (possibly empty under Poisson sampling).

  Args:
    sampling: The run's sampling.
    client_ids: Every client, in the task's order.
    rng: The secret sampling randomness.
    round_num: The round (1-based; the cyclic modes' group).
    partition_seed: The public seed of the cyclic modes' groups.
  """
  if sampling.cyclic:
    groups = partition(
      client_ids, sampling.groups, partition_seed, sampling.partition
    )
    members = np.flatnonzero(groups == round_group(round_num, sampling.groups))
    mask = rng.random(len(members)) < sampling.rate
    return [client_ids[i] for i in members[mask]]
  if sampling.mode == 'poisson':
    mask = rng.random(len(client_ids)) < sampling.rate
    return [c for c, m in zip(client_ids, mask) if m]
  idx = rng.choice(len(client_ids), sampling.clients_per_round, replace=False)
  return [client_ids[i] for i in np.sort(idx)]
