#!/usr/bin/env bash
# End-to-end training throughput, fusepack against the Hugging Face transformers baseline users run today, side by
# side on this machine's GPU. For each preset of $MODELS (default: bench-200m qwen35-0.8b qwen35-27b-4layers):
#  (a) fusepack-train: packed, fused, bf16, an 8,192-token budget, log-normal lengths (median 900, sigma 0.8,
#      16..8192), $STEPS steps (default 20), step $PROFILE_STEP (default 3) profiled, no activation checkpointing,
#      plus $TRAIN_ARGS (for example "--complete-packs" or "--micro-batches 2");
#  (b) ci/hf_baseline.py with $HF_PYTHON (default python3) on the same model (its config.json from
#      fusepack-train --print-config) and the same length law: transformers' Qwen3_5ForCausalLM, padded batches of
#      rows x longest <= 8,192, bf16, sdpa, fused AdamW, no activation checkpointing; SKIP_HF=1 leaves it out.
# Then one markdown table (ci/bench_e2e_summary.py, also written to $OUT_DIR/summary.md): per model, tokens/s averaged
# over all steps including the first and the steady median (steps $WARMUP on, default 2) for both and their ratio,
# the GPU-busy share and the GPU kernels per token of the profiled step, the peak GPU memory, the baseline's padding
# share, and the SM clock under load with the share of it throttled for power or heat (nvidia-smi sampled every 200 ms
# during each run, when there is one: an H200 holding its 700 W cap runs the largest model's GEMMs 15-20% below its
# boost clock). Logs, metrics and configs go to $OUT_DIR (default: <build dir>/bench-e2e). A model whose run fails
# shows as FAILED with its log; the others still run, and the script exits non-zero at the end.
#   ci/bench_e2e.sh [build dir]        (default: $FUSEPACK_BUILD_DIR or build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-${FUSEPACK_BUILD_DIR:-build}}
train="$build_dir/bin/fusepack-train"
[ -x "$train" ] || { echo "bench_e2e: $train not found; build first" >&2; exit 2; }
read -r -a models <<< "${MODELS:-bench-200m qwen35-0.8b qwen35-27b-4layers}"
steps=${STEPS:-20}
profile_step=${PROFILE_STEP:-3}
warmup=${WARMUP:-2}
out=${OUT_DIR:-$build_dir/bench-e2e}
hf_python=${HF_PYTHON:-python3}
read -r -a train_args <<< "${TRAIN_ARGS:-}"
skip_hf=${SKIP_HF:-0}
budget=8192
data=synthetic:n=4000,median=900,sigma=0.8,min=16,max=8192
if ! [ "$profile_step" -ge 0 ] 2>/dev/null || [ "$profile_step" -ge "$steps" ]; then
  echo "bench_e2e: PROFILE_STEP=$profile_step must be in [0, STEPS=$steps)" >&2
  exit 2
fi
mkdir -p "$out"

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
echo "[bench-e2e] ${gpu:-no nvidia-smi}; models: ${models[*]}; $steps steps, step $profile_step profiled;" \
  "fusepack-train extra options: ${TRAIN_ARGS:-none}; logs in $out"

# Runs a command with its output in a log and its exit status in an .rc file beside it; never fails itself, so the
# other models still run after one fails.
logged() {  # rc file, log, command...
  local rc_file=$1 log=$2 rc=0
  shift 2
  "$@" > "$log" 2>&1 < /dev/null || rc=$?
  echo "$rc" > "$rc_file"
  return 0
}

# Runs a command with the GPU's SM clock, power draw and throttle reasons sampled into a CSV file every 200 ms (the
# GPU the runs use: the first of CUDA_VISIBLE_DEVICES, else 0); just the command without nvidia-smi.
sampled() {  # csv, command...
  local csv=$1 pid=""
  shift
  if command -v nvidia-smi > /dev/null 2>&1; then
    local gpu_id=${CUDA_VISIBLE_DEVICES:-0}
    nvidia-smi -i "${gpu_id%%,*}" --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active \
      --format=csv,noheader,nounits -lms 200 > "$csv" 2>&1 &
    pid=$!
  fi
  "$@"
  if [ -n "$pid" ]; then
    kill "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
  fi
}

for m in "${models[@]}"; do
  rm -f "$out/fusepack-$m".{log,metrics.jsonl,rc,gpu.csv} "$out/hf-$m".{log,json,rc,gpu.csv} "$out/$m.json"

  echo "[bench-e2e] $m: fusepack-train"
  sampled "$out/fusepack-$m.gpu.csv" logged "$out/fusepack-$m.rc" "$out/fusepack-$m.log" \
    "$train" --preset "$m" --device cuda --dtype bf16 --backend fused --batching packed --pairing fill \
    --budget "$budget" --data "$data" --steps "$steps" --profile-step "$profile_step" --no-progress \
    --metrics "$out/fusepack-$m.metrics.jsonl" ${train_args[@]+"${train_args[@]}"}
  echo "[bench-e2e] $m: fusepack-train exit $(cat "$out/fusepack-$m.rc"); $(grep -m1 '^throughput:' \
    "$out/fusepack-$m.log" || echo "no throughput line; see $out/fusepack-$m.log")"

  [ "$skip_hf" = 1 ] && continue
  echo "[bench-e2e] $m: Hugging Face transformers baseline ($hf_python)"
  if ! "$train" --preset "$m" --print-config > "$out/$m.json" 2> "$out/hf-$m.log"; then
    echo "bench_e2e: fusepack-train --preset $m --print-config failed: no config.json for the baseline" \
      >> "$out/hf-$m.log"
    echo 2 > "$out/hf-$m.rc"
  else
    sampled "$out/hf-$m.gpu.csv" logged "$out/hf-$m.rc" "$out/hf-$m.log" \
      "$hf_python" ci/hf_baseline.py --config "$out/$m.json" --steps "$steps" --warmup "$warmup" --budget "$budget" \
      --device cuda --profile-step "$profile_step" --json "$out/hf-$m.json"
  fi
  echo "[bench-e2e] $m: baseline exit $(cat "$out/hf-$m.rc"); $(grep -m1 '^throughput:' "$out/hf-$m.log" ||
    echo "no throughput line; see $out/hf-$m.log")"
done

echo
summary_args=("$out" "${models[@]}" --warmup "$warmup" --profile-step "$profile_step")
[ "$skip_hf" = 1 ] && summary_args+=(--skip-hf)
rc=0
python3 ci/bench_e2e_summary.py "${summary_args[@]}" > "$out/summary.md" || rc=$?
cat "$out/summary.md"
exit "$rc"
