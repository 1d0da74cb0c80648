"""Tests of ci/kernel_profile.py on a made-up Nsight Compute raw CSV (no GPU needed):
python3 -m unittest ci/test_kernel_profile.py"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kernel_profile  # noqa: E402

COLUMNS = ["ID", "Process ID", "Kernel Name", "Block Size", "Grid Size"] + [m for _, m, _ in kernel_profile.METRICS] + \
    kernel_profile.LAUNCH


def report(rows, time_unit="nsecond", drop=None):
    """A raw-page CSV: header, units, then one line per launch (name, time, instructions, grid, block, regs)."""
    columns = [c for c in COLUMNS if c != drop]
    units = {"gpu__time_duration.sum": time_unit, "smsp__inst_executed.sum": "inst"}
    lines = [",".join(f'"{c}"' for c in columns), ",".join(f'"{units.get(c, "")}"' for c in columns)]
    for i, (name, time, inst, grid, block, regs) in enumerate(rows):
        value = {"ID": str(i), "Process ID": "7", "Kernel Name": name, "Block Size": f"({block}, 1, 1)",
                 "Grid Size": f"({grid}, 1, 1)", "gpu__time_duration.sum": time, "smsp__inst_executed.sum": inst,
                 "launch__grid_size": grid, "launch__block_size": block, "launch__registers_per_thread": regs}
        lines.append(",".join(f'"{value.get(c, "12.5")}"' for c in columns))
    return lines


WY = "void fusepack::gated_delta_fwd_detail::gated_delta_fwd_wy_inverse<__nv_bfloat16, 128>(fusepack::P, float *)"
CHAIN = "void fusepack::gated_delta_fwd_detail::gated_delta_fwd_state_chain<float, 64, 2>(fusepack::P, " \
    "fusepack::Maps<std::pair<int, int>>)"


class KernelProfileTest(unittest.TestCase):
    def test_folds_launches_into_their_median_in_launch_order(self):
        # Three WY launches at 100, 400 and 200 us: median 200 (the first is 100, the mean 233).
        rows = [(WY, "100,000", "50,880,512", "2,048", "256", "64"),
                (CHAIN, "303,264", "77,726,720", "128", "128", "193"),
                (WY, "400,000", "50,880,512", "2,048", "256", "64"),
                (WY, "200,000", "50,880,512", "2,048", "256", "64")]
        lines = kernel_profile.table(kernel_profile.parse(report(rows))).splitlines()
        self.assertEqual(len(lines), 4)
        wy, chain = [line.split(" | ") for line in lines[2:]]
        self.assertEqual(wy[0], "| gated_delta_fwd_wy_inverse")
        self.assertEqual(wy[1:5], ["3", "2,048 x 256", "64", "200"])
        self.assertEqual(wy[5], "50.9")  # millions of warp instructions
        self.assertEqual(chain[0], "| gated_delta_fwd_state_chain")
        self.assertEqual(chain[1:5], ["1", "128 x 128", "193", "303"])

    def test_reads_microseconds_as_they_are(self):
        rows = [(WY, "88.16", "1", "2048", "256", "64")]
        line = kernel_profile.table(kernel_profile.parse(report(rows, time_unit="usecond"))).splitlines()[2]
        self.assertEqual(line.split(" | ")[4], "88.2")

    def test_short_names_drop_namespaces_and_nested_template_arguments(self):
        self.assertEqual(kernel_profile.short_name(CHAIN), "gated_delta_fwd_state_chain")
        self.assertEqual(kernel_profile.short_name("k<a<b>, c>(int)"), "k")

    def test_refuses_a_report_without_a_metric(self):
        with self.assertRaises(SystemExit) as e:
            kernel_profile.parse(report([(WY, "1", "1", "1", "1", "1")], drop="smsp__issue_active.avg."
                                        "pct_of_peak_sustained_active"))
        self.assertIn("smsp__issue_active", str(e.exception))

    def test_refuses_an_unknown_time_unit_and_a_report_without_kernels(self):
        with self.assertRaises(SystemExit) as e:
            kernel_profile.parse(report([(WY, "1", "1", "1", "1", "1")], time_unit="cycle"))
        self.assertIn("'cycle'", str(e.exception))
        with self.assertRaises(SystemExit) as e:
            kernel_profile.parse(["==PROF== No kernels were profiled."])
        self.assertIn("Kernel Name", str(e.exception))
        with self.assertRaises(SystemExit) as e:
            kernel_profile.parse(report([]))
        self.assertIn("no kernel rows", str(e.exception))

    def test_refuses_a_value_that_is_not_a_number(self):
        with self.assertRaises(SystemExit) as e:
            kernel_profile.parse(report([(WY, "n/a", "1", "1", "1", "1")]))
        self.assertIn("gated_delta_fwd_wy_inverse gpu__time_duration.sum", str(e.exception))


if __name__ == "__main__":
    unittest.main()
