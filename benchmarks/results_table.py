"""Markdown results tables whose rows each carry the command that made them.

Rows are kept in a JSON file beside the markdown, keyed by row name, so a
rerun of one row replaces that row and leaves the others.
"""

import datetime
import json
import pathlib
import platform
import shlex
import sys
from typing import Any, Sequence


def command_line() -> str:
  """The command that is running, as a person would type it."""
  args = [a for a in sys.argv[1:]]
  module = pathlib.Path(sys.argv[0]).with_suffix('')
  parts = pathlib.Path(module).resolve().parts
  try:
    i = parts.index('benchmarks')
    mod = '.'.join(parts[i:])
    return ' '.join(['python -m', mod] + [shlex.quote(a) for a in args])
  except ValueError:
    return ' '.join(shlex.quote(a) for a in sys.argv)


def machine() -> str:
  import os  # pylint: disable=g-import-not-at-top

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  return (
    f'{platform.machine()}, {os.cpu_count()} cores, Python '
    f'{platform.python_version()}, TF {tf.__version__}, TFF '
    f'{tff.__version__}'
  )


def today() -> str:
  return datetime.date.today().isoformat()


def update(
  md_path: str,
  name: str,
  row: dict[str, Any],
  *,
  title: str,
  columns: Sequence[str],
  notes: str = '',
) -> None:
  """Inserts or replaces row `name` and rewrites the markdown table."""
  md = pathlib.Path(md_path)
  store = md.with_suffix('.json')
  rows = json.loads(store.read_text()) if store.exists() else {}
  rows[name] = row
  md.parent.mkdir(parents=True, exist_ok=True)
  store.write_text(json.dumps(rows, indent=2, sort_keys=True) + '\n')
  render(md_path, title=title, columns=columns, notes=notes)


def replace_all(
  md_path: str,
  rows: dict[str, dict[str, Any]],
  *,
  title: str,
  columns: Sequence[str],
  notes: str = '',
) -> None:
  """Writes a table of exactly `rows` (one run's), dropping earlier rows."""
  md = pathlib.Path(md_path)
  md.parent.mkdir(parents=True, exist_ok=True)
  store = md.with_suffix('.json')
  store.write_text(json.dumps(rows, indent=2, sort_keys=True) + '\n')
  render(md_path, title=title, columns=columns, notes=notes)


def render(
  md_path: str, *, title: str, columns: Sequence[str], notes: str = ''
) -> None:
  """Rewrites the markdown table from its JSON store, changing no row.

  Raises:
    FileNotFoundError: If the store (`md_path` with `.json`) does not exist.
  """
  md = pathlib.Path(md_path)
  store = md.with_suffix('.json')
  if not store.exists():
    raise FileNotFoundError(f'No results store {store} to render {md} from.')
  rows = json.loads(store.read_text())
  lines = [f'# {title}', '']
  if notes:
    lines += [notes.strip(), '']
  lines.append('| ' + ' | '.join(c.replace('|', '\\|') for c in columns) + ' |')
  lines.append('|' + '---|' * len(columns))
  for r in rows.values():
    cells = []
    for c in columns:
      v = r.get(c, '')
      if v is None:
        v = ''
      if isinstance(v, float):
        v = f'{v:.4g}'
      if c == 'command':
        v = f'`{v}`'
      cells.append(str(v).replace('|', '\\|'))
    lines.append('| ' + ' | '.join(cells) + ' |')
  md.write_text('\n'.join(lines) + '\n')
