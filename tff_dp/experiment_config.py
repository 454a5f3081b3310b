"""A run's configuration: `ExperimentConfig` and its validation (every bad
value is named with its allowed range before any data loads)."""

import dataclasses
import math
import pathlib
import tempfile
from typing import Any, Optional


from absl import logging
import numpy as np

from tff_dp.aggregators import cmp_fed
from tff_dp.aggregators import count_sketch
from tff_dp.aggregators import dp_randagg
from tff_dp.aggregators import dpsfl
from tff_dp import distributed
from tff_dp import methods as methods_lib
from tff_dp import public_data
from tff_dp import tasks as tasks_lib


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
      check_int(name, getattr(self, name), 1)
    if self.local_steps is not None:
      check_int('local_steps', self.local_steps, 1)
    check_int('seed', self.seed, 0)
    if self.noise_seed is not None:
      check_int('noise_seed', self.noise_seed, 0)
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
      check_int('clients_per_round', self.clients_per_round, 1)
    if self.ddgauss_min_clients is not None:
      check_int('ddgauss_min_clients', self.ddgauss_min_clients, 2)
    for name in ('client_lr', 'server_lr', 'clip', 'sketch_lr'):
      check_float(name, getattr(self, name), positive=True)
    d = self.client_lr_decay
    if not (isinstance(d, (int, float)) and 0 < d <= 1):
      raise ValueError(f'client_lr_decay must be in (0, 1]. Found {d!r}.')
    for name in ('client_momentum', 'server_momentum'):
      v = getattr(self, name)
      if not 0 <= v < 1:
        raise ValueError(f'{name} must be in [0, 1). Found {v!r}.')
    if self.noise_multiplier is not None:
      check_float('noise_multiplier', self.noise_multiplier, positive=False)
      if self.target_epsilon is not None:
        raise ValueError('Set noise_multiplier or target_epsilon, not both.')
    if self.target_epsilon is not None:
      check_float('target_epsilon', self.target_epsilon, positive=True)
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
    check_int('intra_op_threads', self.intra_op_threads, 0)
    check_int('inter_op_threads', self.inter_op_threads, 0)
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
    check_int('local_workers', self.local_workers, 0)
    for name in ('sketch_rows', 'sketch_columns', 'sketch_k', 'cmp_rank'):
      check_int(name, getattr(self, name), 1)
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
      check_float(name, getattr(self, name), positive=True)
    if self.dpsfl_bit_noise is not None:
      check_float('dpsfl_bit_noise', self.dpsfl_bit_noise, positive=False)
    dpsfl.AdaptiveClip(
      impact_threshold=self.dpsfl_impact_threshold,
      impact_rule=self.dpsfl_impact_rule,
    ).check()
    for name in ('cmp_clip_u', 'cmp_clip_v'):
      if getattr(self, name) is not None:
        check_float(name, getattr(self, name), positive=True)
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
    check_int('ddgauss_bits', self.ddgauss_bits, 2)
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


def check_int(name, value, minimum):
  if (
    isinstance(value, bool)
    or not isinstance(value, (int, np.integer))
    or (value < minimum)
  ):
    raise ValueError(
      f'{name} must be an integer >= {minimum}. Found {value!r}.'
    )


def check_float(name, value, *, positive):
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
