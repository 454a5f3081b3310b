r"""Paper-table studies: runs `python -m tff_dp.run` rows, writes a table.

Each study is a list of rows; a row is one `tff_dp.run` command (recorded
verbatim in the table, so rerunning it reproduces the row) and, where the
paper has one, the paper's number beside ours. Runs go one after the other
(never two trainings at once on this 2-core machine) into
`runs/studies/<study>/<row>/`; rerunning a finished row only re-reads it
unless `--rerun`.

  python -m benchmarks.studies --study=seed004_fashion
  python -m benchmarks.studies --study=seed000_table3 --rows=dp_fedavg,lus_0.5

A row may take its clip from another row's measured pre-clip update norms
(`clip_from`: the median over rounds of that run's median client norm),
as seed 004 sets S from an unclipped round; the resolved number is what the
recorded command carries.

One module per paper's study, its rows as data (`seed000` ... `seed004`);
`study` holds the row and study types, `runner` runs a row and writes its
table row, `__main__` is the absl command line. A new paper's study is a
new module here and one line in `STUDIES` below.
"""

from benchmarks.studies import linear_compression
from benchmarks.studies import public_warm
from benchmarks.studies import seed000
from benchmarks.studies import seed001
from benchmarks.studies import seed002
from benchmarks.studies import seed003
from benchmarks.studies import seed004
from benchmarks.studies.runner import clip_from_run
from benchmarks.studies.runner import CMP_CLIENT_NORMS
from benchmarks.studies.runner import cmp_clip_from_run
from benchmarks.studies.runner import cmp_signal_shares
from benchmarks.studies.runner import final_model_norm
from benchmarks.studies.runner import keep_run_files
from benchmarks.studies.runner import read_metrics
from benchmarks.studies.runner import RESULTS
from benchmarks.studies.runner import run_row
from benchmarks.studies.runner import RUNS
from benchmarks.studies.runner import sampling_fraction
from benchmarks.studies.runner import summarize_run
from benchmarks.studies.study import Row
from benchmarks.studies.study import SMOKE_ROUNDS
from benchmarks.studies.study import Study

STUDIES: dict[str, Study] = {
  **seed004.STUDIES,
  **seed000.STUDIES,
  **seed002.STUDIES,
  **seed001.STUDIES,
  **seed003.STUDIES,
  **linear_compression.STUDIES,
  **public_warm.STUDIES,
}

__all__ = [
  'CMP_CLIENT_NORMS',
  'RESULTS',
  'RUNS',
  'Row',
  'SMOKE_ROUNDS',
  'STUDIES',
  'Study',
  'clip_from_run',
  'cmp_clip_from_run',
  'cmp_signal_shares',
  'final_model_norm',
  'keep_run_files',
  'read_metrics',
  'run_row',
  'sampling_fraction',
  'summarize_run',
]
