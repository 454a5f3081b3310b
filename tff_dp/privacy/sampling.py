"""How a run samples its clients (`Sampling`), and the event that wraps a
round's release in that sampling (`Sampling.round_event`).

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
"""

import dataclasses
from typing import Any, Optional

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp

from tff_dp.aggregators import correlated_noise
from tff_dp.privacy import accountants
from tff_dp.privacy import correlated
from tff_dp.privacy import events


SAMPLING_MODES = ('poisson', 'fixed', 'cyclic_poisson', 'cyclic')


# Clients split into fixed groups, round t drawing from group t mod groups:
# the participation schemas of noise correlated across rounds
# (`correlated`).
CYCLIC_MODES = ('cyclic_poisson', 'cyclic')


# How the cyclic modes deal clients into groups (`tff_dp.job.cohorts.partition`)
# and the neighbouring relation each supports: a client's group a function
# of its own id alone (add/remove one client), or of a permutation of the
# whole population (zero-out one client, the population fixed).
PARTITIONS = ('by_client_id', 'balanced')


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


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How clients are sampled each round.

  Attributes:
    mode: 'poisson' (each client with probability `rate`), 'fixed'
      (`clients_per_round` uniformly without replacement), or one of the
      cyclic modes, where the clients are split into `groups` fixed groups
      (by a public seed: `tff_dp.job.cohorts.partition`) and round t draws
      each member of group (t - 1) mod `groups` with probability `rate`:
      'cyclic_poisson' accounts that Poisson draw (amplified banded MF),
      'cyclic' does not (min-separation: a client joins at most one round
      in `groups`, nothing more is assumed). Both are accounted by
      `correlated`, with noise independent across rounds or
      correlated (`MatrixFactorizationDpEvent`).
    num_clients: Size of the client population N.
    rate: Poisson sampling probability q in (0, 1] (mode 'poisson'); the
      within-group probability (cyclic modes).
    clients_per_round: Cohort size m in [1, N] (mode 'fixed').
    groups: The number of groups b, in [1, N] (cyclic modes).
    partition: How the cyclic modes deal the clients into groups, one of
      `PARTITIONS` (`tff_dp.job.cohorts.partition`). 'by_client_id': a
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
      return 'replace one client (fixed-size sampling; sensitivity 2 x clip)'
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
    """The cyclic modes' `correlated.Participation`.

    Raises:
      ValueError: For a mode that is not cyclic.
    """
    if not self.cyclic:
      raise ValueError(f'Sampling mode {self.mode!r} is not cyclic.')
    rate = self.rate if self.mode == 'cyclic_poisson' else None
    return correlated.Participation(self.groups, rate)

  def run_event(
    self, event: dp_accounting.DpEvent, rounds: int
  ) -> dp_accounting.DpEvent:
    """The event of `rounds` rounds that each released `event`.

    Poisson and fixed-size sampling: `SelfComposedDpEvent(wrap(event),
    rounds)`. Cyclic modes: the whole run's event (`correlated.
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
    strategy, z = correlated.correlated_round(round_event)
    if z == 0:
      return dp_accounting.NonPrivateDpEvent()
    return correlated.mf_run_event(strategy, z, rounds, self.participation())

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
      if events.contains(event, correlated_noise.MatrixFactorizationDpEvent):
        raise dp_accounting.UnsupportedEventError(
          'Noise correlated across rounds (MatrixFactorizationDpEvent) is '
          'one mechanism over the whole run, not independent rounds: it '
          "needs a cyclic participation schema ('cyclic_poisson', or "
          "'cyclic' for min-separation; groups 1 allows any pattern). "
          f'Found sampling mode {self.mode!r}.'
        )
      return self.wrap(event)
    events.check_event(event)
    event = events.merge_gaussians(event)
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
    events.check_event(event)
    event = events.merge_gaussians(event)
    if isinstance(
      event, (dp_accounting.NoOpDpEvent, dp_accounting.NonPrivateDpEvent)
    ):
      return event
    if self.mode == 'poisson':
      return dp_accounting.PoissonSampledDpEvent(self.rate, event)
    return dp_accounting.SampledWithoutReplacementDpEvent(
      self.num_clients, self.clients_per_round, events.replace_one_event(event)
    )

  def rdp_accountant(self) -> rdp.RdpAccountant:
    """dp_accounting's RDP accountant for this relation, with `CURVE_EVENTS`."""
    relation = (
      dp_accounting.NeighboringRelation.REPLACE_ONE
      if self.mode == 'fixed'
      else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    return accountants.RdpAccountant(neighboring_relation=relation)

  def pld_accountant(self) -> Optional[pld.PLDAccountant]:
    """dp_accounting's PLD accountant (add/remove-one); None for fixed."""
    if self.mode == 'fixed':
      return None
    return accountants.PldAccountant()

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
