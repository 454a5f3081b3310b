#!/usr/bin/env bash
# Installs Bazel 2.1.0 into bazel/.bin/bazel from the npm registry package
# @bazel/bazel-linux_x64 (the official release binary, JDK embedded; npm
# checks the tarball's integrity). Idempotent. Needs npm; no other network.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=2.1.0
BIN=bazel/.bin/bazel
if [[ -x "$BIN" ]] && "$BIN" --version 2>/dev/null | grep -q "bazel $VERSION"; then
  exit 0
fi
command -v npm >/dev/null || { echo "npm not found: cannot install Bazel" >&2; exit 1; }
[[ "$(uname -sm)" == "Linux x86_64" ]] || {
  echo "bazel/install.sh supports Linux x86_64 only (found $(uname -sm))" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "@bazel/bazel-linux_x64@$VERSION" >/dev/null)
tar -xzf "$tmp"/bazel-bazel-linux_x64-"$VERSION".tgz -C "$tmp"
mkdir -p bazel/.bin
install -m 0755 "$tmp/package/bazel-$VERSION-linux-x86_64" "$BIN"
"$BIN" --version
