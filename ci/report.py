#!/usr/bin/env python3
"""Writes the gate's report folder: report.md with the test results per CTest label, what was skipped and why, the
failing tests, the error-budget use of every checked tensor, and each golden training run against its golden (loss and
grad norm curves inside the allowance band, the share of the allowance used per step) with its throughput; plots as
PNG next to it (matplotlib; without it the report is written without plots).

usage: report.py --out DIR --junit JUNIT_XML [--build-dir DIR] [--commit SHA]
                 [--run NAME METRICS_JSONL [GOLDEN_JSON [BASELINE_JSON]]]...
A run given without a golden appears in the throughput table only. Exit status 0 when the report was written (whatever
the tests' verdict), 1 when it could not be."""
import argparse
import datetime
import json
import math
import os
import re
import sys
import traceback
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import summarize  # noqa: E402  (the console summary's label mapping, check-line pattern and suite names)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_CHECKS = 40
DPI = 90

# The fixed tolerances of trainer/train/run.cpp golden_tolerance() (run dtype, golden dtype): per field
# (atol, rtol, drift_per_step); allowed = atol + rtol·|golden| + drift_per_step·step (golden/compare.h).
FIXED_TOLERANCES = {
    ("float64", "float64"): {"loss": (0.0, 1e-12, 1e-13), "grad_norm": (0.0, 1e-12, 1e-13)},
    ("float32", "float64"): {"loss": (0.0, 1e-5, 1e-6), "grad_norm": (0.0, 2e-5, 1e-6)},
}
# One rounding step of a dtype (its unit roundoff), the floor of the low-precision rule (golden/FORMAT.md).
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}
FIELDS = ("loss", "grad_norm")
STEP_FIELDS = ("step", "loss", "grad_norm", "lr", "targets", "tokens", "seconds")
EVAL_FIELDS = ("step", "loss", "targets", "tokens")


# ---------------------------------------------------------------------------------------------- pure functions

def read_metrics(path):
    """A --metrics JSONL file as {"run": first run line, "steps": [step lines], "evals": [eval records], "summary":
    last summary or None, "resumed": number of resumed segments}. Raises ValueError naming the file and line for
    anything else."""
    out = {"run": None, "steps": [], "evals": [], "summary": None, "resumed": 0}
    with open(path, encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                j = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
            if not isinstance(j, dict):
                raise ValueError(f"{path}:{n}: not a JSON object")
            if "run" in j:
                if out["run"] is None:
                    out["run"] = j["run"]
                else:
                    out["resumed"] += 1
            elif "summary" in j:
                out["summary"] = j["summary"]
            elif "eval" in j:
                e = j["eval"]
                missing = [k for k in EVAL_FIELDS if not isinstance(e, dict) or k not in e]
                if missing:
                    raise ValueError(f"{path}:{n}: an eval line without {', '.join(missing)}")
                out["evals"].append(e)
            elif "step" in j:
                missing = [k for k in STEP_FIELDS if k not in j]
                if missing:
                    raise ValueError(f"{path}:{n}: a step line without {', '.join(missing)}")
                out["steps"].append(j)
            else:
                raise ValueError(f"{path}:{n}: neither a run, a step, an eval nor a summary line")
    if out["run"] is None:
        raise ValueError(f"{path}: no run line")
    return out


def read_golden(path):
    """A golden file (golden/FORMAT.md) as {"dtype": ..., "steps": [...]}; raises ValueError when it is not one."""
    with open(path, encoding="utf-8") as f:
        try:
            j = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e.msg})") from None
    if not isinstance(j, dict) or j.get("format") != "fusepack-golden" or not j.get("steps"):
        raise ValueError(f"{path}: not a fusepack golden file")
    return {"dtype": j["provenance"]["dtype"], "steps": j["steps"]}


def fixed_allowed(tolerance, golden_value, step):
    atol, rtol, drift = tolerance
    return atol + rtol * abs(golden_value) + drift * step


def baseline_allowed(golden_value, baseline_value, floor_rel):
    """The low-precision rule: 2·|baseline − golden| + floor_rel·|golden|."""
    return 2 * abs(baseline_value - golden_value) + floor_rel * abs(golden_value)


def allowances(golden, run_dtype, baseline=None):
    """Per field, the allowed |run − golden| at every golden step, and a label for the band; None per field when no
    tolerance is known for this pair of dtypes (fusepack-train refuses such a check without a baseline)."""
    g = golden["steps"]
    if baseline is not None:
        floor = UNIT_ROUNDOFF.get(run_dtype)
        if floor is None:
            return {f: None for f in FIELDS}, f"no rounding step known for {run_dtype}"
        b = baseline["steps"]
        if len(b) < len(g):
            raise ValueError(f"the baseline has {len(b)} steps, the golden {len(g)}")
        exp = round(math.log2(floor))
        label = f"2·|baseline − golden| + 2^{exp}·|golden| ({run_dtype} baseline rule)"
        return {f: [baseline_allowed(gs[f], bs[f], floor) for gs, bs in zip(g, b)] for f in FIELDS}, label
    tol = FIXED_TOLERANCES.get((run_dtype, golden["dtype"]))
    if tol is None:
        return {f: None for f in FIELDS}, f"no fixed tolerance for {run_dtype} against {golden['dtype']}"
    parts = [f"{f} {tol[f][1]:g}·|golden| + {tol[f][2]:g}·step" for f in FIELDS]
    label = f"{run_dtype} tolerance: " + ", ".join(parts)
    return {f: [fixed_allowed(tol[f], gs[f], gs["step"]) for gs in g] for f in FIELDS}, label


def compare_run(metrics, golden, allowed):
    """Step k of the run against step k of the golden: per field the |diff| and the share of the allowance used
    (0 when equal, inf when over a zero allowance), the steps whose numbers or target counts differ, and how many
    steps each has."""
    g, r = golden["steps"], metrics["steps"]
    out = {"steps": min(len(g), len(r)), "golden_steps": len(g), "run_steps": len(r), "mismatched": [],
           "diff": {f: [] for f in FIELDS}, "share": {f: [] for f in FIELDS}}
    for k in range(out["steps"]):
        if g[k]["step"] != r[k]["step"] or g[k]["tokens"] != r[k]["targets"]:
            out["mismatched"].append(g[k]["step"])
        for f in FIELDS:
            d = abs(r[k][f] - g[k][f])
            out["diff"][f].append(d)
            if allowed[f] is None:
                out["share"][f].append(None)
            else:
                a = allowed[f][k]
                out["share"][f].append(d / a if a > 0 else (0.0 if d == 0 else math.inf))
    return out


def verdict(comparison):
    """PASS when every compared step is within the allowance with equal step numbers and target counts and the run
    has every golden step; UNKNOWN without an allowance."""
    shares = [s for f in FIELDS for s in comparison["share"][f]]
    if any(s is None for s in shares):
        return "UNKNOWN"
    ok = (not comparison["mismatched"] and comparison["run_steps"] == comparison["golden_steps"]
          and all(s <= 1 for s in shares))
    return "PASS" if ok else "FAIL"


def throughput(metrics):
    """tokens/s, padding share, steps, tokens and train seconds of a run: its summary line, else its steps."""
    steps, s = metrics["steps"], metrics["summary"]
    gib = [x["device_gib"] for x in steps if "device_gib" in x]
    out = {"device_gib": max(gib) if gib else None}
    if s:
        out.update(steps=s["steps"], tokens=s["tokens"], tokens_per_second=s["tokens_per_second"],
                   padding=s["padding"], seconds=s["train_seconds"])
        return out
    tokens = sum(x["tokens"] for x in steps)
    slots = sum(x.get("slots", x["tokens"]) for x in steps)
    seconds = sum(x["seconds"] for x in steps)
    out.update(steps=len(steps), tokens=tokens, tokens_per_second=tokens / seconds if seconds > 0 else 0.0,
               padding=1 - tokens / slots if slots else 0.0, seconds=seconds)
    return out


SKIP_START = re.compile(r"^\S+:\d+: Skipped$")
FAIL_START = re.compile(r"^\S+:\d+: Failure$")


def skip_reasons(system_out):
    """The messages of GoogleTest's GTEST_SKIP in a test's output."""
    reasons, lines = [], system_out.splitlines()
    for i, line in enumerate(lines):
        if SKIP_START.match(line):
            msg = []
            for nxt in lines[i + 1:]:
                if nxt.startswith("[  SKIPPED ]") or SKIP_START.match(nxt):
                    break
                msg.append(nxt.strip())
            reasons.append(" ".join(m for m in msg if m) or "(no reason given)")
    return reasons


def failure_excerpt(system_out, max_lines=12):
    """GoogleTest's failure messages and failing check lines of a test's output; else its last lines (a crash, a
    timeout)."""
    lines, picked, take = system_out.splitlines(), [], False
    for line in lines:
        if FAIL_START.match(line):
            take = True
        elif line.startswith(("[  check   ]", "[  FAILED  ]", "[       OK ]", "[----", "[ RUN")):
            take = False
        if take or (line.startswith("[  check   ]") and "| FAIL " in line):
            picked.append(line)
    picked = picked or [x for x in lines if x.strip()][-max_lines:]
    return "\n".join(x.replace(ROOT + "/", "") for x in picked[:max_lines])


def junit_labels(case):
    for prop in case.iter("property"):
        if prop.get("name") == "cmake_labels":
            return [x.strip() for x in re.split(r"[;,]", prop.get("value", "")) if x.strip()]
    return []


def collect_tests(root, labels):
    """Per label counts, the failing tests with their excerpts, skip reasons with their tests, the worst budget share
    per (suite, checked tensor), and the test level the output names."""
    per_label, failed, skipped, worst, level = {}, [], {}, {}, None
    for case in root.iter("testcase"):
        name, out = case.get("name"), case.findtext("system-out") or ""
        state = summarize.case_state(case)
        case_labels = labels.get(name) or junit_labels(case) or ["(no label)"]
        for label in case_labels:
            per_label.setdefault(label, {"passed": 0, "failed": 0, "skipped": 0})[state] += 1
        if state == "failed":
            failed.append((name, case_labels, failure_excerpt(out)))
        elif state == "skipped":
            element = case.find("skipped")
            fallback = element.get("message") if element is not None else None
            for reason in skip_reasons(out) or [fallback or f"not run ({case.get('status')})"]:
                skipped.setdefault(reason, []).append(name)
        if level is None:
            m = re.search(r"FUSEPACK_TEST_LEVEL=(\w+)", out)
            level = m.group(1) if m else None
        summarize.add_checks(worst, out)
    return {"per_label": per_label, "failed": failed, "skipped": skipped, "worst": worst, "level": level}


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "run"


def fmt_pct(share):
    """A share of an allowance (1 = all of it) as a percentage."""
    if share is None:
        return "n/a"
    if math.isinf(share):
        return "inf"
    return f"{100 * share:.3g}%"


def shown_path(path):
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else os.path.basename(path)


# ---------------------------------------------------------------------------------------------------- plots

def plot_golden_run(plt, path, name, metrics, golden, allowed, band_label, comparison, baseline=None):
    n = comparison["steps"]
    steps = [golden["steps"][k]["step"] for k in range(n)]
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.4), sharex=True)
    for col, field in enumerate(FIELDS):
        ax = axes[0][col]
        g = [golden["steps"][k][field] for k in range(n)]
        r = [metrics["steps"][k][field] for k in range(n)]
        title = field.replace("_", " ")
        if allowed[field] is not None:
            a = allowed[field][:n]
            span = (max(g) - min(g)) or abs(g[0]) or 1.0
            hidden = ", too narrow to see" if max(a) < 1e-3 * span else ""
            ax.fill_between(steps, [x - y for x, y in zip(g, a)], [x + y for x, y in zip(g, a)], color="tab:green",
                            alpha=0.3, label="golden ± allowed")
            title += f" (allowed up to ±{max(a):.2g}{hidden})"
        ax.plot(steps, g, color="black", lw=1.2, label="golden")
        if baseline is not None:
            ax.plot(steps, [baseline["steps"][k][field] for k in range(n)], "--", color="tab:gray", lw=1,
                    label="baseline")
        ax.plot(steps, r, "o", ms=4, color="tab:blue", mfc="none", label="run")
        evals = [e for e in metrics.get("evals", []) if e["step"] <= steps[-1]] if field == "loss" and steps else []
        if evals:
            ax.plot([e["step"] for e in evals], [e["loss"] for e in evals], "s", ms=4, color="tab:orange",
                    label="eval loss")
        ax.set_title(title, fontsize=9)
        ax = axes[1][col]
        shares = comparison["share"][field]
        if all(s is None for s in shares):
            ax.text(0.5, 0.5, "no allowance known", ha="center", va="center", transform=ax.transAxes)
            continue
        pct = [100 * s for s in shares]
        positive = [p for p in pct if 0 < p < math.inf]
        floor = min(positive) / 10 if positive else 1e-4
        ax.axhline(100, color="tab:red", ls="--", lw=1, label="100% (limit)")
        top = max(positive + [100]) * 5
        ax.plot(steps, [p if 0 < p < math.inf else math.nan for p in pct], "o", ms=5, color="tab:blue",
                label="|run − golden|")
        exact = [s for s, p in zip(steps, pct) if p == 0]
        if exact:
            ax.plot(exact, [floor] * len(exact), "x", color="tab:gray", label="equal (0)")
        over = [s for s, p in zip(steps, pct) if p == math.inf]
        if over:
            ax.plot(over, [top / 2] * len(over), "^", color="tab:red", label="over a zero allowance")
        ax.set_yscale("log")
        ax.set_ylim(floor / 3 if exact else floor * 3, top)
        ax.set_ylabel("|run − golden|, % of allowed")
        ax.set_xlabel("step")
        ax.legend(fontsize=8, loc="best")
    fig.suptitle(f"{name}: {verdict(comparison)}\nallowed: {band_label}", fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.935), ncol=4, fontsize=8, frameon=False)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


KIND_COLORS = {"fused": "tab:orange", "composite": "tab:blue", "reference": "tab:green", "other": "tab:gray"}


def suite_kind(suite):
    """fused, composite, reference or other, from a test suite's name (GatedDeltaFused, RopeComposite, Conv1dRef)."""
    for suffix, kind in (("Fused", "fused"), ("Composite", "composite"), ("Ref", "reference")):
        if suite.endswith(suffix):
            return kind
    return "other"


def plot_budget(plt, path, worst):
    items = sorted(worst.items(), key=lambda kv: -kv[1][0])[:TOP_CHECKS]
    labels = [f"{suite}: {tensor}" for (suite, tensor), _ in items]
    pct = [max(v[0], 1e-6) for _, v in items]
    colors = ["tab:red" if v[1] == "FAIL" else KIND_COLORS[suite_kind(suite)] for (suite, _), v in items]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.22 * len(items)))
    y = list(range(len(items)))
    ax.barh(y, pct, color=colors)
    ax.axvline(100, color="tab:red", ls="--", lw=1)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    if max(pct) / min(pct) > 100:
        ax.set_xscale("log")
        ax.set_xlim(min(pct) / 2, max(max(pct), 100) * 2)
    else:
        ax.set_xlim(0, max(max(pct), 100) * 1.1)
    scale = ", log scale" if max(pct) / min(pct) > 100 else ""
    ax.set_xlabel(f"worst share of the error budget used (%{scale}; dashed: 100%)")
    kinds = sorted({suite_kind(suite) for (suite, _), _ in items})
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLORS[k]) for k in kinds]
    if any(v[1] == "FAIL" for _, v in items):
        kinds, handles = kinds + ["FAIL"], handles + [plt.Rectangle((0, 0), 1, 1, color="tab:red")]
    ax.legend(handles, kinds, fontsize=7, loc="lower right")
    shown = f"the {len(items)} worst of {len(worst)}" if len(worst) > len(items) else f"all {len(items)}"
    ax.set_title(f"error budget per checked tensor ({shown})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_throughput(plt, path, rows):
    names = [name for name, _ in rows]
    fig, axes = plt.subplots(1, 2, figsize=(9, 1.0 + 0.45 * len(rows)), sharey=True)
    y = list(range(len(rows)))
    tps = [t["tokens_per_second"] for _, t in rows]
    pad = [100 * t["padding"] for _, t in rows]
    axes[0].barh(y, tps, color="tab:blue")
    axes[0].set_xlim(0, max(tps + [1]) * 1.25)
    axes[0].set_xlabel("tokens/s")
    axes[1].barh(y, pad, color="tab:orange")
    axes[1].set_xlim(0, max(pad + [1]) * 1.25)
    axes[1].set_xlabel("padding share (%)")
    for i in y:
        axes[0].text(tps[i], i, f" {tps[i]:,.0f}", va="center", fontsize=8)
        axes[1].text(pad[i], i, f" {pad[i]:.1f}%", va="center", fontsize=8)
    axes[0].set_yticks(y)
    axes[0].set_yticklabels(names, fontsize=8)
    axes[0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------- report

def load_runs(specs, problems):
    runs = []
    for spec in specs:
        name, paths = spec[0], spec[1:]
        try:
            metrics = read_metrics(paths[0])
            run = {"name": name, "metrics": metrics, "golden_path": paths[1] if len(paths) > 1 else None}
            if run["golden_path"]:
                golden = read_golden(paths[1])
                baseline = read_golden(paths[2]) if len(paths) > 2 else None
                allowed, label = allowances(golden, metrics["run"].get("dtype", "?"), baseline)
                run.update(golden=golden, baseline=baseline, allowed=allowed, band=label,
                           comparison=compare_run(metrics, golden, allowed))
            runs.append(run)
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"run {name}: {e}")
    return runs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the report folder (created; report.md and PNGs are replaced)")
    p.add_argument("--junit", help="CTest's JUnit XML")
    p.add_argument("--build-dir", help="the build folder, for the tests' CTest labels")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--run", nargs="+", action="append", default=[], metavar="ARG",
                   help="NAME METRICS_JSONL [GOLDEN_JSON [BASELINE_JSON]]")
    p.add_argument("--note", help="a line put under the title")
    args = p.parse_args(argv)
    for spec in args.run:
        if not 2 <= len(spec) <= 4:
            p.error(f"--run takes NAME METRICS_JSONL [GOLDEN_JSON [BASELINE_JSON]], got {' '.join(spec)}")

    problems, console = [], []
    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.out):
        if f.endswith(".png"):
            os.remove(os.path.join(args.out, f))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
        print("[report] matplotlib missing: plots skipped (bash ci/setup.sh installs it in its venv)")

    tests = None
    if args.junit:
        try:
            root = ET.parse(args.junit).getroot()
            labels = {}
            if args.build_dir:
                try:
                    labels = summarize.tests_by_label(args.build_dir)
                except OSError as e:
                    problems.append(f"no CTest labels from {args.build_dir}: {e}")
            tests = collect_tests(root, labels)
            tests["root"] = root
        except (OSError, ET.ParseError) as e:
            problems.append(f"no JUnit report ({e})")
    runs = load_runs(args.run, problems)

    md = ["# fusepack gate report", ""]
    if args.note:
        md += [f"> {args.note}", ""]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md += [f"- commit: `{args.commit}`", f"- written: {now}"]
    if tests:
        r = tests["root"]
        md.append(f"- tests: {shown_path(args.junit)} (CTest run of {r.get('timestamp', '?')}, {r.get('time', '?')} s; "
                  f"FUSEPACK_TEST_LEVEL={tests['level'] or '?'})")
    plots = 0

    # Tests per label, failures, skips.
    if tests:
        per_label, failed, skipped = tests["per_label"], tests["failed"], tests["skipped"]
        n_cases = len(list(tests["root"].iter("testcase")))
        n_skipped = sum(1 for c in tests["root"].iter("testcase") if summarize.case_state(c) == "skipped")
        n_passed = n_cases - len(failed) - n_skipped
        md += ["", "## Tests", "",
               f"**{'FAILED' if failed else 'PASSED'}**: {n_passed} passed, {len(failed)} failed, {n_skipped} skipped "
               f"(a test with several labels counts once here, in each of its labels below).", "",
               "| label | passed | failed | skipped |", "|---|---:|---:|---:|"]
        for label in summarize.LABELS + sorted(set(per_label) - set(summarize.LABELS)):
            if label in per_label:
                c = per_label[label]
                md.append(f"| {label} | {c['passed']} | {c['failed']} | {c['skipped']} |")
        console.append(f"tests: {n_passed} passed, {len(failed)} failed, {n_skipped} skipped in "
                       f"{plural(len(per_label), 'label')}")
        if failed:
            md += ["", "### Failing tests", ""]
            for name, labels, excerpt in failed:
                md += [f"- `{name}` ({', '.join(labels)})", "", "  ```", *("  " + x for x in excerpt.splitlines()),
                       "  ```"]
        md += ["", "### Skipped, and why", ""]
        if skipped:
            md += ["| reason | tests | for example |", "|---|---:|---|"]
            for reason, names in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
                examples = ", ".join(f"`{x}`" for x in names[:2]) + (", …" if len(names) > 2 else "")
                md.append(f"| {reason.replace('|', '/')} | {len(names)} | {examples} |")
            top = max(skipped.items(), key=lambda kv: len(kv[1]))
            console.append(f"skipped: {n_skipped} tests for {plural(len(skipped), 'reason')}, most ({len(top[1])}): "
                           f"{top[0]}")
        else:
            md.append("Nothing was skipped.")
            console.append("skipped: none")

        # Error budgets.
        worst = tests["worst"]
        md += ["", "## Error budget per checked tensor", ""]
        if worst:
            if plt:
                plot_budget(plt, os.path.join(args.out, "error-budget.png"), worst)
                plots += 1
                md += ["![error budget](error-budget.png)", ""]
            md += ["The worst share of its tolerance that each checked tensor used over every `[  check   ]` line of "
                   "the tests (100% = at the limit); per suite:", "",
                   "| suite | tensors | worst tensor | max_abs | max_rel | budget used | case |",
                   "|---|---:|---|---:|---:|---:|---|"]
            suites = {}
            for (suite, tensor), v in worst.items():
                suites.setdefault(suite, []).append((v, tensor))
            for suite, items in sorted(suites.items(), key=lambda kv: -max(v[0][0] for v in kv[1])):
                (share, _, max_abs, max_rel, case), tensor = max(items, key=lambda x: x[0][0])
                mark = " **FAIL**" if any(v[1] == "FAIL" for v, _ in items) else ""
                md.append(f"| {suite} | {len(items)} | {tensor} | {max_abs:.3g} | {max_rel:.3g} | "
                          f"{share:.3g}%{mark} | {case} |")
            (suite, tensor), v = max(worst.items(), key=lambda kv: kv[1][0])
            console.append(f"error budget: {len(worst)} tensors in {len(suites)} suites, worst {v[0]:.3g}% "
                           f"({suite} {tensor}, {v[4]})")
        else:
            md.append("No `[  check   ]` lines in the test output.")
            console.append("error budget: no check lines")

    # Golden runs.
    golden_runs = [r for r in runs if r.get("golden")]
    if golden_runs:
        md += ["", "## Golden training runs", "",
               "Each run compared step by step with its golden: target counts exact, loss and grad norm within the "
               "allowance (fusepack-train's own check decides the gate; this recomputes it for the plots).", "",
               "| run | dtype | steps | loss: max of allowed | grad norm: max of allowed | verdict |",
               "|---|---|---:|---:|---:|---|"]
        verdicts = []
        for r in golden_runs:
            c = r["comparison"]
            v = verdict(c)
            verdicts.append(v)
            shares = {f: max(c["share"][f], key=lambda s: -1 if s is None else s, default=None) for f in FIELDS}
            note = f" (steps {c['mismatched']} differ in step number or targets)" if c["mismatched"] else ""
            md.append(f"| {r['name']} | {r['metrics']['run'].get('dtype', '?')} | {c['run_steps']}/{c['golden_steps']} "
                      f"| {fmt_pct(shares['loss'])} | {fmt_pct(shares['grad_norm'])} | {v}{note} |")
        for r in golden_runs:
            c = r["comparison"]
            md += ["", f"### {r['name']}", "",
                   f"Golden `{shown_path(r['golden_path'])}` ({r['golden']['dtype']}); allowed: {r['band']}."]
            if c["run_steps"] != c["golden_steps"]:
                md += ["", f"The run has {c['run_steps']} steps, the golden {c['golden_steps']}."]
            if plt and c["steps"]:
                png = f"golden-{slug(r['name'])}.png"
                plot_golden_run(plt, os.path.join(args.out, png), r["name"], r["metrics"], r["golden"], r["allowed"],
                                r["band"], r["comparison"], r["baseline"])
                plots += 1
                md += ["", f"![{r['name']}]({png})"]
        worst_share = max((s for r in golden_runs for f in FIELDS for s in r["comparison"]["share"][f]
                           if s is not None), default=None)
        state = ("all within the allowance" if all(v == "PASS" for v in verdicts)
                 else f"{sum(v != 'PASS' for v in verdicts)} not within it")
        console.append(f"golden runs: {len(golden_runs)}, {state} (worst {fmt_pct(worst_share)} of it)")

    # Throughput.
    if runs:
        rows = [(r["name"], throughput(r["metrics"])) for r in runs]
        md += ["", "## Throughput and padding", ""]
        if plt:
            plot_throughput(plt, os.path.join(args.out, "throughput.png"), rows)
            plots += 1
            md += ["![throughput](throughput.png)", ""]
        md += ["| run | device | steps | tokens | tokens/s | padding | train s | peak GPU GiB |",
               "|---|---|---:|---:|---:|---:|---:|---:|"]
        for (name, t), r in zip(rows, runs):
            run = r["metrics"]["run"]
            device = f"{run.get('device', '?')} ×{run.get('world_size', 1)}"
            gib = f"{t['device_gib']:.2f}" if t["device_gib"] is not None else "–"
            md.append(f"| {name} | {device} | {t['steps']} | {t['tokens']:,} | {t['tokens_per_second']:,.0f} | "
                      f"{100 * t['padding']:.1f}% | {t['seconds']:.2f} | {gib} |")
        console.append("throughput: " + "; ".join(f"{n} {t['tokens_per_second']:,.0f} tok/s, padding "
                                                  f"{100 * t['padding']:.1f}%" for n, t in rows))

    if problems:
        md += ["", "## Not in this report", ""] + [f"- {x}" for x in problems]
    if not plt:
        md += ["", "Plots skipped: matplotlib is missing (`bash ci/setup.sh` installs it in its venv)."]
    report = os.path.join(args.out, "report.md")
    with open(report, "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    for line in console:
        print(f"[report] {line}")
    for x in problems:
        print(f"[report] not in the report: {x}")
    print(f"[report] written: {report} ({plural(plots, 'plot')})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except Exception as e:  # the report names its own failure in one line and never hides the gate's output
        frame = traceback.extract_tb(e.__traceback__)[-1]
        print(f"[report] FAILED: {type(e).__name__}: {e} (ci/{os.path.basename(frame.filename)}:{frame.lineno})")
        sys.exit(1)
