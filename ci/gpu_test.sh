#!/usr/bin/env bash
# The GPU suite on a machine with a CUDA device that reaches no package registry (the H200 box):
#   1. on a connected machine: bash ci/gpu_deps.sh   (Debian -dev packages into .deps/debs/)
#   2. copy the tree with .deps/ to the GPU machine, then there: bash ci/gpu_test.sh [ctest arguments]
# ci/gpu_env.sh: the .deb files unpacked into .deps/prefix with dpkg -x, LibTorch from the machine's python3 torch.
# Builds into build-gpu/ with FUSEPACK_REQUIRE_CUDA=ON and runs the gate at FUSEPACK_TEST_LEVEL (default full), then
# ci/gpu_sanitize.sh (compute-sanitizer over every fused kernel, about 100 s on an H200; FUSEPACK_SANITIZE=0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
export FUSEPACK_BUILD_DIR=${FUSEPACK_BUILD_DIR:-build-gpu}
export FUSEPACK_JOBS=${FUSEPACK_JOBS:-$(nproc)}
export FUSEPACK_TEST_LEVEL=${FUSEPACK_TEST_LEVEL:-full}
gate_status=0
FUSEPACK_CMAKE_ARGS="-DFUSEPACK_REQUIRE_CUDA=ON" bash ci/gate.sh "$@" || gate_status=$?
sanitize_status=0
if [ "${FUSEPACK_SANITIZE:-1}" != 0 ]; then
  echo "[gpu] compute-sanitizer over the fused kernels (logs in $FUSEPACK_BUILD_DIR/sanitize)"
  OUT_DIR="$FUSEPACK_BUILD_DIR/sanitize" bash ci/gpu_sanitize.sh "$FUSEPACK_BUILD_DIR" || sanitize_status=$?
else
  echo "[gpu] SKIPPED compute-sanitizer (FUSEPACK_SANITIZE=0)"
fi
if [ $gate_status -ne 0 ] || [ $sanitize_status -ne 0 ]; then
  echo "[gpu] FAILED: gate exit $gate_status, sanitizer exit $sanitize_status"
  exit 1
fi
echo "[gpu] PASSED: gate and sanitizer"
