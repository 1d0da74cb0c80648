#!/usr/bin/env bash
# Builds fusepack and runs its tests with CTest; JUnit XML goes to build/junit.xml.
# Arguments are passed to ctest (for example: -L reference, -R Conv1d, --repeat until-fail:3).
# FUSEPACK_TEST_LEVEL=smoke|full (default smoke) and FUSEPACK_SEED select the random cases.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FUSEPACK_BUILD_DIR:-build}
bash ci/build.sh
export FUSEPACK_TEST_LEVEL=${FUSEPACK_TEST_LEVEL:-smoke}
echo "[test] FUSEPACK_TEST_LEVEL=$FUSEPACK_TEST_LEVEL FUSEPACK_SEED=${FUSEPACK_SEED:-default}"
# One test per core, so each test's CPU thread pool gets one thread (more only oversubscribe the cores).
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ctest --test-dir "$build_dir" --output-on-failure --test-output-size-passed 262144 --test-output-size-failed 1048576 --output-junit "$(cd "$build_dir" && pwd)/junit.xml" -j "${FUSEPACK_JOBS:-$(nproc)}" "$@"
