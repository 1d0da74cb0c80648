#!/usr/bin/env python3
"""Prints the gate's summary from a CTest JUnit file: results per CTest label, the failing tests, and the worst
error-budget share per test suite and checked tensor (from the "[  check   ]" lines that tests print) with the case
that holds it, then per dtype for the cases named for one (parameterised cases such as .../fp32_lean_chain_...).

usage: summarize.py BUILD_DIR JUNIT_XML
Exit status 0 when no test failed, 1 otherwise."""
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

LABELS = ["reference", "packing", "properties", "kernels", "gpu", "trainer", "golden", "distributed"]
CHECK = re.compile(r"^\[  check   \] (\S+) \| (PASS|FAIL) (.+?): max_abs (\S+) max_rel (\S+) rel_rms \S+ over \d+ values; "
                   r"budget used ([0-9.e+-]+|inf)%")


def tests_by_label(build_dir):
    """{test name: [its labels among LABELS]}, from one `ctest -N --show-only=json-v1` (each ctest call may list the
    test binaries' cases again, which takes minutes on a machine where every binary initialises a GPU)."""
    run = subprocess.run(["ctest", "--test-dir", build_dir, "-N", "--show-only=json-v1"],
                         capture_output=True, text=True)
    try:
        tests = json.loads(run.stdout).get("tests", [])
    except json.JSONDecodeError:
        print(f"summarize: no test labels from `ctest --test-dir {build_dir} -N --show-only=json-v1` (exit "
              f"{run.returncode}: {run.stderr.strip()[:200]}); every test counts as unlabelled", file=sys.stderr)
        tests = []
    labels = {}
    for test in tests:
        for prop in test.get("properties", []):
            if prop.get("name") == "LABELS":
                found = [label for label in LABELS if label in prop.get("value", [])]
                if found:
                    labels[test["name"]] = found
    return labels


def suite_of(test_name):
    name = test_name.split("/")[1] if test_name.count("/") >= 1 and "." not in test_name.split("/")[0] else test_name
    return name.split(".")[0]


def case_state(case):
    """passed, failed or skipped: a CTest JUnit testcase's outcome."""
    status = case.get("status")
    if case.find("failure") is not None or status == "fail":
        return "failed"
    if case.find("skipped") is not None or status in ("notrun", "disabled"):
        return "skipped"
    return "passed"


def add_checks(worst, system_out, by_dtype=None):
    """Keeps in `worst` the largest budget share per (suite, checked tensor) of the "[  check   ]" lines in
    `system_out`, as (share, verdict, max_abs, max_rel, the check's case name); and in `by_dtype`, when given, the
    largest share per (suite, checked tensor) and dtype, {(suite, tensor): {dtype: share}}, of the cases named for a
    dtype (dtype_of)."""
    for line in system_out.splitlines():
        m = CHECK.match(line)
        if m:
            key = (suite_of(m.group(1)), m.group(3).split(" ")[0])
            share = float(m.group(6))
            if key not in worst or share > worst[key][0]:
                worst[key] = (share, m.group(2), float(m.group(4)), float(m.group(5)), m.group(1))
            dtype = dtype_of(m.group(1)) if by_dtype is not None else None
            if dtype:
                shares = by_dtype.setdefault(key, {})
                shares[dtype] = max(shares.get(dtype, 0.0), share)


DTYPES = ("bf16", "fp16", "fp32", "fp64")


def dtype_of(check_name):
    """The dtype a parameterised case is named for, from the first word of its parameter name
    ('Sm90/GatedDeltaFused.MatchesReference/fp32_lean_chain_x' -> fp32, 'Sm90/Conv1dFused.Backward/bf16' -> bf16);
    None without one."""
    test = check_name.split(".", 1)[1] if "." in check_name else ""
    if "/" not in test:
        return None
    first = test.rsplit("/", 1)[1].split("_")[0]
    return first if first in DTYPES else None


def by_dtype_table(worst):
    """The worst budget share per suite, tensor and dtype as console lines; none when no case is named for a dtype."""
    if not worst:
        return []
    dtypes = [d for d in DTYPES if any(d in shares for shares in worst.values())]
    lines = ["\nworst budget used by dtype (cases named for one):",
             f"{'suite':<22} {'checked':<22} " + " ".join(f"{d:>8}" for d in dtypes)]
    for (suite, tensor), shares in sorted(worst.items()):
        cells = [f"{shares[d]:.3g}%" if d in shares else "-" for d in dtypes]
        lines.append(f"{suite:<22} {tensor:<22} " + " ".join(f"{c:>8}" for c in cells))
    return lines


def main():
    build_dir, junit = sys.argv[1], sys.argv[2]
    labels = tests_by_label(build_dir)
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"GATE FAILED: no CTest JUnit report to summarize ({e}); see the test log")
        return 1
    per_label = {}
    failed, worst, worst_by_dtype = [], {}, {}
    for case in root.iter("testcase"):
        name, state = case.get("name"), case_state(case)
        for label in labels.get(name, ["(no label)"]):
            per_label.setdefault(label, {"passed": 0, "failed": 0, "skipped": 0})[state] += 1
        if state == "failed":
            failed.append(name)
        add_checks(worst, case.findtext("system-out") or "", worst_by_dtype)

    print("\n== fusepack summary ==")
    print(f"{'label':<12} {'passed':>7} {'failed':>7} {'skipped':>8}")
    for label in LABELS + ["(no label)"]:
        if label in per_label:
            c = per_label[label]
            print(f"{label:<12} {c['passed']:>7} {c['failed']:>7} {c['skipped']:>8}")
    if worst:
        print(f"\n{'suite':<22} {'checked':<22} {'worst max_abs':>13} {'max_rel':>9} {'budget used':>12}       case")
        for (suite, tensor), (share, verdict, max_abs, max_rel, case) in sorted(worst.items()):
            print(f"{suite:<22} {tensor:<22} {max_abs:>13.3g} {max_rel:>9.3g} {share:>11.3g}% {verdict:<4}  {case}")
    for line in by_dtype_table(worst_by_dtype):
        print(line)
    total = {k: sum(c[k] for c in per_label.values()) for k in ("passed", "failed", "skipped")}
    tests = len(list(root.iter("testcase")))
    if failed:
        print("\nfailed tests:\n  " + "\n  ".join(failed))
    print("\ntests in all (a test with several labels counts once):")
    print(f"{tests - len(failed) - int(root.get('skipped', 0))} passed, {len(failed)} failed, "
          f"{root.get('skipped', 0)} skipped")
    print("GATE " + ("FAILED" if failed else "PASSED"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
