r"""Writes `docs/settings.md`: every flag of `python -m tff_dp.run`.

The page comes from the same declarations as the flags (the run settings,
`tff_dp.methods.settings.RunSettings`; the runner's clip probe,
`training.ClipProbe`; each method's options dataclass), so a new setting
or technique documents itself:

  python -m tff_dp.settings_doc            # rewrites docs/settings.md

`tests/tff_dp/settings_doc_test.py` fails when the page is stale.
"""

import dataclasses
import pathlib
import sys

from tff_dp import methods
from tff_dp.job import training
from tff_dp.methods import options as options_lib
from tff_dp.methods import settings

PAGE = pathlib.Path(__file__).absolute().parents[1] / 'docs' / 'settings.md'


def _cell(text) -> str:
  return str(text).replace('|', '\\|').replace('\n', ' ')


def _default(field: dataclasses.Field) -> str:
  if options_lib.parser_of(field) is not None:
    return '(none; repeatable)'
  return f'`{field.default!r}`'


def _rows(fields, extra=lambda f: '') -> list[str]:
  out = []
  for f in fields:
    choices = options_lib.choices_of(f)
    allowed = f' One of {", ".join(map(str, choices))}.' if choices else ''
    out.append(
      f'| `--{options_lib.flag_name_of(f)}` | {_default(f)} | '
      f'{_cell(options_lib.help_of(f) + allowed)}{extra(f)} |'
    )
  return out


def render() -> str:
  """The page's Markdown."""
  header = ['| flag | default | meaning |', '| --- | --- | --- |']
  lines = [
    '# Settings of `python -m tff_dp.run`',
    '',
    'Written by `python -m tff_dp.settings_doc` from the declarations the '
    'flags come from; do not edit by hand.',
    '',
    '## Every run',
    '',
    *header,
    *_rows(options_lib.flag_fields(settings.RunSettings)),
    *_rows(options_lib.flag_fields(training.ClipProbe)),
    '',
    '## Methods',
    '',
  ]
  for name, method in sorted(methods.METHODS.items()):
    lines += [f'- `{name}`: {_cell(method.description)}']
  lines += [
    '',
    '## Method options',
    '',
    '| flag | default | meaning | methods |',
    '| --- | --- | --- | --- |',
  ]
  for field, users in methods.option_fields().values():
    lines += _rows([field], lambda f, users=users: ' | ' + ', '.join(users))
  return '\n'.join(lines) + '\n'


def main(argv) -> None:
  del argv
  PAGE.parent.mkdir(parents=True, exist_ok=True)
  PAGE.write_text(render())
  print(f'wrote {PAGE}')


if __name__ == '__main__':
  main(sys.argv)
