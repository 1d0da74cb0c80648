"""Tests of ci/report.py's pure functions (no matplotlib needed): python3 -m unittest ci/test_report.py"""
import json
import math
import os
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(HERE), "golden", "qwen35-tiny-padded.json")


def step_line(step, loss, grad_norm, targets=100, tokens=120, slots=120, seconds=0.5, **extra):
    j = {"step": step, "loss": loss, "grad_norm": grad_norm, "lr": 1e-3, "targets": targets, "tokens": tokens,
         "slots": slots, "examples": 3, "micro_batches": 2, "padding": 1 - tokens / slots, "seconds": seconds,
         "tokens_per_second": tokens / seconds}
    j.update(extra)
    return j


def golden(dtype, values, tokens=100):
    return {"dtype": dtype,
            "steps": [{"step": k, "loss": l, "grad_norm": g, "tokens": tokens, "lr": 1e-3} for k, (l, g) in
                      enumerate(values)]}


class TempFiles(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, lines):
        path = os.path.join(self.dir.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
        return path


class ReadMetrics(TempFiles):
    def test_reads_the_run_the_steps_and_the_summary(self):
        path = self.write("m.jsonl", [{"run": {"dtype": "float64", "world_size": 1}}, step_line(0, 5.5, 0.8),
                                      step_line(1, 5.4, 0.7), {"summary": {"steps": 2, "tokens_per_second": 240.0}}])
        m = report.read_metrics(path)
        self.assertEqual(m["run"]["dtype"], "float64")
        self.assertEqual([s["step"] for s in m["steps"]], [0, 1])
        self.assertEqual(m["steps"][1]["loss"], 5.4)
        self.assertEqual(m["summary"]["steps"], 2)
        self.assertEqual(m["resumed"], 0)

    def test_a_resumed_run_appends_its_steps_and_keeps_the_first_run_line(self):
        path = self.write("m.jsonl", [{"run": {"dtype": "float64"}}, step_line(0, 5.5, 0.8),
                                      {"run": {"dtype": "float64", "resumed": True}}, step_line(1, 5.4, 0.7)])
        m = report.read_metrics(path)
        self.assertEqual(len(m["steps"]), 2)
        self.assertEqual(m["resumed"], 1)
        self.assertNotIn("resumed", m["run"])
        self.assertIsNone(m["summary"])  # the run died before its summary

    def test_collects_the_eval_lines(self):
        path = self.write("m.jsonl", [{"run": {}}, step_line(0, 5.5, 0.8),
                                      {"eval": {"step": 0, "loss": 5.6, "targets": 40, "tokens": 44}}])
        m = report.read_metrics(path)
        self.assertEqual([(e["step"], e["loss"]) for e in m["evals"]], [(0, 5.6)])
        self.assertEqual(len(m["steps"]), 1)

    def test_names_the_line_of_anything_else(self):
        cases = {"not JSON": ["{\"run\": {}}", "{oops"],
                 "an eval line without loss": [{"run": {}}, {"eval": {"step": 0, "targets": 1, "tokens": 1}}],
                 "without lr": [{"run": {}}, {k: v for k, v in step_line(0, 1, 1).items() if k != "lr"}],
                 "neither a run, a step, an eval": [{"run": {}}, {"loss": 1.0}],
                 "not a JSON object": [{"run": {}}, "[1, 2]"],
                 "no run line": [step_line(0, 1, 1)]}
        for what, lines in cases.items():
            with self.subTest(what):
                path = self.write("bad.jsonl", lines)
                with self.assertRaisesRegex(ValueError, what):
                    report.read_metrics(path)

    def test_reads_a_metrics_file_of_fusepack_train_format(self):
        # One line of each kind as fusepack-train writes them (trainer/train/metrics.cpp).
        path = self.write("m.jsonl", [
            '{"run":{"batching":{"layout":"packed"},"device":"cpu","dtype":"float64","seed":1234,"world_size":1}}',
            '{"examples":14,"grad_norm":0.8118683495054873,"loss":5.558048581629365,"lr":0.0,"micro_batches":2,'
            '"padding":0.0,"seconds":0.334817024,"slots":505,"step":0,"targets":384,"tokens":505,'
            '"tokens_per_second":1508.2865081555708}',
            '{"summary":{"examples":14,"final_loss":5.558048581629365,"first_loss":5.558048581629365,"first_step":0,'
            '"padding":0.0,"steps":1,"targets":384,"tokens":505,"tokens_per_second":1508.2,"train_seconds":0.33,'
            '"wall_seconds":0.4}}'])
        m = report.read_metrics(path)
        self.assertEqual(m["steps"][0]["targets"], 384)
        t = report.throughput(m)
        self.assertEqual((t["steps"], t["tokens"], t["tokens_per_second"], t["padding"]), (1, 505, 1508.2, 0.0))
        self.assertIsNone(t["device_gib"])


class Allowances(unittest.TestCase):
    def test_fp64_against_fp64_is_fusepack_trains_fixed_tolerance(self):
        # 1e-12·|golden| + 1e-13·step (trainer/train/run.cpp golden_tolerance): the allowed column of fusepack-train's
        # table for the committed golden reads 5.558e-12 (loss, step 0), 5.660e-12 (step 1), 1.622e-12 (grad norm,
        # step 9).
        g = report.read_golden(GOLDEN)
        allowed, label = report.allowances(g, "float64")
        self.assertAlmostEqual(allowed["loss"][0], 5.558e-12, delta=1e-15)
        self.assertAlmostEqual(allowed["loss"][1], 5.660e-12, delta=1e-15)
        self.assertAlmostEqual(allowed["grad_norm"][9], 1.622e-12, delta=1e-15)
        self.assertIn("float64 tolerance", label)

    def test_fp32_against_fp64_uses_its_own_rtol_per_field(self):
        g = golden("float64", [(2.0, 4.0), (2.0, 4.0)])
        allowed, _ = report.allowances(g, "float32")
        self.assertEqual(allowed["loss"], [2e-5, 2e-5 + 1e-6])
        self.assertEqual(allowed["grad_norm"], [8e-5, 8e-5 + 1e-6])

    def test_with_a_baseline_twice_its_drift_plus_one_rounding_step_of_the_run_dtype(self):
        g = golden("float64", [(4.0, 1.0), (3.0, 0.5)])
        b = golden("bfloat16", [(4.01, 1.0), (2.99, 0.52)])
        allowed, label = report.allowances(g, "bfloat16", b)
        for field, k, expected in [("loss", 0, 2 * 0.01 + 4.0 / 256), ("loss", 1, 2 * 0.01 + 3.0 / 256),
                                   ("grad_norm", 0, 1.0 / 256), ("grad_norm", 1, 2 * 0.02 + 0.5 / 256)]:
            self.assertAlmostEqual(allowed[field][k], expected, places=12)
        self.assertIn("2^-8", label)
        allowed32, label32 = report.allowances(g, "float32", b)
        self.assertAlmostEqual(allowed32["grad_norm"][0], 2.0 ** -24, places=20)
        self.assertIn("2^-24", label32)

    def test_a_baseline_shorter_than_the_golden_is_refused(self):
        with self.assertRaisesRegex(ValueError, "baseline has 1 steps"):
            report.allowances(golden("float64", [(1, 1), (1, 1)]), "bfloat16", golden("bfloat16", [(1, 1)]))

    def test_no_fixed_tolerance_for_bf16_without_a_baseline(self):
        allowed, label = report.allowances(golden("float64", [(1, 1)]), "bfloat16")
        self.assertEqual(allowed, {"loss": None, "grad_norm": None})
        self.assertIn("no fixed tolerance", label)


class CompareRun(unittest.TestCase):
    def metrics(self, values, targets=100):
        return {"run": {}, "summary": None,
                "steps": [step_line(k, l, g, targets=targets) for k, (l, g) in enumerate(values)]}

    def test_shares_of_the_allowance_and_the_verdict(self):
        g = golden("float64", [(2.0, 1.0), (2.0, 1.0)])
        allowed = {"loss": [0.125, 0.125], "grad_norm": [0.25, 0.25]}
        c = report.compare_run(self.metrics([(2.0625, 1.0), (1.875, 1.125)]), g, allowed)  # at the limit passes
        self.assertAlmostEqual(c["share"]["loss"][0], 0.5)
        self.assertAlmostEqual(c["share"]["loss"][1], 1.0)
        self.assertEqual(c["share"]["grad_norm"][0], 0.0)
        self.assertEqual(report.verdict(c), "PASS")
        c = report.compare_run(self.metrics([(2.0, 1.0), (2.0, 1.3)]), g, allowed)
        self.assertEqual(report.verdict(c), "FAIL")

    def test_over_a_zero_allowance_is_infinite(self):
        g = golden("float64", [(2.0, 1.0)])
        c = report.compare_run(self.metrics([(2.0, 1.5)]), g, {"loss": [0.0], "grad_norm": [0.0]})
        self.assertEqual(c["share"]["loss"], [0.0])
        self.assertTrue(math.isinf(c["share"]["grad_norm"][0]))
        self.assertEqual(report.fmt_pct(c["share"]["grad_norm"][0]), "inf")

    def test_other_targets_and_missing_steps_fail(self):
        g = golden("float64", [(2.0, 1.0), (2.0, 1.0)])
        allowed = {"loss": [1.0, 1.0], "grad_norm": [1.0, 1.0]}
        c = report.compare_run(self.metrics([(2.0, 1.0), (2.0, 1.0)], targets=99), g, allowed)
        self.assertEqual(c["mismatched"], [0, 1])
        self.assertEqual(report.verdict(c), "FAIL")
        c = report.compare_run(self.metrics([(2.0, 1.0)]), g, allowed)
        self.assertEqual((c["steps"], c["run_steps"], c["golden_steps"]), (1, 1, 2))
        self.assertEqual(report.verdict(c), "FAIL")

    def test_unknown_without_an_allowance(self):
        g = golden("float64", [(2.0, 1.0)])
        c = report.compare_run(self.metrics([(2.0, 1.0)]), g, {"loss": None, "grad_norm": None})
        self.assertEqual(report.verdict(c), "UNKNOWN")

    def test_throughput_of_a_run_that_died_comes_from_its_steps(self):
        m = {"run": {}, "summary": None,
             "steps": [step_line(0, 1, 1, tokens=300, slots=400, seconds=1.0, device_gib=2.5),
                       step_line(1, 1, 1, tokens=100, slots=100, seconds=1.0, device_gib=3.0)]}
        t = report.throughput(m)
        self.assertEqual((t["steps"], t["tokens"], t["tokens_per_second"], t["device_gib"]), (2, 400, 200.0, 3.0))
        self.assertAlmostEqual(t["padding"], 0.2)


CASE_SKIPPED = """<testcase name="SwiGluFused.Backward" status="notrun"><skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
<system-out>[ RUN      ] SwiGluFused.Backward
[   seed   ] FUSEPACK_SEED=20261129 FUSEPACK_TEST_LEVEL=smoke (this test's seed: 1)
/src/tests/kernels/swiglu_test.cpp:87: Skipped
no CUDA device: cudaGetDeviceCount returned cudaErrorNoDevice with 0 devices
[  SKIPPED ] SwiGluFused.Backward (0 ms)
</system-out></testcase>"""
CASE_FAILED = """<testcase name="Conv1dFused.Forward" status="fail"><failure message="Failed"/>
<properties><property name="cmake_labels" value="gpu;kernels"/></properties>
<system-out>[ RUN      ] Conv1dFused.Forward
[  check   ] Conv1dFused.Forward | FAIL y [2, 8]: max_abs 0.002 max_rel 0.01 rel_rms 0.001 over 16 values; budget used 130% (worst at [0, 1])
/src/tests/kernels/conv1d_test.cpp:40: Failure
Value of: result.pass
  Actual: false
[  FAILED  ] Conv1dFused.Forward (3 ms)
</system-out></testcase>"""
CASE_PASSED = """<testcase name="Conv1dFused.Backward" status="run">
<system-out>[  check   ] Conv1dFused.Backward | PASS y [2, 8]: max_abs 0.001 max_rel 0.01 rel_rms 0.001 over 16 values; budget used 60% (worst at [0, 1])
[  check   ] Sm90/Conv1dFused.Backward/bf16 | PASS dx [2, 8]: max_abs 0.001 max_rel 0.01 rel_rms 0.001 over 16 values; budget used 12.5% (worst at [0, 1])
</system-out></testcase>"""


class Tests(unittest.TestCase):
    def test_collects_labels_failures_skips_and_the_worst_budget_per_tensor(self):
        root = ET.fromstring(f"<testsuite>{CASE_SKIPPED}{CASE_FAILED}{CASE_PASSED}</testsuite>")
        t = report.collect_tests(root, {"SwiGluFused.Backward": ["kernels", "gpu"]})
        self.assertEqual(t["per_label"]["gpu"], {"passed": 0, "failed": 1, "skipped": 1})
        self.assertEqual(t["per_label"]["kernels"], {"passed": 0, "failed": 1, "skipped": 1})
        self.assertEqual(t["per_label"]["(no label)"], {"passed": 1, "failed": 0, "skipped": 0})
        self.assertEqual(t["skipped"], {"no CUDA device: cudaGetDeviceCount returned cudaErrorNoDevice with 0 devices":
                                        ["SwiGluFused.Backward"]})
        (name, labels, excerpt), = t["failed"]
        self.assertEqual((name, labels), ("Conv1dFused.Forward", ["gpu", "kernels"]))
        self.assertIn("conv1d_test.cpp:40: Failure", excerpt)
        self.assertIn("| FAIL y", excerpt)
        self.assertEqual(t["worst"][("Conv1dFused", "y")][:2], (130.0, "FAIL"))
        self.assertEqual(t["worst"][("Conv1dFused", "y")][4], "Conv1dFused.Forward")  # the case that holds it
        self.assertEqual(t["worst"][("Conv1dFused", "dx")][0], 12.5)
        self.assertEqual(t["level"], "smoke")

    def test_a_skip_without_a_googletest_message_keeps_the_junit_one(self):
        root = ET.fromstring('<testsuite><testcase name="X.Y" status="notrun"><skipped message="Disabled"/>'
                             '</testcase></testsuite>')
        self.assertEqual(report.collect_tests(root, {})["skipped"], {"Disabled": ["X.Y"]})

    def test_a_crash_shows_the_last_lines(self):
        out = "\n".join(f"line {i}" for i in range(30)) + "\nSegmentation fault\n"
        excerpt = report.failure_excerpt(out, max_lines=3)
        self.assertEqual(excerpt.splitlines(), ["line 28", "line 29", "Segmentation fault"])

    def test_slug_and_percentages(self):
        self.assertEqual(report.slug("qwen35-tiny packed (composite, fp64, cpu)"),
                         "qwen35-tiny-packed-composite-fp64-cpu")
        self.assertEqual(report.fmt_pct(0.000305), "0.0305%")
        self.assertEqual(report.fmt_pct(None), "n/a")
        self.assertEqual(report.suite_kind("GatedDeltaFused"), "fused")
        self.assertEqual(report.suite_kind("Conv1dRef"), "reference")


if __name__ == "__main__":
    unittest.main()
