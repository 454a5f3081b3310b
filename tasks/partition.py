"""Seeded partitions of a centralized dataset into federated clients.

Each function returns a list with one `np.ndarray` of example indices per
client. All randomness comes from `np.random.default_rng(seed)`: the same
arguments give the same partition on every machine.
"""

from typing import Optional, Sequence

import numpy as np


def _check_num_clients(
  num_clients: int, num_examples: Optional[int] = None
) -> None:
  """An integer >= 1, and at most `num_examples` unless that is None."""
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(
      f'num_clients must be an integer >= 1. Found {num_clients!r}.'
    )
  if num_examples is not None and num_clients > num_examples:
    raise ValueError(
      f'num_clients must be at most the number of examples '
      f'({num_examples}). Found {num_clients!r}.'
    )


def iid_partition(
  num_examples: int, num_clients: int, seed: int
) -> list[np.ndarray]:
  """Shuffles the examples and splits them into `num_clients` equal parts.

  Part sizes differ by at most one (`np.array_split`).
  """
  _check_num_clients(num_clients, num_examples)
  rng = np.random.default_rng(seed)
  order = rng.permutation(num_examples)
  return [np.sort(part) for part in np.array_split(order, num_clients)]


def labels_per_client_partition(
  labels: np.ndarray, num_clients: int, labels_per_client: int, seed: int
) -> list[np.ndarray]:
  """Pathological non-IID split: each client holds exactly `labels_per_client`.

  This is the shard split of McMahan et al. (2017) generalised as in Guo et
  al. (CMP-Fed) (6,000 agents, 5 labels each on Fashion-MNIST). Labels are
  assigned to clients greedily so that every label is used by the same
  number of clients (up to one): each client takes the `labels_per_client`
  labels with the most unassigned slots, ties broken at random. Each
  label's examples are then shuffled and cut into as many nearly equal
  shards as clients that hold it.

  Args:
    labels: Integer labels, shape `[num_examples]`.
    num_clients: Number of clients, >= 1.
    labels_per_client: Distinct labels per client, in [1, number of classes].
    seed: Seed of the partition.

  Returns:
    One sorted index array per client.

  Raises:
    ValueError: On bad arguments, naming the value and the allowed range.
  """
  labels = np.asarray(labels)
  classes = np.unique(labels)
  num_classes = len(classes)
  _check_num_clients(num_clients, len(labels))
  if (
    not isinstance(labels_per_client, (int, np.integer))
    or not 1 <= labels_per_client <= num_classes
  ):
    raise ValueError(
      f'labels_per_client must be an integer in [1, {num_classes}] (the '
      f'number of classes present). Found {labels_per_client!r}.'
    )
  rng = np.random.default_rng(seed)
  # Slots per class: each class is held by the same number of clients +- 1.
  total = num_clients * labels_per_client
  slots = np.full(num_classes, total // num_classes)
  slots[rng.permutation(num_classes)[: total % num_classes]] += 1
  holders = [[] for _ in range(num_classes)]
  for client in rng.permutation(num_clients):
    # Most remaining slots first; random tie-break via a random secondary key.
    order = np.lexsort((rng.random(num_classes), -slots))
    chosen = order[:labels_per_client]
    if np.any(slots[chosen] <= 0):
      raise ValueError('Could not assign labels evenly; this is a bug.')
    slots[chosen] -= 1
    for c in chosen:
      holders[c].append(client)
  parts = [[] for _ in range(num_clients)]
  for c, cls in enumerate(classes):
    idx = rng.permutation(np.flatnonzero(labels == cls))
    if len(holders[c]) > len(idx):
      raise ValueError(
        f'Class {cls} has {len(idx)} examples, fewer than the '
        f'{len(holders[c])} clients that must hold it; use fewer clients.'
      )
    for client, shard in zip(holders[c], np.array_split(idx, len(holders[c]))):
      parts[client].append(shard)
  return [np.sort(np.concatenate(p)) for p in parts]


def dirichlet_partition(
  labels: np.ndarray,
  num_clients: int,
  alpha: float,
  seed: int,
  *,
  min_examples_per_client: int = 1,
  max_attempts: int = 1000,
) -> list[np.ndarray]:
  """Label-skewed split with per-class Dirichlet(alpha) client proportions.

  For every class k, proportions p_k ~ Dir(alpha * 1_N) over the N clients
  decide how that class's (shuffled) examples are divided (Hsu et al. 2019;
  the NIID-Bench reading used by Cheng et al. 2022). A draw in which some
  client gets fewer than `min_examples_per_client` examples is redrawn, as
  in NIID-Bench.
  Small alpha is very non-IID; alpha -> inf tends to IID.

  Args:
    labels: Integer labels, shape `[num_examples]`.
    num_clients: Number of clients, >= 1.
    alpha: Dirichlet concentration, > 0.
    seed: Seed of the partition.
    min_examples_per_client: Smallest allowed client, >= 0.
    max_attempts: Redraws before giving up.

  Returns:
    One sorted index array per client.

  Raises:
    ValueError: On bad arguments, or if no valid draw was found.
  """
  labels = np.asarray(labels)
  _check_num_clients(num_clients, len(labels))
  if not np.isfinite(alpha) or alpha <= 0:
    raise ValueError(f'alpha must be a finite number > 0. Found {alpha!r}.')
  if min_examples_per_client < 0:
    raise ValueError(
      'min_examples_per_client must be >= 0. Found '
      f'{min_examples_per_client!r}.'
    )
  if min_examples_per_client * num_clients > len(labels):
    raise ValueError(
      f'min_examples_per_client * num_clients must be at most the number of '
      f'examples ({len(labels)}). Found {min_examples_per_client} * '
      f'{num_clients}.'
    )
  rng = np.random.default_rng(seed)
  classes = np.unique(labels)
  by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
  for _ in range(max_attempts):
    parts = [[] for _ in range(num_clients)]
    for idx in by_class:
      p = rng.dirichlet(np.full(num_clients, alpha))
      cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
      for client, shard in enumerate(np.split(idx, cuts)):
        parts[client].append(shard)
    sizes = [sum(len(s) for s in p) for p in parts]
    if min(sizes) >= min_examples_per_client:
      return [np.sort(np.concatenate(p)) for p in parts]
  raise ValueError(
    f'No Dirichlet(alpha={alpha}) draw over {num_clients} clients gave every '
    f'client >= {min_examples_per_client} examples in {max_attempts} '
    'attempts; raise alpha or lower num_clients or min_examples_per_client.'
  )


def class_balanced_overlapping_partition(
  labels: np.ndarray, num_clients: int, per_class: int, seed: int
) -> list[np.ndarray]:
  """Every client draws `per_class` examples of every class; clients overlap.

  Zhang et al. 2022's CIFAR-10 split: "each client also has 500 samples (resp.
  50 samples); these samples can overlap with those on the other clients and
  the samples on each client are uniformly distributed in 10 classes, i.e.,
  each client has 50 samples (resp. 5 samples) from each class". Each client's
  draw is uniform without replacement within the client and independent of
  every other client's, so 1,920 clients of 500 fit in CIFAR-10's 50,000.

  Args:
    labels: Integer labels, shape `[num_examples]`.
    num_clients: Number of clients, >= 1 (any number: clients overlap).
    per_class: Examples of each class per client, in [1, smallest class].
    seed: Seed of the partition.

  Returns:
    One sorted index array per client.

  Raises:
    ValueError: On bad arguments, naming the value and the allowed range.
  """
  labels = np.asarray(labels)
  _check_num_clients(num_clients)
  by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
  smallest = min(len(idx) for idx in by_class)
  if not isinstance(per_class, (int, np.integer)) or not (
    1 <= per_class <= smallest
  ):
    raise ValueError(
      f'per_class must be an integer in [1, {smallest}] (the smallest '
      f'class). Found {per_class!r}.'
    )
  rng = np.random.default_rng(seed)
  return [
    np.sort(
      np.concatenate(
        [rng.choice(idx, size=per_class, replace=False) for idx in by_class]
      )
    )
    for _ in range(num_clients)
  ]


def dominant_classes_partition(
  labels: np.ndarray,
  num_clients: int,
  seed: int,
  *,
  dominant_classes: int = 2,
  dominant_count: int = 230,
  other_count: int = 5,
) -> list[np.ndarray]:
  """Label skew by dominant classes, no example on two clients.

  Zhang et al. 2022's non-IID EMNIST split: "each client has 500 samples
  without overlapping ... in the Non-IID case, there are 8 classes each has
  around 5 samples and 2 classes each has 230 samples on each client". Each
  client takes `dominant_count` examples of each of its
  `dominant_classes` classes and `other_count` of every other class. The
  dominant classes go round a fresh random order of the classes, a
  disjoint group per client, so every class is dominant on the same
  number of clients (up to one).

  Args:
    labels: Integer labels, shape `[num_examples]`.
    num_clients: Number of clients, >= 1; the data must hold them all.
    seed: Seed of the partition.
    dominant_classes: Dominant classes per client, in [1, classes - 1].
    dominant_count: Examples of each dominant class per client, >= 1.
    other_count: Examples of each other class per client, >= 0.

  Returns:
    One sorted index array per client.

  Raises:
    ValueError: On bad arguments, or if a class runs out of examples (the
      message names the most clients that fit).
  """
  labels = np.asarray(labels)
  classes = np.unique(labels)
  _check_dominant_args(
    num_clients, len(classes), dominant_classes, dominant_count, other_count
  )
  rng = np.random.default_rng(seed)
  pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
  taken = np.zeros(len(classes), np.int64)
  order: list[int] = []
  parts = []
  for _ in range(num_clients):
    dominant, order = _next_dominant(order, rng, len(classes), dominant_classes)
    counts = np.full(len(classes), other_count)
    counts[dominant] = dominant_count
    if np.any(taken + counts > [len(p) for p in pools]):
      need = (len(classes) - dominant_classes) * other_count + (
        dominant_classes * dominant_count
      )
      fits = len(labels) // need
      raise ValueError(
        f'num_clients={num_clients} does not fit: a class ran out after '
        f'{len(parts)} clients of {need} examples (about {fits} fit in '
        f'{len(labels)} examples at best). Lower num_clients or the counts.'
      )
    parts.append(
      np.sort(
        np.concatenate(
          [pool[t : t + n] for pool, t, n in zip(pools, taken, counts)]
        )
      )
    )
    taken += counts
  return parts


def _check_dominant_args(
  num_clients, num_classes, dominant_classes, dominant_count, other_count
) -> None:
  """`dominant_classes_partition`'s argument checks (ValueError)."""
  _check_num_clients(num_clients)
  if not 1 <= dominant_classes < num_classes:
    raise ValueError(
      f'dominant_classes must be in [1, {num_classes - 1}]. Found '
      f'{dominant_classes!r}.'
    )
  if dominant_count < 1 or other_count < 0:
    raise ValueError(
      'dominant_count must be >= 1 and other_count >= 0. Found '
      f'{dominant_count!r} and {other_count!r}.'
    )


def _next_dominant(
  order: list[int],
  rng: np.random.Generator,
  num_classes: int,
  dominant_classes: int,
) -> tuple[list[int], list[int]]:
  """The next client's dominant classes, and the order left after them.

  `order` is topped up with fresh random orders of the classes until it
  holds `dominant_classes` distinct ones; the first distinct ones are
  taken, the rest keep their order.
  """
  while len(set(order)) < dominant_classes:
    order += [int(c) for c in rng.permutation(num_classes)]
  dominant, rest = [], []
  for c in order:
    if len(dominant) < dominant_classes and c not in dominant:
      dominant.append(c)
    else:
      rest.append(c)
  return dominant, rest


def label_histogram(
  labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int
) -> np.ndarray:
  """Returns the `[num_clients, num_classes]` label counts of a partition."""
  labels = np.asarray(labels)
  return np.stack(
    [np.bincount(labels[p], minlength=num_classes) for p in parts]
  )
