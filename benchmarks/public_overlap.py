r"""How close the LEAF writers' glyphs are to the public EMNIST test split.

An exact-content check cannot see a character rendered twice (LEAF and
EMNIST crop and scale NIST SD19's images differently), so this compares
shapes: each glyph is cropped to its ink's box, scaled to 20 x 20, centred
and normalised, and scored by its correlation with the nearest EMNIST test
glyph of its class. Groups: the LEAF writers of NIST's test partition hsf_4
(forms f2100-f2599, the writers EMNIST's test split is drawn from) and the
other writers, training and test examples; and, as the scale of a shared
character, EMNIST glyphs themselves at half size (`public.half_size`, the
clients' scale) scored against the set with and without their own image.

  python -m benchmarks.public_overlap --samples=600 --seed=0
"""

import time

from absl import app
from absl import flags
import numpy as np

from benchmarks import results_table
from benchmarks.glyph_match import glyph_vector
from benchmarks.glyph_match import nearest_scores
from tff_dp.tasks import emnist
from tff_dp.tasks import public

_SAMPLES = flags.DEFINE_integer('samples', 600, 'Glyphs drawn per group.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the draws.')
_OUTPUT = flags.DEFINE_string(
  'output', 'benchmarks/results/public_overlap.md', 'Results markdown file.'
)
COLUMNS = (
  'group',
  'glyphs',
  'median',
  'share > 0.95',
  'seed',
  'date',
  'wall s',
  'command',
)


def measure(samples: int, seed: int) -> dict[str, np.ndarray]:
  """Nearest-glyph scores of each group (see the module docstring)."""
  rng = np.random.default_rng(seed)
  ex, ey, _ = public.load_emnist_byclass_test()
  refs = np.stack([glyph_vector(x) for x in ex])
  x_tr, y_tr, w_tr, x_te, y_te, w_te, _ = emnist.load_emnist_arrays()
  out = {}
  for split, (x, y, w) in (
    ('test', (x_te, y_te, w_te)),
    ('training', (x_tr, y_tr, w_tr)),
  ):
    hsf4 = emnist.in_nist_test_partition(w)
    for name, mask in (('hsf_4 writers', hsf4), ('other writers', ~hsf4)):
      pick = rng.choice(np.flatnonzero(mask), samples, replace=False)
      queries = np.stack([glyph_vector(g) for g in x[pick]])
      out[f'LEAF {split} examples, {name}'] = nearest_scores(
        queries, y[pick], refs, ey
      )
  pick = rng.choice(len(ex), samples, replace=False)
  halved = np.stack([glyph_vector(g) for g in public.half_size(ex[pick])])
  out['EMNIST glyphs at half size, own image in the set'] = nearest_scores(
    halved, ey[pick], refs, ey
  )
  out['EMNIST glyphs at half size, own image left out'] = nearest_scores(
    halved, ey[pick], refs, ey, skip=pick
  )
  return out


NOTES = (
  'Each glyph is cropped to its ink (> 40), scaled to 20 x 20, centred and '
  'normalised, and scored by its highest correlation with an EMNIST ByClass '
  'test glyph of its class (`benchmarks.public_overlap`). hsf_4 writers: '
  'the LEAF writers of NIST SD19 forms f2100-f2599, the partition '
  "EMNIST's test split is drawn from. The EMNIST rows at half size "
  "(`tff_dp.tasks.public.half_size`, the clients' scale) give the score of "
  'a character that is in the set (own image in) and of the nearest other '
  'character (own image out).'
)


def main(argv):
  del argv
  start = time.perf_counter()
  scores = measure(_SAMPLES.value, _SEED.value)
  wall = round(time.perf_counter() - start)
  for group, s in scores.items():
    row = {
      'group': group,
      'glyphs': len(s),
      'median': round(float(np.median(s)), 3),
      'share > 0.95': round(float(np.mean(s > 0.95)), 3),
      'seed': _SEED.value,
      'date': results_table.today(),
      'wall s': wall,
      'command': results_table.command_line(),
    }
    results_table.update(
      _OUTPUT.value,
      group,
      row,
      title="LEAF writers' glyphs against the public set emnist_byclass_test",
      columns=COLUMNS,
      notes=NOTES + ' Machine: ' + results_table.machine() + '.',
    )
    print(row)


if __name__ == '__main__':
  app.run(main)
