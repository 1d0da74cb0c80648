#!/usr/bin/env bash
# Sharded against unsharded training on this machine's GPUs: fusepack-train on $PRESET (default qwen35-27b-4layers),
# packed, fused, bf16, an 8,192-token budget and log-normal lengths (median 900), first as one process alone, then
# under torchrun --no-python on each GPU count of $GPUS (default: 1 and every power of two up to the GPUs present).
# Per run: seconds from launch to the first step, median tokens/s per GPU over the steady steps (2 onwards), the
# profiled step's communication and its overlap with compute, peak memory per rank and what a step adds on top of the
# weights and optimizer state (activations). The one-process runs go once per activation checkpointing mode of
# $CHECKPOINTING (default: none full); the sharded ones with resharding on and off, and with checkpointing full.
# Logs go to $OUT_DIR.
#   ci/bench_sharded.sh [build dir]        (default: $FUSEPACK_BUILD_DIR or build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-${FUSEPACK_BUILD_DIR:-build}}
train="$build_dir/bin/fusepack-train"
[ -x "$train" ] || { echo "bench_sharded: $train not found; build first"; exit 2; }
preset=${PRESET:-qwen35-27b-4layers}
steps=${STEPS:-12}
out=${OUT_DIR:-$build_dir/bench-sharded}
mkdir -p "$out"
gpus_present=$(nvidia-smi -L | wc -l)
if [ -z "${GPUS:-}" ]; then
  GPUS=1
  for n in 2 4 8 16; do [ "$n" -le "$gpus_present" ] && GPUS="$GPUS $n"; done
fi
torchrun=${TORCHRUN:-"python3 -m torch.distributed.run"}
args=(--preset "$preset" --device cuda --dtype bf16 --backend fused --batching packed --pairing fill --budget 8192
      --data synthetic:n=4000,median=900,sigma=0.8,min=16,max=8192 --steps "$steps" --profile-step $((steps - 2))
      --no-progress)

# Each output line prefixed by the seconds since launch, so the first step's arrival is measured from the outside.
timed() {
  local start
  start=$(date +%s.%N)
  "$@" 2>&1 | while IFS= read -r line; do
    printf '%s %s\n' "$(awk -v now="$(date +%s.%N)" -v t0="$start" 'BEGIN { printf "%.2f", now - t0 }')" "$line"
  done
}

report() {  # log, label, ranks
  local log=$1 label=$2 ranks=$3
  local first tps comm peak
  first=$(awk '$2 == "step" {print $1; exit}' "$log")
  # Median over steps 2.. of tokens/s; with N ranks the step line counts every rank's tokens: per GPU = / N.
  tps=$(awk -v n="$ranks" '$2 == "step" { split($3, s, "/"); if (s[1] >= 2) for (i = 1; i <= NF; ++i)
          if ($i == "tok/s") { v = $(i - 1); gsub(",", "", v); print v / n } }' "$log" |
        sort -n | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }')
  comm=$(grep -o 'communication: .*' "$log" | head -1 || true)
  peak=$(grep -o 'peak GPU memory: [0-9.]* GiB' "$log" | head -1 | awk '{print $4}' || true)
  act=$(grep -o '[0-9.]* GiB more during a step' "$log" | head -1 | awk '{print $1}' || true)
  printf '%-44s first step after %6s s   %9.0f tokens/s per GPU   peak %s GiB (activations %s GiB)   %s\n' \
    "$label" "$first" "$tps" "${peak:-?}" "${act:-?}" "${comm:-no NCCL kernels}"
}

echo "[bench] $preset, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x $gpus_present; logs in $out"
for ac in ${CHECKPOINTING:-none full}; do
  log="$out/unsharded-checkpointing-$ac.log"
  timed "$train" "${args[@]}" --activation-checkpointing "$ac" > "$log"
  report "$log" "unsharded, activation checkpointing $ac" 1
done
for n in $GPUS; do
  for reshard in true false; do
    log="$out/sharded-$n-reshard-$reshard.log"
    timed $torchrun --standalone --nproc-per-node "$n" --no-python "$train" "${args[@]}" \
      --reshard-after-forward "$reshard" > "$log"
    report "$log" "sharded, $n GPU(s), reshard $reshard" "$n"
  done
  log="$out/sharded-$n-checkpointing-full.log"
  timed $torchrun --standalone --nproc-per-node "$n" --no-python "$train" "${args[@]}" --activation-checkpointing full \
    > "$log"
  report "$log" "sharded, $n GPU(s), checkpointing full" "$n"
done
