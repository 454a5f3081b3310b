"""Refuses a `--noise_seed` reused for another configuration.

Two runs that share a noise seed draw the same noise. If their
configurations differ (another noise multiplier, clip, cohort or data), the
difference of their releases cancels the noise and recovers clients'
updates exactly, whatever epsilon each run reports. A given noise seed must
therefore be secret and unique.

`check_and_register(output_dir, config)` keeps a registry file,
`REGISTRY_NAME`, in the output tree (the parent of `--root_output_dir`),
beside the run folders and never inside one. Before a run starts it reads
the registry there and in every folder above, and raises `ValueError` if the
seed was registered for a different configuration (what a round releases
depends on, the data folder included; where and how fast it runs does not
count) by any run folder, this one included (a folder deleted and rerun
with other settings may have been published before). The same
configuration again, in this folder (a resume) or elsewhere (a rerun,
whose releases are identical), is allowed; a setting added to tff-dp after
an entry was registered counts at the value that run had
(`experiment_config.with_settings_added_since`). Runs in sibling trees, or
below this one, are not seen: keep one output tree per project. The
check and the registration hold a lock on the tree. The registry stores a
salted PBKDF2 digest of the seed, not the seed; a small seed can still be
found from it by trying every value, so the registry is as secret as the
seed (a large random seed, e.g. `secrets.randbits(63)`, cannot be).

`TFF_DP_NOISE_SEED_TREE_TOP`, when set to a folder, bounds the upward
search: folders above it are not read. The test suite sets it to its own
temporary root, so a registry that a run left in `/tmp` cannot reach it.
"""

import fcntl
import hashlib
import json
import os
import pathlib
import secrets
import tempfile
from typing import Any, Optional

from tff_dp.job import experiment_config

REGISTRY_NAME = '.tff_dp_noise_seeds.json'
# The highest folder whose registry is read (unset: up to the root).
TREE_TOP_ENV = 'TFF_DP_NOISE_SEED_TREE_TOP'

# Settings that do not change what a round releases.
_NOT_RELEASE_RELEVANT = experiment_config.EXECUTION_ONLY + (
  'output_dir',
  'device',
  'eval_every',
  'checkpoint_every',
  'release_non_private_metrics',
  'update_diagnostics',
  'noise_seed',
)
_ITERATIONS = 200_000


def release_settings(config_dict: dict[str, Any]) -> dict[str, Any]:
  """The settings of `config.to_dict()` that shape what a round releases."""
  return {
    k: v for k, v in config_dict.items() if k not in _NOT_RELEASE_RELEVANT
  }


def _as_today(settings: dict[str, Any]) -> dict[str, Any]:
  """A registered entry's settings with every setting added since it was
  registered filled in as its run had it (a resume of a run started before
  a setting existed is the same configuration, not another)."""
  if 'method' not in settings:
    return settings
  return release_settings(experiment_config.with_settings_added_since(settings))


def _digest(seed: int, salt: str) -> str:
  return hashlib.pbkdf2_hmac(
    'sha256', str(int(seed)).encode(), bytes.fromhex(salt), _ITERATIONS
  ).hex()


def _read(path: pathlib.Path) -> dict[str, Any]:
  try:
    data = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise ValueError(
      f'Noise-seed registry {path} is unreadable ({e}); fix or remove it.'
    ) from e
  if not isinstance(data, dict) or 'salt' not in data:
    raise ValueError(f'Noise-seed registry {path} has no salt; remove it.')
  data.setdefault('runs', [])
  return data


def _registries(tree: pathlib.Path) -> list[pathlib.Path]:
  """Registries in `tree` and every folder above it, up to
  `$TFF_DP_NOISE_SEED_TREE_TOP` where that holds `tree`."""
  tree = tree.resolve()
  folders = (tree, *tree.parents)
  top = os.environ.get(TREE_TOP_ENV, '').strip()
  if top:
    top_dir = pathlib.Path(top).resolve()
    if top_dir in folders:
      folders = folders[: folders.index(top_dir) + 1]
  return [d / REGISTRY_NAME for d in folders if (d / REGISTRY_NAME).is_file()]


def check_and_register(
  output_dir: Optional[pathlib.Path],
  noise_seed: Optional[int],
  config_dict: dict[str, Any],
  *,
  allow_reuse: bool = False,
) -> Optional[str]:
  """Raises if `noise_seed` was used for another configuration; registers it.

  Args:
    output_dir: The run's folder (None: nothing is written, nothing checked).
    noise_seed: The run's `--noise_seed` (None: secret, nothing to check).
    config_dict: The run's `ExperimentConfig.to_dict()`.
    allow_reuse: Research only: warn-free pass for a reused seed (the
      caller records that the guarantee does not hold).

  Returns:
    None, or (with `allow_reuse`) the folder that used the seed for a
    different configuration.

  Raises:
    ValueError: If the seed was registered for a different configuration
      by another run folder, naming it and the settings that differ.
  """
  if output_dir is None or noise_seed is None:
    return None
  output_dir = pathlib.Path(output_dir).resolve()
  output_dir.parent.mkdir(parents=True, exist_ok=True)
  # One check-and-register at a time in this tree (two runs started at once
  # would otherwise both pass, and one entry would be lost).
  with open(output_dir.parent / (REGISTRY_NAME + '.lock'), 'a') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      return _check_and_register(
        output_dir, noise_seed, config_dict, allow_reuse
      )
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _check_and_register(output_dir, noise_seed, config_dict, allow_reuse):
  mine = json.loads(json.dumps(release_settings(config_dict)))
  ours = _as_today(mine)
  clash = None
  for path in _registries(output_dir.parent):
    data = _read(path)
    digest = _digest(noise_seed, data['salt'])
    for run in data['runs']:
      if run['digest'] != digest:
        continue
      other = (path.parent / run['run']).resolve()
      theirs = _as_today(run['settings'])
      if theirs == ours:
        continue
      diff = sorted(
        k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)
      )
      clash = other
      if not allow_reuse:
        raise experiment_config.ConfigError(
          f'--noise_seed was already used in {other} for a different '
          f'configuration (differs in: {", ".join(diff)}). Two runs with '
          'one noise seed let anyone who sees both subtract the noise. '
          'Choose another secret seed (python -c "import secrets; '
          'print(secrets.randbits(63))"), or pass --allow_noise_seed_reuse '
          'for a research run whose guarantee then does not hold.'
        )
  _register(output_dir, noise_seed, mine)
  return None if clash is None else str(clash)


def _register(
  output_dir: pathlib.Path, noise_seed: int, settings: dict[str, Any]
) -> None:
  path = output_dir.parent / REGISTRY_NAME
  data = _read(path) if path.is_file() else {'salt': secrets.token_hex(16)}
  data.setdefault('runs', [])
  digest = _digest(noise_seed, data['salt'])
  entry = {'run': output_dir.name, 'digest': digest, 'settings': settings}
  # Every configuration a folder ran with stays registered (a folder
  # deleted and rerun differently may have been published before).
  data['runs'] = [r for r in data['runs'] if r != entry] + [entry]
  with tempfile.NamedTemporaryFile(
    'w', dir=path.parent, delete=False, prefix=f'.{path.name}'
  ) as f:
    json.dump(data, f, indent=1)
  os.replace(f.name, path)
