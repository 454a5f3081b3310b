"""summary.json's privacy section (`privacy_section`): what the run's
guarantee covers, the outputs it does not (`NON_PRIVATE_OUTPUTS`), the
tuning done outside the ledger (`tuning_outside_ledger`), why the
guarantee may not hold (`guarantee_caveats`) and a cyclic run's noise
across rounds (`noise_across_rounds`).
"""

from typing import Optional

from tff_dp import privacy
from tff_dp.aggregators import mf_strategy
from tff_dp.job.experiment_config import ExperimentConfig
from tff_dp.job.experiment_config import noise_seed_status
from tff_dp.job import checkpoints
from tff_dp.job import metrics_log


# What the ledger does not cover: written to NON_PRIVATE_DIR only with
# --release_non_private_metrics.
NON_PRIVATE_OUTPUTS = (
  'sampled_clients and empty_clients_skipped (the realised cohort size)',
  'train_loss and every client_work/* metric (cohort means of client '
  'values, no noise)',
  'update diagnostics: update_norm_*, fraction_clipped, angles, '
  'diagnostics.jsonl histograms (pre-clip client norms)',
  'non_finite_clients (a count of clients)',
  'round_seconds, data_wait_seconds, train_seconds, eval_seconds and the '
  "run's wall time (they depend on the cohort's size and data)",
  'bytes_down_total and bytes_up_total (the realised cohorts times the '
  'bytes per client)',
  'test metrics of tasks whose test examples belong to training clients '
  "(EMNIST's writers' held-out examples)",
  'every raw TFF measurement (tff/*)',
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
    clips = config.options.clip_words(config.clip)
    steps.append(f'{clips}: {config.clip_source}')
  if config.task in _MEDICAL_TASKS:
    steps.append(
      'feature standardisation, imputation means and the loss pos_weight '
      "are fitted on the pooled training data of all clients (the task's "
      'preprocessing)'
    )
  if method.setup is not None and method.public_selection:
    public_set = (
      'patients held out of every client when the task is loaded'
      if config.task in _MEDICAL_TASKS
      else 'EMNIST digits stand in for the public set'
    )
    steps.append(f'{method.public_selection} (not client data; {public_set})')
  if config.clip_from_public_round:
    rule = method.public_round_clip_rule
    subset = f', {rule}' if rule else ''
    steps.append(
      'the clip (summary "clip") is the update norm of one local round on '
      f"the server's public batch{subset} (Kerkouche et al.'s rule; not "
      'client data)'
    )
  opted_in = dict(config.task_kwargs).get('public_clients')
  if opted_in:
    steps.append(
      f'{opted_in} clients opted in to share their data '
      '(--task_option=public_clients): their examples are public data, '
      'held out of training; the guarantee covers the other clients'
    )
  if config.public_pretrain_steps:
    whose = (
      "the opt-in clients' data, public by their choice"
      if config.public_data == 'fashion_mnist_opt_in'
      else 'not client data'
    )
    steps.append(
      f'the initial model is trained on the public set {config.public_data!r}'
      f" ({whose}; examples equal to a client's or a test example "
      'removed; summary "public_pretrain")'
    )
  if config.initial_weights:
    steps.append(
      f'the initial model is loaded from {config.initial_weights!r}, which '
      'the user states holds no client data of this run (summary '
      '"public_pretrain": its SHA-256)'
    )
  if config.options is not None:
    steps.extend(config.options.tuning_outside_ledger())
  return steps


def population(config, task) -> str:
  """Whom the guarantee covers: the task's training clients, and who left
  them (writers whose data a public set holds, opt-in clients)."""
  words = [f'the {len(task.train_data.client_ids)} training clients']
  if task.writers_dropped:
    words.append(
      f'writers of partition(s) {", ".join(task.writers_dropped)} left the '
      'population (--task_option=drop_nist_test_writers): a public set '
      'holds their data, so the run neither trains on nor evaluates their '
      'examples, and the guarantee does not speak for them'
    )
  if dict(config.task_kwargs).get('public_clients'):
    words.append('the opt-in clients are public and left the population')
  return '; '.join(words)


def _release_section(config, task) -> dict:
  """What the run folder holds beyond the ledger's coverage, if anything."""
  released = config.release_non_private_metrics
  test = (
    'not covered: the test examples belong to training clients, so test '
    'metrics go to non_private/ (written only with '
    '--release_non_private_metrics)'
    if task.test_held_by_clients
    else 'covered: test data held by no client (post-processing of the '
    'released model)'
  )
  return {
    'non_private_metrics_released': released,
    'non_private_dir': metrics_log.NON_PRIVATE_DIR if released else None,
    # Released (in non_private/) or withheld.
    'non_private_outputs': list(NON_PRIVATE_OUTPUTS),
    'test_metrics': test,
    'checkpoints': f"{checkpoints.CHECKPOINT_DIR}/ holds the server's "
    'secret state (the learning state, the ledger, the noise and '
    'client-sampling RNG) while the run goes, owner-only, deleted when it '
    'finishes unless --keep_checkpoints: never publish it',
  }


def privacy_section(
  config, task, method, sampling, ledger, noise_seed_clash=None, noise=None
) -> dict:
  """The summary's account of what the run's guarantee covers.

  Args:
    config: The run's config.
    task: The run's task (whether its test data belongs to clients).
    method: The run's method.
    sampling: The run's client sampling.
    ledger: The run's `privacy.PrivacyLedger`, None for a non-private one.
    noise_seed_clash: The run folder that used this noise seed for another
      configuration (`noise_seeds.check_and_register` with
      --allow_noise_seed_reuse), if any.
    noise: The run's `noise_plan.NoisePlan` (`--bands=auto`'s candidates).
  """
  if ledger is None:
    return {
      'private': False,
      'non_private_outputs': ['everything: the method adds no noise'],
      'tuning_outside_ledger': tuning_outside_ledger(config, method),
    }
  eps_rdp, eps_pld = ledger.epsilon() if ledger.rounds else (0.0, 0.0)
  relation = sampling.neighbouring_relation
  caveats = guarantee_caveats(
    ledger.assumptions(), noise_seed_clash, config.noise_seed is not None
  )
  section = {
    'private': True,
    'unit': "client-level: all of one client's data",
    'population': population(config, task),
    'neighbouring_relation': relation,
    'event_accounted': privacy.event_to_dict(ledger.composed_event()),
    'delta': ledger.delta,
    'epsilon_rdp': eps_rdp,
    'epsilon_pld': eps_pld,
    # Why epsilon_pld is NaN (None where it is computed).
    'pld_unavailable_reason': ledger.pld_unavailable_reason(),
    # What the epsilon assumes beyond the recorded events.
    'assumptions': ledger.assumptions(),
    'noise_seed': noise_seed_status(config.noise_seed),
    'noise_seed_secret': config.noise_seed is None,
    'research_run': config.noise_seed is not None,
    'noise_seed_reused_in': noise_seed_clash,
    # As far as this run can tell when it ends: its noise seed is secret
    # (drawn from OS entropy) and was not reused before it, and its epsilon
    # needs no assumption beyond the events (else `guarantee_caveats`).
    'guarantee_holds': not caveats,
    'guarantee_caveats': caveats,
    'released': 'the model after each round (final_model_weights.npz, '
    'test metrics of it), epsilon and the bytes per client',
    **_release_section(config, task),
    'tuning_outside_ledger': tuning_outside_ledger(config, method)
    + _client_test_tuning(config, task),
  }
  # Why the epsilon itself is not rigorous (tables and plots mark such
  # a point); `guarantee_caveats` adds a given noise seed.
  section['guarantee_caveat'] = guarantee_caveat(
    section['assumptions'], noise_seed_clash
  )
  if sampling.cyclic:
    section['noise_across_rounds'] = noise_across_rounds(ledger, noise)
  return section


def guarantee_caveat(
  assumptions: list[str], noise_seed_clash: Optional[str] = None
) -> Optional[str]:
  """Why the run's epsilon is not a rigorous guarantee, in a sentence or
  two (the privacy section's `guarantee_caveat`); None when nothing in the
  run's events or noise seed registry says so.

  Args:
    assumptions: What the epsilon assumes beyond the recorded events
      (`PrivacyLedger.assumptions`).
    noise_seed_clash: The run folder that used the same noise seed for
      another configuration, if any.
  """
  return ' '.join(_epsilon_caveats(assumptions, noise_seed_clash)) or None


def guarantee_caveats(
  assumptions: list[str],
  noise_seed_clash: Optional[str] = None,
  noise_seed_given: bool = False,
) -> list[str]:
  """Every reason the run's guarantee may not hold (the privacy section's
  `guarantee_caveats`; `guarantee_holds` when empty): `guarantee_caveat`'s,
  and a noise seed given with --noise_seed, which the run cannot know to be
  secret.

  Args:
    assumptions: What the epsilon assumes beyond the recorded events.
    noise_seed_clash: The run folder that used the same noise seed for
      another configuration, if any.
    noise_seed_given: Whether --noise_seed was given (config.json, which is
      released, says so).
  """
  caveats = _epsilon_caveats(assumptions, noise_seed_clash)
  if noise_seed_given:
    caveats.append(
      'The noise seed was given with --noise_seed (config.json says so): '
      'the epsilon holds only while that value stays secret and unique, '
      'which the run cannot check. Whoever knows it (a published command '
      'names it, as every row in benchmarks/results does; a small value '
      'can be guessed) can regenerate the noise and the cohorts.'
    )
  return caveats


def _epsilon_caveats(assumptions, noise_seed_clash) -> list[str]:
  words = []
  if privacy.POISSON_COUNT_ASSUMPTION in assumptions:
    words.append(
      'Not rigorous: DDGauss under Poisson sampling. The epsilon assumes '
      "that the round's participant count stays hidden, but secure "
      'aggregation and the noise variance reveal it (privacy.assumptions); '
      'fixed-size sampling (--clients_per_round) is the rigorous choice.'
    )
  elif assumptions:
    words.append(
      'Rests on an assumption the ledger does not charge (privacy.assumptions).'
    )
  if noise_seed_clash is not None:
    words.append(
      f'The noise seed was used for another configuration in '
      f'{noise_seed_clash}: the two runs share noise, and neither epsilon '
      'holds.'
    )
  return words


def noise_across_rounds(ledger, noise=None) -> dict:
  """The summary's account of a cyclic run's noise: the strategy the ledger
  recorded, its participation schema and the sensitivity its event divides
  by (`tff_dp.privacy.correlated`), and `--bands=auto`'s candidates."""
  sampling = ledger.sampling
  out = {
    'participation': sampling.participation().to_dict(),
    # How the groups were dealt (`privacy.Sampling.partition`), which sets
    # the neighbouring relation the epsilon holds for.
    'partition': sampling.partition,
    'rounds': ledger.rounds,
  }
  if ledger.rounds:
    strategy, z = privacy.correlated_round(ledger.events[0])
    out.update(
      {
        'noise': 'iid' if strategy == mf_strategy.identity() else 'correlated',
        'strategy': strategy.to_dict(),
        'noise_multiplier': z,
        'sensitivity': privacy.mf_sensitivity(
          strategy, ledger.rounds, sampling.participation()
        ),
      }
    )
  if noise is not None and noise.choices:
    out['auto_bands_candidates'] = noise.to_dict()['auto_bands_candidates']
  return out


def _client_test_tuning(config, task) -> list[str]:
  """Test metrics on client-held examples, once released, are client
  data: a round or setting picked by them is tuned outside the ledger."""
  if not (task.test_held_by_clients and config.release_non_private_metrics):
    return []
  return [
    "test metrics (non_private/) are computed on the training clients' "
    'own held-out examples; choosing a round or a setting by them uses '
    'client data outside the ledger'
  ]
