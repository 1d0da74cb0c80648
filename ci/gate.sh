#!/usr/bin/env bash
# The verification gate: builds fusepack, runs every check this machine can run (GPU checks report SKIPPED without
# a device), prints a pass/fail summary per label with the worst error-budget share of every checked tensor, then
# trains the embedded qwen35-tiny model on packed batches and compares it step by step with the committed padded
# golden (golden/qwen35-tiny-padded.json; loss table, tokens/s, padding share), then the same sharded over 2 CPU ranks
# launched by torchrun; on a GPU machine also the fused bf16 path on qwen35-tiny64 against its golden, within twice the
# drift of the padded composite bf16 run.
# Exit status is non-zero on any failure; JUnit XML is in build/junit.xml.
set -uo pipefail
cd "$(dirname "$0")/.."
build_dir=${FUSEPACK_BUILD_DIR:-build}
bash ci/build.sh || exit 1
export FUSEPACK_TEST_LEVEL=${FUSEPACK_TEST_LEVEL:-smoke}
echo "[gate] FUSEPACK_TEST_LEVEL=$FUSEPACK_TEST_LEVEL FUSEPACK_SEED=${FUSEPACK_SEED:-default}; test log: $build_dir/gate.log"
# ctest runs one test per core, so each test's CPU thread pool gets one thread (16 tests x 16 threads thrash).
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ctest --test-dir "$build_dir" --test-output-size-passed 262144 --test-output-size-failed 1048576 --output-junit "$(cd "$build_dir" && pwd)/junit.xml" -j "${FUSEPACK_JOBS:-$(nproc)}" "$@" >"$build_dir/gate.log" 2>&1
ctest_status=$?
python3 ci/summarize.py "$build_dir" "$build_dir/junit.xml"
summary_status=$?
# shellcheck source=golden/settings.sh
source golden/settings.sh
train="$build_dir/bin/fusepack-train"
# The golden's own settings with --batching packed: composite fp64 on the CPU, to the fp64-derived tolerance.
echo "[gate] training qwen35-tiny packed (composite, fp64, cpu) against the padded golden golden/qwen35-tiny-padded.json"
"$train" --preset qwen35-tiny --batching packed --backend composite --dtype fp64 --device cpu "${golden_settings[@]}" \
  --golden-check golden/qwen35-tiny-padded.json
golden_status=$?
echo "[gate] golden comparison (composite): $([ $golden_status -eq 0 ] && echo PASSED || echo FAILED)"
# The same run sharded over 2 CPU ranks (Gloo), launched by torchrun as users launch it: 2 ranks x 1 micro-batch train
# the golden's 2 micro-batches per step.
torchrun=("${FUSEPACK_DEPS:-$HOME/.cache/fusepack}/venv/bin/torchrun")  # ci/setup.sh's; else python3's torch
[ -x "${torchrun[0]}" ] || { python3 -c 'import torch.distributed.run' 2>/dev/null && torchrun=(python3 -m torch.distributed.run); }
if [ -x "${torchrun[0]}" ] || [ "${torchrun[0]}" = python3 ]; then
  echo "[gate] training qwen35-tiny packed on 2 sharded CPU ranks (torchrun, Gloo) against the same golden"
  OMP_NUM_THREADS=1 "${torchrun[@]}" --standalone --nproc-per-node 2 --no-python "$train" --preset qwen35-tiny \
    --batching packed --backend composite --dtype fp64 --device cpu "${golden_settings[@]}" --micro-batches 1 \
    --golden-check golden/qwen35-tiny-padded.json 2>&1 | grep -v "Failed to initialize NumPy\|_conversion_method_template"
  sharded_status=${PIPESTATUS[0]}
  echo "[gate] golden comparison (2 sharded ranks): $([ "$sharded_status" -eq 0 ] && echo PASSED || echo FAILED)"
  [ "$sharded_status" -eq 0 ] || golden_status=1
else
  echo "[gate] SKIPPED the sharded golden check: no torchrun (ci/setup.sh installs one with the torch wheel)"
fi
# On a GPU machine the fused path too: qwen35-tiny64 packed, fused, bf16, against its fp64 padded golden, allowed
# twice the drift of the padded composite bf16 run (the baseline, run first) plus one bf16 rounding step.
if nvidia-smi -L >/dev/null 2>&1; then
  mkdir -p "$build_dir/gate"
  baseline="$build_dir/gate/qwen35-tiny64-padded-composite-bf16.json"
  rm -f "$baseline"
  echo "[gate] GPU: the bf16 baseline, qwen35-tiny64 padded (composite, bf16, cuda) -> $baseline"
  "$train" --preset qwen35-tiny64 --batching padded --backend composite --dtype bf16 --device cuda \
    "${golden_settings[@]}" --golden-write "$baseline" >"$build_dir/gate/baseline.log" 2>&1 ||
    { cat "$build_dir/gate/baseline.log"; golden_status=1; }
  if [ -f "$baseline" ]; then
    echo "[gate] GPU: training qwen35-tiny64 packed (fused, bf16, cuda) against golden/qwen35-tiny64-padded.json"
    "$train" --preset qwen35-tiny64 --batching packed --backend fused --dtype bf16 --device cuda "${golden_settings[@]}" \
      --golden-check golden/qwen35-tiny64-padded.json --golden-baseline "$baseline"
    fused_status=$?
    echo "[gate] golden comparison (fused): $([ $fused_status -eq 0 ] && echo PASSED || echo FAILED)"
    [ $fused_status -eq 0 ] || golden_status=1
  fi
fi
if [ $ctest_status -eq 0 ] && [ $summary_status -eq 0 ] && [ $golden_status -eq 0 ]; then
  echo "[gate] PASSED: tests and golden"
else
  echo "[gate] FAILED: tests $([ $ctest_status -eq 0 ] && [ $summary_status -eq 0 ] && echo passed || echo failed), golden $([ $golden_status -eq 0 ] && echo passed || echo failed)"
  exit 1
fi
