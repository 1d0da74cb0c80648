#!/usr/bin/env bash
# Configures and builds fusepack into build/ (or $FUSEPACK_BUILD_DIR) with Ninja and ccache.
# Extra arguments, and FUSEPACK_CMAKE_ARGS, go to the CMake configure step (for example -DFUSEPACK_CUDA_ARCHS=90a).
# FUSEPACK_TARGETS="a b" builds only those targets (for example kernels_gated_delta_test fusepack-bench).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${FUSEPACK_BUILD_DIR:-build}
deps=${FUSEPACK_DEPS:-$HOME/.cache/fusepack}
jobs=${FUSEPACK_JOBS:-$(nproc)}
prefix_path=${CMAKE_PREFIX_PATH:-}
if [ -f "$deps/torch_prefix" ]; then prefix_path="$(cat "$deps/torch_prefix")${prefix_path:+;$prefix_path}"; fi
if [ -d /usr/local/cuda/bin ] && ! command -v nvcc >/dev/null; then export PATH=/usr/local/cuda/bin:$PATH; fi

export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
start=$(date +%s)
mkdir -p "$build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_PREFIX_PATH="$prefix_path" ${FUSEPACK_CMAKE_ARGS:-} "$@" >"$build_dir/configure.log" 2>&1 ||
  { cat "$build_dir/configure.log"; echo "[build] configure failed (log above)"; exit 1; }
cmake --build "$build_dir" -j "$jobs" ${FUSEPACK_TARGETS:+--target $FUSEPACK_TARGETS}
echo "[build] built $build_dir in $(( $(date +%s) - start )) s"
