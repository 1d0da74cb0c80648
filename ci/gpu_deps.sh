#!/usr/bin/env bash
# Run on a machine that reaches Debian's package registry: downloads the Debian -dev packages fusepack builds
# against into .deps/debs/ (git-ignored), for a GPU machine that reaches no registry (see ci/gpu_test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
cd .deps/debs
pkgs=(libeigen3-dev libgtest-dev librapidcheck-dev libgloo-dev nlohmann-json3-dev libcli11-dev)
missing=()
for p in "${pkgs[@]}"; do ls "${p}"_*.deb >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get download "${missing[@]}" 2>/dev/null || { apt-get update -qq && apt-get download "${missing[@]}"; }
fi
ls -1 ./*.deb
