"""Tests of ci/summarize.py's worst budget share per dtype (the gate's console summary), on made-up check lines:
python3 -m unittest ci/test_summarize.py

Planted while writing them: the dtype read from the first '/' of the name (the device prefix, 'Sm90') fails the
dtype test; the last share kept per dtype instead of the largest fails the table test; a case with no dtype in its
name counted under one fails it too."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import summarize  # noqa: E402


def check(name, tensor, share, verdict="PASS"):
    return (f"[  check   ] {name} | {verdict} {tensor} [2, 8]: max_abs 0.001 max_rel 0.01 rel_rms 0.001 "
            f"over 16 values; budget used {share}% (worst at [0, 1]); tolerance x")


class ByDtype(unittest.TestCase):
    def test_the_dtype_is_the_parameter_names_first_word(self):
        for name, dtype in [("Sm90/GatedDeltaFused.MatchesReference/fp32_lean_chain_hk16", "fp32"),
                            ("Sm90/Conv1dFused.Backward/bf16", "bf16"),
                            ("Cpu/GatedDeltaComposite.MatchesReference/fp64_length_1", "fp64"),
                            ("Conv1dFused.Forward", None),  # not parameterised
                            ("Sm90/SwiGluFused.MatchesReference/odd_3x1007", None),  # named for no dtype
                            ("Sm90/X.Y/fp16x_case", None)]:
            self.assertEqual(summarize.dtype_of(name), dtype, name)

    def test_the_worst_share_per_suite_tensor_and_dtype(self):
        worst = {}
        summarize.add_checks({}, "\n".join([
            check("Sm90/GatedDeltaFused.MatchesReference/fp32_lean_chain_a", "dbeta", 59.2),
            check("Sm90/GatedDeltaFused.MatchesReference/fp32_full_chain_b", "dbeta", 41),
            check("Sm90/GatedDeltaFused.MatchesReference/bf16_lean_chain_a", "dbeta", 39.4),
            check("Sm90/GatedDeltaFused.MatchesReference/bf16_lean_chain_a", "o", 25),
            check("GatedDeltaFused.BackwardIsBitwiseDeterministic", "dbeta", 99),
            "[  check   ] not a check line"]), worst)
        summarize.add_checks({}, check("Sm90/GatedDeltaFused.MatchesReference/fp32_x", "dbeta", 12), worst)
        self.assertEqual(worst, {("GatedDeltaFused", "dbeta"): {"fp32": 59.2, "bf16": 39.4},
                                 ("GatedDeltaFused", "o"): {"bf16": 25.0}})
        lines = summarize.by_dtype_table(worst)
        self.assertEqual(lines[1].split(), ["suite", "checked", "bf16", "fp32"])
        self.assertEqual(lines[2].split(), ["GatedDeltaFused", "dbeta", "39.4%", "59.2%"])
        self.assertEqual(lines[3].split(), ["GatedDeltaFused", "o", "25%", "-"])

    def test_the_worst_share_keeps_its_case(self):
        # The case printed beside a tensor's worst share is the one whose check line holds it (planted: the first
        # case seen kept with a later, larger share fails here).
        worst = {}
        summarize.add_checks(worst, "\n".join([
            check("Sm90/GatedDeltaFused.MatchesReference/bf16_lean_chain_a", "dk", 45.7),
            check("Sm90/GatedDeltaFused.MatchesReference/fp32_full_chain_b", "dk", 81.4),
            check("Sm90/GatedDeltaFused.MatchesReference/fp16_lean_chain_c", "dk", 25.2)]))
        self.assertEqual(worst[("GatedDeltaFused", "dk")],
                         (81.4, "PASS", 0.001, 0.01, "Sm90/GatedDeltaFused.MatchesReference/fp32_full_chain_b"))

    def test_no_table_without_cases_named_for_a_dtype(self):
        worst = {}
        summarize.add_checks({}, check("Conv1dFused.Forward", "y", 130, "FAIL"), worst)
        self.assertEqual(worst, {})
        self.assertEqual(summarize.by_dtype_table(worst), [])


if __name__ == "__main__":
    unittest.main()
