#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (ASan + UBSan, no LibTorch, no CUDA) into build-fuzz/ (or
# $FUSEPACK_FUZZ_BUILD_DIR), replays tests/fuzz/regressions/<target>/, then fuzzes each target for
# FUSEPACK_FUZZ_SECONDS (default 20) from a copy of tests/fuzz/corpus/<target>/ (the repository is never written),
# with tests/fuzz/dict/<target>.dict as its dictionary.
# FUSEPACK_FUZZ_TARGETS="a b" runs only those; FUSEPACK_FUZZ_CXX picks the compiler (default clang++).
# Prints runs, exec/s and the final corpus per target; exits 1 after any crash, naming the input and how to replay it.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${FUSEPACK_FUZZ_BUILD_DIR:-build-fuzz}
seconds=${FUSEPACK_FUZZ_SECONDS:-20}
cxx=${FUSEPACK_FUZZ_CXX:-clang++}
targets=${FUSEPACK_FUZZ_TARGETS:-$(ls tests/fuzz/corpus)}

log() { printf '[fuzz] %s\n' "$*"; }

command -v "$cxx" >/dev/null || { log "$cxx not found: the fuzzers need clang with libFuzzer (Debian: clang)"; exit 1; }
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
start=$(date +%s)
mkdir -p "$build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DFUSEPACK_FUZZ=ON -DFUSEPACK_WITH_TORCH=OFF \
      -DFUSEPACK_WITH_CUDA=OFF >"$build_dir/configure.log" 2>&1 ||
  { cat "$build_dir/configure.log"; log "configure failed (log above)"; exit 1; }
cmake --build "$build_dir" -j "${FUSEPACK_JOBS:-$(nproc)}" --target fusepack-fuzzers
log "built $build_dir in $(( $(date +%s) - start )) s"

# A failing input: where it is, its first bytes, and the command that replays it.
report_crash() {
  local target=$1 bin=$2 input=$3
  log "$target: CRASH on $input ($(stat -c %s "$input") bytes); first bytes:"
  od -A d -c "$input" | head -n 8
  log "replay: $bin $input"
  case "$input" in
    tests/fuzz/regressions/*) ;;
    *) log "once understood, keep it as a regression input: cp $input tests/fuzz/regressions/$target/" ;;
  esac
}

# Sanitizer reports abort the process: libFuzzer then saves the input and exits non-zero.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
work="$(cd "$build_dir" && pwd)/fuzz-run"
failed=()
summary=()
for target in $targets; do
  bin="$(cd "$build_dir" && pwd)/bin/$target"
  [ -x "$bin" ] || { log "$target: no binary $bin"; failed+=("$target"); continue; }
  rm -rf "${work:?}/$target"
  mkdir -p "$work/$target/corpus" "$work/$target/artifacts"
  cp tests/fuzz/corpus/"$target"/* "$work/$target/corpus/"

  regressions=(tests/fuzz/regressions/"$target"/*)
  if [ -e "${regressions[0]}" ]; then
    for input in "${regressions[@]}"; do
      if ! "$bin" "$input" >"$work/$target/regression.log" 2>&1; then
        tail -n 40 "$work/$target/regression.log"
        report_crash "$target" "$bin" "$input"
        failed+=("$target")
        summary+=("$(printf '%-24s FAILED on regression input %s' "$target" "$input")")
        continue 2
      fi
    done
    log "$target: ${#regressions[@]} regression inputs pass"
  fi

  # -rss_limit_mb and -malloc_limit_mb turn an allocation driven by a length in the input into a failure; -timeout
  # makes a hang one.
  dict=()
  if [ -f "tests/fuzz/dict/$target.dict" ]; then dict=(-dict="tests/fuzz/dict/$target.dict"); fi
  status=0
  "$bin" "$work/$target/corpus" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
         -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$work/$target/artifacts/" \
         >"$work/$target/fuzz.log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$target/fuzz.log")
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$target/fuzz.log")
  files=$(find "$work/$target/corpus" -type f | wc -l)
  bytes=$(du -sb "$work/$target/corpus" | cut -f1)
  line=$(printf '%-24s runs %9s  exec/s %7s  corpus %5s files %8s bytes' \
         "$target" "${runs:-?}" "${speed:-?}" "$files" "$bytes")
  if [ $status -ne 0 ]; then
    tail -n 60 "$work/$target/fuzz.log"
    crash=$(find "$work/$target/artifacts" -type f | head -n 1)
    if [ -n "$crash" ]; then
      report_crash "$target" "$bin" "$crash"
    else
      log "$target: exit $status, no input saved"
    fi
    failed+=("$target")
    line="$line  FAILED"
  fi
  log "$line"
  summary+=("$line")
done

log "summary ($seconds s per target):"
for line in "${summary[@]}"; do printf '  %s\n' "$line"; done
if [ ${#failed[@]} -gt 0 ]; then
  log "failed: ${failed[*]} (logs in $work/<target>/)"
  exit 1
fi
log "no crash in ${seconds} s per target"
