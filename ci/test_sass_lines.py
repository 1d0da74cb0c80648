"""Tests of ci/sass_lines.py on a made-up nvdisasm -c -gi listing (no CUDA toolkit needed):
python3 -m unittest ci/test_sass_lines.py"""
import contextlib
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sass_lines  # noqa: E402

# Two kernels. `chain` has a short loop first (2 instructions, lines 10-11), then the long one (7 instructions: lines
# 20, 21 and code inlined from helpers.cuh at line 21 and 22), and a forward branch that is no loop. The long loop is
# the hottest: choosing the first backward branch, the last one seen or the forward branch gives other counts, and
# the tests below fail on each.
LISTING = """
//--------------------- .text._Z5chainPf --------------------------
	.section	.text._Z5chainPf,"ax",@progbits
_Z5chainPf:
	//## File "/src/kernel.cu", line 5
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_1:
	//## File "/src/kernel.cu", line 10
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
	//## File "/src/kernel.cu", line 11
        /*0020*/              @!P0 BRA `(.L_x_1) ;
.L_x_2:
	//## File "/src/kernel.cu", line 20
        /*0030*/                   LDSM.16.M88.4 R4, [R8] ;
        /*0040*/                   HMMA.16816.F32.BF16 R12, R4, R6, R12 ;
	//## File "/src/helpers.cuh", line 7 inlined at "/src/kernel.cu", line 21
        /*0050*/                   F2FP.BF16.F32.PACK_AB R3, R4, R5 ;
        /*0060*/                   PRMT R3, R3, 0x5410, R3 ;
	//## File "/src/helpers.cuh", line 9 inlined at "/src/kernel.cu", line 22
        /*0070*/              @P1 BRA `(.L_x_3) ;
        /*0080*/                   FADD R2, R2, R3 ;
.L_x_3:
	//## File "/src/kernel.cu", line 23
        /*0090*/              @!P2 BRA `(.L_x_2) ;
	//## File "/src/kernel.cu", line 30
        /*00a0*/                   EXIT ;
//--------------------- .text._Z5chainPd --------------------------
	.section	.text._Z5chainPd,"ax",@progbits
        /*0000*/                   EXIT ;
//--------------------- .text._Z6outputPf --------------------------
        /*0000*/                   EXIT ;
"""


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = sass_lines.main(argv)
    return status, out.getvalue(), err.getvalue()


class Parsing(unittest.TestCase):
    def setUp(self):
        self.funcs = sass_lines.functions(LISTING)
        self.instrs, self.labels = sass_lines.instructions(self.funcs["_Z5chainPf"])

    def test_functions_and_instructions(self):
        self.assertEqual(sorted(self.funcs), ["_Z5chainPd", "_Z5chainPf", "_Z6outputPf"])
        self.assertEqual(len(self.instrs), 11)
        self.assertEqual(self.labels, {".L_x_1": 1, ".L_x_2": 3, ".L_x_3": 9})
        self.assertEqual(self.instrs[5][1], (("/src/helpers.cuh", 7), ("/src/kernel.cu", 21)))

    def test_hottest_loop_is_the_longest_backward_branch(self):
        self.assertEqual(sass_lines.hottest_loop(self.instrs, self.labels), (3, 9))
        self.assertIsNone(sass_lines.hottest_loop(self.instrs[:1], {}))

    def test_instructions_count_against_the_kernels_own_lines(self):
        counts = sass_lines.attribute(self.instrs[3:10])
        self.assertEqual({k: sum(v.values()) for k, v in counts.items()},
                         {("/src/kernel.cu", 20): 2, ("/src/kernel.cu", 21): 2, ("/src/kernel.cu", 22): 2,
                          ("/src/kernel.cu", 23): 1})
        self.assertEqual(counts[("/src/kernel.cu", 22)], {"BRA": 1, "FADD": 1})
        inner = sass_lines.attribute(self.instrs[3:10], inner=True)
        self.assertEqual(sum(inner[("/src/helpers.cuh", 7)].values()), 2)

    def test_opcode_drops_predicate_and_modifiers(self):
        self.assertEqual(sass_lines.opcode("@!P0 LDSM.16.M88.4 R4, [R2]"), "LDSM")
        self.assertEqual(sass_lines.opcode("HMMA.16816.F32.BF16 R12, R4, R6, R12"), "HMMA")


class ListingFile(unittest.TestCase):
    """LISTING in a file of a temporary directory, as --from-sass reads it."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.sass = os.path.join(self.dir.name, "listing.sass")
        with open(self.sass, "w", encoding="utf-8") as f:
            f.write(LISTING)


class Command(ListingFile):

    def test_reports_the_hottest_loop(self):
        status, out, _ = run(["--from-sass", self.sass, "unused.o", "chainPf"])
        self.assertEqual(status, 0)
        self.assertIn("hottest loop (instructions 3..9), 7 instructions of 11", out)
        self.assertIn("kernel.cu:21", out)
        self.assertNotIn("helpers.cuh", out)

    def test_whole_function(self):
        status, out, _ = run(["--from-sass", self.sass, "--whole", "unused.o", "chainPf"])
        self.assertEqual(status, 0)
        self.assertIn("whole function, 11 instructions of 11", out)

    def test_a_pattern_must_match_one_kernel(self):
        for pattern, message in [
                ("chain", "'chain' matches 2 kernels, expected one: _Z5chainPd, _Z5chainPf"),
                ("attention", "no kernel matches 'attention'; the object has 3: _Z5chainPd, _Z5chainPf, _Z6outputPf"),
                ("chain(Pf", "KERNEL 'chain(Pf' is not a regular expression: missing ), unterminated subpattern")]:
            status, _, err = run(["--from-sass", self.sass, "unused.o", pattern])
            self.assertEqual(status, 2, pattern)
            self.assertIn(message, err)

    def test_no_line_info_is_said(self):
        status, out, err = run(["--from-sass", self.sass, "unused.o", "outputPf"])
        self.assertEqual(status, 0)
        self.assertIn("carries no line info; build with nvcc -lineinfo", err)
        self.assertIn("(no line info)", out)

    def test_a_missing_object_is_a_usage_error(self):
        status, _, err = run([os.path.join(self.dir.name, "missing.o"), "chain"])
        self.assertEqual(status, 2)
        self.assertIn("no such file:", err)


# Nsight Compute's source page of `chain` as CSV (ncu -i REP --page source --csv --print-source sass), in the listing's
# order; samples per instruction and two stall reasons. Line 20 (LDSM 40 + HMMA 10) waits most, mostly on long_sb;
# line 22 has 1,000 samples on one instruction (a thousands separator) and 5 on the FADD.
STALL_HEADER = ('"Address","Source","Instructions Executed","Warp Stall Sampling (All Samples)",'
                '"Warp Stall Sampling (Not-issued Samples)","stall_long_sb","stall_barrier"')
STALL_ROWS = [("LDC R1, c[0x0][0x28]", 2, 2, 0), ("IADD3 R2, R2, 0x1, RZ", 3, 0, 0), ("@!P0 BRA `(.L_x_1)", 1, 0, 0),
              ("LDSM.16.M88.4 R4, [R8]", 40, 30, 0), ("HMMA.16816.F32.BF16 R12, R4, R6, R12", 10, 0, 0),
              ("F2FP.BF16.F32.PACK_AB R3, R4, R5", 4, 0, 0), ("PRMT R3, R3, 0x5410, R3", 0, 0, 0),
              ("@P1 BRA `(.L_x_3)", "1,000", 0, 900), ("FADD R2, R2, R3", 5, 0, 0),
              ("@!P2 BRA `(.L_x_2)", 6, 0, 6), ("EXIT", 0, 0, 0)]


def stall_csv(rows=STALL_ROWS, kernel="chain(float *)"):
    lines = [f'"Kernel Name","{kernel}"', STALL_HEADER]
    for i, (text, samples, long_sb, barrier) in enumerate(rows):
        lines.append(f'"0x7f00{16 * i:04x}","{text}","32","{samples}","0","{long_sb}","{barrier}"')
    return "\n".join(lines) + "\n"


class Stalls(ListingFile):
    def csv_file(self, text):
        path = os.path.join(self.dir.name, "stalls.csv")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def test_samples_per_line_of_the_hottest_loop(self):
        status, out, err = run(["--from-sass", self.sass, "--stalls", self.csv_file(stall_csv()), "unused.o",
                                "chainPf"])
        self.assertEqual(status, 0, err)
        lines = out.splitlines()
        # the loop's instructions 3..9 only: 40 + 10 + 4 + 0 + 1000 + 5 + 6 samples
        self.assertIn("hottest loop (instructions 3..9), 1065 warp-stall samples on 7 instructions", lines[0])
        rows = [line.split() for line in lines[2:]]
        self.assertEqual([(r[0], r[3]) for r in rows],
                         [("1005", "kernel.cu:22"), ("50", "kernel.cu:20"), ("6", "kernel.cu:23"),
                          ("4", "kernel.cu:21")])
        self.assertEqual(rows[0][2], "2")  # two instructions on line 22
        self.assertIn("barrier:90%", lines[2])  # 900 of line 22's 1005 samples
        self.assertIn("long_sb:60%", lines[3])  # 30 of line 20's 50

    def test_whole_function(self):
        status, out, _ = run(["--from-sass", self.sass, "--whole", "--stalls", self.csv_file(stall_csv()),
                              "unused.o", "chainPf"])
        self.assertEqual(status, 0)
        self.assertIn("whole function, 1071 warp-stall samples on 11 instructions", out)
        self.assertIn("kernel.cu:5", out)

    def test_the_table_of_this_kernel_is_picked(self):
        other = stall_csv(STALL_ROWS[:3], kernel="output(float *)")
        status, out, err = run(["--from-sass", self.sass, "--stalls", self.csv_file(other + stall_csv()),
                                "unused.o", "chainPf"])
        self.assertEqual(status, 0, err)
        self.assertIn("1065 warp-stall samples", out)

    def test_the_cuda_and_sass_page_is_merged_by_address(self):
        # --print-source cuda,sass: one section per source file, each SASS row under its CUDA line (address "-"), the
        # SASS text in the second Source column; an instruction may be listed in two files' sections; columns of
        # not-issued samples per reason are not reasons of their own.
        header = ('"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)",'
                  '"Warp Stall Sampling (Not-issued Samples)","stall_long_sb","stall_barrier",'
                  '"stall_long_sb (Not Issued)"')

        def sass_row(i):
            text, samples, long_sb, barrier = STALL_ROWS[i]
            return f'"","","0x7f00{16 * i:04x}","{text}","{samples}","0","{long_sb}","{barrier}","777"'

        function = '"Function Name","chain(float *)"'
        first = [f'"File Path","/src/helpers.cuh"', function, header, '"7","inline T f()","-","-","4","0","0","0","0"']
        first += [sass_row(i) for i in (5, 6, 7, 8)]
        second = [f'"File Path","/src/kernel.cu"', function, header, '"20","x = y;","-","-","50","0","30","0","0"']
        second += [sass_row(i) for i in (3, 4, 0, 1, 2, 8, 9, 10, 5)]
        path = self.csv_file("\n".join(first + second) + "\n")
        status, out, err = run(["--from-sass", self.sass, "--stalls", path, "unused.o", "chainPf"])
        self.assertEqual(status, 0, err)
        self.assertIn("1065 warp-stall samples on 7 instructions", out)
        self.assertIn("long_sb:60%", out)
        self.assertNotIn("(Not Issued)", out)

    def test_a_csv_of_another_build_is_refused(self):
        # one instruction more (a shifted pairing would attribute every sample to the wrong line)
        longer = [("NOP", 0, 0, 0)] + STALL_ROWS
        swapped = STALL_ROWS[:3] + [STALL_ROWS[4], STALL_ROWS[3]] + STALL_ROWS[5:]
        for rows, message in [
                (longer, "the table of chain(float *) has 12 instructions, _Z5chainPf 11"),
                (swapped, "the table of chain(float *): instruction 3 is HMMA there, LDSM in the listing")]:
            status, _, err = run(["--from-sass", self.sass, "--stalls", self.csv_file(stall_csv(rows)), "unused.o",
                                  "chainPf"])
            self.assertEqual(status, 2, message)
            self.assertIn("the stall CSV is not of this build's kernel: " + message, err)

    def test_a_csv_without_samples_is_refused(self):
        for text, message in [
                (stall_csv().replace("Warp Stall Sampling (All Samples)", "Instructions Issued"),
                 "the stall CSV's header has no 'Warp Stall Sampling (All Samples)' column"),
                ('"Kernel Name","chain"\n', "the stall CSV holds no instructions"),
                (stall_csv().replace('"40"', '"n/a"'), "'n/a' in the stall CSV is not a number")]:
            status, _, err = run(["--from-sass", self.sass, "--stalls", self.csv_file(text), "unused.o", "chainPf"])
            self.assertEqual(status, 2, message)
            self.assertIn(message, err)
        status, _, err = run(["--from-sass", self.sass, "--stalls", os.path.join(self.dir.name, "none.csv"),
                              "unused.o", "chainPf"])
        self.assertEqual(status, 2)
        self.assertIn("cannot read the stall CSV", err)


if __name__ == "__main__":
    unittest.main()
