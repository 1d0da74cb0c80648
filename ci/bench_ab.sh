#!/usr/bin/env bash
# A/B benchmark of a kernel change: fusepack-bench of a base tree (the code before) and of this tree (the code after),
# both built and run here in one call, since timings taken on other machines or at other times do not compare.
# Builds fusepack-bench of BASE with BASE's own ci/build.sh into $AB_DIR/base and of this tree into $AB_DIR/this, both
# at once on half the jobs each (FUSEPACK_REQUIRE_CUDA=ON, the dependencies of ci/gpu_env.sh), then runs both benches
# for OP in each round, base first in odd rounds and this tree first in even ones, so that a drift of the GPU's clocks
# over the call does not favour one side. Prints a Markdown table (ci/bench_ab.py): per shape and pass, the fused ms
# of every round on each side, their means and the change (this - base) / base.
#   ci/bench_ab.sh BASE [OP] [--rounds N] [--same-bits]
#     BASE        the code before: a fusepack source tree, or a .tar.gz of one, unpacked afresh into $AB_DIR/base-src;
#                 on the development machine: git archive --format=tar.gz -o .deps/base.tar.gz main
#     OP          the fusepack-bench op (default gated_delta); FUSEPACK_BENCH_* settings reach both benches unchanged
#     --rounds N  rounds of the two runs (default 2)
#     --same-bits for a change meant to keep every result bit for bit: also builds fusepack-gradcheck, and before any
#                 timing runs OP's cases of ci/same_bits_cases.txt on both trees with --fused-only --digest and
#                 compares every output's and gradient's digest (ci/same_bits.py); one that differs stops the run
# AB_DIR is $FUSEPACK_AB_DIR or build-ab; each run's output goes to $AB_DIR/logs/round<r>-<base|this>.log, and a bench
# that fails stops the script (exit 1), as do different bits under --same-bits. FUSEPACK_CMAKE_ARGS reaches both
# builds; FUSEPACK_AB_SKIP_BUILD=1 runs the builds of an earlier call as they are (a second call on the same machine).
# Example, one shape, three rounds:
#   FUSEPACK_BENCH_GATED_DELTA_SHAPE="1x8192 Hk=16 Hv=32" bash ci/bench_ab.sh .deps/base.tar.gz gated_delta --rounds 3
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
usage() { sed -n '/^#   ci\/bench_ab.sh BASE/,/one that differs stops the run$/s/^# \{0,1\}//p' "$0"; }
fail() { echo "bench_ab: $*" >&2; exit 2; }
base='' op='' rounds=2 same_bits=0
while [ $# -gt 0 ]; do
  case $1 in
    --rounds)
      [ $# -ge 2 ] || fail "--rounds needs a value"
      [[ $2 =~ ^[1-9][0-9]*$ ]] || fail "--rounds needs a positive whole number; got '$2'"
      rounds=$2
      shift 2 ;;
    --same-bits) same_bits=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) fail "unknown argument '$1' (usage: ci/bench_ab.sh BASE [OP] [--rounds N] [--same-bits])" ;;
    *)
      if [ -z "$base" ]; then base=$1
      elif [ -z "$op" ]; then op=$1
      else fail "unknown argument '$1' (usage: ci/bench_ab.sh BASE [OP] [--rounds N] [--same-bits])"
      fi
      shift ;;
  esac
done
[ -n "$base" ] || fail "name BASE, the code before: a fusepack source tree or a .tar.gz of one"
op=${op:-gated_delta}
# --same-bits: OP's lines of the cases file (its arguments for fusepack-gradcheck), refused when there are none.
same_bits_cases=()
if [ $same_bits = 1 ]; then
  [ -f ci/same_bits_cases.txt ] || fail "--same-bits needs ci/same_bits_cases.txt"
  while read -r case_op case_args; do
    if [ "$case_op" = "$op" ]; then same_bits_cases+=("$case_args"); fi
  done < <(grep -v '^[[:space:]]*\(#\|$\)' ci/same_bits_cases.txt)
  [ ${#same_bits_cases[@]} -gt 0 ] || fail "--same-bits: ci/same_bits_cases.txt has no case of '$op'"
fi
targets=fusepack-bench
[ $same_bits = 0 ] || targets="fusepack-bench fusepack-gradcheck"
missing_target() {  # side: the first of the targets its build dir lacks, nothing when it has them all
  for target in $targets; do [ -x "$ab_dir/$1/bin/$target" ] || { echo "$target"; return; }; done
}
# BASE as the caller named it, from the caller's directory.
case $base in /*) base_path=$base ;; *) base_path=$caller/$base ;; esac
[ -e "$base_path" ] || fail "BASE $base does not exist"
if [ -d "$base_path" ]; then
  [ -f "$base_path/ci/build.sh" ] || fail "BASE $base has no ci/build.sh: not a fusepack source tree"
elif [[ $base_path == *.tar.gz && -f $base_path ]]; then
  # grep reads the whole listing: with -q it would stop at the match and tar's SIGPIPE would fail the pipeline.
  tar -tzf "$base_path" 2>/dev/null | grep -E '^(\./)?([^/]+/)?ci/build\.sh$' >/dev/null ||
    fail "BASE $base holds no ci/build.sh: not a .tar.gz of a fusepack source tree"
else
  fail "BASE $base is neither a directory nor a .tar.gz"
fi

ab_dir=${FUSEPACK_AB_DIR:-build-ab}
mkdir -p "$ab_dir/logs"
ab_dir=$(cd "$ab_dir" && pwd)
logs=$ab_dir/logs
rm -f "$logs"/round*.log
if [ "${FUSEPACK_AB_SKIP_BUILD:-0}" = 1 ]; then
  for side in base this; do
    missing=$(missing_target $side)
    [ -z "$missing" ] || fail "FUSEPACK_AB_SKIP_BUILD=1 but $ab_dir/$side/bin/$missing is missing; run once without it"
  done
else
  # This tree's setup for both builds: an older base tree may not have ci/gpu_env.sh.
  source ci/gpu_env.sh
  export FUSEPACK_JOBS=${FUSEPACK_JOBS:-$(nproc)}
  base_src=$base_path
  if [ ! -d "$base_path" ]; then
    base_src=$ab_dir/base-src
    rm -rf "$base_src" && mkdir -p "$base_src"
    tar -xzf "$base_path" -C "$base_src"
    # An archive made with --prefix holds the tree one directory down.
    if [ ! -f "$base_src/ci/build.sh" ]; then
      inner=("$base_src"/*/ci/build.sh)
      base_src=${inner[0]%/ci/build.sh}
    fi
  fi
  # Both builds at once, half the jobs each: a build's last minutes are a few long nvcc compiles that leave most cores
  # idle, and the GPU machine's time is what an A/B call spends.
  jobs_each=$(( (FUSEPACK_JOBS + 1) / 2 ))
  build() {  # side, source tree: exit status 0 when its targets were built
    (cd "$2" && FUSEPACK_BUILD_DIR=$ab_dir/$1 FUSEPACK_JOBS=$jobs_each FUSEPACK_TARGETS="$targets" \
      FUSEPACK_CMAKE_ARGS="-DFUSEPACK_REQUIRE_CUDA=ON ${FUSEPACK_CMAKE_ARGS:-}" bash ci/build.sh) \
      >"$logs/build-$1.log" 2>&1
  }
  echo "[bench-ab] building $targets of base ($base_src) and of this tree ($PWD) at once, $jobs_each jobs" \
    "each, into $ab_dir/base and $ab_dir/this; logs $logs/build-base.log, $logs/build-this.log"
  declare -A build_pid
  build base "$base_src" &
  build_pid[base]=$!
  build this "$PWD" &
  build_pid[this]=$!
  failed=0
  for side in base this; do
    status=0
    wait "${build_pid[$side]}" || status=$?
    if [ "$status" -ne 0 ] || [ -n "$(missing_target $side)" ]; then
      tail -20 "$logs/build-$side.log"
      echo "bench_ab: the build of $side failed (exit $status); log $logs/build-$side.log" >&2
      failed=1
    fi
  done
  [ $failed -eq 0 ] || exit 1
fi

device=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
if [ $same_bits = 1 ]; then
  echo "[bench-ab] same bits? fusepack-gradcheck $op --fused-only --digest on both trees, ${#same_bits_cases[@]} cases"
  rm -f "$logs"/same-bits-*.log
  differ=0
  for i in "${!same_bits_cases[@]}"; do
    case_args=${same_bits_cases[$i]} case_logs=$logs/same-bits-$((i + 1))
    for side in base this; do
      log=$case_logs-$side.log
      status=0
      # shellcheck disable=SC2086  # the case's arguments, split as the cases file writes them
      "$ab_dir/$side/bin/fusepack-gradcheck" "$op" $case_args --fused-only --digest >"$log" 2>&1 </dev/null ||
        status=$?
      if [ $status -ne 0 ]; then
        tail -5 "$log"
        echo "bench_ab: fusepack-gradcheck of $side failed on '$op $case_args' (exit $status); log $log" >&2
        exit 1
      fi
    done
    python3 ci/same_bits.py "$case_logs-base.log" "$case_logs-this.log" --case "$op $case_args" ||
      differ=$((differ + 1))
  done
  if [ $differ -ne 0 ]; then
    echo "bench_ab: --same-bits: $differ of ${#same_bits_cases[@]} cases differ (or compared nothing); no timing of" \
      "results that are not the same (logs $logs/same-bits-*.log)" >&2
    exit 1
  fi
fi
echo "[bench-ab] ${device:-no nvidia-smi}; fusepack-bench $op, $rounds rounds; logs in $logs"
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then order=(base this); else order=(this base); fi
  for side in "${order[@]}"; do
    log=$logs/round$r-$side.log
    echo "[bench-ab] round $r: $side"
    status=0
    "$ab_dir/$side/bin/fusepack-bench" "$op" >"$log" 2>&1 </dev/null || status=$?
    if [ $status -ne 0 ]; then
      tail -5 "$log"
      echo "bench_ab: the $side bench failed in round $r (exit $status); log $log" >&2
      exit 1
    fi
  done
done
python3 ci/bench_ab.py "$logs" --rounds "$rounds" --op "$op" --device "${device:-unknown device}" --base "$base"
