"""The federated training loop behind `python -m tff_dp.run` (flag-free).

`run_experiment(config)`:
  1. validates the config and the output directory (before any data loads);
  2. loads the task, samples clients (Poisson or fixed-size, seeded),
     calibrates the noise to a target epsilon if asked;
  3. builds the method's learning process and runs it in TFF's C++ test
     context (secure sum simulated);
  4. after every round records the DP event that ran in the privacy ledger,
     evaluates, counts bytes, and appends a row to `metrics.csv` and
     TensorBoard; every `checkpoint_every` rounds saves the learning state
     with the ledger, the sampler's RNG state and the rows
     (`tff.program.FileProgramStateManager`);
  5. writes `summary.json` with every flag and the final results, and the
     final model weights to `final_model_weights.npz`.

A rerun of the same command in the same output directory resumes from the
last checkpoint, ledger and RNG included, so epsilon never resets and the
result equals an uninterrupted run.

Randomness: `seed` drives only public randomness (model initialisation,
sketch hashes, DP-RandAgg and FL-BASIC coordinates, CMP-Fed's V_0). The
privacy-relevant randomness, the DP noise and the client sampler (with the
local shuffles it seeds), comes from `noise_seed`: None (the default) draws
it from OS entropy, and it then lives only in the checkpointed server state,
never in config.json, summary.json, metrics.csv, TensorBoard or the logs.
An int `noise_seed` makes the run reproducible; the guarantee then assumes
that seed is kept secret (the summary says so).
"""

import csv
import dataclasses
import json
import math
import os
import pathlib
import tempfile
import time
from typing import Any, Callable, Optional

import asyncio
import concurrent.futures

from absl import logging
import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import composition
from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import count_sketch
from tff_dp.aggregators import ddgauss
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl
from tff_dp.aggregators import finite_guard
from tff_dp.client_works import diagnostics
from tff_dp import contexts
from tff_dp import distributed
from tff_dp import fusion
from tff_dp import methods as methods_lib
from tff_dp import privacy
from tff_dp import processes
from tff_dp import public_data
from tff_dp import tasks as tasks_lib

CHECKPOINT_PREFIX = 'round_'
DIAGNOSTICS_FILE = 'diagnostics.jsonl'  # Per-round update histograms.


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """Everything a run depends on; recorded in `summary.json`.

  Sampling: `client_sampling_rate` (Poisson, each client with probability
  q) or `clients_per_round` (fixed-size, uniform without replacement); if
  neither is set, 10 clients are expected per round (Poisson for private
  methods, fixed-size otherwise). Noise (private methods):
  `noise_multiplier`, or `target_epsilon` with `delta` to calibrate it.
  """

  task: str = 'fashion_mnist_iid'
  method: str = 'dp_fedavg'
  rounds: int = 10
  client_sampling_rate: Optional[float] = None
  clients_per_round: Optional[int] = None
  noise_multiplier: Optional[float] = None
  target_epsilon: Optional[float] = None
  delta: Optional[float] = None
  accountant: str = 'rdp'
  clip: float = 1.0
  target_unclipped_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  ddgauss_bits: int = 20
  # DDGauss: smallest cohort whose round is released (None: the cohort m
  # under fixed-size sampling, the 1% quantile of Binomial(N, q) under
  # Poisson sampling; see `tff_dp.aggregators.ddgauss`).
  ddgauss_min_clients: Optional[int] = None
  randagg_fraction: float = 0.01
  # DP-RandAgg: clip the whole update (seed 001) or only the k-vector
  # ('payload', runs before issue #24; methods.LEGACY_DEFAULTS).
  randagg_clip_scope: str = 'update'
  blur_lambda: float = 0.4
  lus_sparsity: float = 0.7
  top_k_ratio: float = 0.005
  # Non-private FL-TOP/FL-BASIC clip at `clip` as before #24 (the paper's
  # Alg. 1 does not clip; methods.LEGACY_DEFAULTS).
  top_k_nonprivate_clip: bool = False
  # FL-TOP's public batch on image tasks: 10 random EMNIST digits from
  # `seed`, or the first of each class (before #24; public_data.MODES).
  public_batch: str = 'random'
  # Seed 004's clip rule: --clip is replaced by the update norm of one local
  # round on the public batch (methods.PUBLIC_ROUND_CLIP_METHODS).
  clip_from_public_round: bool = False
  sketch_rows: int = 5
  # k / columns = 0.1: a count sketch recovers only coordinates well above
  # ||g|| / sqrt(columns); the seed-002 study diverged at k / columns = 0.5
  # (defaults before issue #24: 20,000 and 5,000).
  sketch_columns: int = 100_000
  sketch_k: int = 10_000
  sketch_momentum: float = 0.9
  sketch_hashing: str = 'murmur'
  # The error-feedback step in sketch space (FetchSGD's lr; the server lr
  # must stay 1). With sketch momentum rho the steady step is lr / (1 - rho).
  sketch_lr: float = 1.0
  dpsfl_target_probability: float = 0.5
  dpsfl_impact_threshold: float = 0.1
  # None: expected clients per round / 20 (Andrew et al.; see dpsfl).
  dpsfl_bit_noise: Optional[float] = None
  dpsfl_clip_lr: float = 0.2
  # DPSFL-AC's clipping-impact test (dpsfl.IMPACT_RULES); 'absolute' before
  # issue #24 (methods.LEGACY_DEFAULTS).
  dpsfl_impact_rule: str = 'relative'
  cmp_rank: int = 4
  cmp_clip_u: Optional[float] = None
  cmp_clip_v: Optional[float] = None
  # CMP-Fed/UV-Fed: U on the output side and the vectors in the V phase
  # ('in_out' and 'u' before issue #24; methods.LEGACY_DEFAULTS).
  cmp_layout: str = 'out_in'
  cmp_vectors_phase: str = 'v'
  batch_size: int = 10
  local_epochs: int = 1
  local_steps: Optional[int] = None
  client_lr: float = 0.05
  client_momentum: float = 0.0
  # Seed 001: the local lr "decays at a rate of 0.99 at each round"; 1: none.
  client_lr_decay: float = 1.0
  server_lr: float = 1.0
  server_momentum: float = 0.0
  seed: int = 0
  # None: noise and sampling from OS entropy (secret); see the docstring.
  noise_seed: Optional[int] = None
  # How --clip was chosen, if from client data outside the ledger (recorded
  # in the summary's privacy section), e.g. 'clip_from_fedavg'.
  clip_source: Optional[str] = None
  eval_every: int = 1
  checkpoint_every: int = 10
  max_concurrent_computation_calls: int = 3
  intra_op_threads: int = 1
  inter_op_threads: int = 4
  device: Optional[str] = None
  data_dir: Optional[str] = None
  output_dir: Optional[str] = None
  task_kwargs: tuple[tuple[str, Any], ...] = ()
  update_diagnostics: bool = True
  workers: Optional[str] = None
  local_workers: int = 0
  # Compile the round through MapReduceForm: one TF call per client
  # (`tff_dp.fusion`; bit-identical results, falls back when not possible).
  fuse_client_work: bool = False

  def validate(self) -> None:
    """Raises ValueError naming the bad value and its allowed range."""
    if self.task not in tasks_lib.TASKS:
      raise ValueError(
        f'Unknown task {self.task!r}; choose one of '
        f'{sorted(tasks_lib.TASKS)}.'
      )
    if self.method not in methods_lib.METHODS:
      raise ValueError(
        f'Unknown method {self.method!r}; choose one of '
        f'{sorted(methods_lib.METHODS)}.'
      )
    for name in (
      'rounds',
      'batch_size',
      'local_epochs',
      'eval_every',
      'checkpoint_every',
    ):
      _check_int(name, getattr(self, name), 1)
    if self.local_steps is not None:
      _check_int('local_steps', self.local_steps, 1)
    _check_int('seed', self.seed, 0)
    if self.noise_seed is not None:
      _check_int('noise_seed', self.noise_seed, 0)
    if self.client_sampling_rate is not None:
      if self.clients_per_round is not None:
        raise ValueError(
          'Set client_sampling_rate (Poisson sampling) or '
          'clients_per_round (fixed-size), not both.'
        )
      q = self.client_sampling_rate
      if not (isinstance(q, (int, float)) and 0 < q <= 1):
        raise ValueError(
          f'client_sampling_rate must be in (0, 1]. Found {q!r}.'
        )
    if self.clients_per_round is not None:
      _check_int('clients_per_round', self.clients_per_round, 1)
    if self.ddgauss_min_clients is not None:
      _check_int('ddgauss_min_clients', self.ddgauss_min_clients, 2)
    for name in ('client_lr', 'server_lr', 'clip', 'sketch_lr'):
      _check_float(name, getattr(self, name), positive=True)
    d = self.client_lr_decay
    if not (isinstance(d, (int, float)) and 0 < d <= 1):
      raise ValueError(f'client_lr_decay must be in (0, 1]. Found {d!r}.')
    for name in ('client_momentum', 'server_momentum'):
      v = getattr(self, name)
      if not 0 <= v < 1:
        raise ValueError(f'{name} must be in [0, 1). Found {v!r}.')
    if self.noise_multiplier is not None:
      _check_float('noise_multiplier', self.noise_multiplier, positive=False)
      if self.target_epsilon is not None:
        raise ValueError('Set noise_multiplier or target_epsilon, not both.')
    if self.target_epsilon is not None:
      _check_float('target_epsilon', self.target_epsilon, positive=True)
      if self.delta is None:
        raise ValueError('target_epsilon needs delta: set --delta in (0, 1).')
    if self.delta is not None and not 0 < self.delta < 1:
      raise ValueError(f'delta must be in (0, 1). Found {self.delta!r}.')
    if self.accountant not in ('rdp', 'pld'):
      raise ValueError(
        f"accountant must be 'rdp' or 'pld'. Found {self.accountant!r}."
      )
    if self.max_concurrent_computation_calls == 0 or (
      self.max_concurrent_computation_calls < -1
    ):
      raise ValueError(
        'max_concurrent_computation_calls must be -1 (no cap) or >= 1. '
        f'Found {self.max_concurrent_computation_calls!r}.'
      )
    _check_int('intra_op_threads', self.intra_op_threads, 0)
    _check_int('inter_op_threads', self.inter_op_threads, 0)
    if not 0 < self.randagg_fraction <= 1:
      raise ValueError(
        f'randagg_fraction must be in (0, 1]. Found {self.randagg_fraction!r}.'
      )
    if not (math.isfinite(self.blur_lambda) and self.blur_lambda >= 0):
      raise ValueError(
        f'blur_lambda must be a finite number >= 0. Found {self.blur_lambda!r}.'
      )
    if self.method in ('blur', 'blur_lus') and (
      self.blur_lambda * self.client_lr >= 1
    ):
      # Seed 000, Lemma 2 (plain SGD): the update is pulled to the ball
      # "with lambda < 1/eta_l"; above it a penalty step overshoots the
      # ball's centre. With client momentum the lemma does not apply and
      # only this necessary bound is checked.
      raise ValueError(
        'blur_lambda must be below 1 / client_lr '
        f'({1 / self.client_lr:.6g}; seed 000, Lemma 2). Found '
        f'{self.blur_lambda!r}.'
      )
    if not 0 <= self.lus_sparsity < 1:
      raise ValueError(
        f'lus_sparsity must be in [0, 1). Found {self.lus_sparsity!r}.'
      )
    if not 0 < self.top_k_ratio <= 1:
      raise ValueError(
        f'top_k_ratio must be in (0, 1]. Found {self.top_k_ratio!r}.'
      )
    distributed.parse_workers(self.workers)  # Raises on a bad host:port.
    _check_int('local_workers', self.local_workers, 0)
    for name in ('sketch_rows', 'sketch_columns', 'sketch_k', 'cmp_rank'):
      _check_int(name, getattr(self, name), 1)
    if self.sketch_k > self.sketch_columns:
      raise ValueError(
        f'sketch_k must be at most sketch_columns ({self.sketch_columns}): '
        'a count sketch recovers only coordinates well above '
        f'||g|| / sqrt(columns). Found {self.sketch_k!r}.'
      )
    if self.method in ('fetchsgd', 'dpsfl', 'dpsfl_ac') and (
      self.sketch_k > 0.1 * self.sketch_columns
    ):
      logging.warning(
        'sketch_k / sketch_columns = %.2f > 0.1: FetchSGD diverged at 0.5 in '
        "the seed-002 study (benchmarks/results/seed002_emnist.md's notes).",
        self.sketch_k / self.sketch_columns,
      )
    count_sketch.check_hashing(self.sketch_hashing)
    public_data.check_mode(self.public_batch)
    cmp_fed.check_options(self.cmp_layout, self.cmp_vectors_phase)
    dp_randagg.check_clip_scope(self.randagg_clip_scope)
    if self.clip_from_public_round:
      if self.method not in methods_lib.PUBLIC_ROUND_CLIP_METHODS:
        raise ValueError(
          'clip_from_public_round is for methods '
          f'{methods_lib.PUBLIC_ROUND_CLIP_METHODS}. Found method='
          f'{self.method!r}.'
        )
      if self.clip_source:
        raise ValueError(
          'Set clip_from_public_round or clip_source, not both: the clip '
          f'comes from one place. Found clip_source={self.clip_source!r}.'
        )
    if not 0 <= self.sketch_momentum < 1:
      raise ValueError(
        f'sketch_momentum must be in [0, 1). Found {self.sketch_momentum!r}.'
      )
    if not 0 < self.dpsfl_target_probability < 1:
      raise ValueError(
        'dpsfl_target_probability must be in (0, 1). Found '
        f'{self.dpsfl_target_probability!r}.'
      )
    for name in ('dpsfl_impact_threshold', 'dpsfl_clip_lr'):
      _check_float(name, getattr(self, name), positive=True)
    if self.dpsfl_bit_noise is not None:
      _check_float('dpsfl_bit_noise', self.dpsfl_bit_noise, positive=False)
    dpsfl.AdaptiveClip(
      impact_threshold=self.dpsfl_impact_threshold,
      impact_rule=self.dpsfl_impact_rule,
    ).check()
    for name in ('cmp_clip_u', 'cmp_clip_v'):
      if getattr(self, name) is not None:
        _check_float(name, getattr(self, name), positive=True)
    method = methods_lib.METHODS[self.method]
    method.preflight()
    if (
      method.private
      and self.noise_multiplier is None
      and (self.target_epsilon is None)
    ):
      raise ValueError(
        f'Method {self.method!r} is private: set '
        '--noise_multiplier (>= 0) or --target_epsilon with '
        '--delta.'
      )
    if not 0 < self.target_unclipped_quantile < 1:
      raise ValueError(
        'target_unclipped_quantile must be in (0, 1). Found '
        f'{self.target_unclipped_quantile!r}.'
      )
    _check_int('ddgauss_bits', self.ddgauss_bits, 2)
    if self.ddgauss_bits > 22:  # TFF's DistributedDpSumFactory limit.
      raise ValueError(
        f'ddgauss_bits must be in [2, 22]. Found {self.ddgauss_bits!r}.'
      )

  def to_dict(self) -> dict[str, Any]:
    """The config as written to config.json and summary.json.

    The noise seed's value is never written: only whether it was given.
    """
    d = dataclasses.asdict(self)
    d['task_kwargs'] = dict(self.task_kwargs)
    d['noise_seed'] = noise_seed_status(self.noise_seed)
    return d


def noise_seed_status(noise_seed: Optional[int]) -> str:
  """What the outputs say of the noise seed (never its value)."""
  if noise_seed is None:
    return 'secret: drawn from OS entropy, kept only in the server state'
  return (
    'given by --noise_seed (reproducible): the guarantee assumes this seed '
    'is kept secret'
  )


def _check_int(name, value, minimum):
  if (
    isinstance(value, bool)
    or not isinstance(value, (int, np.integer))
    or (value < minimum)
  ):
    raise ValueError(
      f'{name} must be an integer >= {minimum}. Found {value!r}.'
    )


def _check_float(name, value, *, positive):
  ok = (
    isinstance(value, (int, float))
    and math.isfinite(value)
    and (value > 0 if positive else value >= 0)
  )
  if not ok:
    raise ValueError(
      f'{name} must be a finite number '
      f'{"> 0" if positive else ">= 0"}. Found {value!r}.'
    )


def check_output_dir(path: Optional[str]) -> Optional[pathlib.Path]:
  """Creates `path` and proves it writable, or raises ValueError."""
  if not path:
    return None
  out = pathlib.Path(path)
  try:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out, prefix='.write_test'):
      pass
  except OSError as e:
    raise ValueError(
      f'root_output_dir {str(out)!r} is not writable: {e}. '
      'Choose a directory you can write to.'
    ) from e
  return out


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


def ddgauss_min_clients(sampling: privacy.Sampling) -> int:
  """DDGauss's default cohort lower bound for this sampling.

  Fixed-size sampling of m clients: m. Poisson sampling: the largest k that
  a Binomial(N, q) cohort falls below with probability <= 1% (so at most
  1% of rounds are withheld); never the expected cohort rounded down.
  """
  if sampling.mode == 'fixed':
    return sampling.clients_per_round
  return ddgauss.binomial_min_clients(
    sampling.num_clients, sampling.rate, withhold_prob=0.01
  )


def sample_clients(
  sampling: privacy.Sampling, client_ids: list[str], rng: np.random.Generator
) -> list[str]:
  """Draws one round's cohort (possibly empty under Poisson sampling)."""
  if sampling.mode == 'poisson':
    mask = rng.random(len(client_ids)) < sampling.rate
    return [c for c, m in zip(client_ids, mask) if m]
  idx = rng.choice(len(client_ids), sampling.clients_per_round, replace=False)
  return [client_ids[i] for i in np.sort(idx)]


def find_dp_events(structure) -> list[dp_accounting.DpEvent]:
  """Events kept in (nested) TFF `DPAggregatorState`s of an aggregator state."""
  found = []

  def walk(x):
    if hasattr(x, 'dp_event') and hasattr(x, 'is_init_state'):
      found.append(privacy.event_from_named_tuple(x.dp_event))
      walk(x.agg_state)
      return
    if isinstance(x, dict):
      for v in x.values():
        walk(v)
    elif isinstance(x, (list, tuple)):
      for v in x:
        walk(v)
    elif hasattr(x, '__attrs_attrs__'):
      for f in x.__attrs_attrs__:
        walk(getattr(x, f.name))

  walk(structure)
  return found


def released_event(
  method: methods_lib.Method, params: methods_lib.MethodParams, state, metrics
) -> dp_accounting.DpEvent:
  """The DP event a round released: from the aggregator state, from its
  measurements, or as declared by the method, in that order."""
  if method.event_from_state:
    events = find_dp_events(state.aggregator)
    if not events:
      raise RuntimeError(
        f'Method {method.name!r} declares that its '
        'aggregator state holds a DpEvent; none found.'
      )
    return (
      events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)
    )
  if method.event_from_measurements is not None:
    return method.event_from_measurements(metrics['aggregator'])
  return method.round_event(params.noise_multiplier, params)


def _flatten(prefix: str, value, out: dict) -> None:
  if isinstance(value, dict):
    for k, v in value.items():
      _flatten(f'{prefix}/{k}' if prefix else str(k), v, out)
  elif isinstance(value, (int, float, np.number)) or (
    isinstance(value, np.ndarray) and value.ndim == 0
  ):
    out[prefix] = float(value)


async def load_latest_readable(manager, structure):
  """`(state, version)` of the newest checkpoint that loads, or `(None, 0)`.

  A checkpoint that fails to load (truncated or corrupt files) is logged,
  renamed to `corrupt_<name>` (so its version can be written again) and
  skipped for the one before it.
  """
  versions = await manager.get_versions() or []
  for version in sorted(versions, reverse=True):
    try:
      return await manager.load(version, structure), version
    except Exception as e:  # pylint: disable=broad-except
      path = pathlib.Path(manager._get_path_for_version(version))  # pylint: disable=protected-access
      logging.warning(
        'Checkpoint %s is unreadable (%s: %s); trying the previous one.',
        path,
        type(e).__name__,
        e,
      )
      path.rename(path.with_name(f'corrupt_{path.name}'))
  return None, 0


def _truncate_diagnostics(path: pathlib.Path, last_round: int) -> None:
  """Drops histogram lines of rounds after the restored checkpoint."""
  if not path.exists():
    return
  keep = [
    line
    for line in path.read_text().splitlines()
    if line and json.loads(line)['round'] <= last_round
  ]
  _atomic_write(path, ''.join(line + '\n' for line in keep))


def _atomic_write(path: pathlib.Path, text: str) -> None:
  with tempfile.NamedTemporaryFile(
    'w', dir=path.parent, delete=False, prefix=f'.{path.name}'
  ) as f:
    f.write(text)
  os.replace(f.name, path)


def _write_csv(path: pathlib.Path, rows: list[dict]) -> None:
  first = [
    'round',
    'sampled_clients',
    'train_loss',
    'epsilon_rdp',
    'epsilon_pld',
    'noise_multiplier',
    'clip',
    'bytes_down_per_client',
    'bytes_up_per_client',
    'bytes_down_total',
    'bytes_up_total',
    'round_seconds',
  ]
  keys = {k for r in rows for k in r}
  test = sorted(k for k in keys if k.startswith('test_'))
  rest = sorted(keys - set(first) - set(test))
  columns = [k for k in first if k in keys] + test + rest
  with tempfile.NamedTemporaryFile(
    'w', dir=path.parent, delete=False, prefix=f'.{path.name}', newline=''
  ) as f:
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
  os.replace(f.name, path)


EVAL_BATCH_SIZE = 1000


def test_batches(task: tasks_lib.FederatedTask) -> tf.data.Dataset:
  """The test set in batches of `EVAL_BATCH_SIZE`, built once per run.

  Keras' `evaluate(x, y)` on NumPy arrays copies them into a new dataset
  each call and kept about 30 MB of Python memory per call here (15 calls
  on Fashion-MNIST's test set: 945 -> 1,360 MB); on one dataset reused
  it stays flat (896 -> 909 MB). Same batches, same order, same metrics.
  """
  return tf.data.Dataset.from_tensor_slices((task.test_x, task.test_y)).batch(
    EVAL_BATCH_SIZE
  )


def evaluate(
  task: tasks_lib.FederatedTask,
  model_weights,
  keras_model: tf.keras.Model,
  batches: Optional[tf.data.Dataset] = None,
) -> dict[str, float]:
  """Centralized test metrics of `model_weights` (loss and task metrics).

  Args:
    task: The task (its test set is used unless `batches` is given).
    model_weights: The `tff.learning.models.ModelWeights` to evaluate.
    keras_model: A compiled Keras model of the task's architecture.
    batches: `test_batches(task)`; pass it when evaluating repeatedly.
  """
  model_weights.assign_weights_to(keras_model)
  if batches is None:
    batches = test_batches(task)
  results = keras_model.evaluate(batches, verbose=0, return_dict=True)
  return {f'test_{k}': float(v) for k, v in results.items()}


def _progress_line(row: dict, rounds: int) -> str:
  parts = [
    f'round {row["round"]}/{rounds}',
    f'clients {row["sampled_clients"]}',
    f'train_loss {row.get("train_loss", float("nan")):.4f}',
  ]
  for k in ('test_accuracy', 'test_auroc', 'test_balanced_accuracy'):
    if k in row:
      parts.append(f'{k[5:]} {row[k]:.4f}')
  if 'epsilon_rdp' in row:
    parts.append(
      f'eps_rdp {row["epsilon_rdp"]:.3f} ' f'eps_pld {row["epsilon_pld"]:.3f}'
    )
  parts.append(f'up {row["bytes_up_total"] / 1e6:.1f} MB total')
  parts.append(f'{row["round_seconds"]:.1f}s')
  return ' | '.join(parts)


@dataclasses.dataclass
class _RunnerState:
  """What is checkpointed besides the learning state."""

  round_num: int
  rng_state: dict
  ledger_json: Optional[str]
  rows: list

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self))

  @classmethod
  def from_json(cls, text) -> '_RunnerState':
    if isinstance(text, bytes):
      text = text.decode()
    return cls(**json.loads(text))


def save_checkpoint(manager, state, runner: _RunnerState) -> float:
  """Saves `(state, runner)` as version `runner.round_num`; returns seconds.

  TFF's `FileProgramStateManager` writes a SavedModel whose objects form
  reference cycles that hold the saved tensors, freed only by a full
  collection, rare in a process holding TF's hundreds of thousands of
  objects: saving the seed 001 CNN's state in a loop kept 5-12 MB a save.
  A full collection after the save frees them (about 0.2 s;
  `processes.collect_garbage`, which keeps a stop signal during it from
  being lost). In `make run`'s job it lowered Python's memory by about
  60 MB but not its growth of about 1.6 MB a round (README, "Memory over
  long runs").
  """
  start = time.perf_counter()
  asyncio.run(
    manager.save((state, np.str_(runner.to_json())), runner.round_num)
  )
  processes.collect_garbage()
  return time.perf_counter() - start


@dataclasses.dataclass
class Prepared:
  """A run's task, method, sampling, privacy parameters and process."""

  task: tasks_lib.FederatedTask
  method: methods_lib.Method
  params: methods_lib.MethodParams
  sampling: privacy.Sampling
  delta: Optional[float]
  cost: Any
  process: tff.learning.templates.LearningProcess

  def round_data(
    self, config: 'ExperimentConfig', client_ids: list[str], shuffle_seed: int
  ) -> list:
    """The round's client datasets, preprocessed for local training."""
    preprocess = tasks_lib.client_preprocess_fn(
      config.batch_size,
      num_epochs=config.local_epochs,
      max_steps=config.local_steps,
      seed=shuffle_seed,
    )
    cd = self.task.train_data
    return [preprocess(cd.create_tf_dataset_for_client(c)) for c in client_ids]


def prepare(config: ExperimentConfig) -> Prepared:
  """Loads the task, resolves sampling and noise, builds the process.

  Also installs the execution context. Used by `run_experiment` and by the
  speed benchmark, so both time the same process.
  """
  method = methods_lib.METHODS[config.method]
  task = tasks_lib.load_task(
    config.task,
    config.data_dir,
    model_seed=config.seed,
    **dict(config.task_kwargs),
  )
  client_ids = task.train_data.client_ids
  sampling = sampling_for(config, len(client_ids), method.private)
  num_params = task.num_parameters()
  # Every method hyperparameter is a config field of the same name.
  params = methods_lib.MethodParams.from_config(
    vars(config),
    num_model_params=num_params,
    expected_clients_per_round=sampling.expected_clients_per_round,
  )
  if config.method == 'ddgauss' and params.ddgauss_min_clients is None:
    params = dataclasses.replace(
      params, ddgauss_min_clients=ddgauss_min_clients(sampling)
    )
  delta = None
  if method.private:
    delta = (
      config.delta
      if config.delta is not None
      else min(1e-5, 1.0 / len(client_ids))
    )
    noise = config.noise_multiplier
    if noise is None:
      noise = privacy.calibrate_noise_multiplier(
        config.target_epsilon,
        delta,
        config.rounds,
        sampling,
        round_event_fn=lambda z: method.round_event(z, params),
        accountant=config.accountant,
      )
      logging.info(
        'Calibrated noise multiplier %.4f for (%.3g, %.3g)-DP '
        'over %d rounds (%s accountant)',
        noise,
        config.target_epsilon,
        delta,
        config.rounds,
        config.accountant,
      )
    params = dataclasses.replace(params, noise_multiplier=float(noise))
  if method.setup is not None:
    params = method.setup(params, task, config.data_dir)
  cost = method.cost(params)
  logging.info(
    'Task: %s | method: %s | sampling: %s | %d params | '
    'bytes/client/round down %d up %d',
    task.description,
    config.method,
    sampling,
    num_params,
    cost.down,
    cost.up,
  )

  if config.workers or config.local_workers:
    targets = distributed.parse_workers(config.workers)
    if config.local_workers:
      targets += [
        target
        for _, target in distributed.start_local_workers(
          config.local_workers,
          max_concurrent_computation_calls=max(
            1, config.max_concurrent_computation_calls
          ),
          intra_op_threads=config.intra_op_threads,
          inter_op_threads=config.inter_op_threads,
        )
      ]
    distributed.set_distributed_context(targets)
    logging.info('Clients of each round split over workers %s', targets)
  else:
    contexts.set_simulation_context(
      config.max_concurrent_computation_calls,
      config.intra_op_threads,
      config.inter_op_threads,
    )
  client_optimizer = tff.learning.optimizers.build_sgdm(
    config.client_lr, momentum=config.client_momentum or None
  )
  client_model_fn = task.client_model_fn(config.device or None)
  aggregator = method.build_aggregator(params)
  if isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory):
    # NaN/Inf client updates become zeros (norm 0) and are counted.
    aggregator = finite_guard.FiniteGuardFactory(aggregator)
  client_work = None
  if method.build_client_work is not None:
    client_work = method.build_client_work(
      params, client_model_fn, client_optimizer
    )
  process = composition.build_learning_process(
    task.model_fn,
    client_optimizer=client_optimizer,
    server_optimizer=tff.learning.optimizers.build_sgdm(
      config.server_lr, momentum=config.server_momentum or None
    ),
    model_aggregator=aggregator,
    client_model_fn=client_model_fn,
    client_work=client_work,
    client_metrics_fn=methods_lib.client_angle_metrics_fn(params),
    track_global_update=params.update_diagnostics,
  )
  if config.fuse_client_work:
    process, reason = fusion.fuse(process)
    logging.info(
      'Client work %s',
      'fused: one TensorFlow call per client a round'
      if reason is None
      else f'not fused ({reason})',
    )

  return Prepared(task, method, params, sampling, delta, cost, process)


def run_experiment(
  config: ExperimentConfig,
  *,
  round_callback: Optional[Callable[[int], None]] = None,
  rows_out: Optional[list] = None,
) -> dict[str, Any]:
  """Runs (or resumes) a federated training job; returns the summary.

  Args:
    config: The run's configuration.
    round_callback: Called with the round number after each round's results
      and checkpoint are written (tests use it to interrupt a run).
    rows_out: If given, the per-round result rows are appended to it.

  Raises:
    ValueError: On an invalid config or output directory, before training.
  """
  config.validate()
  output_dir = check_output_dir(config.output_dir)
  method = methods_lib.METHODS[config.method]
  if output_dir is not None:
    _check_same_config(output_dir, config)

  prepared = prepare(config)
  task, method, params = prepared.task, prepared.method, prepared.params
  sampling, delta, cost = prepared.sampling, prepared.delta, prepared.cost
  process = prepared.process
  cd = task.train_data
  client_ids = cd.client_ids
  num_params = params.num_model_params

  state = process.initialize()
  # Privacy-relevant: the cohort (and the local shuffles). OS entropy
  # unless --noise_seed; its state is checkpointed, never logged.
  rng = np.random.default_rng(config.noise_seed)
  ledger = privacy.PrivacyLedger(sampling, delta) if method.private else None
  rows: list[dict] = []
  start_round = 1
  manager = None
  if output_dir is not None:
    # The two latest checkpoints: if the newest is unreadable (a crash while
    # writing it), the previous one is used.
    manager = tff.program.FileProgramStateManager(
      str(output_dir / 'checkpoints'),
      prefix=CHECKPOINT_PREFIX,
      keep_total=2,
      keep_first=False,
    )
    restored, version = asyncio.run(
      load_latest_readable(manager, (state, np.str_('')))
    )
    if restored is not None and version > 0:
      state, runner_json = restored
      runner = _RunnerState.from_json(runner_json)
      rng.bit_generator.state = runner.rng_state
      rows = runner.rows
      if ledger is not None:
        ledger = privacy.PrivacyLedger.from_json(runner.ledger_json)
      start_round = runner.round_num + 1
      _truncate_diagnostics(output_dir / DIAGNOSTICS_FILE, runner.round_num)
      logging.info(
        'Resumed from checkpoint of round %d in %s', version, output_dir
      )
    _atomic_write(
      output_dir / 'config.json', json.dumps(config.to_dict(), indent=2)
    )
  writer = (
    tf.summary.create_file_writer(str(output_dir / 'tensorboard'))
    if output_dir is not None
    else None
  )

  keras_model = task.model_builder()
  keras_model.compile(loss=task.loss_builder(), metrics=task.metrics_builder())
  eval_batches = test_batches(task)
  totals = {'down': 0, 'up': 0}
  if rows:
    totals = {
      'down': rows[-1]['bytes_down_total'],
      'up': rows[-1]['bytes_up_total'],
    }
  start = time.perf_counter()
  # The next round's cohort is drawn, and its datasets built on a background
  # thread, while the current round runs; the RNG state saved with a
  # checkpoint is the one before that draw, so a resumed run draws the same.
  prefetcher = concurrent.futures.ThreadPoolExecutor(1)

  empty = {c for c, n in zip(client_ids, cd.client_sizes()) if int(n) == 0}

  def draw():
    rng_state = rng.bit_generator.state
    sampled = sample_clients(sampling, client_ids, rng)
    seed = int(rng.integers(2**31 - 1))
    # A sampled client without data contributes nothing: skipped, counted.
    ids = [c for c in sampled if c not in empty]
    return (
      rng_state,
      ids,
      prefetcher.submit(prepared.round_data, config, ids, seed),
      len(sampled) - len(ids),
    )

  upcoming = draw() if start_round <= config.rounds else None
  for round_num in range(start_round, config.rounds + 1):
    t0 = time.perf_counter()
    _, ids, data_future, num_empty = upcoming
    data = data_future.result()
    data_wait = time.perf_counter() - t0
    upcoming = draw() if round_num < config.rounds else None
    rng_state_after_round = upcoming[0] if upcoming else rng.bit_generator.state
    t_train = time.perf_counter()
    if config.client_lr_decay != 1.0:
      # A function of the round only, so a resumed run is exact.
      state = composition.with_client_learning_rate(
        process, state, client_lr_at(config, round_num)
      )
    try:
      if config.workers or config.local_workers:
        output = distributed.call_watching_workers(process.next, state, data)
      else:
        output = process.next(state, data)
    except Exception as e:  # pylint: disable=broad-except
      if not (config.workers or config.local_workers):
        raise
      done = rows[-1]['round'] if rows else 0
      raise RuntimeError(
        f'Round {round_num} failed on the TFF workers ({type(e).__name__}: '
        f'{str(e)[:300]}). A worker may have died. Checkpoints up to round '
        f'{done - done % config.checkpoint_every if done else 0} are intact '
        'in the output directory: restart the workers and rerun the same '
        'command to resume.'
      ) from e
    train_seconds = time.perf_counter() - t_train
    state = output.state
    metrics: dict = {}
    _flatten('', output.metrics, metrics)
    totals['down'] += cost.down * len(ids)
    totals['up'] += cost.up * len(ids)
    row = {
      'round': round_num,
      'sampled_clients': len(ids),
      'empty_clients_skipped': num_empty,
      'train_loss': metrics.get('client_work/train/loss', float('nan')),
      'bytes_down_per_client': cost.down,
      'bytes_up_per_client': cost.up,
      'bytes_down_total': totals['down'],
      'bytes_up_total': totals['up'],
    }
    if config.client_lr_decay != 1.0:
      row['client_lr'] = client_lr_at(config, round_num)
    if method.private:
      event = released_event(method, params, state, output.metrics)
      ledger.record(event)
      row['epsilon_rdp'], row['epsilon_pld'] = ledger.epsilon()
      row['noise_multiplier'] = params.noise_multiplier
    clip = metrics.get(
      'aggregator/dp_query_metrics/clip', metrics.get('aggregator/clip')
    )
    if clip is not None or method.private:
      row['clip'] = clip if clip is not None else params.clip
    if round_num % config.eval_every == 0 or round_num == config.rounds:
      t_eval = time.perf_counter()
      row.update(
        evaluate(
          task, process.get_model_weights(state), keras_model, eval_batches
        )
      )
      row['eval_seconds'] = time.perf_counter() - t_eval
    extra = output.metrics.get('client_work', {}).get('extra', {})
    vectors = {diagnostics.PREFIX + k: np.asarray(v) for k, v in extra.items()}
    row.update(diagnostics.summarize({**metrics, **vectors}))
    if 'aggregator/non_finite_clients' in metrics:
      row['non_finite_clients'] = metrics['aggregator/non_finite_clients']
    hists = diagnostics.histograms(vectors)
    if hists and output_dir is not None:
      with open(output_dir / DIAGNOSTICS_FILE, 'a') as f:
        f.write(json.dumps({'round': round_num, **hists}) + '\n')
    row.update({f'tff/{k}': v for k, v in metrics.items()})
    # Where the round's time went: waiting for the prefetched datasets, the
    # TFF round (process.next), evaluation (eval_seconds, when it ran).
    row['data_wait_seconds'] = data_wait
    row['train_seconds'] = train_seconds
    row['round_seconds'] = time.perf_counter() - t0
    rows.append(row)
    logging.info('%s', _progress_line(row, config.rounds))
    if output_dir is not None:
      _write_csv(output_dir / 'metrics.csv', rows)
      with writer.as_default(step=round_num):
        for k, v in row.items():
          if k != 'round' and isinstance(v, float) and math.isfinite(v):
            tf.summary.scalar(k, v)
      writer.flush()
      if round_num % config.checkpoint_every == 0 or round_num == config.rounds:
        runner = _RunnerState(
          round_num,
          rng_state_after_round,
          ledger.to_json() if ledger else None,
          rows,
        )
        logging.info(
          'Checkpoint of round %d written in %.1f s',
          round_num,
          save_checkpoint(manager, state, runner),
        )
    # Freed native buffers back to the OS (processes.release_free_memory;
    # README "Memory over long runs" says what it did and did not fix).
    processes.release_free_memory()
    if round_callback is not None:
      round_callback(round_num)

  prefetcher.shutdown(wait=True)
  if rows_out is not None:
    rows_out.extend(rows)
  final = rows[-1] if rows else {}
  summary = {
    'config': config.to_dict(),
    'task_description': task.description,
    'method_description': method.description,
    'num_clients': len(client_ids),
    'num_model_params': num_params,
    'sampling': sampling.to_dict(),
    'noise_multiplier': params.noise_multiplier if method.private else None,
    # --clip, or what replaced it (--clip_from_public_round).
    'clip': params.clip,
    # A round that composes several Gaussians on one cohort (DPSFL-AC's
    # sketch and clip bit): each one's share of the merged 1/z^2.
    'round_event_shares': privacy.gaussian_shares(
      method.round_event(params.noise_multiplier, params)
    )
    if method.private and method.round_event is not None
    else None,
    'delta': delta,
    'dp_events': [privacy.event_to_dict(e) for e in ledger.events[-1:]]
    if ledger
    else [],
    'privacy': privacy_section(config, task, method, sampling, ledger),
    'epsilon_rdp': final.get('epsilon_rdp'),
    'epsilon_pld': final.get('epsilon_pld'),
    'bytes_per_client_per_round': dataclasses.asdict(cost),
    'bytes_down_total': totals['down'],
    'bytes_up_total': totals['up'],
    'final': {k: v for k, v in final.items() if k.startswith('test_')},
    'rounds_completed': len(rows),
    'wall_seconds_this_invocation': time.perf_counter() - start,
  }
  if output_dir is not None:
    save_model_weights(
      output_dir / 'final_model_weights.npz', process.get_model_weights(state)
    )
    _atomic_write(output_dir / 'summary.json', json.dumps(summary, indent=2))
  if config.local_workers:
    distributed.stop_local_workers()
  return summary


# What a run writes that is not covered by the ledger's guarantee.
NON_PRIVATE_OUTPUTS = (
  'sampled_clients and empty_clients_skipped (the realised cohort size)',
  'train_loss and every client_work/* metric (cohort means of client '
  'values, no noise)',
  'update diagnostics: update_norm_*, fraction_clipped, angles, '
  'diagnostics.jsonl histograms (pre-clip client norms)',
  'non_finite_clients (a count of clients)',
  'round_seconds, data_wait_seconds, train_seconds, eval_seconds (they '
  "depend on the cohort's size and data)",
  "DPSFL's num_clients and DDGauss's actual_num_clients and released "
  'measurements',
  "CMP-Fed/UV-Fed's client_norms (the cohort's mean pre-clip norms of "
  'U_i, V_i and the biases, and the fraction each clip cut)',
)
_MEDICAL_TASKS = ('physionet2012', 'heart_disease')


def tuning_outside_ledger(config: ExperimentConfig, method) -> list[str]:
  """The run's choices made from client data outside the privacy ledger."""
  steps = []
  if config.clip_source:
    if config.method == 'cmp_fed':
      c1, c2 = (
        config.clip if c is None else c
        for c in (config.cmp_clip_u, config.cmp_clip_v)
      )
      clips = f'clips C1 {c1:.6g}, C2 {c2:.6g}'
    else:
      clips = f'clip {config.clip:.6g}'
    steps.append(f'{clips}: {config.clip_source}')
  if config.task in _MEDICAL_TASKS:
    steps.append(
      'feature standardisation, imputation means and the loss pos_weight '
      "are fitted on the pooled training data of all clients (the task's "
      'preprocessing)'
    )
  if method.setup is not None and config.method.startswith('fl_top'):
    public_set = (
      'patients held out of every client when the task is loaded'
      if config.task in _MEDICAL_TASKS
      else 'EMNIST digits stand in for the public set'
    )
    steps.append(
      "FL-TOP's Top-K mask is chosen on a server-held public batch "
      f'(not client data; {public_set})'
    )
  if config.clip_from_public_round:
    subset = (
      ', the median over random K-subsets'
      if config.method == 'fl_basic_dp'
      else ''
    )
    steps.append(
      'the clip (summary "clip") is the update norm of one local round on '
      f"the server's public batch{subset} (seed 004's rule; not client data)"
    )
  return steps


def privacy_section(config, task, method, sampling, ledger) -> dict:
  """The summary's account of what the run's guarantee covers."""
  del task
  if ledger is None:
    return {
      'private': False,
      'non_private_outputs': ['everything: the method adds no noise'],
      'tuning_outside_ledger': tuning_outside_ledger(config, method),
    }
  eps_rdp, eps_pld = ledger.epsilon() if ledger.rounds else (0.0, 0.0)
  relation = (
    'add/remove one client (Poisson sampling)'
    if sampling.mode == 'poisson'
    else 'replace one client (fixed-size sampling; sensitivity 2 x clip)'
  )
  return {
    'private': True,
    'unit': "client-level: all of one client's data",
    'neighbouring_relation': relation,
    'event_accounted': privacy.event_to_dict(ledger.composed_event()),
    'delta': ledger.delta,
    'epsilon_rdp': eps_rdp,
    'epsilon_pld': eps_pld,
    'noise_seed': noise_seed_status(config.noise_seed),
    'noise_seed_secret': config.noise_seed is None,
    'released': 'the model after each round (final_model_weights.npz, '
    'test metrics and checkpoints of it)',
    'non_private_outputs': list(NON_PRIVATE_OUTPUTS),
    'tuning_outside_ledger': tuning_outside_ledger(config, method),
  }


def save_model_weights(path: pathlib.Path, model_weights) -> None:
  """Writes `tff.learning.models.ModelWeights` as an .npz (atomic)."""
  arrays = {
    f'trainable_{i}': np.asarray(w)
    for i, w in enumerate(model_weights.trainable)
  }
  arrays.update(
    {
      f'non_trainable_{i}': np.asarray(w)
      for i, w in enumerate(model_weights.non_trainable)
    }
  )
  with tempfile.NamedTemporaryFile(
    dir=path.parent, suffix='.npz', delete=False
  ) as f:
    np.savez(f, **arrays)
  os.replace(f.name, path)


_EXECUTION_ONLY = (
  'fuse_client_work',
  'workers',
  'local_workers',
  'max_concurrent_computation_calls',
  'intra_op_threads',
  'inter_op_threads',
)


def client_lr_at(config: ExperimentConfig, round_num: int) -> float:
  """Round `round_num`'s (1-based) client lr: client_lr x decay^(t - 1)."""
  return config.client_lr * config.client_lr_decay ** (round_num - 1)


def _check_same_config(
  output_dir: pathlib.Path, config: ExperimentConfig
) -> None:
  saved = output_dir / 'config.json'
  if not saved.exists():
    return
  old = json.loads(saved.read_text())
  new = json.loads(json.dumps(config.to_dict()))
  # A flag added after the run started: the run had its legacy value where
  # the new default changed the behaviour, else its default (see
  # methods.LEGACY_DEFAULTS).
  defaults = json.loads(json.dumps(ExperimentConfig().to_dict()))
  legacy = json.loads(json.dumps(methods_lib.LEGACY_DEFAULTS))
  for name, value in defaults.items():
    old.setdefault(name, legacy.get(name, value))
  # Where and how fast it runs does not change the results.
  for key in _EXECUTION_ONLY:
    old.pop(key, None)
    new.pop(key, None)
  if old != new:
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    raise ValueError(
      f'{output_dir} holds a run with different flags ({", ".join(diff)}); '
      'rerun the same command to resume, or choose a new root_output_dir.'
    )


def clip_from_fedavg(
  config: ExperimentConfig, rounds: int = 3, fraction: float = 0.5
) -> float:
  """Seed 003's clip: `fraction` of FedAvg's average unclipped update norm.

  Runs `rounds` rounds of non-private FedAvg with `config`'s task, data,
  sampling and local training (no output directory) and returns `fraction`
  times the mean over rounds of the cohort's mean update norm. Like the
  paper's choice it looks at the clients' data outside the privacy ledger:
  a tuning step, not a private one.

  Raises:
    ValueError: If rounds < 1 or fraction is not in (0, 1].
  """
  _check_int('rounds', rounds, 1)
  if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
    raise ValueError(f'fraction must be in (0, 1]. Found {fraction!r}.')
  probe = dataclasses.replace(
    config,
    method='fedavg',
    rounds=rounds,
    eval_every=rounds,
    output_dir=None,
    update_diagnostics=True,
    noise_multiplier=None,
    target_epsilon=None,
    clip_source=None,
    # Non-private and outside the ledger anyway: a cohort from the public
    # seed, so that a rerun (resume) finds the same clip.
    noise_seed=config.noise_seed
    if config.noise_seed is not None
    else (config.seed),
  )
  rows = []
  run_experiment(probe, rows_out=rows)
  norms = [r['update_norm_mean'] for r in rows if 'update_norm_mean' in r]
  if not norms:
    raise RuntimeError('The FedAvg probe reported no update norms.')
  return float(fraction * np.mean(norms))
