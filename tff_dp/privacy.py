"""Privacy ledger: the DP events that actually ran, and their epsilon.

Every round the training loop records the event the aggregator released
(read from its state or declared by its factory). The ledger wraps it in the
sampling event that matches the client sampling used and asks dp_accounting's
RDP and PLD accountants for epsilon at the run's delta. Epsilon is never
computed by hand.

Several Gaussian releases on the same sampled cohort in one round (adaptive
clipping's sum and clipped-count, CMP-Fed's two phases, DPSFL-AC's sketch and
bit) are merged into one Gaussian with 1/z^2 = sum_i 1/z_i^2. This is exact:
each release is a Gaussian mechanism of sensitivity 1 after scaling, and
their composition is the Gaussian mechanism on the concatenated vector
(mu-GDP with mu^2 = sum mu_i^2). It is needed because dp_accounting 0.4.3's
PLD accountant rejects a sampled `ComposedDpEvent`; RDP accepts both forms
and gives the same epsilon (tested).

Sampling:
* 'poisson': every client joins independently with probability q; the
  neighbouring relation is add/remove one client; both accountants apply.
* 'fixed': a uniformly random subset of m of the N clients; the matching
  event is `SampledWithoutReplacementDpEvent`, which dp_accounting's RDP
  accountant supports only under replace-one neighbouring. Its bound (Wang,
  Balle, Kasiviswanathan 2019) takes the inner event's multiplier as noise
  over the *replace-one* L2 sensitivity, and replacing one clipped client
  moves the sum by up to 2C, not C: the inner Gaussian is therefore recorded
  with half the multiplier the mechanism has over its clip
  (`GaussianDpEvent(z / 2)`; see google/differential-privacy issue 378).
  Epsilons under the two relations are not comparable: replace-one is the
  guarantee fixed-size runs get. The PLD accountant does not support this
  event, so `epsilon_pld` is NaN for fixed-size sampling.

A round whose event is `NonPrivateDpEvent` (no noise) is recorded unsampled
whatever the sampling, so the run's epsilon is infinite (amplification by
sampling of a mechanism with no guarantee gives none).

Events known only by a theorem's RDP curve (`CURVE_EVENTS`: DDGauss's
`DiscreteGaussianSumDpEvent`, whose curve alpha c^2 / 2 is an upper bound,
not the divergence) are amplified with bounds that hold for any mechanism
with that curve: Poisson sampling by Zhu & Wang 2019 ("Poisson Subsampled
Renyi Differential Privacy", ICML, Theorem 6), fixed-size sampling under
replace-one by Wang, Balle & Kasiviswanathan 2019 ("Subsampled Renyi
Differential Privacy and Analytical Moments Accountant", AISTATS, Theorem
9), each capped by the unsampled curve, at integer orders (fractional ones
by the convexity of the CGF, their Corollary 10). They compose with the
other rounds in dp_accounting's RDP accountant (`rdp_accountant()`), which
converts to (epsilon, delta) with its own `compute_epsilon`. No PLD: the
ledger's PLD epsilon is NaN and `pld_unavailable_reason` says why. A
mechanism whose participant count is public (secure aggregation) makes a
Poisson-sampled run rest on an assumption (`assumptions`).
"""

import dataclasses
import functools
import itertools
import json
import math
import numbers
from typing import Any, Callable, Optional

import attr
import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
from scipy import special

from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import dp_events
from tff_dp.aggregators import mf_strategy

SAMPLING_MODES = ('poisson', 'fixed', 'cyclic_poisson', 'cyclic')
# Clients split into fixed groups, round t drawing from group t mod groups:
# the participation schemas of noise correlated across rounds
# (`tff_dp.mf_accounting`).
CYCLIC_MODES = ('cyclic_poisson', 'cyclic')
# How the cyclic modes deal clients into groups (`tff_dp.sampling.partition`)
# and the neighbouring relation each supports: a client's group a function
# of its own id alone (add/remove one client), or of a permutation of the
# whole population (zero-out one client, the population fixed).
PARTITIONS = ('by_client_id', 'balanced')
_EVENT_TYPES = {
  cls.__name__: cls
  for cls in (
    dp_accounting.GaussianDpEvent,
    dp_accounting.LaplaceDpEvent,
    dp_accounting.NoOpDpEvent,
    dp_accounting.NonPrivateDpEvent,
    dp_accounting.ComposedDpEvent,
    dp_accounting.SelfComposedDpEvent,
    dp_accounting.PoissonSampledDpEvent,
    dp_accounting.SampledWithoutReplacementDpEvent,
    dp_accounting.SampledWithReplacementDpEvent,
    dp_accounting.UnsupportedDpEvent,
    ddgauss.DiscreteGaussianSumDpEvent,
    correlated_noise.MatrixFactorizationDpEvent,
  )
}
# Events known only by an upper bound on their RDP curve (a theorem, not
# the divergence itself): accounted with generic subsampling bounds, no PLD.
CURVE_EVENTS = (ddgauss.DiscreteGaussianSumDpEvent,)
# Events of mechanisms whose round reveals its participant count (secure
# aggregation tells the server; the noise variance tells everyone).
PUBLIC_COUNT_EVENTS = (ddgauss.DiscreteGaussianSumDpEvent,)
POISSON_COUNT_ASSUMPTION = (
  'Poisson sampling with a public participant count (DDGauss): the '
  'subsampling bound treats whether the target client was sampled as '
  'hidden, but the round reveals its count n (to the server through secure '
  'aggregation, to anyone through the noise variance n sigma^2), the '
  "target's own noise share comes and goes with it, and whether a round is "
  'withheld (count below min_clients) can turn on the target alone. None '
  'of this is charged: the epsilon holds only if the count is hidden. '
  'Fixed-size sampling (n = m every round) needs no such assumption.'
)


FIXED_COUNT_ASSUMPTION = (
  'Fixed-size sampling with a public participant count (DDGauss): every '
  'sampled client takes part, so n = m in every round. A sampled client '
  'that sends nothing (the runner skips clients without data) withholds '
  'the round, and whether that happens can turn on the target alone '
  '(replacing it by a client without data); that is not charged.'
)


def event_to_dict(event: dp_accounting.DpEvent) -> dict[str, Any]:
  """A JSON-able dict of a DpEvent (nested events included).

  Args:
    event: A dp_accounting event (or a `DiscreteGaussianSumDpEvent`).

  Returns:
    `{'type': class name, field: value, ...}`, nested events as such dicts.
  """
  out = {'type': type(event).__name__}
  for field in attr.fields(type(event)):
    value = getattr(event, field.name)
    if isinstance(value, dp_accounting.DpEvent):
      value = event_to_dict(value)
    elif isinstance(value, (list, tuple)):
      value = [event_to_dict(v) for v in value]
    out[field.name] = value
  return out


def event_from_dict(d: dict[str, Any]) -> dp_accounting.DpEvent:
  """Inverse of `event_to_dict`.

  Args:
    d: A dict `event_to_dict` wrote.

  Returns:
    The event.

  Raises:
    ValueError: If `d['type']` is not an event type the ledger knows.
  """
  cls = _EVENT_TYPES.get(d['type'])
  if cls is None:
    raise ValueError(f'Unknown DpEvent type {d["type"]!r}.')
  kwargs = {}
  for field in attr.fields(cls):
    value = d[field.name]
    if isinstance(value, dict) and 'type' in value:
      value = event_from_dict(value)
    elif isinstance(value, list):
      value = [event_from_dict(v) for v in value]
    kwargs[field.name] = value
  return cls(**kwargs)


def event_from_named_tuple(nt: Any) -> dp_accounting.DpEvent:
  """Converts TFF's stored `DpEvent.to_named_tuple()` value back to an event.

  TFF's `DifferentiallyPrivateFactory` keeps the released event in its state
  as `event.to_named_tuple()`; numeric fields come back as NumPy scalars and
  are converted to Python numbers.

  Args:
    nt: The stored named tuple (e.g. `state.dp_event`).

  Returns:
    The event, with Python numbers in its fields.
  """
  event = dp_accounting.DpEvent.from_named_tuple(nt)
  return dp_events.to_python_numbers(event)


def merge_gaussians(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  """Merges a composition of Gaussian events into one Gaussian (exact).

  `ComposedDpEvent([Gaussian(z_1), ..., Gaussian(z_k)])` (nested, and with
  `SelfComposedDpEvent` of Gaussians and `NoOpDpEvent`s) becomes
  `Gaussian(z)` with 1/z^2 = sum 1/z_i^2; a composition of
  `MatrixFactorizationDpEvent`s of one strategy (one round's correlated
  streams) becomes one of the same strategy, merged alike. Other events
  are returned as is.

  Args:
    event: Any event.

  Returns:
    The merged `GaussianDpEvent` (`NoOpDpEvent` if nothing is noised), or
    `event` itself if it is not such a composition.
  """
  inverse_sq = _gaussian_inverse_square(event)
  if inverse_sq is None:
    return _merge_correlated(event)
  if inverse_sq == 0:
    return dp_accounting.NoOpDpEvent()
  return dp_accounting.GaussianDpEvent(1.0 / math.sqrt(inverse_sq))


def _merge_correlated(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  """`ComposedDpEvent` of `MatrixFactorizationDpEvent`s of one strategy
  (nested, with `NoOpDpEvent`s) as one, 1/z^2 = sum 1/z_i^2; else `event`.

  Exact: the streams (CMP-Fed's two phases, DPSFL-AC's sketch and bit)
  each add `z_i c_i (C^-1 w_i)_t` for the same lower-triangular C, so
  their normalised releases stacked are one Gaussian MF mechanism whose
  rounds (the phases in release order: C kron I, still lower-triangular,
  so adaptive inputs are covered) carry a client's contribution of norm
  sqrt(sum 1/z_i^2) in every row block C touches. Its sensitivity under
  any participation pattern is C's times that norm, which is what
  `mf_accounting` charges for `MatrixFactorizationDpEvent(z)`.
  """
  leaves = []

  def walk(e) -> bool:
    if isinstance(e, dp_accounting.NoOpDpEvent):
      return True
    if isinstance(e, correlated_noise.MatrixFactorizationDpEvent):
      leaves.append(e)
      return True
    if isinstance(e, dp_accounting.ComposedDpEvent):
      return all(walk(x) for x in e.events)
    return False

  if not isinstance(event, dp_accounting.ComposedDpEvent) or not walk(event):
    return event
  if not leaves:
    return dp_accounting.NoOpDpEvent()
  if len({e.strategy for e in leaves}) > 1:
    return event  # Different strategies: not one mechanism (refused later).
  if any(float(e.noise_multiplier) == 0 for e in leaves):
    return correlated_noise.MatrixFactorizationDpEvent(0.0, leaves[0].strategy)
  inverse_sq = sum(1.0 / float(e.noise_multiplier) ** 2 for e in leaves)
  return correlated_noise.MatrixFactorizationDpEvent(
    1.0 / math.sqrt(inverse_sq), leaves[0].strategy
  )


def gaussian_shares(event: dp_accounting.DpEvent) -> Optional[list[float]]:
  """Each part's share of a composed Gaussian round's privacy cost.

  For `ComposedDpEvent([Gaussian(z_1), ..., Gaussian(z_k)])` (one cohort,
  merged exactly as `merge_gaussians` does), part i's 1/z_i^2 over
  sum_j 1/z_j^2: the fraction of the merged event's inverse variance it
  adds (e.g. DPSFL-AC's clip bit against its sketch).

  Args:
    event: Any event.

  Returns:
    One share per part of a `ComposedDpEvent` whose parts are all finite
    Gaussian compositions (summing to 1); None for any other event.
  """
  if not isinstance(event, dp_accounting.ComposedDpEvent):
    return None
  parts = [_gaussian_inverse_square(e) for e in event.events]
  if any(x is None or math.isinf(x) for x in parts) or not sum(parts):
    return None
  total = sum(parts)
  return [x / total for x in parts]


def _gaussian_inverse_square(event) -> Optional[float]:
  if isinstance(event, dp_accounting.GaussianDpEvent):
    z = float(event.noise_multiplier)
    return math.inf if z == 0 else 1.0 / z**2
  if isinstance(event, dp_accounting.NoOpDpEvent):
    return 0.0
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    inner = _gaussian_inverse_square(event.event)
    return None if inner is None else inner * event.count
  if isinstance(event, dp_accounting.ComposedDpEvent):
    parts = [_gaussian_inverse_square(e) for e in event.events]
    return None if any(p is None for p in parts) else sum(parts)
  return None


@dataclasses.dataclass(frozen=True)
class Participation:
  """Cyclic participation over `groups` fixed groups of clients.

  Attributes:
    groups: b >= 1 groups; round t draws from group t mod b.
    rate: Poisson probability of each member of the round's group (cyclic
      Poisson, amplified); None: every member takes part (min-separation).

  Raises:
    ValueError: On `groups` < 1 or `rate` outside (0, 1], naming the value.
  """

  groups: int
  rate: Optional[float] = None

  def __post_init__(self):
    if not isinstance(self.groups, int) or self.groups < 1:
      raise ValueError(
        f'groups must be an integer >= 1. Found {self.groups!r}.'
      )
    if self.rate is not None and not 0 < self.rate <= 1:
      raise ValueError(
        'The within-group sampling rate must be in (0, 1]. Found '
        f'{self.rate!r}.'
      )

  @property
  def amplified(self) -> bool:
    return self.rate is not None

  def to_dict(self) -> dict:
    return {
      'schema': 'cyclic_poisson' if self.amplified else 'min_separation',
      'groups': self.groups,
      'rate': self.rate,
    }


def group_rate(rate: float, groups: int) -> float:
  """The within-group rate whose expected cohort equals Poisson sampling of
  all clients at `rate`: `rate * groups` (a group holds 1/groups of them).

  Raises:
    ValueError: If it exceeds 1 (fewer groups, or a lower rate, fit).
  """
  q = rate * groups
  if not 0 < q <= 1:
    raise ValueError(
      f'groups * client_sampling_rate must be in (0, 1]: {groups} * {rate!r}'
      f' = {q!r}. Use at most {int(1 / rate)} groups at this rate.'
    )
  return q


def mf_sensitivity(
  strategy: mf_strategy.Strategy, rounds: int, participation: Participation
) -> float:
  """The sensitivity the schema's event divides the multiplier by.

  Cyclic Poisson: `kappa`, the largest column norm of `C` over `rounds`.
  Min-separation: the maximum norm of a sum of columns `groups` apart.

  Raises:
    ValueError: Where the schema's conditions fail (module docstring).
  """
  if participation.amplified:
    if strategy.kind != mf_strategy.BANDED:
      raise ValueError(
        'Cyclic Poisson sampling (amplified banded MF) needs a banded '
        f'strategy; found {strategy.kind!r}. Use min-separation '
        'participation (no within-group rate) for BLT.'
      )
    if strategy.bands > participation.groups:
      raise ValueError(
        f'Amplified banded MF needs bands <= groups. Found {strategy.bands} '
        f'bands and {participation.groups} groups.'
      )
    # Column 0 is the longest; one participation per group visit.
    return mf_strategy.sensitivity(strategy, rounds, participation.groups, 1)
  return mf_strategy.sensitivity(strategy, rounds, participation.groups)


def mf_run_event(
  strategy: mf_strategy.Strategy,
  noise_multiplier: float,
  rounds: int,
  participation: Participation,
) -> dp_accounting.DpEvent:
  """The DP event of the first `rounds` rounds (module docstring).

  Args:
    strategy: The strategy `C` (its sensitivity is computed here, so its
      scale does not matter).
    noise_multiplier: z, the stddev of each `w_t` coordinate over the clip.
    rounds: Rounds run so far, >= 1.
    participation: The schema.

  Raises:
    ValueError: On a bad argument or a schema whose conditions fail.
  """
  if not noise_multiplier > 0 or not math.isfinite(noise_multiplier):
    raise ValueError(
      f'noise_multiplier must be finite and > 0. Found {noise_multiplier!r}.'
    )
  sens = mf_sensitivity(strategy, rounds, participation)
  gaussian = dp_accounting.GaussianDpEvent(noise_multiplier / sens)
  if not participation.amplified:
    return gaussian
  visits = -(-rounds // participation.groups)
  sampled = dp_accounting.PoissonSampledDpEvent(participation.rate, gaussian)
  return dp_accounting.SelfComposedDpEvent(sampled, visits)


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How clients are sampled each round.

  Attributes:
    mode: 'poisson' (each client with probability `rate`), 'fixed'
      (`clients_per_round` uniformly without replacement), or one of the
      cyclic modes, where the clients are split into `groups` fixed groups
      (by a public seed: `tff_dp.sampling.partition`) and round t draws
      each member of group (t - 1) mod `groups` with probability `rate`:
      'cyclic_poisson' accounts that Poisson draw (amplified banded MF),
      'cyclic' does not (min-separation: a client joins at most one round
      in `groups`, nothing more is assumed). Both are accounted by
      `tff_dp.mf_accounting`, with noise independent across rounds or
      correlated (`MatrixFactorizationDpEvent`).
    num_clients: Size of the client population N.
    rate: Poisson sampling probability q in (0, 1] (mode 'poisson'); the
      within-group probability (cyclic modes).
    clients_per_round: Cohort size m in [1, N] (mode 'fixed').
    groups: The number of groups b, in [1, N] (cyclic modes).
    partition: How the cyclic modes deal the clients into groups, one of
      `PARTITIONS` (`tff_dp.sampling.partition`). 'by_client_id': a
      client's group is a public hash of its own id, so adding or removing
      one client changes no other client's group (nor, in distribution,
      any other client's draws: each still joins with `rate`), and the
      epsilon (computed for add/remove-one) holds for add/remove-one
      neighbouring. 'balanced': a seeded permutation of the whole
      population, so every group depends on who is in it; the same epsilon
      then holds for zero-out neighbouring only (one client's data replaced
      by data contributing nothing, the population and its groups fixed:
      the released stream is then that of the client being absent from a
      fixed partition, the add/remove analysis of the same event).

  Raises:
    ValueError: On a bad mode, population, rate, cohort size or number of
      groups, naming it and its allowed range.
  """

  mode: str
  num_clients: int
  rate: Optional[float] = None
  clients_per_round: Optional[int] = None
  groups: Optional[int] = None
  partition: str = 'by_client_id'

  def __post_init__(self):
    if self.partition not in PARTITIONS:
      raise ValueError(
        f'partition must be one of {PARTITIONS}. Found {self.partition!r}.'
      )
    if self.mode not in SAMPLING_MODES:
      raise ValueError(
        f'sampling mode must be one of {SAMPLING_MODES}. '
        f'Found {self.mode!r}.'
      )
    if not isinstance(self.num_clients, int) or self.num_clients < 1:
      raise ValueError(
        f'num_clients must be an integer >= 1. Found {self.num_clients!r}.'
      )
    if self.mode == 'fixed':
      m = self.clients_per_round
      if not isinstance(m, int) or not 1 <= m <= self.num_clients:
        raise ValueError(
          f'clients_per_round must be an integer in [1, '
          f'{self.num_clients}]. Found {m!r}.'
        )
      return
    what = 'within-group sampling rate' if self.cyclic else 'rate'
    if self.rate is None or not 0 < self.rate <= 1:
      raise ValueError(
        f'client_sampling_rate ({what}) must be in (0, 1]. Found '
        f'{self.rate!r}.'
      )
    if self.cyclic:
      b = self.groups
      if not isinstance(b, int) or not 1 <= b <= self.num_clients:
        raise ValueError(
          f'participation groups must be an integer in [1, '
          f'{self.num_clients}] (the number of clients). Found {b!r}.'
        )

  @property
  def cyclic(self) -> bool:
    """Whether clients are drawn from fixed groups in turn."""
    return self.mode in CYCLIC_MODES

  @property
  def neighbouring_relation(self) -> str:
    """The neighbouring relation the run's epsilon is stated for, in
    words."""
    if self.mode == 'poisson':
      return 'add/remove one client (Poisson sampling)'
    if self.mode == 'fixed':
      return (
        'replace one client (fixed-size sampling; sensitivity 2 x clip)'
      )
    if self.partition == 'balanced':
      return (
        f'zero-out one client ({self.mode} sampling, balanced groups: a '
        "permutation of the whole population, so a client's group depends "
        'on who else is in it; add/remove-one is not covered)'
      )
    return (
      f'add/remove one client ({self.mode} sampling, groups by a public '
      'hash of each client id)'
    )

  @property
  def expected_clients_per_round(self) -> float:
    """q N for Poisson sampling, q N / b for the cyclic modes, m for
    fixed-size sampling."""
    if self.mode == 'poisson':
      return self.rate * self.num_clients
    if self.cyclic:
      return self.rate * self.num_clients / self.groups
    return float(self.clients_per_round)

  def participation(self):
    """The cyclic modes' `mf_accounting.Participation`.

    Raises:
      ValueError: For a mode that is not cyclic.
    """
    if not self.cyclic:
      raise ValueError(f'Sampling mode {self.mode!r} is not cyclic.')
    rate = self.rate if self.mode == 'cyclic_poisson' else None
    return Participation(self.groups, rate)

  def run_event(
    self, event: dp_accounting.DpEvent, rounds: int
  ) -> dp_accounting.DpEvent:
    """The event of `rounds` rounds that each released `event`.

    Poisson and fixed-size sampling: `SelfComposedDpEvent(wrap(event),
    rounds)`. Cyclic modes: the whole run's event (`tff_dp.mf_accounting.
    run_event`) of the round event's strategy and multiplier
    (`correlated_round`); a run with no noise is non-private.

    Raises:
      dp_accounting.UnsupportedEventError: For a cyclic mode and an event
        that is neither Gaussian nor correlated Gaussian.
      ValueError: Where a cyclic schema's conditions fail.
    """
    if not self.cyclic:
      return dp_accounting.SelfComposedDpEvent(self.wrap(event), rounds)
    round_event = self.round_event(event)
    if isinstance(round_event, dp_accounting.NoOpDpEvent):
      return round_event
    strategy, z = correlated_round(round_event)
    if z == 0:
      return dp_accounting.NonPrivateDpEvent()
    return mf_run_event(strategy, z, rounds, self.participation())

  def round_event(self, event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
    """The form the ledger records a round's event in (`wrap` for Poisson
    and fixed-size sampling; for the cyclic modes the Gaussians merged,
    unsampled: the run, not the round, is sampled).

    Raises:
      dp_accounting.UnsupportedEventError: For a cyclic mode and an event
        that is neither Gaussian nor correlated Gaussian, or correlated
        noise under a sampling that is not cyclic.
      ValueError: If a Gaussian's multiplier is NaN or negative.
    """
    if not self.cyclic:
      if _contains(event, correlated_noise.MatrixFactorizationDpEvent):
        raise dp_accounting.UnsupportedEventError(
          'Noise correlated across rounds (MatrixFactorizationDpEvent) is '
          'one mechanism over the whole run, not independent rounds: it '
          "needs a cyclic participation schema ('cyclic_poisson', or "
          "'cyclic' for min-separation; groups 1 allows any pattern). "
          f'Found sampling mode {self.mode!r}.'
        )
      return self.wrap(event)
    check_event(event)
    event = merge_gaussians(event)
    if not isinstance(
      event,
      (
        dp_accounting.GaussianDpEvent,
        dp_accounting.NoOpDpEvent,
        correlated_noise.MatrixFactorizationDpEvent,
      ),
    ):
      raise dp_accounting.UnsupportedEventError(
        f'Cyclic participation ({self.mode!r}) accounts Gaussian rounds, '
        'independent or correlated (MatrixFactorizationDpEvent), only. '
        f'Found {event}.'
      )
    return event

  def wrap(self, event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
    """The round's event under this sampling (Gaussians merged first).

    `event` is stated as the aggregator states it: multipliers are noise
    over one client's clip (add/remove-one sensitivity). For fixed-size
    sampling the merged Gaussian's multiplier is halved (replace-one
    sensitivity is twice the clip; see the module docstring).

    Args:
      event: One round's released event.

    Returns:
      `PoissonSampledDpEvent(rate, event)` or
      `SampledWithoutReplacementDpEvent(N, m, replace-one event)`, with
      Gaussians merged; a `NoOpDpEvent` or `NonPrivateDpEvent` unwrapped.

    Raises:
      dp_accounting.UnsupportedEventError: For fixed-size sampling of an
        event that is not a (composition of) Gaussian(s) or a curve event,
        whose replace-one form this ledger cannot state.
      ValueError: If a Gaussian's multiplier is NaN or negative
        (`check_event`).
    """
    if self.cyclic:
      raise ValueError(
        f'Sampling mode {self.mode!r} samples the run, not the round: use '
        '`run_event`.'
      )
    check_event(event)
    event = merge_gaussians(event)
    if isinstance(
      event, (dp_accounting.NoOpDpEvent, dp_accounting.NonPrivateDpEvent)
    ):
      return event
    if self.mode == 'poisson':
      return dp_accounting.PoissonSampledDpEvent(self.rate, event)
    return dp_accounting.SampledWithoutReplacementDpEvent(
      self.num_clients, self.clients_per_round, replace_one_event(event)
    )

  def rdp_accountant(self) -> rdp.RdpAccountant:
    """dp_accounting's RDP accountant for this relation, with `CURVE_EVENTS`."""
    relation = (
      dp_accounting.NeighboringRelation.REPLACE_ONE
      if self.mode == 'fixed'
      else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    return RdpAccountant(neighboring_relation=relation)

  def pld_accountant(self) -> Optional[pld.PLDAccountant]:
    """dp_accounting's PLD accountant (add/remove-one); None for fixed."""
    if self.mode == 'fixed':
      return None
    return PldAccountant()

  def to_dict(self) -> dict[str, Any]:
    """The fields as a JSON-able dict (`from_dict` inverts it); `groups`
    and `partition` only for the cyclic modes."""
    d = dataclasses.asdict(self)
    if d['groups'] is None:
      del d['groups']
    if not self.cyclic:
      del d['partition']
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> 'Sampling':
    """Inverts `to_dict`. A cyclic sampling saved before `partition`
    existed dealt its groups from a permutation: 'balanced'."""
    d = dict(d)
    if d.get('mode') in CYCLIC_MODES:
      d.setdefault('partition', 'balanced')
    return cls(**d)


def correlated_round(
  event: dp_accounting.DpEvent,
) -> tuple[mf_strategy.Strategy, float]:
  """(strategy, noise multiplier) of one round of a cyclic run: a
  `MatrixFactorizationDpEvent`'s, or the identity and z for an independent
  `GaussianDpEvent(z)` (DP-FedAvg is the one-band strategy).

  Raises:
    dp_accounting.UnsupportedEventError: For any other event.
  """
  if isinstance(event, correlated_noise.MatrixFactorizationDpEvent):
    return (
      correlated_noise.strategy_from_json(event.strategy),
      float(event.noise_multiplier),
    )
  if isinstance(event, dp_accounting.GaussianDpEvent):
    return mf_strategy.identity(), float(event.noise_multiplier)
  raise dp_accounting.UnsupportedEventError(
    f'Not a (correlated) Gaussian round: {event}.'
  )


def replace_one_event(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  """A merged Gaussian's (or a curve event's) event under replace-one.

  Replacing one client moves the clipped sum by up to twice what removing
  it does: a Gaussian's multiplier is halved, a
  `DiscreteGaussianSumDpEvent`'s sensitivity doubled (its tau term, which
  does not depend on the sensitivity, is unchanged).

  Args:
    event: A `GaussianDpEvent` or `DiscreteGaussianSumDpEvent` stated over
      add/remove-one sensitivity.

  Returns:
    The same mechanism's event over replace-one sensitivity.

  Raises:
    dp_accounting.UnsupportedEventError: If `event` is neither.
  """
  if isinstance(event, ddgauss.DiscreteGaussianSumDpEvent):
    return event.with_sensitivity_scaled(2.0)
  if not isinstance(event, dp_accounting.GaussianDpEvent):
    raise dp_accounting.UnsupportedEventError(
      'Fixed-size sampling is accounted for Gaussian mechanisms and '
      "DDGauss's DiscreteGaussianSumDpEvent only (replace-one sensitivity "
      f'2C). Found {event}; use Poisson sampling '
      '(--client_sampling_rate).'
    )
  return dp_accounting.GaussianDpEvent(event.noise_multiplier / 2)


def check_event(event: dp_accounting.DpEvent) -> None:
  """Raises if a Gaussian in `event` has a NaN or negative multiplier.

  dp_accounting's RDP accountant loops forever on a NaN multiplier (its
  fractional-order series never meets its stopping test), so the ledger
  checks every event it records.

  Args:
    event: Any event; nested events are checked too.

  Raises:
    ValueError: Naming the multiplier and its allowed range.
  """
  if isinstance(event, dp_accounting.GaussianDpEvent):
    z = event.noise_multiplier
    if isinstance(z, bool) or not (
      isinstance(z, numbers.Real) and not math.isnan(z) and z >= 0
    ):
      raise ValueError(
        'A GaussianDpEvent noise_multiplier must be a number >= 0. '
        f'Found {z!r}.'
      )
    return
  for field in attr.fields(type(event)):
    value = getattr(event, field.name)
    for v in value if isinstance(value, (list, tuple)) else [value]:
      if isinstance(v, dp_accounting.DpEvent):
        check_event(v)


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
  return (
    special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
  )


def _log_sum_exp(x: np.ndarray) -> float:
  """log(sum(exp(x))), as max + log1p(rest): the CGF bounds are often
  log(1 + tiny), which `scipy.special.logsumexp` rounds at 1e-16 absolute."""
  i = int(np.argmax(x))
  rest = np.delete(x, i) - x[i]
  return float(x[i] + np.log1p(np.sum(np.exp(rest))))


def _poisson_cgf_bound(q: float, curve, alpha: int) -> float:
  """Zhu & Wang 2019, Theorem 6 (general upper bound), as a CGF.

  (alpha - 1) times the RDP at integer alpha >= 2 of the Poisson-sampled
  mechanism (rate 0 < q < 1, add/remove-one) whose RDP is at most eps(j):
    log[(1 - q)^(alpha - 1) (1 + (alpha - 1) q)
        + C(alpha, 2) q^2 (1 - q)^(alpha - 2) e^eps(2)
        + 3 sum_{j=3}^alpha C(alpha, j) q^j (1 - q)^(alpha - j)
          e^((j - 1) eps(j))].
  The 3 is the theorem's (its bound is tight up to log(3) / (alpha - 1));
  Kairouz et al.'s own accountant (google-research/federated,
  distributed_dp/accounting_utils.py) uses the same expression.
  """
  j = np.arange(2, alpha + 1)
  log_q, log_1mq = math.log(q), math.log1p(-q)
  terms = _log_comb(alpha, j) + j * log_q + (alpha - j) * log_1mq
  terms = terms + (j - 1) * curve(j)
  terms[1:] += math.log(3.0)
  first = (alpha - 1) * log_1mq + math.log1p((alpha - 1) * q)
  return _log_sum_exp(np.concatenate([[first], terms]))


def _wor_cgf_bound(q: float, curve, alpha: int) -> float:
  """Wang, Balle & Kasiviswanathan 2019, Theorem 9, as a CGF.

  (alpha - 1) times the RDP at integer alpha >= 2 of a mechanism with RDP
  at most eps(j) run on m = q N of N records drawn without replacement,
  under replace-one:
    log[1 + q^2 C(alpha, 2) min(4 (e^eps(2) - 1),
                                e^eps(2) min(2, (e^eps(inf) - 1)^2))
        + sum_{j=3}^alpha q^j C(alpha, j) e^((j - 1) eps(j))
          min(2, (e^eps(inf) - 1)^j)],
  here with eps(inf) = inf (a Gaussian-like curve has no pure-DP bound),
  so both min(2, ...) are 2.
  """
  j = np.arange(2, alpha + 1)
  eps = curve(j)
  log_q = math.log(q)
  e2 = float(eps[0])
  t2 = (
    2 * log_q
    + float(_log_comb(alpha, np.array(2)))
    + min(math.log(4.0) + e2 + math.log(-math.expm1(-e2)), e2 + math.log(2.0))
  )
  rest = (
    math.log(2.0)
    + j[1:] * log_q
    + _log_comb(alpha, j[1:])
    + (j[1:] - 1) * eps[1:]
  )
  return _log_sum_exp(np.concatenate([[0.0, t2], rest]))


def subsampled_rdp(
  curve: Callable[[np.ndarray], np.ndarray],
  q: float,
  orders,
  scheme: str,
) -> np.ndarray:
  """RDP of a subsampled mechanism known only by an upper curve eps(alpha).

  Generic bounds (valid for any mechanism whose RDP is at most `curve`):
  `scheme` 'poisson' (add/remove-one) by Zhu & Wang 2019 Theorem 6,
  'without_replacement' (replace-one; q = m / N) by Wang, Balle &
  Kasiviswanathan 2019 Theorem 9 with eps(inf) = inf. Both are computed as
  cumulant bounds K(alpha) at integer orders, each capped by the unsampled
  (alpha - 1) eps(alpha) (subsampling never hurts: joint convexity); a
  fractional order interpolates K linearly between its neighbouring
  integers (K is convex, K(1) = 0; WBK19 Corollary 10) and is capped by
  eps(alpha) too.

  Args:
    curve: eps(alpha) of the unsampled mechanism, vectorized over orders.
    q: Sampling probability (Poisson) or m / N, in [0, 1].
    orders: RDP orders, each > 1.
    scheme: 'poisson' or 'without_replacement'.

  Returns:
    The RDP at each order.

  Raises:
    ValueError: On a bad `q`, order or `scheme`.
  """
  bounds = {
    'poisson': _poisson_cgf_bound,
    'without_replacement': _wor_cgf_bound,
  }
  if scheme not in bounds:
    raise ValueError(
      f'scheme must be one of {sorted(bounds)}. Found {scheme!r}.'
    )
  if not 0 <= q <= 1:
    raise ValueError(f'q must be in [0, 1]. Found {q!r}.')
  orders = np.asarray(orders, np.float64)
  if not np.all(orders > 1) or not np.all(np.isfinite(orders)):
    raise ValueError(f'orders must be finite and > 1. Found {orders!r}.')
  if q == 0:
    return np.zeros_like(orders)
  if q == 1:
    return np.asarray(curve(orders), np.float64)
  cgf = {1: 0.0}
  for a in sorted(
    {math.floor(a) for a in orders} | {math.ceil(a) for a in orders}
  ):
    if a >= 2:
      unsampled = (a - 1) * float(curve(np.array([a], np.float64))[0])
      cgf[a] = min(bounds[scheme](q, curve, a), unsampled)
  out = []
  for a in orders:
    lo, hi = math.floor(a), math.ceil(a)
    t = a - lo
    k = cgf[lo] if lo == hi else (1 - t) * cgf[lo] + t * cgf[hi]
    out.append(min(k / (a - 1), float(curve(np.array([a]))[0])))
  return np.array(out)


@functools.lru_cache(maxsize=16)
def _subsampled_gaussian_pld(
  noise_multiplier: float, sampling_probability: float, interval: float
):
  """One Poisson-sampled Gaussian's PLD, as dp_accounting builds it.

  Building it is most of an epsilon's cost (about 0.5 s here) and does not
  depend on the round count; `PrivacyLossDistribution`s are immutable, so
  one object serves every round.
  """
  return pld.privacy_loss_distribution.from_gaussian_mechanism(
    standard_deviation=noise_multiplier,
    value_discretization_interval=interval,
    sampling_prob=sampling_probability,
  )


class PldAccountant(pld.PLDAccountant):
  """dp_accounting's PLD accountant, with the sampled Gaussian's PLD built
  once per (multiplier, sampling rate) and self-composed for each count.

  The same PLD objects and operations as `pld.PLDAccountant`, so the same
  epsilon to the bit (tested); only the rebuilding each round is saved.
  """

  def _maybe_compose(self, event, count, do_compose):
    if (
      do_compose
      and isinstance(event, dp_accounting.PoissonSampledDpEvent)
      and isinstance(event.event, dp_accounting.GaussianDpEvent)
      and self.neighboring_relation
      == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
      and event.sampling_probability != 0
      and event.event.noise_multiplier != 0
    ):
      base = _subsampled_gaussian_pld(
        event.event.noise_multiplier,
        event.sampling_probability,
        self._value_discretization_interval,
      )
      self._pld = self._pld.compose(base.self_compose(count))
      return None
    return super()._maybe_compose(event, count, do_compose)


class RdpAccountant(rdp.RdpAccountant):
  """dp_accounting's RDP accountant that also composes `CURVE_EVENTS`.

  A curve event, alone or as the inner event of a `PoissonSampledDpEvent`
  (add/remove-one) or `SampledWithoutReplacementDpEvent` (replace-one), is
  accounted with `subsampled_rdp`; every other event as dp_accounting does.
  Epsilon is dp_accounting's conversion (`get_epsilon`).
  """

  def _maybe_compose(self, event, count, do_compose):
    relation = dp_accounting.NeighboringRelation
    inner = getattr(event, 'event', None)
    if isinstance(event, CURVE_EVENTS):
      values = lambda: event.rdp(self._orders)
    elif isinstance(event, dp_accounting.PoissonSampledDpEvent) and isinstance(
      inner, CURVE_EVENTS
    ):
      if self._neighboring_relation is not relation.ADD_OR_REMOVE_ONE:
        return self.CompositionErrorDetails(
          invalid_event=event,
          error_message='PoissonSampledDpEvent needs ADD_OR_REMOVE_ONE.',
        )
      values = lambda: subsampled_rdp(
        inner.rdp, event.sampling_probability, self._orders, 'poisson'
      )
    elif isinstance(
      event, dp_accounting.SampledWithoutReplacementDpEvent
    ) and isinstance(inner, CURVE_EVENTS):
      if self._neighboring_relation is not relation.REPLACE_ONE:
        return self.CompositionErrorDetails(
          invalid_event=event,
          error_message='SampledWithoutReplacementDpEvent needs REPLACE_ONE.',
        )
      values = lambda: subsampled_rdp(
        inner.rdp,
        event.sample_size / event.source_dataset_size,
        self._orders,
        'without_replacement',
      )
    else:
      return super()._maybe_compose(event, count, do_compose)
    if do_compose:
      self._rdp += count * values()
    return None


# Ledger JSON version: 2 records fixed-size rounds with replace-one
# sensitivity 2C; version-1 ledgers (no 'version') recorded them with C.
LEDGER_VERSION = 2


class PrivacyLedger:
  """The per-round DP events of a run and their (epsilon, delta) guarantee.

  `record(event)` appends one round's released event (unsampled); the ledger
  applies the sampling (`Sampling.round_event`). `epsilon()` composes every
  recorded round with both accountants: as independent rounds, or, for the
  cyclic modes, as the one mechanism of the rounds run
  (`Sampling.run_event`: every round must have released the same event).
  State round-trips through `to_json`/`from_json` so a resumed run
  continues the same ledger.

  Args:
    sampling: The client sampling every recorded round ran under.
    delta: The delta of `epsilon()`, in (0, 1).

  Raises:
    ValueError: If `delta` is not in (0, 1).
  """

  def __init__(self, sampling: Sampling, delta: float):
    if not 0 < delta < 1:
      raise ValueError(f'delta must be in (0, 1). Found {delta!r}.')
    self.sampling = sampling
    self.delta = float(delta)
    self._events: list[dp_accounting.DpEvent] = []
    self._cache: dict[int, tuple[float, float]] = {}

  @property
  def rounds(self) -> int:
    return len(self._events)

  @property
  def events(self) -> list[dp_accounting.DpEvent]:
    """The recorded per-round events, sampling applied (cyclic modes:
    Gaussians merged, the run's sampling in `composed_event`)."""
    return list(self._events)

  def record(self, event: dp_accounting.DpEvent) -> None:
    """Records one round's released (unsampled) event.

    Args:
      event: The event the round's aggregator released.

    Raises:
      TypeError: If `event` is not a `DpEvent`.
      ValueError: If a Gaussian in it has a NaN or negative multiplier.
      dp_accounting.UnsupportedEventError: If the sampling cannot state it
        (`Sampling.round_event`).
      ValueError: For a cyclic mode, if it differs from the rounds before
        (one strategy and multiplier for the whole run).
    """
    if not isinstance(event, dp_accounting.DpEvent):
      raise TypeError(f'Expected a DpEvent. Found {type(event)!r}.')
    event = self.sampling.round_event(event)
    if self.sampling.cyclic and self._events and event != self._events[0]:
      raise ValueError(
        f'Cyclic participation ({self.sampling.mode!r}) accounts one '
        'strategy and noise multiplier for every round; round '
        f'{len(self._events) + 1} released {event}, round 1 '
        f'{self._events[0]}. (A resumed run reads the strategy it started '
        "with from its folder's noise_plan.json; one whose folder lacks it "
        'optimised it again.)'
      )
    self._events.append(event)

  def composed_event(self) -> dp_accounting.DpEvent:
    """All rounds as one event: runs of equal rounds self-composed; for the
    cyclic modes, the run's event (`Sampling.run_event`)."""
    if self.sampling.cyclic:
      if not self._events:
        return dp_accounting.ComposedDpEvent([])
      return self.sampling.run_event(self._events[0], len(self._events))
    parts = []
    for event, group in itertools.groupby(self._events):
      n = len(list(group))
      parts.append(
        event if n == 1 else dp_accounting.SelfComposedDpEvent(event, n)
      )
    return dp_accounting.ComposedDpEvent(parts)

  def epsilon(self) -> tuple[float, float]:
    """(epsilon from RDP, epsilon from PLD) at `delta`; PLD NaN if unsupported.

    A run with no private round (only NoOp events) has epsilon 0; one with
    a non-private event has epsilon inf. Where the PLD epsilon is NaN,
    `pld_unavailable_reason()` says why.

    Returns:
      `(epsilon_rdp, epsilon_pld)` of all recorded rounds at `delta`.

    Raises:
      dp_accounting.UnsupportedEventError: If the RDP accountant cannot
        compose the recorded events.
    """
    key = len(self._events)
    if key not in self._cache:
      self._cache = {
        key: epsilon_of(self.composed_event(), self.sampling, self.delta)
      }
    return self._cache[key]

  def pld_unavailable_reason(self) -> Optional[str]:
    """Why `epsilon()`'s PLD epsilon is NaN; None where it is computed."""
    return pld_unavailable_reason(self.composed_event(), self.sampling)

  def assumptions(self) -> list[str]:
    """What the epsilon assumes beyond the recorded events (empty: nothing).

    A Poisson-sampled run of a mechanism whose participant count is public
    (`PUBLIC_COUNT_EVENTS`) rests on `POISSON_COUNT_ASSUMPTION`.
    """
    if not any(_contains(e, PUBLIC_COUNT_EVENTS) for e in self._events):
      return []
    if self.sampling.mode == 'poisson':
      return [POISSON_COUNT_ASSUMPTION]
    return [FIXED_COUNT_ASSUMPTION]

  def to_json(self) -> str:
    """The sampling, delta and recorded events, as `from_json` reads them."""
    return json.dumps(
      {
        'version': LEDGER_VERSION,
        'sampling': self.sampling.to_dict(),
        'delta': self.delta,
        'events': [event_to_dict(e) for e in self._events],
      }
    )

  @classmethod
  def from_json(cls, text: str) -> 'PrivacyLedger':
    """The ledger `to_json` wrote; version-1 fixed-size rounds corrected.

    A version-1 ledger (no 'version' key) recorded fixed-size rounds with
    the add/remove-one multiplier, as
    `SampledWithoutReplacementDpEvent(N, m, Gaussian(z))`; they are read
    back as `Gaussian(z / 2)` inside, what they released.

    Args:
      text: What `to_json` wrote.

    Returns:
      The ledger, its recorded events restored.
    """
    d = json.loads(text)
    ledger = cls(Sampling.from_dict(d['sampling']), d['delta'])
    ledger._events = [event_from_dict(e) for e in d['events']]
    if d.get('version', 1) < 2:
      ledger._events = [
        attr.evolve(e, event=replace_one_event(e.event))
        if isinstance(e, dp_accounting.SampledWithoutReplacementDpEvent)
        else e
        for e in ledger._events
      ]
    return ledger


def epsilon_of(
  event: dp_accounting.DpEvent, sampling: Sampling, delta: float
) -> tuple[float, float]:
  """(RDP epsilon, PLD epsilon) of an already-sampled event at `delta`.

  Infinite for both if any part of `event` is a `NonPrivateDpEvent`.

  Args:
    event: The composed, sampled event (e.g. `PrivacyLedger.composed_event`).
    sampling: The sampling it ran under (picks the neighbouring relation).
    delta: In (0, 1).

  Returns:
    `(epsilon_rdp, epsilon_pld)`; the PLD value is NaN where the PLD
    accountant is unavailable (`pld_unavailable_reason`).

  Raises:
    dp_accounting.UnsupportedEventError: If the RDP accountant does not
      support `event`.
  """
  if _has_non_private(event):
    return math.inf, math.inf
  accountant = sampling.rdp_accountant()
  if not accountant.supports(event):
    raise dp_accounting.UnsupportedEventError(
      f'The RDP accountant does not support {event}.'
    )
  eps_rdp = accountant.compose(event).get_epsilon(delta)
  eps_pld = math.nan
  accountant = sampling.pld_accountant()
  if accountant is not None and accountant.supports(event):
    eps_pld = accountant.compose(event).get_epsilon(delta)
  return float(eps_rdp), float(eps_pld)


def pld_unavailable_reason(
  event: dp_accounting.DpEvent, sampling: Sampling
) -> Optional[str]:
  """Why `epsilon_of` gives no PLD epsilon for `event`; None if it does.

  Args:
    event: The composed, sampled event.
    sampling: The sampling it ran under.

  Returns:
    A sentence naming the reason, or None where the PLD epsilon is computed
    (or the event is non-private: both epsilons are then infinite).
  """
  if _has_non_private(event):
    return None
  if _contains(event, CURVE_EVENTS):
    return (
      'The round event (DiscreteGaussianSumDpEvent, DDGauss) is known only '
      'by an upper bound on its RDP curve (Kairouz et al. 2021, Prop. 14); '
      'no privacy loss distribution follows from an RDP bound, so only the '
      'RDP epsilon is sound.'
    )
  accountant = sampling.pld_accountant()
  if accountant is None:
    return (
      "dp_accounting's PLD accountant does not support "
      'SampledWithoutReplacementDpEvent (fixed-size sampling); the RDP '
      'epsilon is the guarantee.'
    )
  if not accountant.supports(event):
    return f"dp_accounting's PLD accountant does not support {event}."
  return None


def _contains(event: dp_accounting.DpEvent, types) -> bool:
  """Whether `event` or an event nested in it is an instance of `types`."""
  if isinstance(event, types):
    return True
  for field in attr.fields(type(event)):
    value = getattr(event, field.name)
    values = value if isinstance(value, (list, tuple)) else [value]
    if any(
      isinstance(v, dp_accounting.DpEvent) and _contains(v, types)
      for v in values
    ):
      return True
  return False


def _has_non_private(event: dp_accounting.DpEvent) -> bool:
  return _contains(event, dp_accounting.NonPrivateDpEvent)


def calibrate_noise_multiplier(
  target_epsilon: float,
  delta: float,
  rounds: int,
  sampling: Sampling,
  *,
  round_event_fn: Callable[[float], dp_accounting.DpEvent] = (
    dp_accounting.GaussianDpEvent
  ),
  accountant: str = 'rdp',
) -> float:
  """Smallest noise multiplier whose `rounds` rounds meet (epsilon, delta).

  Each round's event is `round_event_fn(z)`, and the run's `rounds` of them
  under `sampling` are `sampling.run_event` (self-composed, or for the
  cyclic modes one correlated-noise mechanism); dp_accounting's
  `calibrate_dp_mechanism` searches z to a tolerance of 1e-4.

  Args:
    target_epsilon: Target epsilon, finite and > 0.
    delta: Target delta, in (0, 1).
    rounds: Number of rounds, an integer >= 1.
    sampling: The client sampling.
    round_event_fn: Maps the noise multiplier to one round's (unsampled)
      event, e.g. two Gaussians for a two-phase mechanism.
    accountant: 'rdp' or 'pld' (PLD needs Poisson sampling and an event
      with a PLD: not DDGauss's, `pld_unavailable_reason`).

  Returns:
    The noise multiplier z (noise stddev over the clip) at which the
    chosen accountant's epsilon is at most `target_epsilon`.

  Raises:
    ValueError: On bad arguments, for `accountant='pld'` with fixed-size
      sampling or an event the PLD accountant cannot state, or if the PLD
      search finds no bracket.
  """
  _check_calibration_args(target_epsilon, delta, rounds, sampling, accountant)

  def event_fn(z):
    return sampling.run_event(round_event_fn(z), rounds)

  if accountant == 'pld':
    reason = pld_unavailable_reason(event_fn(1.0), sampling)
    if reason is not None:
      raise ValueError(
        f"accountant='pld' cannot calibrate this round event: {reason} Use "
        "accountant='rdp'."
      )

  return calibrate_event(
    event_fn,
    target_epsilon,
    delta,
    accountant,
    sampling.rdp_accountant,
    sampling.pld_accountant,
  )


def calibrate_event(
  event_fn: Callable[[float], dp_accounting.DpEvent],
  target_epsilon: float,
  delta: float,
  accountant: str,
  make_rdp: Callable[[], rdp.RdpAccountant],
  make_pld: Callable[[], pld.PLDAccountant],
) -> float:
  """The smallest z with `event_fn(z)` within (target_epsilon, delta):
  dp_accounting's search to 1e-4 with `make_rdp`'s accountant, then, for
  `accountant='pld'`, with `make_pld`'s below the RDP multiplier
  (`calibrate_pld_below`). Arguments checked by the callers."""
  z_rdp = float(
    dp_accounting.calibrate_dp_mechanism(
      make_rdp,
      event_fn,
      target_epsilon,
      delta,
      bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
      tol=1e-4,
    )
  )
  if accountant == 'rdp':
    return z_rdp
  return calibrate_pld_below(event_fn, target_epsilon, delta, make_pld, z_rdp)


def _check_calibration_args(
  target_epsilon, delta, rounds, sampling: Sampling, accountant
) -> None:
  """`calibrate_noise_multiplier`'s argument checks.

  Raises:
    ValueError: Naming the bad argument and its allowed range.
  """
  check_calibration_args(target_epsilon, delta, rounds, accountant)
  if accountant == 'pld' and sampling.mode == 'fixed':
    raise ValueError(
      'The PLD accountant does not support fixed-size sampling; use '
      "accountant='rdp' with fixed-size sampling."
    )


def check_calibration_args(target_epsilon, delta, rounds, accountant) -> None:
  """A calibration's target, delta, rounds and accountant name.

  Raises:
    ValueError: Naming the bad argument and its allowed range.
  """
  if not target_epsilon > 0 or not math.isfinite(target_epsilon):
    raise ValueError(
      f'target_epsilon must be a finite number > 0. Found {target_epsilon!r}.'
    )
  if not 0 < delta < 1:
    raise ValueError(f'delta must be in (0, 1). Found {delta!r}.')
  if not isinstance(rounds, int) or rounds < 1:
    raise ValueError(f'rounds must be an integer >= 1. Found {rounds!r}.')
  if accountant not in ('rdp', 'pld'):
    raise ValueError(
      f"accountant must be 'rdp' or 'pld'. Found {accountant!r}."
    )


def calibrate_pld_below(
  event_fn: Callable[[float], dp_accounting.DpEvent],
  target_epsilon: float,
  delta: float,
  make_accountant: Callable[[], pld.PLDAccountant],
  z_rdp: float,
) -> float:
  """The PLD accountant's multiplier, searched below the RDP one `z_rdp`.

  Raises:
    ValueError: If no bracket is found within six halvings of `z_rdp`.
  """
  # PLD is tighter than RDP, so its multiplier is below z_rdp. Search a
  # bracket below it: PLDs of very small multipliers exhaust memory.
  upper = z_rdp
  for _ in range(6):
    lower = upper / 2
    eps_lower = make_accountant().compose(event_fn(lower)).get_epsilon(delta)
    if eps_lower > target_epsilon:
      return float(
        dp_accounting.calibrate_dp_mechanism(
          make_accountant,
          event_fn,
          target_epsilon,
          delta,
          bracket_interval=dp_accounting.ExplicitBracketInterval(lower, upper),
          tol=1e-4,
        )
      )
    upper = lower
  raise ValueError('PLD calibration found no bracket; use the RDP accountant.')


def pld_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
  """Epsilon at `delta` of an (already sampled) event by a PLD accountant.

  Args:
    event: An event the PLD accountant supports.
    delta: In (0, 1).

  Returns:
    dp_accounting's PLD epsilon.
  """
  return float(pld.PLDAccountant().compose(event).get_epsilon(delta))
