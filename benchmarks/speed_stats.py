"""The speed benchmark's statistics (`benchmarks.round_speed`), flag-free.

Per configuration: seconds per 100 clients over every timed round of every
cycle, each cycle's median, and the floor check that pairs each cycle with
its own floor.
"""

import statistics

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
      'min': min(cycle_medians),
      'max': max(cycle_medians),
      'cycle_medians': cycle_medians,
      'rounds': len(rounds),
      'cores': cpu / wall if cpu else None,
      'peak_rss': max((r.get('peak_rss') or 0) for r in results) or None,
    }
  return out


# How much faster than the floor, in its own cycle, a configuration may
# be before the floor is called mis-measured (the noise between blocks
# minutes apart, measured within a cycle).
FLOOR_TOLERANCE = 0.10


def floor_violations(stats: dict[str, dict]) -> list[str]:
  """Configurations faster than the floor in every cycle, each against
  the floor of its own cycle (so the machine's drift cancels), by more
  than `FLOOR_TOLERANCE`."""
  if 'floor_2x1' not in stats:
    return []
  floor = stats['floor_2x1']['cycle_medians']
  out = []
  for name, s in stats.items():
    if name in ('floor_2x1', 'arith_limit'):
      continue
    ratios = [c / f for c, f in zip(s['cycle_medians'], floor)]
    if ratios and max(ratios) < 1 - FLOOR_TOLERANCE:
      out.append(
        f'{name}: {", ".join(f"{r:.2f}" for r in ratios)} of the floor '
        'in its cycles'
      )
  return out
