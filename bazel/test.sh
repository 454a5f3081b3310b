#!/usr/bin/env bash
# The test suite: `bazel test //...` (one py_test per test file, each run by
# pytest) when Bazel is installed or installable (bazel/install.sh, needs
# npm), else pytest directly. Either way the last line is
# "N passed, N failed, N skipped". TIMEOUT (seconds) bounds the whole run.
set -uo pipefail
cd "$(dirname "$0")/.."
TIMEOUT="${TIMEOUT:-1500}"
PY=.venv/bin/python
if [[ "${TFF_DP_NO_BAZEL:-}" == 1 ]] || ! bash bazel/install.sh; then
  echo "Bazel unavailable: running pytest directly." >&2
  exec timeout -k 30 "$TIMEOUT" "$PY" -m pytest -q tests
fi
BAZEL=bazel/.bin/bazel
rc=0
timeout -k 30 "$TIMEOUT" "$BAZEL" test //... || rc=$?
"$BAZEL" shutdown >/dev/null 2>&1 || true
# Last: the plain closing line.
"$PY" bazel/summary.py bazel-testlogs || rc=$((rc ? rc : 1))
exit "$rc"
