#!/usr/bin/env python3
"""Tests of ci/bench_e2e_summary.py (the end-to-end benchmark's table) on fixture runs in the real formats, and of
ci/hf_baseline.py's data functions (no torch, no GPU): python3 -m unittest ci/test_bench_e2e_summary.py"""
import io
import json
import os
import statistics
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_e2e_summary as summary  # noqa: E402
import hf_baseline  # noqa: E402

MODEL = "bench-200m"

# fusepack-train's run: 6 steps, step 3 profiled.
F_TOKENS = [8000, 8100, 8150, 8050, 8180, 8120]
F_SECONDS = [2.0, 0.1, 0.05, 0.2, 0.05, 0.04]
# The baseline's run: 6 steps, step 3 profiled.
H_TOKENS = [5000, 4000, 4500, 4900, 3000, 5200]
H_SECONDS = [3.0, 1.0, 1.0, 2.0, 0.6, 1.3]

F_AVG = sum(F_TOKENS) / sum(F_SECONDS)  # 19,918 tokens/s
F_STEADY = statistics.median([F_TOKENS[i] / F_SECONDS[i] for i in (2, 4, 5)])  # 163,600: steps 2.., step 3 left out
H_AVG = sum(H_TOKENS) / sum(H_SECONDS)  # 2,989
H_STEADY = statistics.median([H_TOKENS[i] / H_SECONDS[i] for i in (2, 4, 5)])  # 4,500


def grouped(n):
    return f"{round(n):,}"


def step_log_line(step, total, tokens, seconds):
    """A step line as trainer/train/report.cpp step_log_line writes it."""
    return (f"step {step:{len(str(total))}d}/{total}  loss 10.412345  grad norm 3.1234  lr 1.000e-04  targets "
            f"{grouped(tokens - 3)}  tokens {grouped(tokens)}  {grouped(tokens / seconds)} tok/s  padding 0.0%")


def fusepack_log(profiled_step=3):
    lines = ["model: preset bench-200m, 8 layers, hidden 1024, vocab 32768, 207,932,352 parameters; bf16 on cuda:0, "
             "backend fused", "ready in 3.2 s"]
    for i, (t, s) in enumerate(zip(F_TOKENS, F_SECONDS)):
        lines.append(step_log_line(i, len(F_TOKENS), t, s))
        if i == profiled_step:  # trainer/train/profile.cpp profile_text
            lines += [f"profile of step {i} (backend fused)",
                      "  CPU op calls:   12,345 (+ 4,567 CUDA API calls)",
                      "  GPU kernels:    4,035 (+ 314 memcpy/memset)",
                      "  step wall time: 217.812 ms (CPU side, GPU waited for)",
                      "  GPU kernel time: 193.816 ms (89.0% of the wall time)",
                      "  GPU memory:     3.50 GiB allocated at the start, 8.01 GiB at the peak of the step",
                      "  most frequent GPU kernels:",
                      "         512  void fusepack::kernels::gated_delta_fwd<...>",
                      "  all 96 op calls ran fused"]
    lines += ["peak GPU memory: 8.08 GiB allocated on cuda:0; 3.50 GiB held between steps (weights, optimizer state), "
              "4.58 GiB more during a step",
              "summary: 6 steps, 48,582 targets, 48,600 tokens in 51 examples",
              f"throughput: {grouped(F_AVG)} tokens/s (train time {sum(F_SECONDS):.2f} s, wall time 6.10 s)",
              "padding: 0.0% of 48,600 computed positions"]
    return "\n".join(lines) + "\n"


def metrics_lines():
    """A --metrics file as trainer/train/metrics.cpp writes it."""
    out = [{"run": {"dtype": "bfloat16", "world_size": 1}}]
    for i, (t, s) in enumerate(zip(F_TOKENS, F_SECONDS)):
        out.append({"step": i, "loss": 10.4, "grad_norm": 3.1, "lr": 1e-4, "targets": t - 3, "tokens": t, "slots": t,
                    "examples": 9, "micro_batches": 1, "padding": 0.0, "seconds": s, "tokens_per_second": t / s,
                    "device_gib": 3.5})
    out.append({"summary": {"steps": 6, "tokens": sum(F_TOKENS), "tokens_per_second": F_AVG}})
    return [json.dumps(j) for j in out]


def hf_json():
    """ci/hf_baseline.py --json."""
    return {"baseline": "transformers Qwen3_5ForCausalLM, padded", "steps": 6, "warmup": 2,
            "step_seconds": H_SECONDS, "step_tokens": H_TOKENS, "step_slots": [8192] * 6, "tokens": sum(H_TOKENS),
            "slots": 8192 * 6, "padding": 0.338, "first_step_seconds": H_SECONDS[0], "tokens_per_second": H_AVG,
            "tokens_per_second_steady_median": H_STEADY, "peak_memory_bytes": int(71.5 * 2 ** 30),
            "profile": {"step": 3, "tokens": 4900, "wall_seconds": 2.0, "cpu_op_calls": 62910, "gpu_kernels": 9310,
                        "gpu_memory_ops": 120, "gpu_kernel_seconds": 0.9, "gpu_busy_share": 0.45,
                        "kernels_per_token": 1.9}}


# nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader,nounits -lms 200
# during a run. The highest draw is 701.0 W, so the loaded samples draw >= 350.5 W: the idle one (80.5 W) is left out.
# Loaded clocks 1980, 1650, 1500, 1700, 1900, 1400: median 1675; throttled for power (0x4 twice, 0x80) or heat (0x40):
# 4 of 6; 0x2 (application clocks) is no throttle.
GPU_CSV = "\n".join([
    "345, 80.5, 0x0000000000000001",
    "1980, 420.0, 0x0000000000000000",
    "1650, 699.2, 0x0000000000000004",
    "1500, 701.0, 0x0000000000000004",
    "1700, 650.0, 0x0000000000000040",
    "1900, 500.0, 0x0000000000000002",
    "1400, 360.0, 0x0000000000000080",
]) + "\n"


class OutDir(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.out = self.dir.name

    def write(self, name, text):
        with open(os.path.join(self.out, name), "w", encoding="utf-8") as f:
            f.write(text)

    def write_fusepack(self, rc=0, metrics=True, log=None):
        self.write(f"fusepack-{MODEL}.log", fusepack_log() if log is None else log)
        if metrics:
            self.write(f"fusepack-{MODEL}.metrics.jsonl", "\n".join(metrics_lines()) + "\n")
        self.write(f"fusepack-{MODEL}.rc", f"{rc}\n")

    def write_hf(self, rc=0, doc=None):
        self.write(f"hf-{MODEL}.log", "throughput: ...\n")
        if rc == 0:
            self.write(f"hf-{MODEL}.json", json.dumps(hf_json() if doc is None else doc))
        self.write(f"hf-{MODEL}.rc", f"{rc}\n")

    def main(self, *args):
        out = io.StringIO()
        with redirect_stdout(out):
            rc = summary.main([self.out, MODEL, *args])
        return rc, out.getvalue()

    def row(self, text):
        rows = [line for line in text.splitlines() if line.startswith(f"| {MODEL} |")]
        self.assertEqual(len(rows), 1, text)
        return [c.strip() for c in rows[0].strip("|").split("|")]


class FusepackRun(OutDir):
    def test_reads_the_metrics_file_and_the_log(self):
        self.write_fusepack()
        r = summary.fusepack_run(self.out, MODEL, warmup=2, profile_step=3)
        self.assertEqual(r["steps"], 6)
        self.assertAlmostEqual(r["avg"], F_AVG)
        self.assertAlmostEqual(r["avg"], 48600 / 2.44)
        self.assertAlmostEqual(r["steady"], F_STEADY)
        self.assertAlmostEqual(r["steady"], 163600)
        self.assertEqual(r["first_step_seconds"], 2.0)
        self.assertEqual(r["peak_gib"], 8.08)
        self.assertAlmostEqual(r["busy"], 193.816 / 217.812)
        self.assertAlmostEqual(r["busy_steady"], 0.193816 / 8050 * 163600)  # per token of the profiled step
        self.assertAlmostEqual(r["kernels_per_token"], 4035 / 8050)  # the profiled step's tokens

    def test_without_a_metrics_file_the_step_lines_of_the_log_give_the_steps(self):
        self.write_fusepack(metrics=False)
        r = summary.fusepack_run(self.out, MODEL, warmup=2, profile_step=3)
        self.assertEqual(r["steps"], 6)
        self.assertAlmostEqual(r["avg"], F_AVG, delta=F_AVG * 1e-4)  # tok/s are rounded in the log
        self.assertAlmostEqual(r["steady"], F_STEADY, delta=F_STEADY * 1e-4)
        self.assertAlmostEqual(r["kernels_per_token"], 4035 / 8050)

    def test_the_profiled_step_named_in_the_log_wins_over_the_default(self):
        self.write_fusepack(log=fusepack_log(profiled_step=4))
        r = summary.fusepack_run(self.out, MODEL, warmup=2, profile_step=3)
        self.assertAlmostEqual(r["steady"], statistics.median([F_TOKENS[i] / F_SECONDS[i] for i in (2, 3, 5)]))
        self.assertAlmostEqual(r["kernels_per_token"], 4035 / 8180)

    def test_a_line_cut_short_by_a_killed_run_is_skipped(self):
        self.write_fusepack()
        with open(os.path.join(self.out, f"fusepack-{MODEL}.metrics.jsonl"), "a", encoding="utf-8") as f:
            f.write('{"step": 6, "loss": 10.')
        self.assertEqual(summary.fusepack_run(self.out, MODEL, 2, 3)["steps"], 6)

    def test_a_failed_or_missing_run_raises(self):
        with self.assertRaisesRegex(summary.Missing, "no log"):
            summary.fusepack_run(self.out, MODEL, 2, 3)
        self.write_fusepack(rc=134)
        with self.assertRaisesRegex(summary.Missing, "exit status 134"):
            summary.fusepack_run(self.out, MODEL, 2, 3)
        os.remove(os.path.join(self.out, f"fusepack-{MODEL}.metrics.jsonl"))
        self.write_fusepack(rc=0, metrics=False, log="fusepack-train: --preset: unknown preset\n")
        with self.assertRaisesRegex(summary.Missing, "no step finished"):
            summary.fusepack_run(self.out, MODEL, 2, 3)


class HfRun(OutDir):
    def test_reads_the_json(self):
        self.write_hf()
        r = summary.hf_run(self.out, MODEL, warmup=2)
        self.assertAlmostEqual(r["avg"], 26600 / 8.9)
        self.assertAlmostEqual(r["steady"], 4500)
        self.assertEqual(r["first_step_seconds"], 3.0)
        self.assertAlmostEqual(r["peak_gib"], 71.5)
        self.assertEqual(r["busy"], 0.45)
        self.assertAlmostEqual(r["busy_steady"], 0.9 / 4900 * H_STEADY)
        self.assertEqual(r["kernels_per_token"], 1.9)
        self.assertEqual(r["padding"], 0.338)

    def test_a_cpu_run_has_no_profile_and_no_peak(self):
        doc = hf_json()
        doc.update(profile=None, peak_memory_bytes=None)
        self.write_hf(doc=doc)
        r = summary.hf_run(self.out, MODEL, warmup=2)
        self.assertIsNone(r["busy"])
        self.assertIsNone(r["peak_gib"])
        self.assertAlmostEqual(r["steady"], statistics.median([H_TOKENS[i] / H_SECONDS[i] for i in range(2, 6)]))

    def test_a_failed_run_raises(self):
        self.write_hf(rc=2)
        with self.assertRaisesRegex(summary.Missing, "exit status 2"):
            summary.hf_run(self.out, MODEL, 2)
        os.remove(os.path.join(self.out, f"hf-{MODEL}.rc"))
        with self.assertRaisesRegex(summary.Missing, "no --json file"):
            summary.hf_run(self.out, MODEL, 2)


class GpuClocks(OutDir):
    def test_the_median_clock_and_throttled_share_of_the_loaded_samples(self):
        self.write("f.gpu.csv", GPU_CSV)
        c = summary.gpu_clocks(os.path.join(self.out, "f.gpu.csv"))
        self.assertEqual(c["samples"], 6)
        self.assertEqual(c["clock_mhz"], 1675)
        self.assertAlmostEqual(c["throttled"], 4 / 6)
        self.assertEqual(summary.fmt(c, "clock"), "1,675 (67%)")

    def test_a_message_of_a_failed_nvidia_smi_is_no_sample(self):
        self.write("f.gpu.csv", 'Field "clocks_throttle_reasons.active" is not a valid field to query.\n')
        self.assertIsNone(summary.gpu_clocks(os.path.join(self.out, "f.gpu.csv")))
        self.write("g.gpu.csv", 'Field "x" is not a valid field to query.\n' + GPU_CSV)
        self.assertEqual(summary.gpu_clocks(os.path.join(self.out, "g.gpu.csv"))["samples"], 6)
        self.assertIsNone(summary.gpu_clocks(os.path.join(self.out, "missing.gpu.csv")))


class Table(OutDir):
    def test_the_row_of_two_finished_runs(self):
        self.write_fusepack()
        self.write_hf()
        rc, text = self.main()
        self.assertEqual(rc, 0, text)
        self.assertTrue(text.startswith("| model | fusepack tokens/s (avg incl. first / steady median) |"), text)
        self.assertEqual(text.splitlines()[1], "|---|---|---|---|---|---|---|---|---|---|")
        cells = self.row(text)
        self.assertEqual(len(cells), 10)
        self.assertEqual(cells[1], "19,918 / 163,600")
        self.assertEqual(cells[2], "2,989 / 4,500")
        self.assertEqual(cells[3], f"{F_AVG / H_AVG:.1f}× / {F_STEADY / H_STEADY:.1f}×")
        self.assertEqual(cells[3], "6.7× / 36.4×")
        self.assertEqual(cells[4], "89.0% / 45.0%")
        self.assertEqual(cells[5], f"{100 * 0.193816 / 8050 * 163600:.1f}% / {100 * 0.9 / 4900 * H_STEADY:.1f}%")
        self.assertEqual(cells[5], "393.9% / 82.7%")
        self.assertEqual(cells[6], "8.08 / 71.50")
        self.assertEqual(cells[7], "0.501 / 1.900")
        self.assertEqual(cells[8], "33.8%")
        self.assertEqual(cells[9], "— / —")  # nothing sampled
        self.assertNotIn("FAILED", text)

    def test_the_clock_cell_of_a_sampled_run(self):
        self.write_fusepack()
        self.write_hf()
        self.write(f"fusepack-{MODEL}.gpu.csv", GPU_CSV)
        rc, text = self.main()
        self.assertEqual(rc, 0, text)
        self.assertEqual(self.row(text)[9], "1,675 (67%) / —")

    def test_a_failed_fusepack_run_is_failed_with_its_log_and_the_exit_status_is_1(self):
        self.write_fusepack(rc=1)
        self.write_hf()
        rc, text = self.main()
        self.assertEqual(rc, 1)
        cells = self.row(text)
        log = os.path.join(self.out, f"fusepack-{MODEL}.log")
        self.assertEqual(cells[1], f"FAILED (exit status 1): {log}")
        self.assertEqual(cells[2], "2,989 / 4,500")  # the other side still shows
        self.assertEqual(cells[3], "—")
        self.assertEqual(cells[6], "— / 71.50")
        self.assertIn(f"FAILED: fusepack {MODEL}: exit status 1; log {log}", text)

    def test_a_missing_baseline_is_failed(self):
        self.write_fusepack()
        rc, text = self.main()
        self.assertEqual(rc, 1)
        cells = self.row(text)
        self.assertEqual(cells[2], f"FAILED (no --json file): {os.path.join(self.out, f'hf-{MODEL}.log')}")
        self.assertEqual(cells[1], "19,918 / 163,600")
        self.assertEqual(cells[8], "—")

    def test_a_model_without_any_file_is_failed_on_both_sides(self):
        rc, text = self.main()
        self.assertEqual(rc, 1)
        cells = self.row(text)
        self.assertTrue(cells[1].startswith("FAILED (no log)"), cells)
        self.assertTrue(cells[2].startswith("FAILED (no --json file)"), cells)

    def test_a_skipped_baseline_is_no_failure(self):
        self.write_fusepack()
        rc, text = self.main("--skip-hf")
        self.assertEqual(rc, 0, text)
        cells = self.row(text)
        self.assertEqual(cells[2], "skipped")
        self.assertEqual(cells[4], "89.0% / —")

    def test_no_out_dir_is_a_usage_error(self):
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            self.assertEqual(summary.main([os.path.join(self.out, "none"), MODEL]), 2)


class HfBaselineData(unittest.TestCase):
    def test_padded_batches_keep_rows_times_longest_within_the_budget(self):
        self.assertEqual(hf_baseline.padded_batches([100, 300, 200, 900, 50, 50], 1000),
                         [[100, 300, 200], [900], [50, 50]])
        self.assertEqual(hf_baseline.padded_batches([1200, 10], 1000), [[1200], [10]])  # at least one row
        lengths = hf_baseline.draw_lengths(2000, 900, 0.8, 16, 8192, seed=1)
        batches = hf_baseline.padded_batches(lengths, 8192)
        self.assertEqual([n for b in batches for n in b], lengths)  # drawn order, every example once
        self.assertTrue(all(len(b) * max(b) <= 8192 for b in batches))

    def test_lengths_follow_the_log_normal_law(self):
        lengths = hf_baseline.draw_lengths(20000, 900, 0.8, 16, 8192, seed=3)
        self.assertEqual(lengths, hf_baseline.draw_lengths(20000, 900, 0.8, 16, 8192, seed=3))  # seeded
        self.assertTrue(all(16 <= n <= 8192 and isinstance(n, int) for n in lengths))
        self.assertAlmostEqual(statistics.median(lengths), 900, delta=30)
        self.assertEqual(max(hf_baseline.draw_lengths(1000, 900, 3.0, 16, 8192, seed=1)), 8192)  # clamped
        self.assertEqual(min(hf_baseline.draw_lengths(1000, 900, 3.0, 16, 8192, seed=1)), 16)

    def test_steady_median_leaves_out_the_warm_up_and_the_profiled_step(self):
        self.assertEqual(hf_baseline.steady_median([10, 20, 30, 40, 50], [1] * 5, warmup=2, skip_step=3), 40)
        self.assertIsNone(hf_baseline.steady_median([10, 20], [1, 1], warmup=2))


if __name__ == "__main__":
    unittest.main()
