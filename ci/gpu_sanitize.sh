#!/usr/bin/env bash
# compute-sanitizer's four tools over small cases of every fused kernel, forward and backward: memcheck (out-of-bounds
# and misaligned accesses), racecheck (shared-memory hazards), initcheck (reads of global memory never written) and
# synccheck (barriers not reached by every thread). Each case is one fusepack-gradcheck run of the op's fused forward
# and backward on a packed batch with edge lengths (an empty example, one token, a chunk of 64 exactly, one past it).
#   memcheck, synccheck: the whole gradient check (the fused op, its composite baseline, the fp64 reference),
#     instrumenting fusepack's kernels only (--kernel-name kns=fusepack): the baseline's ATen and cuBLAS kernels are
#     not ours to fix.
#   racecheck: the fused op alone (--fused-only), fusepack's kernels. With the composite attention baseline in the
#     same process, racecheck itself faults ("failed to handle a hardware exception", then an illegal address in an
#     uninstrumented kernel) although memcheck over every kernel of that run reports nothing.
#   initcheck: the fused op alone, every kernel instrumented (memory written by an uninstrumented kernel, such as the
#     FlashAttention-2 output that the attention gate reads, would look uninitialised). In the composite baseline it
#     reports ATen's reads of cuBLAS's batched-GEMM output, whose values are right: stores initcheck does not see.
# The fused linear cross-entropy, conv1d's column parts and the AdamW kernel run through their GPU tests instead
# (fusepack-gradcheck has no case for them).
# Exit status is non-zero when any tool reports anything or a gradient check fails; logs in $OUT_DIR.
#   ci/gpu_sanitize.sh [build dir] [--only REGEX] [--list]
#     build dir     default: $FUSEPACK_BUILD_DIR or build
#     --only REGEX  only the cases whose name (as --list prints it) matches the extended regular expression, e.g.
#                   'gated_delta .*lean' for the lean Gated DeltaNet kernels in every dtype; refused when it selects none
#     --list        print the selected cases' names and exit (needs no build, no GPU)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
usage() { sed -n '/^#   ci\/gpu_sanitize.sh \[/,/^#     --list/s/^# \{0,1\}//p' "$0"; }
build_dir=${FUSEPACK_BUILD_DIR:-build}
only_regex=
list=false
while [ $# -gt 0 ]; do
  case $1 in
    --only)
      [ $# -ge 2 ] || { echo "gpu_sanitize: --only needs a regular expression"; usage; exit 2; }
      only_regex=$2
      shift 2 ;;
    --list) list=true; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu_sanitize: unknown option '$1'"; usage; exit 2 ;;
    *) build_dir=$1; shift ;;
  esac
done
if [ -n "$only_regex" ]; then
  echo | grep -Eq -- "$only_regex" 2>/dev/null
  [ $? -le 1 ] || { echo "gpu_sanitize: --only '$only_regex' is not an extended regular expression"; exit 2; }
fi
selected_count=0
# NAME: whether --only selects the case; counts it, and prints it instead under --list.
selected() {
  if [ -n "$only_regex" ] && ! grep -Eq -- "$only_regex" <<<"$1"; then return 1; fi
  selected_count=$((selected_count + 1))
  if $list; then echo "$1"; return 1; fi
  return 0
}
gradcheck="$build_dir/bin/fusepack-gradcheck"
if ! $list; then
  [ -x "$gradcheck" ] || { echo "gpu_sanitize: $gradcheck not found; build first"; exit 2; }
  sanitizer=${COMPUTE_SANITIZER:-compute-sanitizer}
  command -v "$sanitizer" >/dev/null || sanitizer=/usr/local/cuda/bin/compute-sanitizer
  [ -x "$(command -v "$sanitizer")" ] || { echo "gpu_sanitize: compute-sanitizer not found (CUDA toolkit)"; exit 2; }
  out=${OUT_DIR:-$build_dir/sanitize}
  mkdir -p "$out"
fi
seqlens=0,1,17,64,65,130

# op, dtype, extra gradcheck arguments: every fused kernel family, Gated DeltaNet in each dtype (its kernels differ by
# dtype) and under each schedule (different kernels for the state chains and the output), attention with grouped query
# heads and its gate, conv1d with and without its fused SiLU.
cases=(
  "swiglu bf16"
  "rmsnorm bf16"
  "gated_rmsnorm bf16"
  "rope bf16 --rotary-dim 64"
  "conv1d bf16"
  "conv1d fp32 --no-silu"
  "attention bf16 --heads 4 --kv-heads 2"
  "gated_delta bf16 --heads 2,4 --schedule full"
  "gated_delta fp16 --heads 2,4 --schedule full"
  "gated_delta fp32 --heads 2,4 --schedule full"
  "gated_delta bf16 --heads 2,4 --schedule lean"
  "gated_delta fp16 --heads 2,4 --schedule lean"
  "gated_delta fp32 --heads 2,4 --schedule lean"
)
failed=0
# CASE TOOL LOG COMMAND...: runs COMMAND under TOOL, prints one line, sets failed=1 on any report or failure.
check() {
  local name=$1 tool=$2 log=$3 status summary verdict
  shift 3
  "$sanitizer" --tool "$tool" "$@" >"$log" 2>&1
  status=$?
  summary=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1 | sed 's/^========= //')
  verdict=$(tail -1 "$log")
  if [ $status -ne 0 ] || ! grep -qE 'SUMMARY: 0 (errors|hazards)' "$log"; then
    failed=1
    printf '%-44s %-10s FAILED (exit %d): %s; %s (log %s)\n' "$name" "$tool" "$status" "${summary:-no summary}" \
      "$verdict" "$log"
  else
    printf '%-44s %-10s clean: %s; %s\n' "$name" "$tool" "$summary" "$verdict"
  fi
}
$list || printf '%-44s %-10s %s\n' case tool result
for c in "${cases[@]}"; do
  read -r op dtype extra <<<"$c"
  selected "$op $dtype${extra:+ $extra}" || continue
  for tool in memcheck racecheck initcheck synccheck; do
    log="$out/${op}-${dtype}${extra:+-$(echo "$extra" | tr -d ' -' | tr ',' '_')}-$tool.log"
    filter=(--kernel-name kns=fusepack)
    only=()
    case $tool in
      racecheck) only=(--fused-only) ;;
      initcheck) filter=(); only=(--fused-only) ;;
    esac
    # shellcheck disable=SC2086
    check "$op $dtype $extra" "$tool" "$log" "${filter[@]}" --print-limit 50 --error-exitcode 99 \
      "$gradcheck" "$op" --backend fused --device cuda --dtype "$dtype" --seqlens "$seqlens" "${only[@]}" $extra
  done
done
# NAME LOG BINARY TESTS [RACE_INIT_TESTS]: a test binary's GPU tests (a --gtest_filter) under the four tools,
# fusepack's kernels instrumented, except initcheck, which instruments every kernel (ATen's kernels write the tests'
# inputs first); racecheck and initcheck run RACE_INIT_TESTS when given.
sanitize_tests() {
  local name=$1 log=$2 binary=$3 tests=$4 race_init_tests=${5:-$4} tool selected filter
  selected "$name" || return
  if [ ! -x "$binary" ]; then
    failed=1
    echo "gpu_sanitize: $binary not found (build the tests)"
    return
  fi
  for tool in memcheck racecheck initcheck synccheck; do
    filter=(--kernel-name kns=fusepack)
    selected=$tests
    [ $tool = initcheck ] && filter=()
    { [ $tool = initcheck ] || [ $tool = racecheck ]; } && selected=$race_init_tests
    check "$name" "$tool" "$out/$log-$tool.log" "${filter[@]}" --print-limit 50 --error-exitcode 99 "$binary" \
      --gtest_filter="$selected"
  done
}
# The fused linear cross-entropy, which fusepack-gradcheck has no case for, through its GPU tests: the per-token kernel
# on rows of whole and partial 16-byte vectors, chunks of 37 tokens and automatic, labels -100, and a bad label.
# initcheck and racecheck run the kernel's own test instead, whose logits ATen's kernels write: in the op the kernel
# reads the head GEMM's output, and initcheck does not see cuBLAS's stores (it reports ATen's reads of such output in
# the composite attention too, whose values the same run checks); racecheck faults in the op's tests as it does beside
# the composite attention ("failed to handle a hardware exception", then an illegal address in every later test) while
# memcheck over the same tests reports nothing.
sanitize_tests "linear_cross_entropy (its GPU tests)" linear_cross_entropy \
  "$build_dir/tests/kernels_linear_cross_entropy_test" \
  '*LinearCrossEntropyFused.MatchesTheReference*bf16*:*LinearCrossEntropyFused.ABadLabel*' \
  '*LinearCrossEntropyFused.RowKernel*'
# conv1d writing its output as column parts and reading its gradient from them (the model's q, k, v), through the test
# that compares them with the whole convolution: the vector path (every part start a multiple of 4) and the scalar
# path, with empty parts and empty examples.
sanitize_tests "conv1d column parts (its GPU test)" conv1d-parts "$build_dir/tests/kernels_conv1d_test" \
  '*Conv1dFused.PartsAreTheColumnsOfConv1dToTheBit*'
# fusepack's AdamW kernel (kernels/optim), through the trainer's optimizer tests that run it: many parameters of
# every size, aligned and one element into their buffers, fp32 and fp64, with compute copies (p, g, m and v are
# written by ATen's kernels first).
sanitize_tests "adamw (its GPU tests)" adamw "$build_dir/tests/trainer_optim_test" '*CudaFusepack*'
if [ $selected_count -eq 0 ]; then
  echo "gpu_sanitize: --only '$only_regex' selects no case (--list prints them)"
  exit 2
fi
$list && exit 0
[ $failed -eq 0 ] && echo "[sanitize] PASSED: no report from any tool" || echo "[sanitize] FAILED (logs in $out)"
exit $failed
