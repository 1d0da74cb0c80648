#!/usr/bin/env bash
# The verification gate: builds fusepack, runs every check this machine can run (GPU checks report SKIPPED without
# a device), prints a pass/fail summary per label with the worst error-budget share of every checked tensor, then
# trains the embedded qwen35-tiny model on packed batches and compares it step by step with the committed padded
# golden (golden/qwen35-tiny-padded.json; loss table, tokens/s, padding share), then the same sharded over 2 CPU ranks
# launched by torchrun; on a GPU machine also the fused bf16 path on qwen35-tiny64 against its golden, within twice the
# drift of the padded composite bf16 run. Last, ci/report.py writes $build_dir/report/report.md with plots of all of it.
# Exit status is non-zero on any failure; JUnit XML is in $build_dir/junit.xml.
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
# Every golden run writes its metrics (--metrics) into $build_dir/gate/ for the report; none is left from a former gate.
mkdir -p "$build_dir/gate"
rm -f "$build_dir"/gate/metrics-*.jsonl
report_runs=()
add_report_run() {  # NAME METRICS [GOLDEN [BASELINE]]: the report's --run, when the run wrote its metrics
  if [ -s "$2" ]; then report_runs+=(--run "$@"); fi
}
# The golden's own settings with --batching packed: composite fp64 on the CPU, to the fp64-derived tolerance.
echo "[gate] training qwen35-tiny packed (composite, fp64, cpu) against the padded golden golden/qwen35-tiny-padded.json"
"$train" --preset qwen35-tiny --batching packed --backend composite --dtype fp64 --device cpu "${golden_settings[@]}" \
  --golden-check golden/qwen35-tiny-padded.json --metrics "$build_dir/gate/metrics-packed.jsonl"
golden_status=$?
add_report_run "qwen35-tiny packed (composite, fp64, cpu)" "$build_dir/gate/metrics-packed.jsonl" \
  golden/qwen35-tiny-padded.json
echo "[gate] golden comparison (composite): $([ $golden_status -eq 0 ] && echo PASSED || echo FAILED)"
# The same run sharded over 2 CPU ranks (Gloo), launched by torchrun as users launch it: 2 ranks x 1 micro-batch train
# the golden's 2 micro-batches per step.
torchrun=("${FUSEPACK_DEPS:-$HOME/.cache/fusepack}/venv/bin/torchrun")  # ci/setup.sh's; else python3's torch
[ -x "${torchrun[0]}" ] || { python3 -c 'import torch.distributed.run' 2>/dev/null && torchrun=(python3 -m torch.distributed.run); }
if [ -x "${torchrun[0]}" ] || [ "${torchrun[0]}" = python3 ]; then
  echo "[gate] training qwen35-tiny packed on 2 sharded CPU ranks (torchrun, Gloo) against the same golden"
  OMP_NUM_THREADS=1 "${torchrun[@]}" --standalone --nproc-per-node 2 --no-python "$train" --preset qwen35-tiny \
    --batching packed --backend composite --dtype fp64 --device cpu "${golden_settings[@]}" --micro-batches 1 \
    --golden-check golden/qwen35-tiny-padded.json --metrics "$build_dir/gate/metrics-sharded.jsonl" 2>&1 |
    grep -v "Failed to initialize NumPy\|_conversion_method_template"
  sharded_status=${PIPESTATUS[0]}
  add_report_run "qwen35-tiny packed, 2 sharded ranks (composite, fp64, cpu)" "$build_dir/gate/metrics-sharded.jsonl" \
    golden/qwen35-tiny-padded.json
  echo "[gate] golden comparison (2 sharded ranks): $([ "$sharded_status" -eq 0 ] && echo PASSED || echo FAILED)"
  [ "$sharded_status" -eq 0 ] || golden_status=1
else
  echo "[gate] SKIPPED the sharded golden check: no torchrun (ci/setup.sh installs one with the torch wheel)"
fi
# On a GPU machine the fused path too: qwen35-tiny64 packed, fused, bf16, against its fp64 padded golden, allowed
# twice the drift of the padded composite bf16 run (the baseline, run first) plus one bf16 rounding step.
if nvidia-smi -L >/dev/null 2>&1; then
  baseline="$build_dir/gate/qwen35-tiny64-padded-composite-bf16.json"
  rm -f "$baseline"
  echo "[gate] GPU: the bf16 baseline, qwen35-tiny64 padded (composite, bf16, cuda) -> $baseline"
  "$train" --preset qwen35-tiny64 --batching padded --backend composite --dtype bf16 --device cuda \
    "${golden_settings[@]}" --golden-write "$baseline" --metrics "$build_dir/gate/metrics-baseline-bf16.jsonl" \
    >"$build_dir/gate/baseline.log" 2>&1 || { cat "$build_dir/gate/baseline.log"; golden_status=1; }
  if [ -f "$baseline" ]; then
    echo "[gate] GPU: training qwen35-tiny64 packed (fused, bf16, cuda) against golden/qwen35-tiny64-padded.json"
    "$train" --preset qwen35-tiny64 --batching packed --backend fused --dtype bf16 --device cuda "${golden_settings[@]}" \
      --golden-check golden/qwen35-tiny64-padded.json --golden-baseline "$baseline" \
      --metrics "$build_dir/gate/metrics-fused-bf16.jsonl"
    fused_status=$?
    add_report_run "qwen35-tiny64 packed (fused, bf16, cuda)" "$build_dir/gate/metrics-fused-bf16.jsonl" \
      golden/qwen35-tiny64-padded.json "$baseline"
    echo "[gate] golden comparison (fused): $([ $fused_status -eq 0 ] && echo PASSED || echo FAILED)"
    [ $fused_status -eq 0 ] || golden_status=1
  fi
  add_report_run "qwen35-tiny64 padded (composite, bf16, cuda): the baseline" \
    "$build_dir/gate/metrics-baseline-bf16.jsonl"
fi
# The report folder: ci/setup.sh's venv python (it has matplotlib), else python3 (the report without plots). It never
# changes the verdict; a failure of its own is named here.
report_py=("${FUSEPACK_DEPS:-$HOME/.cache/fusepack}/venv/bin/python")
[ -x "${report_py[0]}" ] || report_py=(python3)
"${report_py[@]}" ci/report.py --out "$build_dir/report" --junit "$build_dir/junit.xml" --build-dir "$build_dir" \
  --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "${report_runs[@]}" ||
  echo "[gate] REPORT FAILED (exit $?): $build_dir/report is incomplete; the verdict below does not depend on it"
if [ $ctest_status -eq 0 ] && [ $summary_status -eq 0 ] && [ $golden_status -eq 0 ]; then
  echo "[gate] PASSED: tests and golden"
else
  echo "[gate] FAILED: tests $([ $ctest_status -eq 0 ] && [ $summary_status -eq 0 ] && echo passed || echo failed), golden $([ $golden_status -eq 0 ] && echo passed || echo failed)"
  exit 1
fi
