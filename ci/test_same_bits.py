"""Tests of ci/same_bits.py on made-up fusepack-gradcheck --digest outputs:
python3 -m unittest ci/test_same_bits.py

Planted while writing them: comparing only the digest column (not dtype and shape) fails the dtype test; passing
when no tensor is common to both logs fails the nothing-compared test; a name pattern without spaces ("o (no grad)")
fails the parse test."""
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import same_bits  # noqa: E402


def gradcheck_output(digests):
    """fusepack-gradcheck's output with --fused-only --digest (verify/fusepack_gradcheck.cpp): a summary line, then
    one line per tensor; digests: [(name, dtype, shape, digest)]."""
    lines = ["fusepack-gradcheck gated_delta: fused only on cuda, bf16: 2 outputs and 6 gradients computed, and the "
             "outputs again without gradients; none checked (run without --fused-only to check them)"]
    lines += [f"  {name} {dtype} [{shape}]: digest {digest}" for name, dtype, shape, digest in digests]
    return "\n".join(lines) + "\n"


O = ("o", "bf16", "75, 2, 64", "0123456789abcdef")
DQ = ("dq", "bf16", "75, 1, 64", "fedcba9876543210")
O_NO_GRAD = ("o (no grad)", "bf16", "75, 2, 64", "0123456789abcdef")


class Parse(unittest.TestCase):
    def test_digest_lines_with_names_holding_spaces_and_nothing_else(self):
        text = gradcheck_output([O, DQ, O_NO_GRAD]) + "  not a digest line\n  o bf16 [75]: digest 12345\n"
        self.assertEqual(same_bits.parse_digests(text), {
            "o": ("bf16", "75, 2, 64", "0123456789abcdef"),
            "dq": ("bf16", "75, 1, 64", "fedcba9876543210"),
            "o (no grad)": ("bf16", "75, 2, 64", "0123456789abcdef")})


class Report(unittest.TestCase):
    def run_report(self, base, this):
        return same_bits.report("gated_delta --dtype bf16", same_bits.parse_digests(gradcheck_output(base)),
                                same_bits.parse_digests(gradcheck_output(this)))

    def test_equal_digests_pass(self):
        self.assertEqual(self.run_report([O, DQ], [O, DQ]), (0, ["same bits: gated_delta --dtype bf16: 2 tensors"]))

    def test_a_different_digest_fails_naming_the_tensor(self):
        status, lines = self.run_report([O, DQ], [O, DQ[:3] + ("fedcba9876543211",)])
        self.assertEqual(status, 1)
        self.assertEqual(lines, ["DIFFERENT bits: gated_delta --dtype bf16: dq differ (of 2 tensors)"])

    def test_a_different_dtype_or_shape_fails(self):
        for changed in [("dq", "fp32") + DQ[2:], ("dq", "bf16", "75, 2, 64", DQ[3])]:
            status, lines = self.run_report([O, DQ], [O, changed])
            self.assertEqual(status, 1, changed)
            self.assertIn("dq differ", lines[0])

    def test_tensors_of_one_side_are_listed_and_do_not_fail(self):
        status, lines = self.run_report([O, DQ], [O, DQ, O_NO_GRAD])
        self.assertEqual(status, 0)
        self.assertEqual(lines, ["same bits: gated_delta --dtype bf16: 2 tensors",
                                 "  not compared, only this tree printed: o (no grad)"])
        status, lines = self.run_report([O, DQ], [O])
        self.assertEqual(status, 0)
        self.assertEqual(lines[1], "  not compared, only base printed: dq")

    def test_nothing_compared_fails(self):
        for base, this in [([], []), ([O], [DQ]), ([O, DQ], [])]:
            status, lines = self.run_report(base, this)
            self.assertEqual(status, 1, (base, this))
            self.assertIn("no tensor to compare", lines[0])


class Main(unittest.TestCase):
    def test_logs_in_and_status_out(self):
        with tempfile.TemporaryDirectory() as tmp:
            base, this = os.path.join(tmp, "base.log"), os.path.join(tmp, "this.log")
            for path, digests in ((base, [O, DQ]), (this, [O, DQ])):
                with open(path, "w") as f:
                    f.write(gradcheck_output(digests))
            out = io.StringIO()
            with redirect_stdout(out):
                self.assertEqual(same_bits.main([base, this, "--case", "gated_delta x"]), 0)
            self.assertEqual(out.getvalue(), "same bits: gated_delta x: 2 tensors\n")
            err = io.StringIO()
            with redirect_stderr(err):
                self.assertEqual(same_bits.main([base, os.path.join(tmp, "missing.log")]), 2)
            self.assertIn("cannot read", err.getvalue())


if __name__ == "__main__":
    unittest.main()
