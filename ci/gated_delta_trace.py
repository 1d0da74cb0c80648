#!/usr/bin/env python3
"""Summarizes the gated delta forward's block timeline: where its time goes when the lean chain and the output kernel
share the multiprocessors, which neither kernel's own time says (kernels/gated_delta/NOTES.md, where the chain's
blocks sit).

usage: gated_delta_trace.py CSV
  CSV  what fusepack-bench writes with FUSEPACK_BENCH_GATED_DELTA_TRACE=CSV, from a build configured with
       -DFUSEPACK_GATED_DELTA_TRACE=ON (kernels/gated_delta/gated_delta_trace.h): one row per event, columns
       shape, pass, event, ns, sm, block, step.

For every shape and pass (fwd: nothing saved; fwd save: the training forward), in µs from the pass's first event:
  wy        the WY kernel's blocks: first start, last end
  chain     the lean chain's blocks: first start, last end; its chunk steps (from one step's start to the next, the
            last to the block's end, per block) as median and 90th percentile
  output    the output kernel's blocks: first start, last end; the wait of each for its chunk (start to ready: its
            loads and P as well), the part of it spent polling (built to ready: from its first warp's share of P
            built; "-" in traces without that event) and its work once the chunk is ready (ready to end), each as
            median and 90th percentile; how many ran on a multiprocessor while a chain block was on it
  tail      the output's last end after the chain's last end
Exit status 0 on success, 2 on a file that is not such a trace."""
import argparse
import collections
import csv
import sys

EVENTS = ("wy_start", "wy_end", "chain_start", "chain_step", "chain_end", "output_start", "output_ready", "output_end",
          "output_built")
COLUMNS = ("shape", "pass", "event", "ns", "sm", "block", "step")


class TraceError(Exception):
    """A file that is not a trace, with where and why."""


def read_trace(path):
    """The rows as dicts, by (shape, pass) in file order. TraceError on a missing column, an unknown event or a
    field that is not a whole number."""
    groups = collections.OrderedDict()
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: no column {', '.join(missing)} (expected {', '.join(COLUMNS)}; "
                             f"got {', '.join(reader.fieldnames or ['nothing'])})")
        for line, row in enumerate(reader, start=2):
            if row["event"] not in EVENTS:
                raise TraceError(f"{path}:{line}: unknown event '{row['event']}' (expected one of {', '.join(EVENTS)})")
            try:
                event = {c: int(row[c]) for c in ("ns", "sm", "block", "step")}
            except (TypeError, ValueError):
                raise TraceError(f"{path}:{line}: ns, sm, block and step must be whole numbers; got "
                                 f"{row['ns']}, {row['sm']}, {row['block']}, {row['step']}") from None
            event["event"] = row["event"]
            groups.setdefault((row["shape"], row["pass"]), []).append(event)
    if not groups:
        raise TraceError(f"{path}: no events")
    return groups


def percentile(values, q):
    """The q-quantile (0..1) of values by the nearest rank; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]


def blocks_of(events, kind):
    """{block: {event: [events]}} of one kernel ('wy', 'chain', 'output')."""
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for e in events:
        if e["event"].startswith(kind + "_"):
            out[e["block"]][e["event"][len(kind) + 1:]].append(e)
    return out


def span(blocks, first="start", last="end"):
    starts = [e["ns"] for b in blocks.values() for e in b.get(first, [])]
    ends = [e["ns"] for b in blocks.values() for e in b.get(last, [])]
    return (min(starts) if starts else None, max(ends) if ends else None)


def summarize(events):
    """The figures of one shape and pass, in ns (None where its events are absent)."""
    wy, chain, output = blocks_of(events, "wy"), blocks_of(events, "chain"), blocks_of(events, "output")
    steps = []
    chain_on_sm = collections.defaultdict(list)  # sm -> [(start, end)] of the chain blocks there
    for b in chain.values():
        times = sorted(e["ns"] for e in b.get("step", []))
        if b.get("end"):
            times.append(b["end"][0]["ns"])
        steps += [t1 - t0 for t0, t1 in zip(times, times[1:])]
        if b.get("start") and b.get("end"):
            chain_on_sm[b["start"][0]["sm"]].append((b["start"][0]["ns"], b["end"][0]["ns"]))
    waits, idles, works, beside = [], [], [], 0
    for b in output.values():
        if b.get("start") and b.get("ready"):
            waits.append(b["ready"][0]["ns"] - b["start"][0]["ns"])
        if b.get("built") and b.get("ready"):
            idles.append(b["ready"][0]["ns"] - b["built"][0]["ns"])
        if b.get("ready") and b.get("end"):
            works.append(b["end"][0]["ns"] - b["ready"][0]["ns"])
        if b.get("start") and b.get("end"):
            s, e = b["start"][0]["ns"], b["end"][0]["ns"]
            sm = b["start"][0]["sm"]
            if any(cs < e and s < ce for cs, ce in chain_on_sm.get(sm, [])):
                beside += 1
    chain_span, output_span = span(chain), span(output)
    tail = None
    if chain_span[1] is not None and output_span[1] is not None:
        tail = output_span[1] - chain_span[1]
    return {
        "wy": span(wy), "wy_blocks": len(wy),
        "chain": chain_span, "chain_blocks": len(chain),
        "chain_sms": len(chain_on_sm),
        "step_median": percentile(steps, 0.5), "step_p90": percentile(steps, 0.9), "steps": len(steps),
        "output": output_span, "output_blocks": len(output),
        "wait_median": percentile(waits, 0.5), "wait_p90": percentile(waits, 0.9),
        "idle_median": percentile(idles, 0.5), "idle_p90": percentile(idles, 0.9),
        "work_median": percentile(works, 0.5), "work_p90": percentile(works, 0.9),
        "output_beside_chain": beside,
        "tail": tail,
        "end": max(e["ns"] for e in events),
    }


def us(ns):
    return "-" if ns is None else f"{ns / 1000:.1f}"


def report(groups, out):
    print("| shape | pass | wy µs | chain µs (blocks on SMs) | chain step µs median (p90) | output µs (blocks, "
          "beside a chain block) | output wait µs median (p90) | of it polling µs median (p90) "
          "| output work µs median (p90) | tail µs | end µs |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|---|", file=out)
    for (shape, pass_), events in groups.items():
        s = summarize(events)
        print(f"| {shape} | {pass_} | {us(s['wy'][0])}–{us(s['wy'][1])} "
              f"| {us(s['chain'][0])}–{us(s['chain'][1])} ({s['chain_blocks']} on {s['chain_sms']}) "
              f"| {us(s['step_median'])} ({us(s['step_p90'])}) "
              f"| {us(s['output'][0])}–{us(s['output'][1])} ({s['output_blocks']}, {s['output_beside_chain']}) "
              f"| {us(s['wait_median'])} ({us(s['wait_p90'])}) | {us(s['idle_median'])} ({us(s['idle_p90'])}) "
              f"| {us(s['work_median'])} ({us(s['work_p90'])}) "
              f"| {us(s['tail'])} | {us(s['end'])} |", file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv")
    args = parser.parse_args(argv)
    try:
        groups = read_trace(args.csv)
    except (OSError, TraceError) as e:
        print(f"gated_delta_trace: {e}", file=sys.stderr)
        return 2
    report(groups, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
