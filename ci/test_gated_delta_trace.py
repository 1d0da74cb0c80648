"""Tests of ci/gated_delta_trace.py on a made-up trace (no GPU needed):
python3 -m unittest ci/test_gated_delta_trace.py"""
import contextlib
import io
import os
import re
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gated_delta_trace  # noqa: E402

# Two WY blocks; two chain blocks, on SMs 0 and 1, whose steps take 2 µs and 3 µs and whose events interleave in the
# file (as blocks record them); three output blocks: one on SM 0 while chain block 0 is there, one on SM 2 (no chain
# block), one on SM 1 after chain block 1 has ended, each with P built before it polls (the third: at once ready).
# Each figure below was worked out by hand from these rows.
ROWS = [
    ("wy_start", 0, 0, 0, 0), ("wy_start", 100, 1, 1, 0), ("wy_end", 1000, 0, 0, 0), ("wy_end", 1500, 1, 1, 0),
    ("chain_start", 2000, 0, 0, 0), ("chain_start", 2000, 1, 1, 0),
    ("chain_step", 2100, 0, 0, 0), ("chain_step", 2100, 1, 1, 0),
    ("output_start", 2500, 0, 0, 0), ("output_start", 2600, 2, 1, 0),
    ("output_built", 3000, 0, 0, 0), ("output_built", 3600, 2, 1, 0),
    ("chain_step", 4100, 0, 0, 1), ("output_ready", 4200, 0, 0, 0), ("output_end", 5000, 0, 0, 0),
    ("chain_step", 5100, 1, 1, 1), ("output_ready", 5200, 2, 1, 1), ("output_end", 6000, 2, 1, 0),
    ("chain_step", 6100, 0, 0, 2), ("chain_end", 8100, 0, 0, 0),
    ("chain_step", 8100, 1, 1, 2), ("chain_end", 11100, 1, 1, 0),
    ("output_start", 11200, 1, 2, 0), ("output_built", 11290, 1, 2, 0), ("output_ready", 11300, 1, 2, 2),
    ("output_end", 12000, 1, 2, 0),
]
SHAPE = "1x192 Hk=1 Hv=1 K=V=128"


def write(path, rows, header="shape,pass,event,ns,sm,block,step", shape=SHAPE, pass_="fwd"):
    with open(path, "w") as f:
        f.write(header + "\n")
        for event, ns, sm, block, step in rows:
            f.write(f"{shape},{pass_},{event},{ns},{sm},{block},{step}\n")


class GatedDeltaTraceTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "trace.csv")

    def tearDown(self):
        self.dir.cleanup()

    def summary(self):
        write(self.path, ROWS)
        groups = gated_delta_trace.read_trace(self.path)
        self.assertEqual(list(groups), [(SHAPE, "fwd")])
        return gated_delta_trace.summarize(groups[(SHAPE, "fwd")])

    def test_spans_of_each_kernel(self):
        s = self.summary()
        self.assertEqual(s["wy"], (0, 1500))
        self.assertEqual(s["chain"], (2000, 11100))
        self.assertEqual(s["output"], (2500, 12000))
        self.assertEqual((s["wy_blocks"], s["chain_blocks"], s["output_blocks"], s["chain_sms"]), (2, 2, 3, 2))
        self.assertEqual(s["end"], 12000)

    def test_chain_steps_per_block_not_in_file_order(self):
        # Steps 2000, 2000, 2000 (block 0) and 3000, 3000, 3000 (block 1), the last one to the block's end. Taken in
        # file order, where the blocks' events interleave, the differences would be 0, 2000, 1000, ...: planted,
        # that mutation gives a median of 1000 and fails here.
        s = self.summary()
        self.assertEqual(s["steps"], 6)
        self.assertEqual(s["step_median"], 2000)
        self.assertEqual(s["step_p90"], 3000)

    def test_output_beside_the_chain_needs_the_same_sm_at_the_same_time(self):
        # Block 0 (SM 0, during chain block 0) is beside; block 1 (SM 2) is not; block 2 is on SM 1 after chain block
        # 1 ended. Counting by SM alone (planted) gives 2.
        self.assertEqual(self.summary()["output_beside_chain"], 1)

    def test_output_waits_and_tail(self):
        s = self.summary()
        self.assertEqual(s["wait_median"], 1700)  # waits 1700, 2600, 100
        self.assertEqual(s["wait_p90"], 2600)
        self.assertEqual(s["tail"], 900)  # 12000 after the chain's last end, 11100 (its first end, 8100: planted)

    def test_output_polling_from_built_to_ready(self):
        # Polling 1200, 1600, 10: from each block's P built to its chunk ready. From the block's start (planted) it
        # would be the waits, 1700, 2600, 100.
        s = self.summary()
        self.assertEqual(s["idle_median"], 1200)
        self.assertEqual(s["idle_p90"], 1600)

    def test_polling_absent_from_older_traces(self):
        write(self.path, [r for r in ROWS if r[0] != "output_built"])
        s = gated_delta_trace.summarize(gated_delta_trace.read_trace(self.path)[(SHAPE, "fwd")])
        self.assertIsNone(s["idle_median"])
        self.assertEqual(s["wait_median"], 1700)

    def test_output_work_from_ready_to_end(self):
        # Work 800, 800, 700: from each block's ready to its end. Timed from the block's start (planted) it is 2500,
        # 3400, 800, median 2500.
        s = self.summary()
        self.assertEqual(s["work_median"], 800)
        self.assertEqual(s["work_p90"], 800)

    def test_report_row(self):
        write(self.path, ROWS)
        out = io.StringIO()
        gated_delta_trace.report(gated_delta_trace.read_trace(self.path), out)
        self.assertIn(f"| {SHAPE} | fwd | 0.0–1.5 | 2.0–11.1 (2 on 2) | 2.0 (3.0) | 2.5–12.0 (3, 1) | 1.7 (2.6) "
                      "| 1.2 (1.6) | 0.8 (0.8) | 0.9 | 12.0 |", out.getvalue())

    def test_passes_and_shapes_apart(self):
        with open(self.path, "w") as f:
            f.write("shape,pass,event,ns,sm,block,step\n")
            f.write(f"{SHAPE},fwd,wy_start,0,0,0,0\n{SHAPE},fwd save,wy_start,0,0,0,0\n{SHAPE},fwd,wy_end,10,0,0,0\n")
        groups = gated_delta_trace.read_trace(self.path)
        self.assertEqual(list(groups), [(SHAPE, "fwd"), (SHAPE, "fwd save")])
        self.assertEqual(len(groups[(SHAPE, "fwd")]), 2)

    def test_event_names_are_the_kernels(self):
        # The CSV's event names come from gated_delta_trace_kind_name (gated_delta_fwd.cu), by the enum's values
        # (gated_delta_trace.h): an event the kernels name otherwise would be refused as unknown, or, with two names
        # swapped, counted as the other.
        root = os.path.dirname(HERE)
        with open(os.path.join(root, "kernels/gated_delta/gated_delta_trace.h")) as f:
            values = dict(re.findall(r"^\s*(k\w+) = (\d+),", f.read(), re.M))
        with open(os.path.join(root, "kernels/gated_delta/gated_delta_fwd.cu")) as f:
            names = re.findall(r'case GatedDeltaTraceKind::(k\w+): return "(\w+)";', f.read())
        self.assertEqual(len(names), len(gated_delta_trace.EVENTS))
        self.assertEqual(sorted((int(values[k]), n) for k, n in names), list(enumerate(gated_delta_trace.EVENTS)))

    def test_refusals(self):
        cases = [
            ("shape,pass,event,ns,sm,block", ROWS[:1], "no column step"),
            ("shape,pass,event,ns,sm,block,step", [("wy_begin", 0, 0, 0, 0)], "unknown event 'wy_begin'"),
            ("shape,pass,event,ns,sm,block,step", [("wy_start", "1.5", 0, 0, 0)], "must be whole numbers"),
            ("shape,pass,event,ns,sm,block,step", [], "no events"),
        ]
        for header, rows, message in cases:
            with self.subTest(message=message):
                write(self.path, rows, header=header)
                with self.assertRaises(gated_delta_trace.TraceError) as caught:
                    gated_delta_trace.read_trace(self.path)
                self.assertIn(message, str(caught.exception))
                err = io.StringIO()
                with contextlib.redirect_stderr(err):
                    self.assertEqual(gated_delta_trace.main([self.path]), 2)
                self.assertIn(message, err.getvalue())


if __name__ == "__main__":
    unittest.main()
