"""The training methods `python -m tff_dp.run --method=...` can run.

Each technique family's module below holds its options (one typed
dataclass, `options.Options`, whose fields are its flags) and registers its
`registry.Method` entries; importing it is the one registry line a new
technique adds here (docs/architecture.md, "Adding a technique").
"""

from tff_dp.methods import registry
from tff_dp.methods.registry import client_angle_metrics_fn  # noqa: F401
from tff_dp.methods.registry import client_metrics_fn  # noqa: F401
from tff_dp.methods.registry import Method  # noqa: F401
from tff_dp.methods.registry import MethodParams  # noqa: F401
from tff_dp.methods.registry import METHODS  # noqa: F401
from tff_dp.methods.registry import option_fields  # noqa: F401
from tff_dp.methods.registry import register  # noqa: F401

# The registry: one line per technique family.
from tff_dp.methods import dp_fedavg  # noqa: F401,E402
from tff_dp.methods import ddgauss  # noqa: F401,E402
from tff_dp.methods import dp_randagg  # noqa: F401,E402
from tff_dp.methods import blur_lus  # noqa: F401,E402
from tff_dp.methods import top_k  # noqa: F401,E402
from tff_dp.methods import sketching  # noqa: F401,E402
from tff_dp.methods import low_rank  # noqa: F401,E402
from tff_dp.methods import clipping  # noqa: F401,E402

# Every setting's legacy value (the run settings' and the options'
# `legacy=`): what a saved config without the key ran with.
LEGACY_DEFAULTS = registry.legacy_defaults()
# The methods that take --clip_from_public_round (Kerkouche et al. 2021's
# clip rule).
PUBLIC_ROUND_CLIP_METHODS = tuple(
  name for name, m in METHODS.items() if m.public_round_clip
)
