#!/usr/bin/env bash
# The CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer: configures and builds fusepack with
# -DFUSEPACK_SANITIZE="address;undefined" and CUDA off into build-asan/ (or $FUSEPACK_BUILD_DIR), then runs CTest.
# FUSEPACK_SANITIZE_LABELS (a ctest -L regex, default the torch-free labels) picks the tests; LibTorch is built only
# when the regex names a label of LibTorch tests (kernels, trainer, distributed), or FUSEPACK_SANITIZE_TORCH=1.
# Extra arguments go to ctest (for example: -R Packer). Any sanitizer report fails its test.
set -euo pipefail
cd "$(dirname "$0")/.."

export FUSEPACK_BUILD_DIR=${FUSEPACK_BUILD_DIR:-build-asan}
labels=${FUSEPACK_SANITIZE_LABELS:-reference|packing|properties|golden}
torch=${FUSEPACK_SANITIZE_TORCH:-}
if [ -z "$torch" ]; then
  if [[ "$labels" =~ kernels|trainer|distributed ]]; then torch=1; else torch=0; fi
fi
torch_flag=$([ "$torch" = 1 ] && echo ON || echo OFF)

start=$(date +%s)
# -O1: instrumented code compiles 1.5x faster than at -O2 (safetensors.cpp: 45 s of CPU against 66 s; 25 s without
# sanitizers) and the stacks of reports stay readable.
bash ci/build.sh -DFUSEPACK_SANITIZE="address;undefined" -DFUSEPACK_WITH_CUDA=OFF -DFUSEPACK_WITH_TORCH="$torch_flag" \
     -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG"
built=$(date +%s)

supp="$(pwd)/ci/lsan_libtorch.supp"
# halt_on_error: the first report ends the test, so it cannot pass. LeakSanitizer runs; ci/lsan_libtorch.supp is where
# LibTorch's own process-lifetime allocations would be suppressed (third-party frames only). detect_container_overflow
# stays on: libstdc++ does not annotate its containers unless _GLIBCXX_SANITIZE_VECTOR is defined, so LibTorch's
# uninstrumented code cannot trip it.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:check_initialization_order=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export FUSEPACK_TEST_LEVEL=${FUSEPACK_TEST_LEVEL:-smoke}
echo "[sanitize] labels '$labels', LibTorch $torch_flag, FUSEPACK_TEST_LEVEL=$FUSEPACK_TEST_LEVEL" \
     "FUSEPACK_SEED=${FUSEPACK_SEED:-default}"
echo "[sanitize] ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS"
status=0
ctest --test-dir "$FUSEPACK_BUILD_DIR" -L "$labels" --output-on-failure --test-output-size-failed 1048576 \
      --output-junit "$(cd "$FUSEPACK_BUILD_DIR" && pwd)/junit.xml" -j "${FUSEPACK_JOBS:-$(nproc)}" "$@" || status=$?
echo "[sanitize] build $(( built - start )) s, tests $(( $(date +%s) - built )) s"
exit $status
