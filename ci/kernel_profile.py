#!/usr/bin/env python3
"""Summarises an Nsight Compute raw CSV (ncu --csv --page raw --metrics ...; ci/gpu_profile.sh runs it) as one row per
kernel: which limit each kernel meets (kernels/gated_delta/NOTES.md keeps such a table). Launches of the same kernel
(same short name and grid) are folded into their median; the count says how many there were.

Columns: grid x block, registers per thread, median time (us), warp instructions (millions), issue (% of cycles a
scheduler issues), tensor pipe, L1/shared pipe and DRAM (% of peak), warps (achieved occupancy, %).

  python3 ci/kernel_profile.py profile.csv      (or the CSV on stdin)"""
import argparse
import csv
import re
import statistics
import sys

# (column title, metric, scale to the printed unit); gpu_profile.sh asks ncu for exactly these.
METRICS = [
    ("time us", "gpu__time_duration.sum", None),
    ("instr M", "smsp__inst_executed.sum", 1e-6),
    ("issue %", "smsp__issue_active.avg.pct_of_peak_sustained_active", 1.0),
    ("tensor %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", 1.0),
    ("L1 %", "l1tex__throughput.avg.pct_of_peak_sustained_active", 1.0),
    ("DRAM %", "dram__throughput.avg.pct_of_peak_sustained_elapsed", 1.0),
    ("warps %", "sm__warps_active.avg.pct_of_peak_sustained_active", 1.0),
]
LAUNCH = ["launch__grid_size", "launch__block_size", "launch__registers_per_thread"]
TIME_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6,
              "second": 1e6}


def short_name(full):
    """'void ns::detail::kernel<float, 128>(Params, float *)' -> 'kernel'."""
    name = full.split("(", 1)[0].strip()
    name = re.sub(r"^void\s+", "", name)
    depth, out = 0, []
    for ch in name:  # drop template arguments, nested ones included
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).split("::")[-1].strip()


def number(text, what):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        raise SystemExit(f"kernel_profile: {what}: expected a number, got {text!r}") from None


def parse(lines):
    """Rows of the raw CSV as (kernel, {metric: value}) with times in us; SystemExit with the reason on bad input."""
    rows = list(csv.reader(lines))
    header_at = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if header_at is None:
        raise SystemExit("kernel_profile: no 'Kernel Name' column: not an ncu --csv --page raw report "
                         "(did ncu profile any kernel? check its --kernel-name and --launch-skip)")
    header, units = rows[header_at], rows[header_at + 1] if header_at + 1 < len(rows) else []
    col = {name: i for i, name in enumerate(header)}
    missing = [m for _, m, _ in METRICS if m not in col] + [m for m in LAUNCH if m not in col]
    if missing:
        raise SystemExit("kernel_profile: the report lacks " + ", ".join(missing) +
                         " (run it through ci/gpu_profile.sh)")
    unit = units[col["gpu__time_duration.sum"]] if units else ""
    if unit not in TIME_TO_US:
        raise SystemExit(f"kernel_profile: gpu__time_duration.sum in unknown unit {unit!r}; expected one of "
                         + ", ".join(sorted(TIME_TO_US)))
    out = []
    for r in rows[header_at + 2:]:
        if len(r) < len(header) or not r[col["Kernel Name"]]:
            continue
        kernel = short_name(r[col["Kernel Name"]])
        values = {m: number(r[col[m]], f"{kernel} {m}") for m in LAUNCH}
        for _, m, _ in METRICS:
            values[m] = number(r[col[m]], f"{kernel} {m}")
        values["gpu__time_duration.sum"] *= TIME_TO_US[unit]
        out.append((kernel, values))
    if not out:
        raise SystemExit("kernel_profile: the report has a header but no kernel rows")
    return out


def table(launches):
    """Markdown table, one row per (kernel, grid, block), in order of first launch."""
    groups = {}
    for kernel, v in launches:
        key = (kernel, int(v["launch__grid_size"]), int(v["launch__block_size"]))
        groups.setdefault(key, []).append(v)
    titles = ["kernel", "launches", "grid x block", "regs"] + [t for t, _, _ in METRICS]
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    for (kernel, grid, block), vs in groups.items():
        med = {m: statistics.median(v[m] for v in vs) for m in vs[0]}
        cells = [kernel, str(len(vs)), f"{grid:,} x {block}", str(int(med["launch__registers_per_thread"]))]
        for title, metric, scale in METRICS:
            value = med[metric] * (scale or 1.0)
            cells.append(f"{value:.0f}" if title == "time us" and value >= 100 else f"{value:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="?", help="ncu --csv --page raw output (default: stdin)")
    args = ap.parse_args(argv)
    if args.csv:
        with open(args.csv, newline="", errors="replace") as f:
            text = f.read().splitlines()
    else:
        text = sys.stdin.read().splitlines()
    print(table(parse(text)))


if __name__ == "__main__":
    main()
