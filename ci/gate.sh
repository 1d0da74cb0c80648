#!/usr/bin/env bash
# The verification gate: builds fusepack, runs every check this machine can run (GPU checks report SKIPPED without
# a device) and prints a pass/fail summary per label with the worst error-budget share of every checked tensor.
# Exit status is non-zero on any failure; JUnit XML is in build/junit.xml.
set -uo pipefail
cd "$(dirname "$0")/.."
build_dir=${FUSEPACK_BUILD_DIR:-build}
bash ci/build.sh || exit 1
export FUSEPACK_TEST_LEVEL=${FUSEPACK_TEST_LEVEL:-smoke}
echo "[gate] FUSEPACK_TEST_LEVEL=$FUSEPACK_TEST_LEVEL FUSEPACK_SEED=${FUSEPACK_SEED:-default}; test log: $build_dir/gate.log"
ctest --test-dir "$build_dir" --test-output-size-passed 262144 --test-output-size-failed 1048576 --output-junit "$(cd "$build_dir" && pwd)/junit.xml" -j "${FUSEPACK_JOBS:-$(nproc)}" "$@" >"$build_dir/gate.log" 2>&1
ctest_status=$?
python3 ci/summarize.py "$build_dir" "$build_dir/junit.xml"
summary_status=$?
[ $ctest_status -eq 0 ] && [ $summary_status -eq 0 ]
