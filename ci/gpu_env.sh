# shellcheck shell=bash
# Sourced (from the repo root) by the scripts that build on the offline GPU machine (ci/gpu_test.sh, ci/bench_ab.sh):
# unpacks the Debian -dev packages of .deps/debs (ci/gpu_deps.sh fetched them) into .deps/prefix with dpkg -x, again
# only when a .deb is newer than the last unpacking, takes LibTorch's CMake path from python3's torch, and exports
# CMAKE_PREFIX_PATH and CPATH for ci/build.sh. Exits the sourcing script when .deps/debs is missing.
if [ ! -d .deps/debs ]; then
  echo "[gpu] .deps/debs is missing: run ci/gpu_deps.sh on a machine with Debian's registry"
  exit 1
fi
deps_prefix=$PWD/.deps/prefix
if [ ! -f "$deps_prefix/.unpacked" ] || [ -n "$(find .deps/debs -newer "$deps_prefix/.unpacked" -name '*.deb')" ]; then
  rm -rf "$deps_prefix" && mkdir -p "$deps_prefix"
  for deb in .deps/debs/*.deb; do dpkg -x "$deb" "$deps_prefix"; done
  touch "$deps_prefix/.unpacked"
fi
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
export CMAKE_PREFIX_PATH="$deps_prefix/usr;$torch_prefix"
export CPATH="$deps_prefix/usr/include${CPATH:+:$CPATH}"
