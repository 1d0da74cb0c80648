#!/usr/bin/env bash
# The verification gate: builds fusepack, runs every check this machine can run (GPU checks report SKIPPED without
# a device), prints a pass/fail summary per label with the worst error-budget share of every checked tensor, then
# trains the embedded qwen35-tiny model on packed batches and compares it step by step with the committed padded
# golden (golden/qwen35-tiny-padded.json; loss table, tokens/s, padding share).
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
# The golden's own settings (golden/regenerate.sh) with --batching packed: composite fp64 on the CPU. (The fused
# backend needs DeltaNet head dims of 64 or 128; qwen35-tiny's are 16, the Hugging Face golden's.)
echo "[gate] training qwen35-tiny packed against the padded golden golden/qwen35-tiny-padded.json"
args=$(sed -n 's/^  *--/--/p' golden/regenerate.sh | sed 's/ *\\$//' | tr '\n' ' ' | sed 's/--golden-write [^ ]*//')
# shellcheck disable=SC2086
"$build_dir/bin/fusepack-train" ${args/--batching padded/--batching packed} --golden-check golden/qwen35-tiny-padded.json
golden_status=$?
echo "[gate] golden comparison: $([ $golden_status -eq 0 ] && echo PASSED || echo FAILED)"
if [ $ctest_status -eq 0 ] && [ $summary_status -eq 0 ] && [ $golden_status -eq 0 ]; then
  echo "[gate] PASSED: tests and golden"
else
  echo "[gate] FAILED: tests $([ $ctest_status -eq 0 ] && [ $summary_status -eq 0 ] && echo passed || echo failed), golden $([ $golden_status -eq 0 ] && echo passed || echo failed)"
  exit 1
fi
