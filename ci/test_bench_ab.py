"""Tests of ci/bench_ab.py (the A/B table) on a made-up fusepack-bench output, and of ci/bench_ab.sh without a GPU:
whole runs in a copy of its scripts without .deps/, against stand-ins for the two benches (scripts that print made-up
reports and record the order they ran in), for nvidia-smi, and, for the builds, for ci/build.sh, dpkg and torch:
python3 -m unittest ci/test_bench_ab.py

Planted while writing them: the parser taking the composite's column fails the parse and table tests; the script running
base first in every round fails the order tests; the change as (base - this) / base fails the table tests; the script
sourcing ci/gpu_env.sh with FUSEPACK_AB_SKIP_BUILD=1 fails every whole run (".deps/debs is missing"); the script
ignoring a bench's exit status fails the failure test; the base's build dir passed as a relative path (a build inside
the base tree) fails the build tests; running the two builds one after the other fails the build test (each stand-in
build waits for the other's start); with --same-bits, timing although a case's bits differ fails the different-bits
test, and skipping the cases fails the same-bits test. Found while writing them: grep -q on a tarball's listing stops
reading at the match, and tar's SIGPIPE then fails the pipeline under pipefail; the tarball test's long listing catches
it."""
import io
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import unittest
from contextlib import redirect_stderr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_ab  # noqa: E402

SHORT = "8x1024 Hk=16 Hv=32 K=V=128"
LONG = "pack of 9 (2840 ...) Hk=16 Hv=16 K=V=128"  # longer than the report's 28 columns
ONLY_THIS = "1x65536 Hk=16 Hv=32 K=V=128"


def bench_output(rows, op="gated_delta"):
    """fusepack-bench's output as kernels/bench/bench_main.cpp and bench.cpp print it, with the lines of
    bench_gated_delta.cpp that are no report rows; rows: (shape, pass, composite ms, fused ms)."""
    lines = [f"benchmarking {op} ..."]
    for shape in dict.fromkeys(r[0] for r in rows):
        lines.append(f"{op} {shape}: 48.1 GFLOP fwd; fused fwd 98 TFLOP/s, fwd+bwd 82 TFLOP/s")
        lines.append(f"{op} {shape} schedules: full chain fwd 1.058 / fwd+bwd 2.918 ms; lean chain fwd 0.493 / "
                     "fwd+bwd 1.755 ms")
    lines.append(f"{op} anchors (Hk=16 Hv=32 K=V=128 bf16): HF torch fallback 6.70 ms fwd / 30.3 ms fwd+bwd")
    lines.append("")
    lines.append("device-to-device copy bandwidth measured in this run: 3891 GB/s")
    lines.append("%-16s %-28s %-8s %12s %10s %8s %10s %7s" % ("op", "shape", "pass", "composite ms", "fused ms",
                                                             "speedup", "fused GB/s", "of copy"))
    for shape, pass_, composite, fused in rows:
        gbps = 1e9 / (fused * 1e-3) / 1e9
        lines.append("%-16s %-28s %-8s %12.4f %10.4f %7.1fx %10.0f %6.0f%%" % (
            op, shape, pass_, composite, fused, composite / fused, gbps, 100.0 * gbps / 3891))
    return "\n".join(lines) + "\n"


# Fused ms per call of each side's bench (call 0, 1, 2); the composite is 6.7 ms fwd, 30.3 fwd+bwd throughout.
BASE_MS = [(0.5000, 1.8000, 0.3000), (0.5100, 1.8200, 0.3100), (0.5050, 1.8100, 0.3050)]
THIS_MS = [(0.4900, 1.7500, 0.2900, 2.0000), (0.4950, 1.7700, 0.2950, 2.1000), (0.4920, 1.7600, 0.2920, 2.0500)]


def report(side, call):
    ms = (BASE_MS if side == "base" else THIS_MS)[call]
    rows = [(SHORT, "fwd", 6.7, ms[0]), (SHORT, "fwd+bwd", 30.3, ms[1]), (LONG, "fwd", 6.7, ms[2])]
    if side == "this":
        rows.append((ONLY_THIS, "fwd", 6.7, ms[3]))
    return bench_output(rows)


# A stand-in for one side's fusepack-bench: its side into $AB_ORDER, its arguments and the shape setting into
# $AB_RECORD/<side>.args, then its made-up report of this call ($AB_REPORTS/<side>-<call>.txt); exits 1 on the call
# that $AB_FAIL names (<side>:<call>).
FAKE_BENCH = """#!/usr/bin/env bash
n=$(grep -cx SIDE "$AB_ORDER") || n=0
echo SIDE >> "$AB_ORDER"
printf '%s\\n' "$@" "shape=${FUSEPACK_BENCH_GATED_DELTA_SHAPE:-}" > "$AB_RECORD/SIDE.args"
if [ "${AB_FAIL:-}" = "SIDE:$n" ]; then echo "benchmarking gated_delta ..."; echo "fusepack-bench: boom" >&2; exit 1; fi
cat "$AB_REPORTS/SIDE-$n.txt"
"""

# A stand-in for a tree's ci/build.sh: what it was given into $AB_RECORD/build-TREE, then the stand-in bench of its
# tree into the build dir. With AB_CONCURRENT set it fails unless the other tree's build starts while it runs (each
# waits up to 5 s for the other's mark).
FAKE_BUILD = """#!/usr/bin/env bash
set -euo pipefail
printf '%s\\n' "pwd=$PWD" "build_dir=$FUSEPACK_BUILD_DIR" "targets=$FUSEPACK_TARGETS" "jobs=$FUSEPACK_JOBS" \\
  "cmake_args=$FUSEPACK_CMAKE_ARGS" "prefix_path=$CMAKE_PREFIX_PATH" "cpath=$CPATH" > "$AB_RECORD/build-TREE"
if [ -n "${AB_CONCURRENT:-}" ]; then
  touch "$AB_RECORD/started-TREE"
  for _ in $(seq 100); do [ -e "$AB_RECORD/started-OTHER" ] && break; sleep 0.05; done
  [ -e "$AB_RECORD/started-OTHER" ] || { echo "the build of OTHER did not run beside this one" >&2; exit 4; }
fi
mkdir -p "$FUSEPACK_BUILD_DIR/bin"
cp "$AB_STANDINS/bench-TREE" "$FUSEPACK_BUILD_DIR/bin/fusepack-bench"
case " $FUSEPACK_TARGETS " in
  *" fusepack-gradcheck "*) cp "$AB_STANDINS/gradcheck-TREE" "$FUSEPACK_BUILD_DIR/bin/fusepack-gradcheck" ;;
esac
"""


def fake_build(tree):
    return FAKE_BUILD.replace("TREE", tree).replace("OTHER", "this" if tree == "base" else "base")

# A stand-in for one side's fusepack-gradcheck: its arguments as a line into $AB_RECORD/gradcheck-SIDE, then o's and
# dq's digests (dq's from $AB_DQ_SIDE, if set) and, on this tree, a tensor the base does not print; exits 1 when
# $AB_GRADCHECK_FAIL names its side.
FAKE_GRADCHECK = """#!/usr/bin/env bash
echo "$*" >> "$AB_RECORD/gradcheck-SIDE"
echo "fusepack-gradcheck $1: fused only on cuda, bf16: 2 outputs and 6 gradients computed; none checked"
if [ "${AB_GRADCHECK_FAIL:-}" = SIDE ]; then echo "fusepack-gradcheck: boom" >&2; exit 1; fi
echo "  o bf16 [75, 2, 64]: digest 0123456789abcdef"
echo "  dq bf16 [75, 1, 64]: digest ${AB_DQ_SIDE:-fedcba9876543210}"
[ SIDE = base ] || echo "  o (no grad) bf16 [75, 2, 64]: digest 0123456789abcdef"
"""

FAKE_NVIDIA_SMI = '#!/bin/sh\necho "NVIDIA H200, 580.95.05"\n'
# dpkg -x DEB DIR: records the .deb and leaves a file in DIR.
FAKE_DPKG = '#!/bin/sh\necho "$2" >> "$AB_RECORD/dpkg"\nmkdir -p "$3/usr/include" && touch "$3/usr/include/x.h"\n'


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text, executable=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    if executable:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class Parse(unittest.TestCase):
    def test_only_the_report_rows_with_their_fused_ms(self):
        text = bench_output([(SHORT, "fwd", 6.7, 0.4930), (SHORT, "fwd+bwd", 30.3, 1.7550), (LONG, "fwd", 2.1, 0.291)])
        self.assertEqual(bench_ab.parse_report(text), [(("gated_delta", SHORT, "fwd"), 0.4930),
                                                       (("gated_delta", SHORT, "fwd+bwd"), 1.7550),
                                                       (("gated_delta", LONG, "fwd"), 0.2910)])

    def test_a_run_without_a_report_has_no_rows(self):
        self.assertEqual(bench_ab.parse_report(bench_output([])), [])


class Table(unittest.TestCase):
    def runs(self):
        return {side: [bench_ab.parse_report(report(side, call)) for call in (0, 1)] for side in ("base", "this")}

    def test_rounds_means_and_change(self):
        lines = bench_ab.table(self.runs(), "gated_delta", "NVIDIA H200, 580.95.05", ".deps/base.tar.gz",
                               ['FUSEPACK_BENCH_GATED_DELTA_SHAPE="Hv=32"'])
        self.assertIn(" on NVIDIA H200 (driver 580.95.05), ", lines[0])
        self.assertIn("base (.deps/base.tar.gz)", lines[0])
        self.assertIn("fusepack-bench gated_delta", lines[0])
        self.assertIn("2 rounds", lines[0])
        self.assertIn('FUSEPACK_BENCH_GATED_DELTA_SHAPE="Hv=32"', lines[0])
        self.assertEqual(lines[2], "| shape | pass | base ms (rounds) | base mean | this ms (rounds) | this mean | "
                                   "change |")
        # base 0.5000, 0.5100: mean 0.5050; this 0.4900, 0.4950: mean 0.4925; (0.4925 - 0.5050) / 0.5050 = -2.48%
        self.assertEqual(lines[4], f"| {SHORT} | fwd | 0.5000, 0.5100 | 0.5050 | 0.4900, 0.4950 | 0.4925 | -2.5% |")
        # 1.8100 -> 1.7600: -2.8%
        self.assertEqual(lines[5], f"| {SHORT} | fwd+bwd | 1.8000, 1.8200 | 1.8100 | 1.7500, 1.7700 | 1.7600 | "
                                   "-2.8% |")
        # 0.3050 -> 0.2925: -4.1%
        self.assertEqual(lines[6], f"| {LONG} | fwd | 0.3000, 0.3100 | 0.3050 | 0.2900, 0.2950 | 0.2925 | -4.1% |")
        self.assertEqual(lines[7], f"| {ONLY_THIS} | fwd | — | — | 2.0000, 2.1000 | 2.0500 | — |")
        self.assertEqual(len(lines), 8)

    def test_a_slower_change_is_positive_and_another_op_is_named(self):
        runs = {"base": [[(("attention_gate", "4x2048", "fwd"), 0.2)]],
                "this": [[(("attention_gate", "4x2048", "fwd"), 0.25)]]}
        lines = bench_ab.table(runs, "attention")
        self.assertIn("1 round,", lines[0])
        self.assertEqual(lines[4], "| attention_gate 4x2048 | fwd | 0.2000 | 0.2000 | 0.2500 | 0.2500 | +25.0% |")

    def test_logs_without_a_report_row_fail(self):
        with tempfile.TemporaryDirectory() as logs:
            for side in ("base", "this"):
                write(os.path.join(logs, f"round1-{side}.log"), bench_output([]))
            err = io.StringIO()
            with redirect_stderr(err):
                self.assertEqual(bench_ab.main([logs, "--rounds", "1", "--op", "swiglu"]), 1)
                self.assertEqual(bench_ab.main([logs, "--rounds", "2", "--op", "swiglu"]), 1)
        self.assertIn("no report rows", err.getvalue())
        self.assertIn("round2-base.log", err.getvalue())


class Script(unittest.TestCase):
    """ci/bench_ab.sh in a copy of its scripts (no .deps/), run from the directory above that copy."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        root = self.tmp.name
        self.repo = os.path.join(root, "repo")
        for name in ("bench_ab.sh", "bench_ab.py", "gpu_env.sh", "same_bits.py", "same_bits_cases.txt"):
            write(os.path.join(self.repo, "ci", name), read(os.path.join(HERE, name)))
        self.ab_dir = os.path.join(root, "ab")
        self.record = os.path.join(root, "record")
        self.reports = os.path.join(root, "reports")
        self.standins = os.path.join(root, "standins")
        self.fake_bin = os.path.join(root, "fake-bin")
        self.order = os.path.join(root, "order")
        for d in (self.record, self.reports, self.standins):
            os.makedirs(d)
        write(self.order, "")
        for side in ("base", "this"):
            write(os.path.join(self.standins, f"bench-{side}"), FAKE_BENCH.replace("SIDE", side), executable=True)
            write(os.path.join(self.standins, f"gradcheck-{side}"), FAKE_GRADCHECK.replace("SIDE", side),
                  executable=True)
            for call in range(3):
                write(os.path.join(self.reports, f"{side}-{call}.txt"), report(side, call))
        write(os.path.join(self.fake_bin, "nvidia-smi"), FAKE_NVIDIA_SMI, executable=True)
        # The base tree, as a directory beside the copy.
        self.base = os.path.join(root, "base")
        write(os.path.join(self.base, "ci", "build.sh"), fake_build("base"), executable=True)

    def tearDown(self):
        self.tmp.cleanup()

    def install_benches(self, gradcheck=False):
        for side in ("base", "this"):
            for target, standin in [("fusepack-bench", "bench"), ("fusepack-gradcheck", "gradcheck")][:1 + gradcheck]:
                write(os.path.join(self.ab_dir, side, "bin", target),
                      read(os.path.join(self.standins, f"{standin}-{side}")), executable=True)

    def run_script(self, *args, skip_build=True, **env_extra):
        env = dict(os.environ, PATH=self.fake_bin + os.pathsep + os.environ["PATH"], FUSEPACK_AB_DIR=self.ab_dir,
                   AB_ORDER=self.order, AB_RECORD=self.record, AB_REPORTS=self.reports, AB_STANDINS=self.standins)
        for key in [k for k in env if k.startswith("FUSEPACK_BENCH_") or k == "FUSEPACK_AB_SKIP_BUILD"]:
            del env[key]
        if skip_build:
            env["FUSEPACK_AB_SKIP_BUILD"] = "1"
        env.update(env_extra)
        done = subprocess.run(["bash", os.path.join(self.repo, "ci", "bench_ab.sh"), *args], capture_output=True,
                              text=True, timeout=60, env=env, cwd=self.tmp.name)
        return done.returncode, done.stdout, done.stderr

    def order_of_runs(self):
        with open(self.order) as f:
            return f.read().split()

    def test_a_whole_run_alternates_and_prints_the_table(self):
        self.install_benches()
        status, out, err = self.run_script("base", FUSEPACK_BENCH_GATED_DELTA_SHAPE="8x1024 Hk=16")
        self.assertEqual(status, 0, out + err)
        self.assertEqual(self.order_of_runs(), ["base", "this", "this", "base"])
        lines = out.splitlines()
        self.assertIn("[bench-ab] NVIDIA H200, 580.95.05; fusepack-bench gated_delta, 2 rounds; logs in "
                      f"{self.ab_dir}/logs", lines)
        head = [line for line in lines if line.startswith("fusepack-bench gated_delta on ")]
        self.assertEqual(len(head), 1, out)
        self.assertIn(" on NVIDIA H200 (driver 580.95.05), ", head[0])
        self.assertIn(" base (base) ", head[0])
        self.assertIn('FUSEPACK_BENCH_GATED_DELTA_SHAPE="8x1024 Hk=16"', head[0])
        self.assertIn(f"| {SHORT} | fwd | 0.5000, 0.5100 | 0.5050 | 0.4900, 0.4950 | 0.4925 | -2.5% |", lines)
        self.assertIn(f"| {ONLY_THIS} | fwd | — | — | 2.0000, 2.1000 | 2.0500 | — |", lines)
        self.assertEqual(sum(line.startswith("|") for line in lines), 6, out)  # the header, the separator, 4 rows
        for side in ("base", "this"):
            with open(os.path.join(self.record, f"{side}.args")) as f:
                self.assertEqual(f.read().splitlines(), ["gated_delta", "shape=8x1024 Hk=16"])
            for r in (1, 2):
                with open(os.path.join(self.ab_dir, "logs", f"round{r}-{side}.log")) as f:
                    self.assertIn("benchmarking gated_delta ...", f.read())

    def test_three_rounds_and_another_op(self):
        self.install_benches()
        status, out, err = self.run_script(self.base, "rope", "--rounds", "3")
        self.assertEqual(status, 0, out + err)
        self.assertEqual(self.order_of_runs(), ["base", "this", "this", "base", "base", "this"])
        with open(os.path.join(self.record, "this.args")) as f:
            self.assertEqual(f.read().splitlines()[0], "rope")
        # The reports name gated_delta, not the op asked for: the rows say their op.
        self.assertIn(f"| gated_delta {SHORT} | fwd | 0.5000, 0.5100, 0.5050 | 0.5050 | 0.4900, 0.4950, 0.4920 | "
                      "0.4923 | -2.5% |", out.splitlines())

    def test_a_failing_bench_stops_the_run_naming_its_log(self):
        self.install_benches()
        status, out, err = self.run_script("base", AB_FAIL="this:1")
        self.assertEqual(status, 1, out + err)
        self.assertEqual(self.order_of_runs(), ["base", "this", "this"])
        log = os.path.join(self.ab_dir, "logs", "round2-this.log")
        self.assertIn(f"bench_ab: the this bench failed in round 2 (exit 1); log {log}", err)
        self.assertIn("fusepack-bench: boom", out)  # the end of the log
        self.assertNotIn("| shape |", out)

    def test_a_tarball_base_is_checked_without_unpacking_when_builds_are_reused(self):
        self.install_benches()
        tarball = os.path.join(self.tmp.name, "base.tar.gz")
        with tarfile.open(tarball, "w:gz") as tar:
            tar.add(os.path.join(self.base, "ci"), arcname="ci")
            # A listing much longer than a pipe's buffer after ci/build.sh, as a whole tree's.
            for i in range(6000):
                tar.addfile(tarfile.TarInfo(f"kernels/{'x' * 60}/{i}.cpp"), io.BytesIO(b""))
        status, out, err = self.run_script("base.tar.gz", "--rounds", "1")
        self.assertEqual(status, 0, out + err)
        self.assertEqual(self.order_of_runs(), ["base", "this"])
        self.assertFalse(os.path.exists(os.path.join(self.ab_dir, "base-src")))

    def test_bad_arguments_are_refused(self):
        write(os.path.join(self.tmp.name, "not-a-tree", "README"), "")
        write(os.path.join(self.tmp.name, "plain.txt"), "")
        empty = os.path.join(self.tmp.name, "empty.tar.gz")
        with tarfile.open(empty, "w:gz") as tar:
            tar.add(os.path.join(self.tmp.name, "not-a-tree"), arcname="src")
        for args, message in [((), "bench_ab: name BASE, the code before"),
                              (("missing",), "bench_ab: BASE missing does not exist"),
                              (("not-a-tree",), "bench_ab: BASE not-a-tree has no ci/build.sh"),
                              (("plain.txt",), "bench_ab: BASE plain.txt is neither a directory nor a .tar.gz"),
                              (("empty.tar.gz",), "bench_ab: BASE empty.tar.gz holds no ci/build.sh"),
                              (("base", "--rounds", "0"), "bench_ab: --rounds needs a positive whole number; got '0'"),
                              (("base", "--rounds", "two"), "--rounds needs a positive whole number; got 'two'"),
                              (("base", "--rounds"), "bench_ab: --rounds needs a value"),
                              (("base", "--fast"), "bench_ab: unknown argument '--fast'"),
                              (("base", "gated_delta", "rope"), "bench_ab: unknown argument 'rope'"),
                              (("base",), f"FUSEPACK_AB_SKIP_BUILD=1 but {self.ab_dir}/base/bin/fusepack-bench is "
                                          "missing")]:
            status, out, err = self.run_script(*args)
            self.assertEqual(status, 2, (args, out, err))
            self.assertEqual(len(err.splitlines()), 1, (args, err))
            self.assertIn(message, err, args)
            self.assertEqual(self.order_of_runs(), [], args)

    def gated_delta_cases(self):
        with open(os.path.join(HERE, "same_bits_cases.txt")) as f:
            return [line.split(None, 1)[1].strip() for line in f if line.startswith("gated_delta ")]

    def test_same_bits_compares_every_case_of_the_op_then_times(self):
        self.install_benches(gradcheck=True)
        status, out, err = self.run_script("base", "--same-bits", "--rounds", "1")
        self.assertEqual(status, 0, out + err)
        cases = self.gated_delta_cases()
        self.assertGreaterEqual(len(cases), 5)
        for side in ("base", "this"):
            self.assertEqual(read(os.path.join(self.record, f"gradcheck-{side}")).splitlines(),
                             [f"gated_delta {args} --fused-only --digest" for args in cases])
        same = [line for line in out.splitlines() if line.startswith("same bits: ")]
        self.assertEqual(same, [f"same bits: gated_delta {args}: 2 tensors" for args in cases])
        self.assertEqual(out.count("  not compared, only this tree printed: o (no grad)"), len(cases))
        self.assertEqual(self.order_of_runs(), ["base", "this"])  # timed after the bits matched
        self.assertIn("| shape |", out)

    def test_different_bits_stop_the_run_before_timing(self):
        self.install_benches(gradcheck=True)
        status, out, err = self.run_script("base", "--same-bits", AB_DQ_this="fedcba9876543211")
        self.assertEqual(status, 1, out + err)
        cases = self.gated_delta_cases()
        self.assertEqual(out.count("DIFFERENT bits: gated_delta "), len(cases))
        self.assertIn(": dq differ (of 2 tensors)", out)
        self.assertIn(f"bench_ab: --same-bits: {len(cases)} of {len(cases)} cases differ", err)
        self.assertEqual(self.order_of_runs(), [])
        self.assertNotIn("| shape |", out)

    def test_a_failing_gradcheck_stops_the_run_naming_its_log(self):
        self.install_benches(gradcheck=True)
        status, out, err = self.run_script("base", "--same-bits", AB_GRADCHECK_FAIL="this")
        self.assertEqual(status, 1, out + err)
        self.assertIn(f"bench_ab: fusepack-gradcheck of this failed on 'gated_delta {self.gated_delta_cases()[0]}' "
                      f"(exit 1); log {self.ab_dir}/logs/same-bits-1-this.log", err)
        self.assertIn("fusepack-gradcheck: boom", out)
        self.assertEqual(self.order_of_runs(), [])

    def test_same_bits_needs_cases_of_the_op_and_both_gradchecks(self):
        self.install_benches()
        for args, message in [(("base", "linear_cross_entropy", "--same-bits"),
                               "bench_ab: --same-bits: ci/same_bits_cases.txt has no case of 'linear_cross_entropy'"),
                              (("base", "--same-bits"), f"FUSEPACK_AB_SKIP_BUILD=1 but {self.ab_dir}/base/bin/"
                                                        "fusepack-gradcheck is missing")]:
            status, out, err = self.run_script(*args)
            self.assertEqual(status, 2, (args, out, err))
            self.assertIn(message, err, args)
            self.assertEqual(self.order_of_runs(), [], args)

    def test_building_needs_deps(self):
        status, out, err = self.run_script("base", skip_build=False)
        self.assertEqual(status, 1, out + err)
        self.assertIn("[gpu] .deps/debs is missing: run ci/gpu_deps.sh", out)

    def build_deps(self):
        """.deps with one package and stand-ins for dpkg and torch, for the builds; the stand-in torch's path."""
        write(os.path.join(self.repo, ".deps", "debs", "libfake-dev_1.0_amd64.deb"), "")
        write(os.path.join(self.fake_bin, "dpkg"), FAKE_DPKG, executable=True)
        fake_py = os.path.join(self.tmp.name, "fake-py")
        write(os.path.join(fake_py, "torch", "__init__.py"), "")
        write(os.path.join(fake_py, "torch", "utils.py"), "cmake_prefix_path = '/opt/torch/share/cmake'\n")
        return fake_py

    def test_building_with_same_bits_builds_both_tools(self):
        write(os.path.join(self.repo, "ci", "build.sh"), fake_build("this"), executable=True)
        status, out, err = self.run_script("base", "--same-bits", "--rounds", "1", skip_build=False,
                                           PYTHONPATH=self.build_deps())
        self.assertEqual(status, 0, out + err)
        for tree in ("base", "this"):
            self.assertIn("targets=fusepack-bench fusepack-gradcheck",
                          read(os.path.join(self.record, f"build-{tree}")).splitlines())
        self.assertIn("[bench-ab] building fusepack-bench fusepack-gradcheck of base", out)
        self.assertEqual(len(read(os.path.join(self.record, "gradcheck-this")).splitlines()),
                         len(self.gated_delta_cases()))
        self.assertEqual(self.order_of_runs(), ["base", "this"])

    def test_building_both_trees(self):
        write(os.path.join(self.repo, "ci", "build.sh"), fake_build("this"), executable=True)
        fake_py = self.build_deps()
        tarball = os.path.join(self.tmp.name, "base.tar.gz")
        with tarfile.open(tarball, "w:gz") as tar:
            tar.add(os.path.join(self.base, "ci"), arcname="fusepack/ci")  # git archive --prefix=fusepack/
        write(os.path.join(self.ab_dir, "base-src", "stale"), "")
        status, out, err = self.run_script(tarball, "--rounds", "1", skip_build=False, PYTHONPATH=fake_py,
                                           FUSEPACK_CMAKE_ARGS="-DFUSEPACK_CUDA_ARCHS=90a", CPATH="/usr/x",
                                           FUSEPACK_JOBS="5", AB_CONCURRENT="1")
        self.assertEqual(status, 0, out + err)
        self.assertEqual(self.order_of_runs(), ["base", "this"])
        self.assertFalse(os.path.exists(os.path.join(self.ab_dir, "base-src", "stale")))
        deps = os.path.join(self.repo, ".deps", "prefix")
        for tree, src in [("base", os.path.join(self.ab_dir, "base-src", "fusepack")), ("this", self.repo)]:
            with open(os.path.join(self.record, f"build-{tree}")) as f:
                got = dict(line.split("=", 1) for line in f.read().splitlines())
            self.assertEqual(got, {"pwd": src, "build_dir": os.path.join(self.ab_dir, tree),
                                   "targets": "fusepack-bench", "jobs": "3",
                                   "cmake_args": "-DFUSEPACK_REQUIRE_CUDA=ON -DFUSEPACK_CUDA_ARCHS=90a",
                                   "prefix_path": f"{deps}/usr;/opt/torch/share/cmake",
                                   "cpath": f"{deps}/usr/include:/usr/x"}, tree)
            self.assertTrue(os.path.exists(os.path.join(self.ab_dir, "logs", f"build-{tree}.log")))
        with open(os.path.join(self.record, "dpkg")) as f:
            self.assertEqual(f.read().split(), [".deps/debs/libfake-dev_1.0_amd64.deb"])
        self.assertIn(f"| {SHORT} | fwd | 0.5000 | 0.5000 | 0.4900 | 0.4900 | -2.0% |", out.splitlines())

    def test_a_failing_build_stops_the_run(self):
        write(os.path.join(self.repo, "ci", "build.sh"), "#!/bin/sh\necho 'compile error' >&2\nexit 3\n")
        fake_py = self.build_deps()
        status, out, err = self.run_script("base", skip_build=False, PYTHONPATH=fake_py)
        self.assertEqual(status, 1, out + err)
        self.assertIn("compile error", out)
        self.assertIn(f"bench_ab: the build of this failed (exit 3); log {self.ab_dir}/logs/build-this.log", err)
        self.assertNotIn("the build of base failed", err)
        self.assertEqual(self.order_of_runs(), [])
        # Both failing: each is named (neither build's failure hides the other's).
        write(os.path.join(self.base, "ci", "build.sh"), "#!/bin/sh\necho 'base error' >&2\nexit 5\n")
        status, out, err = self.run_script("base", skip_build=False, PYTHONPATH=fake_py)
        self.assertEqual(status, 1, out + err)
        self.assertIn(f"bench_ab: the build of base failed (exit 5); log {self.ab_dir}/logs/build-base.log", err)
        self.assertIn("bench_ab: the build of this failed (exit 3)", err)


if __name__ == "__main__":
    unittest.main()
