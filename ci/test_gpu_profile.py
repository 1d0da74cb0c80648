"""Tests of ci/gpu_profile.sh without a GPU: its arguments, and a whole run against a stand-in for ncu (a script that
records its arguments and prints a made-up report) and an empty stand-in for fusepack-bench:
python3 -m unittest ci/test_gpu_profile.py

Planted while writing them: the script passing ncu no --launch-skip fails the whole-run test; the script ignoring
ncu's exit status fails the failure test."""
import os
import stat
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "gpu_profile.sh")
sys.path.insert(0, HERE)
import test_kernel_profile  # noqa: E402

# A stand-in for ncu: its arguments one per line into $NCU_ARGS, the report in $NCU_REPORT on stdout (and a line on
# stderr, which the script keeps in its log); exits with $NCU_STATUS.
FAKE_NCU = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$NCU_ARGS"
echo "==PROF== Connected to process 1 (fusepack-bench)"
cat "$NCU_REPORT"
echo "ncu's own message" >&2
exit "${NCU_STATUS:-0}"
"""

# One launch of the lean chain, as ncu's raw page prints it (test_kernel_profile's made-up report; its other metrics
# read 12.5).
REPORT = "\n".join(test_kernel_profile.report([(test_kernel_profile.CHAIN, "303,264", "77,726,720", "128", "128",
                                                  "193")])) + "\n"


class GpuProfile(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        root = self.tmp.name
        self.build = os.path.join(root, "build")
        os.makedirs(os.path.join(self.build, "bin"))
        self.ncu = os.path.join(root, "ncu")
        bench = os.path.join(self.build, "bin", "fusepack-bench")
        for path, text in [(bench, "#!/bin/sh\n"), (self.ncu, FAKE_NCU)]:
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        self.args_file = os.path.join(root, "ncu_args")
        self.report = os.path.join(root, "report.csv")
        with open(self.report, "w") as f:
            f.write(REPORT)

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *args, ncu_status=0):
        env = dict(os.environ, NCU=self.ncu, NCU_ARGS=self.args_file, NCU_REPORT=self.report,
                   NCU_STATUS=str(ncu_status), OUT_DIR=os.path.join(self.tmp.name, "out"))
        done = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60, env=env)
        return done.returncode, (done.stdout + done.stderr).splitlines()

    def test_a_whole_run_prints_the_table_of_what_ncu_reported(self):
        status, lines = self.run_script(self.build, "--kernels", "state_chain", "--skip", "7", "--count", "3",
                                        "gated_delta")
        self.assertEqual(status, 0, lines)
        self.assertIn("| gated_delta_fwd_state_chain | 1 | 128 x 128 | 193 | 303 | 77.7 | 12.5 | 12.5 | 12.5 | 12.5 | "
                      "12.5 |", lines)
        with open(self.args_file) as f:
            args = f.read().splitlines()
        for flag, value in [("--kernel-name", "regex:state_chain"), ("--launch-skip", "7"), ("--launch-count", "3")]:
            self.assertEqual(args[args.index(flag) + 1], value, args)
        self.assertEqual(args[-2:], [os.path.join(self.build, "bin", "fusepack-bench"), "gated_delta"])

    def test_a_failing_ncu_fails_the_run_with_its_log(self):
        status, lines = self.run_script(self.build, "gated_delta", ncu_status=3)
        self.assertEqual(status, 1, lines)
        self.assertIn("gpu_profile: ncu failed (exit 3); the end of its log:", lines)
        self.assertIn("ncu's own message", lines)

    def test_bad_arguments_are_refused(self):
        for args, message in [((), "name the op to profile"),
                              (("a", "b", "c"), "expected [build dir] OP; got a b c"),
                              (("--skip", "x", "gated_delta"), "--skip needs a whole number; got 'x'"),
                              (("--count", "0", "gated_delta"), "--count must be at least 1"),
                              (("--bogus", "gated_delta"), "unknown option '--bogus'"),
                              (("/nonexistent-build", "gated_delta"),
                               "/nonexistent-build/bin/fusepack-bench not found")]:
            status, lines = self.run_script(*args)
            self.assertEqual(status, 2, (args, lines))
            self.assertTrue(lines and message in lines[0], (args, lines))


if __name__ == "__main__":
    unittest.main()
