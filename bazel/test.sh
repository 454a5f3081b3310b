#!/usr/bin/env bash
# Bazel's part of the tests (see bazel/README.md). TIMEOUT (seconds) bounds
# the run.
#
#   bazel/test.sh         `bazel test //...`: the whole suite through the
#                         real targets, one py_test per test file; the last
#                         line is "N passed, N failed, N skipped" (summary.py).
#   bazel/test.sh smoke   what `make test` runs beside pytest: every target
#                         built (`bazel build //...`: deps, data, runfiles
#                         trees), then the tests of the build itself (imports
#                         from runfiles only, BUILD files up to date) and the
#                         user example.
#
# Bazel is Debian's 4.2.3 from apt, else 2.1.0 from npm (bazel/install.sh).
# Without either: the smoke is skipped with a message, or fails under
# CI=true; the whole suite falls back to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
TIMEOUT="${TIMEOUT:-1500}"
PY=.venv/bin/python
MODE="${1:-all}"
BAZEL=bazel/.bin/bazel
if [[ "${TFF_DP_NO_BAZEL:-}" == 1 ]] || ! bash bazel/install.sh; then
  if [[ "$MODE" == smoke ]]; then
    if [[ "${CI:-}" == true || "${CI:-}" == 1 ]]; then
      echo "Bazel unavailable under CI=true: failing (CI has apt or npm)." >&2
      exit 1
    fi
    echo "Bazel unavailable (needs apt as root, or npm): Bazel smoke skipped." >&2
    exit 0
  fi
  echo "Bazel unavailable: running pytest directly." >&2
  exec timeout -k 30 "$TIMEOUT" "$PY" -m pytest -q -n 2 --dist loadfile tests
fi
rc=0
if [[ "$MODE" == smoke ]]; then
  timeout -k 30 "$TIMEOUT" "$BAZEL" build //... \
    && timeout -k 30 "$TIMEOUT" "$BAZEL" test \
      //tests:bazel_runfiles_test //tests:bazel_build_test \
      //bazel/example:dp_fedavg_example || rc=$?
  "$BAZEL" shutdown >/dev/null 2>&1 || true
  exit "$rc"
fi
timeout -k 30 "$TIMEOUT" "$BAZEL" test //... || rc=$?
"$BAZEL" shutdown >/dev/null 2>&1 || true
# Last: the plain closing line.
"$PY" bazel/summary.py bazel-testlogs || rc=$((rc ? rc : 1))
exit "$rc"
