#!/usr/bin/env bash
# Where a fused op's time goes, per kernel: Nsight Compute over fusepack-bench's timing loops, one row per kernel with
# its time, instructions and the limits it meets (issue, tensor pipe, L1/shared memory, DRAM, occupancy), as
# ci/kernel_profile.py prints them (kernels/gated_delta/NOTES.md has such a table). Clocks are left as they are
# (--clock-control none), as the benchmark runs; each kernel runs alone under the profiler. The op's benchmark shape
# comes from its environment variables, for example FUSEPACK_BENCH_GATED_DELTA_SHAPE="1x8192 Hk=16 Hv=32".
#   ci/gpu_profile.sh [build dir] [--kernels REGEX] [--skip N] [--count N] OP
#     build dir        default: $FUSEPACK_BUILD_DIR or build
#     --kernels REGEX  the kernels to profile (ncu's regex on the function name); default: OP
#     --skip N         launches of those kernels to let run first (default 40: past the benchmark's checks and warm-up;
#                      with the default regex these are forward kernels, which the benchmark times first; for the
#                      backward's: --kernels OP_bwd --skip 10 --count 6, e.g. gated_delta_bwd)
#     --count N        launches to profile (default 12); a kernel launched more than once is folded into its median
#     OP               the fusepack-bench op, e.g. gated_delta
# Exit status non-zero when ncu or the report fails; ncu's report and log in $OUT_DIR (default: build dir/profile).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
usage() { sed -n '/^#   ci\/gpu_profile.sh \[/,/^#     OP /s/^# \{0,1\}//p' "$0"; }
build_dir=${FUSEPACK_BUILD_DIR:-build}
kernels= skip=40 count=12 op=
positional=()
positive() { [[ $2 =~ ^[0-9]+$ ]] || { echo "gpu_profile: $1 needs a whole number; got '$2'"; exit 2; }; }
while [ $# -gt 0 ]; do
  case $1 in
    --kernels|--skip|--count)
      [ $# -ge 2 ] || { echo "gpu_profile: $1 needs a value"; usage; exit 2; }
      case $1 in
        --kernels) kernels=$2 ;;
        --skip) positive "$1" "$2"; skip=$2 ;;
        --count) positive "$1" "$2"; count=$2 ;;
      esac
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu_profile: unknown option '$1'"; usage; exit 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
case ${#positional[@]} in
  1) op=${positional[0]} ;;
  2) build_dir=${positional[0]} op=${positional[1]} ;;
  0) echo "gpu_profile: name the op to profile (e.g. gated_delta)"; usage; exit 2 ;;
  *) echo "gpu_profile: expected [build dir] OP; got ${positional[*]}"; usage; exit 2 ;;
esac
[ "$count" -ge 1 ] || { echo "gpu_profile: --count must be at least 1"; exit 2; }
bench="$build_dir/bin/fusepack-bench"
if [ ! -x "$bench" ]; then
  echo "gpu_profile: $bench not found; build first (ci/build.sh with FUSEPACK_TARGETS=fusepack-bench)"
  exit 2
fi
ncu=${NCU:-ncu}
command -v "$ncu" >/dev/null || ncu=/usr/local/cuda/bin/ncu
[ -x "$(command -v "$ncu")" ] || { echo "gpu_profile: ncu (Nsight Compute) not found"; exit 2; }
out=${OUT_DIR:-$build_dir/profile}
mkdir -p "$out"
metrics=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,l1tex__throughput.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,launch__grid_size,launch__block_size,launch__registers_per_thread
csv="$out/$op.csv"
echo "gpu_profile: $op, kernels matching '${kernels:-$op}', launches $skip.. ($count of them); ncu log $out/$op.log"
"$ncu" --clock-control none --kernel-name "regex:${kernels:-$op}" --launch-skip "$skip" --launch-count "$count" \
  --csv --page raw --print-units base --metrics "$metrics" "$bench" "$op" >"$csv" 2>"$out/$op.log"
status=$?
if [ $status -ne 0 ]; then
  echo "gpu_profile: ncu failed (exit $status); the end of its log:"
  tail -5 "$out/$op.log"
  exit 1
fi
python3 ci/kernel_profile.py "$csv"
