#!/usr/bin/env bash
# Puts a Bazel at bazel/.bin/bazel. Idempotent; no network beyond the
# package registries.
#
# 1. Debian's `bazel-bootstrap` 4.2.3 from apt (the newer Bazel, kept up by
#    Debian), linked as bazel/.bin/bazel, where apt-get can install it
#    (root, Debian's package lists). It runs offline with the stand-ins in
#    bazel/stubs/ (Debian's own bazel-rules-cc 0.0.4 needs a newer
#    @bazel_tools than 4.2.3 has).
# 2. Otherwise Bazel 2.1.0, the official release binary (JDK embedded), from
#    the npm registry package @bazel/bazel-linux_x64 (npm checks the
#    tarball's integrity).
# TFF_DP_BAZEL=npm skips the first. The chosen Bazel is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
NPM_VERSION=2.1.0
DEBIAN_VERSION=4.2.3
BIN=bazel/.bin/bazel

debian_bazel() {
  dpkg-query -W -f='${Version}' bazel-bootstrap 2>/dev/null \
    | grep -q "^$DEBIAN_VERSION" && [[ -x /usr/bin/bazel ]]
}

if [[ "${TFF_DP_BAZEL:-}" != npm ]]; then
  if ! debian_bazel && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      bazel-bootstrap >/dev/null 2>&1 || true
  fi
  if debian_bazel; then
    mkdir -p bazel/.bin
    ln -sfn /usr/bin/bazel "$BIN"
    echo "bazel $DEBIAN_VERSION (Debian bazel-bootstrap, /usr/bin/bazel)"
    exit 0
  fi
fi

if [[ -x "$BIN" && ! -L "$BIN" ]] \
  && "$BIN" --version 2>/dev/null | grep -q "bazel $NPM_VERSION"; then
  echo "bazel $NPM_VERSION (npm, $BIN)"
  exit 0
fi
rm -f "$BIN"
command -v npm >/dev/null || { echo "npm not found: cannot install Bazel" >&2; exit 1; }
[[ "$(uname -sm)" == "Linux x86_64" ]] || {
  echo "bazel/install.sh supports Linux x86_64 only (found $(uname -sm))" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "@bazel/bazel-linux_x64@$NPM_VERSION" >/dev/null)
tar -xzf "$tmp"/bazel-bazel-linux_x64-"$NPM_VERSION".tgz -C "$tmp"
mkdir -p bazel/.bin
install -m 0755 "$tmp/package/bazel-$NPM_VERSION-linux-x86_64" "$BIN"
echo "bazel $NPM_VERSION (npm, $BIN)"
