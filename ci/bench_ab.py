#!/usr/bin/env python3
"""The table of ci/bench_ab.sh: fusepack-bench's fused times of a base tree (the code before) against this tree, read
from the logs of its rounds, LOG_DIR/round<r>-base.log and LOG_DIR/round<r>-this.log for r = 1..ROUNDS.

One Markdown row per (op, shape, pass) of the bench's report, in order of first appearance: the fused ms of every round
on each side, each side's mean and the change of the means, (this - base) / base in %. A row that only one side
reports has "—" on the other side and no change. The composite's times are left out: the A/B is of the fused code.

usage: bench_ab.py LOG_DIR --rounds N --op OP [--device TEXT] [--base TEXT]
Prints the table on stdout. Exit status 1 when a log is missing or no log holds a report row, 2 for bad usage."""
import argparse
import os
import re
import statistics
import sys

# A row of Report::print (kernels/bench/bench.cpp), "%-16s %-28s %-8s %12.4f %10.4f %7.1fx %10.0f %6.0f%%": op, shape
# (may hold spaces and pass its 28 columns), pass, composite ms, fused ms, speedup, fused GB/s, % of copy bandwidth.
ROW = re.compile(r"^(?P<op>\S+) +(?P<shape>\S.*?) +(?P<pass>\S+) +(?P<composite>\S+) +(?P<fused>\S+) +"
                 r"(?P<speedup>\S+)x +(?P<gbps>\S+) +(?P<copy>\S+)%$")
SIDES = ("base", "this")
MISSING = "—"


def number(text):
    try:
        return float(text)
    except ValueError:
        return None


def parse_report(text):
    """The report rows of one fusepack-bench output as [((op, shape, pass), fused ms)]; every other line (progress,
    FLOP rates, schedules, the table's header) is skipped."""
    rows = []
    for line in text.splitlines():
        m = ROW.match(line.rstrip())
        if not m or any(number(m[k]) is None for k in ("composite", "fused", "speedup", "gbps", "copy")):
            continue
        rows.append(((m["op"], m["shape"], m["pass"]), float(m["fused"])))
    return rows


def collect(runs):
    """runs: {side: [rows of round 1, rows of round 2, ...]} (parse_report's lists) -> (keys in order of first
    appearance, {(side, key): [fused ms or None per round]})."""
    keys, times = [], {}
    rounds = max(len(r) for r in runs.values())
    for r in range(rounds):
        for side in SIDES:
            for key, ms in runs[side][r]:
                if key not in keys:
                    keys.append(key)
                per_round = times.setdefault((side, key), [None] * rounds)
                if per_round[r] is None:  # the first row of a key in one run, should a bench print one twice
                    per_round[r] = ms
    return keys, times


def change_text(base_mean, this_mean):
    return f"{100.0 * (this_mean - base_mean) / base_mean:+.1f}%"


def table(runs, op, device="unknown device", base="the base tree", settings=()):
    """The Markdown lines: a line saying what ran where (device as nvidia-smi's "name, driver_version"), a blank
    line, the table."""
    keys, times = collect(runs)
    rounds = max(len(r) for r in runs.values())
    name, _, driver = device.partition(", ")  # nvidia-smi's "name, driver_version"
    head = (f"fusepack-bench {op} on {name}{f' (driver {driver})' if driver else ''}, fused ms of base ({base}) and "
            f"this tree; {rounds} round{'s' if rounds != 1 else ''}, base first in odd rounds and this tree first in "
            "even ones")
    if settings:
        head += "; " + ", ".join(settings)
    lines = [head, "", "| shape | pass | base ms (rounds) | base mean | this ms (rounds) | this mean | change |",
             "|---|---|---|---|---|---|---|"]
    for key in keys:
        row_op, shape, pass_ = key
        cells = [shape if row_op == op else f"{row_op} {shape}", pass_]
        means = {}
        for side in SIDES:
            per_round = times.get((side, key))
            present = [ms for ms in per_round or [] if ms is not None]
            if not present:
                cells += [MISSING, MISSING]
                continue
            means[side] = statistics.fmean(present)
            cells += [", ".join(MISSING if ms is None else f"{ms:.4f}" for ms in per_round), f"{means[side]:.4f}"]
        cells.append(change_text(means["base"], means["this"]) if len(means) == 2 and means["base"] > 0 else MISSING)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description="The A/B table of ci/bench_ab.sh's logs.")
    ap.add_argument("log_dir")
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--op", required=True)
    ap.add_argument("--device", default="unknown device")
    ap.add_argument("--base", default="the base tree")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    runs = {side: [] for side in SIDES}
    for r in range(1, args.rounds + 1):
        for side in SIDES:
            path = os.path.join(args.log_dir, f"round{r}-{side}.log")
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    runs[side].append(parse_report(f.read()))
            except OSError as e:
                print(f"bench_ab: cannot read {path}: {e.strerror}", file=sys.stderr)
                return 1
    if not any(rows for side in SIDES for rows in runs[side]):
        print(f"bench_ab: no report rows in {args.log_dir}/round*.log; is '{args.op}' an op of fusepack-bench?",
              file=sys.stderr)
        return 1
    # The bench's own settings (which shapes ran), so that a table pasted elsewhere says what it timed.
    settings = [f'{k}="{v}"' for k, v in sorted(os.environ.items()) if k.startswith("FUSEPACK_BENCH_")]
    print("\n".join(table(runs, args.op, args.device, args.base, settings)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
