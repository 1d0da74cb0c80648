"""Tests of ci/gpu_sanitize.sh's case selection (--list, --only), which need no build and no GPU:
python3 -m unittest ci/test_gpu_sanitize.py

Planted while writing them: test groups that skip the selection (the linear cross-entropy, conv1d parts and AdamW
runs) fail the listing and selection tests; a selection of no case that passes fails the refusal test."""
import os
import subprocess
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_sanitize.sh")


def run(*args):
    """The script's exit status and output lines, with a build directory that does not exist: --list must not need
    one."""
    done = subprocess.run(["bash", SCRIPT, "/nonexistent-build", *args], capture_output=True, text=True, timeout=60)
    return done.returncode, (done.stdout + done.stderr).splitlines()


LEAN = [f"gated_delta {dtype} --heads 2,4 --schedule lean" for dtype in ("bf16", "fp16", "fp32")]
GROUPS = ["linear_cross_entropy (its GPU tests)", "conv1d column parts (its GPU test)", "adamw (its GPU tests)"]


class GpuSanitizeSelection(unittest.TestCase):
    def test_list_names_every_case_gradcheck_and_test_groups_alike(self):
        status, lines = run("--list")
        self.assertEqual(status, 0, lines)
        self.assertEqual(len(lines), len(set(lines)), lines)  # one name per case
        for name in LEAN + GROUPS + ["swiglu bf16", "gated_delta fp32 --heads 2,4 --schedule full"]:
            self.assertIn(name, lines)
        self.assertEqual(sum(line.startswith("gated_delta ") for line in lines), 6, lines)

    def test_only_selects_by_name(self):
        self.assertEqual(run("--list", "--only", "gated_delta .*lean"), (0, LEAN))
        # Test groups are selected by their names as well, and a regular expression may pick several.
        self.assertEqual(run("--only", "adamw|column parts", "--list"),
                         (0, ["conv1d column parts (its GPU test)", "adamw (its GPU tests)"]))

    def test_only_that_selects_nothing_is_refused(self):
        status, lines = run("--list", "--only", "no_such_kernel")
        self.assertEqual(status, 2)
        self.assertIn("selects no case", lines[-1])

    def test_bad_arguments_are_refused_with_usage(self):
        for args, message in [(("--only", "("), "not an extended regular expression"),
                              (("--only",), "--only needs a regular expression"),
                              (("--bogus",), "unknown option '--bogus'")]:
            status, lines = run(*args)
            self.assertEqual(status, 2, args)
            self.assertIn(message, lines[0], args)

    def test_a_run_without_list_needs_the_build(self):
        status, lines = run("--only", "swiglu")
        self.assertEqual(status, 2)
        self.assertIn("/nonexistent-build/bin/fusepack-gradcheck not found; build first", lines[0])


if __name__ == "__main__":
    unittest.main()
