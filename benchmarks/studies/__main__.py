"""`python -m benchmarks.studies --study=S [--rows=a,b] [--rerun]`, or
`--render_only` to rewrite the study's table from its results store."""

from absl import app
from absl import flags

from benchmarks.studies import runner
from benchmarks.studies import STUDIES

_STUDY = flags.DEFINE_enum('study', None, sorted(STUDIES), 'Study to run.')
_ROWS = flags.DEFINE_list('rows', None, 'Rows to run (default: all).')
_RERUN = flags.DEFINE_boolean(
  'rerun', False, 'Delete and rerun rows that already finished.'
)
_TIMEOUT = flags.DEFINE_integer(
  'row_timeout_s', 3600, 'Wall-clock limit of one row.'
)
_RENDER_ONLY = flags.DEFINE_boolean(
  'render_only',
  False,
  'Run nothing: rewrite benchmarks/results/<study>.md from its JSON store '
  "with the study's current notes and columns.",
)


def main(argv):
  del argv
  study = STUDIES[_STUDY.value]
  if _RENDER_ONLY.value:
    if _ROWS.value or _RERUN.value:
      raise app.UsageError('--render_only takes no --rows or --rerun.')
    print(runner.render_table(_STUDY.value, study))
    return
  names = _ROWS.value or [r.name for r in study.rows]
  by_name = {r.name: r for r in study.rows}
  unknown = sorted(set(names) - set(by_name))
  if unknown:
    raise app.UsageError(f'Unknown rows {unknown}; choose from {list(by_name)}')
  for name in names:
    runner.run_row(
      _STUDY.value, study, by_name[name], _RERUN.value, _TIMEOUT.value
    )


if __name__ == '__main__':
  flags.mark_flag_as_required('study')
  app.run(main)
