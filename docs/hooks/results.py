"""MkDocs hook: the committed results (`benchmarks/results/`) as `results/`.

The measurements stay where the benchmarks write them; the site serves them
unchanged under `results/` (study tables as pages, plots, JSON and run
files as they are), so a page links `results/seed001_iid.md` or
`results/frontiers/fashion_mnist_iid_180rounds.png` and `mkdocs build
--strict` fails on a link to a file that is not there.
"""

import pathlib

from mkdocs.structure.files import File, InclusionLevel

_RESULTS = pathlib.Path(__file__).absolute().parents[2] / 'benchmarks' / 'results'


def on_files(files, config):
  for path in sorted(_RESULTS.rglob('*')):
    if not path.is_file():
      continue
    uri = 'results/' + path.relative_to(_RESULTS).as_posix()
    files.append(
      File.generated(
        config,
        uri,
        abs_src_path=str(path),
        inclusion=InclusionLevel.NOT_IN_NAV,
      )
    )
  return files
