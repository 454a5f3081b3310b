"""The speed benchmark's statistics (`benchmarks.round_speed`), flag-free.

Per configuration: seconds per 100 clients over every timed round of every
cycle, each cycle's median, and the floor check that pairs each cycle with
its own floor.
"""

import json
import statistics
import subprocess

# The benchmark's cohort: seconds are normalised to it.
COHORT = 100


def per100(result: dict) -> list[float]:
  """Each timed round's seconds per 100 clients (Poisson cohorts vary)."""
  clients = result.get('clients', [COHORT] * len(result['seconds']))
  return [s * COHORT / c for s, c in zip(result['seconds'], clients) if c]


def summarize(blocks: dict[str, list[dict]]) -> dict[str, dict]:
  """Per configuration: the median over every timed round of every cycle
  (seconds per 100 clients), the min and max of the cycles' medians, and
  the cores kept busy."""
  out = {}
  for name, results in blocks.items():
    rounds = [x for r in results for x in per100(r)]
    cycle_medians = [statistics.median(per100(r)) for r in results]
    cpu = sum(sum(r.get('cpu_seconds') or []) for r in results)
    wall = sum(sum(r.get('cpu_wall_seconds', r['seconds'])) for r in results)
    out[name] = {
      'median': statistics.median(rounds),
      # Every round's time counts: a round slowed by an evaluation too.
      'mean': statistics.fmean(rounds),
      'min': min(cycle_medians),
      'max': max(cycle_medians),
      'cycle_medians': cycle_medians,
      'rounds': len(rounds),
      'cores': cpu / wall if cpu else None,
      'peak_rss': max((r.get('peak_rss') or 0) for r in results) or None,
    }
  return out


def cycle_ratios(stats: dict[str, dict], reference: str, name: str):
  """`reference`'s cycle median over `name`'s, cycle by cycle (each pair
  alternated, so the machine's drift cancels); [] without either."""
  if reference not in stats or name not in stats:
    return []
  return [
    r / c
    for r, c in zip(
      stats[reference]['cycle_medians'], stats[name]['cycle_medians']
    )
  ]


# How much faster than the floor, in its own cycle, a configuration may
# be before the floor is called mis-measured (the noise between blocks
# minutes apart, measured within a cycle).
FLOOR_TOLERANCE = 0.10


def floor_violations(stats: dict[str, dict]) -> list[str]:
  """Configurations faster than a floor (every `floor_*` configuration)
  in every cycle, each against that floor in its own cycle (so the
  machine's drift cancels), by more than `FLOOR_TOLERANCE`."""
  floors = [name for name in stats if name.startswith('floor_')]
  out = []
  for floor_name in floors:
    floor = stats[floor_name]['cycle_medians']
    for name, s in stats.items():
      if name in floors or name == 'arith_limit':
        continue
      ratios = [c / f for c, f in zip(s['cycle_medians'], floor)]
      if ratios and max(ratios) < 1 - FLOOR_TOLERANCE:
        out.append(
          f'{name}: {", ".join(f"{r:.2f}" for r in ratios)} of '
          f'{floor_name} in its cycles'
        )
  return out


def job_phases(results: list[dict]) -> str:
  """Where `ours_readme`'s rounds went, per 100 clients (medians over its
  timed rounds): process.next, evaluation (spread over all rounds), and
  the rest of the main thread's round; '' without that configuration.

  A result with `background_evaluation` true evaluated in its evaluation
  process: its `round_seconds` do not hold the evaluation.
  """
  phases = {'wall': [], 'next': [], 'eval': [], 'rest': []}
  background = set()
  for r in results:
    inline = not r.get('background_evaluation', False)
    background.add(not inline)
    for wall, train, ev, round_s, c in zip(
      r['seconds'],
      r['train_seconds'],
      r.get('eval_seconds', [0.0] * len(r['seconds'])),
      r['round_seconds'],
      r['clients'],
    ):
      if not c or train is None:
        continue
      k = COHORT / c
      phases['wall'].append(wall * k)
      phases['next'].append(train * k)
      phases['eval'].append(ev * k)
      phases['rest'].append((round_s - train - (ev if inline else 0)) * k)
  if not phases['wall']:
    return ''
  med = {k: statistics.median(v) for k, v in phases.items()}
  mean_eval = statistics.fmean(phases['eval'])
  where = {
    frozenset({False}): 'on the main thread',
    frozenset({True}): "in the evaluation process, beside the next round's "
    'training',
  }.get(frozenset(background), 'on the main thread in some blocks')
  return (
    "Where `ours_readme`'s rounds went, per 100 clients (medians over "
    f"its timed rounds): {med['next']:.2f} s in `process.next`, "
    f'{mean_eval:.2f} s of evaluation a round on average ({where}, every '
    f"--eval_every rounds), {med['rest']:.2f} s of the rest of the main "
    "thread's round (cohort wait, ledger, hand-off), "
    f"{med['wall']:.2f} s from the end of one round to the next's (its "
    'log lines). '
  )


def worker_result(cmd: list[str], what: str) -> dict:
  """Runs a benchmark's worker process `cmd` and returns the JSON of the
  last `RESULT {...}` line it prints.

  Raises:
    RuntimeError: If it fails or prints no result, naming `what` and the
      end of its stderr.
  """
  done = subprocess.run(cmd, capture_output=True, text=True, check=False)
  line = [l for l in done.stdout.splitlines() if l.startswith('RESULT ')]
  if done.returncode != 0 or not line:
    raise RuntimeError(f'{what} failed:\n{done.stderr[-3000:]}')
  return json.loads(line[-1][len('RESULT ') :])
