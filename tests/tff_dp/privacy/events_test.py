"""DP events: Gaussian merges, named tuples, and the merged noise of
DPSFL-AC's sketch and bit."""

import dp_accounting
from dp_accounting import rdp
import pytest

from tff_dp import privacy

G = dp_accounting.GaussianDpEvent


def test_merged_gaussians_equal_composed_under_rdp():
  """Two Gaussian releases on one cohort == one Gaussian, 1/z^2 = sum."""
  z1, z2 = 1.3, 2.1
  merged = privacy.merge_gaussians(
    dp_accounting.ComposedDpEvent([G(z1), G(z2)])
  )
  assert merged.noise_multiplier == pytest.approx((z1**-2 + z2**-2) ** -0.5)
  q = 0.05
  composed = dp_accounting.PoissonSampledDpEvent(
    q, dp_accounting.ComposedDpEvent([G(z1), G(z2)])
  )
  single = dp_accounting.PoissonSampledDpEvent(q, merged)
  a = rdp.RdpAccountant().compose(composed, 50).get_epsilon(1e-5)
  b = rdp.RdpAccountant().compose(single, 50).get_epsilon(1e-5)
  assert a == pytest.approx(b, rel=1e-6)


def test_merge_leaves_other_events():
  lap = dp_accounting.LaplaceDpEvent(1.0)
  assert privacy.merge_gaussians(lap) is lap
  mixed = dp_accounting.ComposedDpEvent([G(1.0), lap])
  assert privacy.merge_gaussians(mixed) is mixed
  assert isinstance(
    privacy.merge_gaussians(dp_accounting.NoOpDpEvent()),
    dp_accounting.NoOpDpEvent,
  )


def test_event_from_named_tuple():
  event = dp_accounting.ComposedDpEvent([G(1.5), G(2.5)])
  assert privacy.event_from_named_tuple(event.to_named_tuple()) == event
