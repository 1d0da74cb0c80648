#!/usr/bin/env python3
"""Counts a CUDA kernel's machine instructions (SASS) per line of its own source: where the instructions of its
hottest loop go (or of the whole function, --whole). For kernels whose time is their instruction count times a lone
warp's dependency latency, as the Gated DeltaNet recurrences (kernels/gated_delta/NOTES.md), this is the profile that
says which source lines to shorten, without a GPU.

usage: sass_lines.py [--whole] [--inner] [--arch ARCH] [--stalls CSV] OBJECT KERNEL
  OBJECT  a cubin, or a file with cubins inside (a CMake object file such as
          build/kernels/CMakeFiles/fusepack_kernels.dir/gated_delta/gated_delta_fwd.cu.o, a library, an executable)
  KERNEL  a regular expression searched in the kernels' mangled names; it must match exactly one
          (for example 'state_chainI13__nv_bfloat16Li128')
  --stalls CSV  where the kernel's warps waited on a GPU, not only what it executes: Nsight Compute's source page of
          one launch of the same build, as CSV (ncu --section SourceCounters -o REP ...; then ncu -i REP --page source
          --csv --print-source sass > CSV). Each line then shows its share of the warp-stall samples and its most
          sampled stall reasons. The listing's instructions and the CSV's are paired in order, and every pair must
          have the same opcode: a CSV of another build or kernel is refused.

Each instruction counts against the kernel's own source line it came from: the call site in the kernel body for code
inlined from helpers (--inner: the innermost line instead). The loop is the backward branch that spans the most
instructions; its body is unrolled in fusepack's recurrences, so its static count is the count per iteration once it
has no inner loops (a count under an inner loop line runs that loop's trip count times). Needs the objects built with
line info (fusepack's CMake passes -lineinfo to nvcc) and the CUDA toolkit's nvdisasm and cuobjdump on PATH, in
$CUDA_HOME/bin or in /usr/local/cuda/bin.
Exit status 0 on success, 2 on a usage error (no such file, no or several matching kernels, no tool)."""
import argparse
import collections
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile

SECTION = re.compile(r"^//-+ \.text\.(\S+) -+$")
LINE_INFO = re.compile(r'^\s*//## File "([^"]+)", line (\d+)(.*)$')
INLINED_AT = re.compile(r'inlined at "([^"]+)", line (\d+)')
INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"\bBRA\b[^`]*`\((\.L_x_\d+)\)")


class UsageError(Exception):
    pass


def tool(name):
    """The path of a CUDA toolkit binary, or UsageError naming where it was looked for."""
    places = [shutil.which(name)]
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            places.append(os.path.join(root, "bin", name))
    for p in places:
        if p and os.access(p, os.X_OK):
            return p
    raise UsageError(f"{name} not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin (it comes with the CUDA "
                     f"toolkit: Debian's nvidia-cuda-toolkit, NVIDIA's cuda-nvdisasm / cuda-cuobjdump packages)")


def disassemble(obj, arch):
    """nvdisasm -c -gi text of every cubin in `obj` (for `arch` when it holds several), concatenated."""
    if not os.path.isfile(obj):
        raise UsageError(f"no such file: {obj}")
    nvdisasm = tool("nvdisasm")
    with open(obj, "rb") as f:
        is_cubin = f.read(4) == b"\x7fELF" and obj.endswith(".cubin")
    if is_cubin:
        cubins = [obj]
        tmp = None
    else:
        tmp = tempfile.TemporaryDirectory()
        run = subprocess.run([tool("cuobjdump"), "-xelf", "all", os.path.abspath(obj)], cwd=tmp.name,
                             capture_output=True, text=True)
        cubins = sorted(os.path.join(tmp.name, c) for c in os.listdir(tmp.name) if c.endswith(".cubin"))
        names = [os.path.basename(c) for c in cubins]
        if arch:  # cuobjdump names an sm_90a cubin "<stem>.sm_90.cubin"
            cubins = [c for c in cubins if f".{arch.rstrip('a')}." in os.path.basename(c)]
        if not cubins:
            raise UsageError(f"no cubin{' for ' + arch if arch else ''} in {obj} (cuobjdump -xelf all: exit "
                             f"{run.returncode}, extracted: {', '.join(names) or 'nothing'})")
        if len(cubins) > 1:
            raise UsageError(f"{obj} holds {len(cubins)} cubins ({', '.join(names)}); pick one with --arch")
    try:
        texts = []
        for c in cubins:
            run = subprocess.run([nvdisasm, "-c", "-gi", c], capture_output=True, text=True)
            if run.returncode != 0:
                raise UsageError(f"nvdisasm -c -gi {os.path.basename(c)} failed (exit {run.returncode}): "
                                 f"{run.stderr.strip()[:300]}")
            texts.append(run.stdout)
        return "\n".join(texts)
    finally:
        if tmp is not None:
            tmp.cleanup()


def functions(sass):
    """{mangled name: its lines} of an nvdisasm listing."""
    out, name = {}, None
    for line in sass.splitlines():
        m = SECTION.match(line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name is not None:
            out[name].append(line)
    return out


def pick(funcs, pattern):
    """The one function whose mangled name matches `pattern`, or UsageError listing the candidates."""
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise UsageError(f"KERNEL '{pattern}' is not a regular expression: {e}") from None
    matches = sorted(n for n in funcs if regex.search(n))
    if len(matches) == 1:
        return matches[0]
    if not funcs:
        raise UsageError("the object's disassembly has no kernels")
    if not matches:
        raise UsageError(f"no kernel matches '{pattern}'; the object has {len(funcs)}: " +
                         ", ".join(sorted(funcs)[:20]) + (" ..." if len(funcs) > 20 else ""))
    raise UsageError(f"'{pattern}' matches {len(matches)} kernels, expected one: " + ", ".join(matches[:20]) +
                     (" ..." if len(matches) > 20 else ""))


def instructions(lines):
    """[(opcode text, frames)] and {label: index of the next instruction}; frames are the (file, line) pairs of the
    line info in force, innermost first, the kernel body's last."""
    out, labels, frames = [], {}, ()
    for line in lines:
        m = LINE_INFO.match(line)
        if m:
            frames = ((m.group(1), int(m.group(2))),) + tuple(
                (f, int(n)) for f, n in INLINED_AT.findall(m.group(3)))
            continue
        m = LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(out)
            continue
        m = INSTRUCTION.match(line)
        if m:
            out.append((m.group(2), frames))
    return out, labels


def hottest_loop(instrs, labels):
    """(first, last) indices of the backward branch spanning the most instructions, or None without loops."""
    best = None
    for i, (text, _) in enumerate(instrs):
        m = BRANCH.search(text)
        if m and m.group(1) in labels:
            j = labels[m.group(1)]
            if j <= i and (best is None or i - j > best[1] - best[0]):
                best = (j, i)
    return best


def opcode(text):
    """The instruction's opcode without predicate and modifiers ('@!P0 LDSM.16.M88.4 R4, [R2]' -> 'LDSM')."""
    words = text.split()
    word = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "?")
    return word.split(".")[0]


def source_line(frames, inner=False):
    """(file, line) an instruction counts against: the kernel body's line, or the innermost with `inner`; (None, 0)
    without line info."""
    return (frames[0] if inner else frames[-1]) if frames else (None, 0)


def attribute(instrs, inner=False):
    """{(file, line): Counter of opcodes} over `instrs`; (None, 0) for instructions without line info."""
    out = collections.defaultdict(collections.Counter)
    for text, frames in instrs:
        out[source_line(frames, inner)][opcode(text)] += 1
    return out


STALL_SAMPLES = "Warp Stall Sampling (All Samples)"


def number(text):
    """A count as Nsight Compute prints it ('1,234', '', '0')."""
    text = (text or "").replace(",", "").strip()
    try:
        return float(text) if text else 0.0
    except ValueError:
        raise UsageError(f"'{text}' in the stall CSV is not a number") from None


def stall_tables(text):
    """[(kernel name, [(SASS text, samples, {reason: samples})])] of an ncu source page as CSV, in address order. A
    table starts at a 'Kernel Name' or 'Function Name' row; its header is a row with an 'Address' column, and its
    instructions the rows with an address (0x...). With --print-source cuda,sass the page repeats the function once per
    source file, its SASS rows under their lines (the SASS text in the 'Source' column after 'Address'): the sections
    of one function are merged, each address kept once. Reasons are the header's columns named stall_<reason>."""
    tables, header, where = {}, None, None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] in ("Kernel Name", "Function Name"):
            where = tables.setdefault(row[1] if len(row) > 1 else "", {})
            header = None
        elif "Address" in row:
            for column in ("Source", STALL_SAMPLES):
                if column not in row:
                    raise UsageError(f"the stall CSV's header has no '{column}' column (ncu --page source --csv "
                                     f"--print-source sass of a report with the SourceCounters section)")
            address = row.index("Address")
            sources = [i for i, c in enumerate(row) if c == "Source"]
            header = (row, address, next((i for i in sources if i > address), sources[0]), row.index(STALL_SAMPLES),
                      [(c[len("stall_"):], i) for i, c in enumerate(row) if re.fullmatch(r"stall_[a-z_]+", c)])
            if where is None:
                where = tables.setdefault("", {})
        elif header is not None and len(row) == len(header[0]) and row[header[1]].startswith("0x"):
            _, address, source, samples, reasons = header
            where.setdefault(int(row[address], 16), (row[source].strip(), number(row[samples]),
                                                     {r: number(row[i]) for r, i in reasons}))
    tables = [(name, [rows[a] for a in sorted(rows)]) for name, rows in tables.items() if rows]
    if not tables:
        raise UsageError("the stall CSV holds no instructions (expected an 'Address' header row, then one row per "
                         "SASS instruction)")
    return tables


def pair_stalls(instrs, tables, name):
    """The stall rows of the one table whose instructions are the listing's, in order, opcode for opcode; UsageError
    saying how each table differs otherwise."""
    why = []
    for kernel, rows in tables:
        label = f"the table of {kernel}" if kernel else "the table"
        if len(rows) != len(instrs):
            why.append(f"{label} has {len(rows)} instructions, {name} {len(instrs)}")
            continue
        bad = next((i for i, ((text, _), row) in enumerate(zip(instrs, rows)) if opcode(text) != opcode(row[0])),
                   None)
        if bad is not None:
            why.append(f"{label}: instruction {bad} is {opcode(rows[bad][0])} there, {opcode(instrs[bad][0])} in "
                       f"the listing")
            continue
        return rows
    raise UsageError("the stall CSV is not of this build's kernel: " + "; ".join(why))


def attribute_stalls(instrs, rows, inner=False):
    """{(file, line): (samples, Counter of stall reasons)} over paired instructions and stall rows."""
    out = collections.defaultdict(lambda: [0.0, collections.Counter()])
    for (_, frames), (_, samples, reasons) in zip(instrs, rows):
        where = source_line(frames, inner)
        out[where][0] += samples
        out[where][1].update({r: v for r, v in reasons.items() if v})
    return out


def source_text(path, line, cache={}):  # noqa: B006 (a cache on purpose)
    if path not in cache:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                cache[path] = f.read().splitlines()
        except OSError:
            cache[path] = []
    lines = cache[path]
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def where_text(path, line):
    return f"{os.path.basename(path)}:{line}" if path else "(no line info)"


def span_text(instrs, span):
    first, last = span
    return "whole function" if span == (0, len(instrs) - 1) else f"hottest loop (instructions {first}..{last})"


def report(name, instrs, span, counts):
    total = sum(sum(c.values()) for c in counts.values())
    what = span_text(instrs, span)
    rows = [f"{name}: {what}, {total} instructions of {len(instrs)}",
            f"{'count':>6}  {'share':>5}  {'where':<40}  {'top opcodes':<44}  source"]
    for (path, line), ops in sorted(counts.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
        n = sum(ops.values())
        where = where_text(path, line)
        top = " ".join(f"{op}:{k}" for op, k in ops.most_common(4))
        rows.append(f"{n:6d}  {100 * n / total:4.1f}%  {where:<40}  {top:<44}  "
                    f"{source_text(path, line)[:70] if path else ''}")
    return "\n".join(rows)


def report_stalls(name, instrs, span, counts, stalls):
    """report()'s table with each line's warp-stall samples first, sorted by them: the lines the warps waited at."""
    first, last = span
    total = sum(v[0] for v in stalls.values())
    what = span_text(instrs, span)
    rows = [f"{name}: {what}, {total:.0f} warp-stall samples on {last - first + 1} instructions",
            f"{'samples':>8}  {'share':>5}  {'instr':>5}  {'where':<40}  {'top stall reasons':<44}  source"]
    if total == 0:
        return "\n".join(rows[:1] + ["no samples fell in this span (the kernel ran too briefly, or another span)"])
    for (path, line), (samples, reasons) in sorted(stalls.items(), key=lambda kv: -kv[1][0]):
        n = sum(counts[(path, line)].values())
        where = where_text(path, line)
        top = " ".join(f"{r}:{100 * v / samples:.0f}%" for r, v in reasons.most_common(3)) if samples else ""
        rows.append(f"{samples:8.0f}  {100 * samples / total:4.1f}%  {n:5d}  {where:<40}  {top:<44}  "
                    f"{source_text(path, line)[:70] if path else ''}")
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("object", help="a cubin, or an object file, library or executable with cubins inside")
    parser.add_argument("kernel", help="a regular expression matching exactly one kernel's mangled name")
    parser.add_argument("--whole", action="store_true", help="count the whole function, not its hottest loop")
    parser.add_argument("--inner", action="store_true", help="count against the innermost source line (the helper's)")
    parser.add_argument("--arch", help="the cubin's architecture in an object holding several (for example sm_90a)")
    parser.add_argument("--stalls", metavar="CSV", help="Nsight Compute's source page of one launch of this kernel "
                        "(ncu -i REP --page source --csv --print-source sass): warp-stall samples per line")
    parser.add_argument("--from-sass", metavar="FILE", help=argparse.SUPPRESS)  # an nvdisasm -c -gi listing (tests)
    args = parser.parse_args(argv)
    try:
        if args.from_sass:
            with open(args.from_sass, encoding="utf-8") as f:
                sass = f.read()
        else:
            sass = disassemble(args.object, args.arch)
        funcs = functions(sass)
        name = pick(funcs, args.kernel)
        instrs, labels = instructions(funcs[name])
        if not instrs:
            raise UsageError(f"{name} has no instructions in the listing")
        span = None if args.whole else hottest_loop(instrs, labels)
        if span is None:
            span = (0, len(instrs) - 1)
        if not any(frames for _, frames in instrs):
            print(f"sass_lines: {name} carries no line info; build with nvcc -lineinfo", file=sys.stderr)
        counts = attribute(instrs[span[0]:span[1] + 1], args.inner)
        if args.stalls:
            try:
                with open(args.stalls, encoding="utf-8", errors="replace") as f:
                    rows = pair_stalls(instrs, stall_tables(f.read()), name)
            except OSError as e:
                raise UsageError(f"cannot read the stall CSV {args.stalls}: {e.strerror}") from None
            stalls = attribute_stalls(instrs[span[0]:span[1] + 1], rows[span[0]:span[1] + 1], args.inner)
            print(report_stalls(name, instrs, span, counts, stalls))
        else:
            print(report(name, instrs, span, counts))
        return 0
    except UsageError as e:
        print(f"sass_lines: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
