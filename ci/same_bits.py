#!/usr/bin/env python3
"""Whether two builds computed the same bits: the digests that `fusepack-gradcheck OP ... --fused-only --digest`
printed for a base tree and for this tree (ci/bench_ab.sh --same-bits runs both), compared tensor by tensor.

A digest line is "  <name> <dtype> [<shape>]: digest <16 hex digits>" (verify/fusepack_gradcheck.cpp, print_digest);
a name may hold spaces ("o (no grad)"). Tensors that both logs name are compared; a tensor only one log names (a
base tree older than a new output) is listed as not compared, and is no failure by itself. Nothing compared at all
is a failure: a check that compared nothing must not pass.

usage: same_bits.py BASE_LOG THIS_LOG [--case TEXT]
Prints one line: "same bits: CASE: N tensors" or "DIFFERENT bits: CASE: a, b differ", then any not compared.
Exit status 0 when every common tensor has the same digest, 1 when one differs or nothing could be compared, 2 for
bad usage or an unreadable log."""
import argparse
import re
import sys

LINE = re.compile(r"^  (?P<name>\S.*?) (?P<dtype>\S+) \[(?P<shape>[^\]]*)\]: digest (?P<digest>[0-9a-f]{16})$")


def parse_digests(text):
    """{name: (dtype, shape, digest)} of one run's output, in the order printed; other lines are skipped."""
    digests = {}
    for line in text.splitlines():
        m = LINE.match(line.rstrip())
        if m:
            digests[m["name"]] = (m["dtype"], m["shape"], m["digest"])
    return digests


def compare(base, this):
    """(compared names, names whose dtype, shape or digest differ, names only in base, names only in this)."""
    common = [name for name in this if name in base]
    differ = [name for name in common if base[name] != this[name]]
    return common, differ, [n for n in base if n not in this], [n for n in this if n not in base]


def report(case, base, this):
    """(exit status, lines) for the digests of one case."""
    common, differ, only_base, only_this = compare(base, this)
    lines = []
    if not common:
        lines.append(f"DIFFERENT bits: {case}: no tensor to compare (base printed {len(base)} digests, this tree "
                     f"{len(this)}; run with --fused-only --digest?)")
    elif differ:
        lines.append(f"DIFFERENT bits: {case}: {', '.join(differ)} differ (of {len(common)} tensors)")
    else:
        lines.append(f"same bits: {case}: {len(common)} tensors")
    for side, names in (("base", only_base), ("this tree", only_this)):
        if names:
            lines.append(f"  not compared, only {side} printed: {', '.join(names)}")
    return (0 if common and not differ else 1), lines


def main(argv=None):
    ap = argparse.ArgumentParser(description="Compare two fusepack-gradcheck --digest outputs.")
    ap.add_argument("base_log")
    ap.add_argument("this_log")
    ap.add_argument("--case", default="the case")
    args = ap.parse_args(argv)
    texts = []
    for path in (args.base_log, args.this_log):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
        except OSError as e:
            print(f"same_bits: cannot read {path}: {e.strerror}", file=sys.stderr)
            return 2
    status, lines = report(args.case, parse_digests(texts[0]), parse_digests(texts[1]))
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
