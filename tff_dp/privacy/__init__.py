"""Privacy accounting: the DP events that actually ran, and their epsilon.

Laid out like dp_accounting, one abstraction a module: `events`
(serialisation, merges, checks), `sampling` (how a run samples its
clients, and the event that wraps a round in it), `correlated` (noise
correlated across rounds: participation, sensitivity, events),
`accountants` (subsampled RDP curves, the RDP and PLD accountants),
`calibration` (every `calibrate_*`, the band choice) and `ledger` (the
run's record). Their public names are also this package's (as in
tff-dp 0.1's `tff_dp.privacy` module).

May import: `tff_dp.aggregators` (the events they release).


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

`sampling`'s docstring says how each sampling is accounted: Poisson
under add/remove-one; fixed-size under replace-one, its Gaussian recorded
at half the multiplier, with no PLD.

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

from tff_dp.privacy import accountants
from tff_dp.privacy import calibration
from tff_dp.privacy import correlated
from tff_dp.privacy import events
from tff_dp.privacy import ledger
from tff_dp.privacy import sampling
from tff_dp.privacy.events import CURVE_EVENTS
from tff_dp.privacy.events import PUBLIC_COUNT_EVENTS
from tff_dp.privacy.events import event_to_dict
from tff_dp.privacy.events import event_from_dict
from tff_dp.privacy.events import event_from_named_tuple
from tff_dp.privacy.events import merge_gaussians
from tff_dp.privacy.events import gaussian_shares
from tff_dp.privacy.events import replace_one_event
from tff_dp.privacy.events import check_event
from tff_dp.privacy.correlated import Participation
from tff_dp.privacy.correlated import group_rate
from tff_dp.privacy.correlated import mf_sensitivity
from tff_dp.privacy.correlated import mf_run_event
from tff_dp.privacy.correlated import correlated_round
from tff_dp.privacy.sampling import SAMPLING_MODES
from tff_dp.privacy.sampling import CYCLIC_MODES
from tff_dp.privacy.sampling import PARTITIONS
from tff_dp.privacy.sampling import POISSON_COUNT_ASSUMPTION
from tff_dp.privacy.sampling import FIXED_COUNT_ASSUMPTION
from tff_dp.privacy.sampling import Sampling
from tff_dp.privacy.accountants import subsampled_rdp
from tff_dp.privacy.accountants import PldAccountant
from tff_dp.privacy.accountants import RdpAccountant
from tff_dp.privacy.ledger import LEDGER_VERSION
from tff_dp.privacy.ledger import PrivacyLedger
from tff_dp.privacy.ledger import epsilon_of
from tff_dp.privacy.ledger import pld_unavailable_reason
from tff_dp.privacy.ledger import pld_epsilon
from tff_dp.privacy.calibration import calibrate_noise_multiplier
from tff_dp.privacy.calibration import calibrate_event
from tff_dp.privacy.calibration import check_calibration_args
from tff_dp.privacy.calibration import calibrate_pld_below

__all__ = [
  'CURVE_EVENTS',
  'CYCLIC_MODES',
  'FIXED_COUNT_ASSUMPTION',
  'LEDGER_VERSION',
  'PARTITIONS',
  'POISSON_COUNT_ASSUMPTION',
  'PUBLIC_COUNT_EVENTS',
  'Participation',
  'PldAccountant',
  'PrivacyLedger',
  'RdpAccountant',
  'SAMPLING_MODES',
  'Sampling',
  'accountants',
  'calibrate_event',
  'calibrate_noise_multiplier',
  'calibrate_pld_below',
  'calibration',
  'check_calibration_args',
  'check_event',
  'correlated',
  'correlated_round',
  'epsilon_of',
  'event_from_dict',
  'event_from_named_tuple',
  'event_to_dict',
  'events',
  'gaussian_shares',
  'group_rate',
  'ledger',
  'merge_gaussians',
  'mf_run_event',
  'mf_sensitivity',
  'pld_epsilon',
  'pld_unavailable_reason',
  'replace_one_event',
  'sampling',
  'subsampled_rdp',
]
