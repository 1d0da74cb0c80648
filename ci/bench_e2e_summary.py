#!/usr/bin/env python3
"""The summary table of ci/bench_e2e.sh: per model, fusepack-train against the Hugging Face transformers baseline
(ci/hf_baseline.py), read from the files the script leaves in its out dir:
  fusepack-M.log, fusepack-M.metrics.jsonl, fusepack-M.rc   fusepack-train's log, --metrics file and exit status
  hf-M.log, hf-M.json, hf-M.rc                              the baseline's log, --json file and exit status
  fusepack-M.gpu.csv, hf-M.gpu.csv                          nvidia-smi samples during each run (optional)
(an .rc file holds the exit status; without one a run counts as finished when its numbers are there).

Per model: tokens/s averaged over all steps including the first (Σ tokens / Σ step times) and the steady median (the
median tokens/s of the steps from --warmup on, the profiled step left out) for both, their ratio fusepack ÷ HF, the
GPU-busy share of the profiled step (GPU kernel time / step wall time) and its estimate for the steady steps (the
profiled step's GPU kernel time per token x the steady tokens/s: the profiler's own host work slows the profiled step
much more than its kernels, whose tracing adds a little to their time, so the estimate can pass 100%), the peak GPU
memory allocated, GPU kernels per token in the profiled step, the baseline's padding share, and the GPU's SM clock
under load with the share of loaded samples it was throttled for power or heat (from M's nvidia-smi samples,
fusepack-M.gpu.csv and hf-M.gpu.csv: the same model can run 15-20% slower when the board holds its power cap). Tokens
are real (non-padding) tokens on both sides.

usage: bench_e2e_summary.py OUT_DIR MODEL [MODEL...] [--warmup 2] [--profile-step 3] [--skip-hf]
Prints the table (markdown) on stdout. Exit status 0 when every run finished, 1 when a run failed or is missing (it
shows as FAILED with its log), 2 for bad usage."""
import argparse
import json
import math
import os
import re
import statistics
import sys

# fusepack-train's step log line (trainer/train/report.cpp step_log_line), e.g.
# "step  3/20  loss 10.123456  grad norm 1.2345  lr 1.000e-04  targets 8,100  tokens 8,123  64,237 tok/s  padding 0.0%"
STEP_LINE = re.compile(r"(?:^|\s)step\s+(\d+)/(\d+)\s+loss\s.*?\stokens\s+([\d,]+)\s+([\d,]+) tok/s")
# trainer/train/run.cpp: "peak GPU memory: 8.08 GiB allocated on cuda:0 ..."
PEAK_LINE = re.compile(r"peak GPU memory: ([\d.]+) GiB")
# trainer/train/profile.cpp profile_text
PROFILE_HEAD = re.compile(r"profile of step (\d+)")
PROFILE_KERNELS = re.compile(r"^\s*GPU kernels:\s+([\d,]+) \(\+ ([\d,]+) memcpy/memset\)", re.M)
PROFILE_WALL = re.compile(r"^\s*step wall time: ([\d.]+) ms", re.M)
PROFILE_KERNEL_TIME = re.compile(r"^\s*GPU kernel time: ([\d.]+) ms", re.M)


# Throttle-reason bits of nvidia-smi's clocks_throttle_reasons.active (NVML's nvmlClocksEventReasons): for power,
# the software power cap (0x4) and the hardware power brake (0x80); for heat, hardware slowdown (0x8) and the software
# and hardware thermal slowdowns (0x20, 0x40).
THROTTLE_POWER = 0x4 | 0x80
THROTTLE_HEAT = 0x8 | 0x20 | 0x40


class Missing(Exception):
    """A run that failed or left no numbers; the message says why."""


def number(text):
    return float(text.replace(",", ""))


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def exit_status(path):
    """The exit status recorded in `path`; None when there is no such file (or it holds no number)."""
    text = read_text(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def average(tokens, seconds):
    """Tokens/s over all steps, the first included: Σ tokens / Σ step times."""
    total = sum(seconds)
    return sum(tokens) / total if total > 0 else None


def steady_median(tokens, seconds, warmup, skip_step=None):
    """The median tokens/s of the steps at index `warmup` on, leaving out index `skip_step` (the profiled step)."""
    rates = [t / s for i, (t, s) in enumerate(zip(tokens, seconds)) if i >= warmup and i != skip_step and s > 0]
    return statistics.median(rates) if rates else None


def busy_steady(kernel_seconds, tokens, steady_rate):
    """The GPU-busy share of a steady step, estimated as the profiled step's GPU kernel seconds per token x the steady
    tokens/s; None when a number is missing."""
    if not kernel_seconds or not tokens or not steady_rate:
        return None
    return kernel_seconds / tokens * steady_rate


def metrics_steps(path):
    """(step, tokens, seconds) of each step line of a fusepack-train --metrics file (trainer/train/metrics.h); [] when
    the file is missing. Lines that are not JSON (a run killed mid-line) are skipped."""
    text = read_text(path)
    steps = []
    for line in (text or "").splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if isinstance(j, dict) and "step" in j and "tokens" in j and "seconds" in j:
            steps.append((int(j["step"]), int(j["tokens"]), float(j["seconds"])))
    return steps


def log_steps(log):
    """(step, tokens, seconds) from fusepack-train's step log lines; seconds = tokens / the rounded tok/s."""
    steps = []
    for m in STEP_LINE.finditer(log):
        tokens, rate = number(m.group(3)), number(m.group(4))
        if rate > 0:
            steps.append((int(m.group(1)), int(tokens), tokens / rate))
    return steps


def gpu_clocks(path):
    """The GPU's clock under load from nvidia-smi samples ('clocks.sm, power.draw, clocks_throttle_reasons.active'
    with noheader,nounits: '1650, 698.41, 0x0000000000000004' per line): the median SM clock (MHz) of the loaded
    samples, those drawing at least half the run's highest power (start-up, data loading and the idle GPU between
    steps left out), and the share of them throttled for power or heat. None when the file is missing or holds no
    sample (nvidia-smi failed: its message is not a sample)."""
    samples = []
    for line in (read_text(path) or "").splitlines():
        fields = [f.strip() for f in line.split(",")]
        try:
            samples.append((float(fields[0]), float(fields[1]), int(fields[2], 16)))
        except (ValueError, IndexError):
            continue
    if not samples:
        return None
    top = max(power for _, power, _ in samples)
    loaded = [(clock, reasons) for clock, power, reasons in samples if power >= top / 2]
    throttled = sum(1 for _, reasons in loaded if reasons & (THROTTLE_POWER | THROTTLE_HEAT))
    return {"clock_mhz": statistics.median(clock for clock, _ in loaded), "throttled": throttled / len(loaded),
            "samples": len(loaded)}


def fusepack_run(out_dir, model, warmup, profile_step):
    """fusepack-train's numbers for `model`; raises Missing."""
    log_path = os.path.join(out_dir, f"fusepack-{model}.log")
    rc = exit_status(os.path.join(out_dir, f"fusepack-{model}.rc"))
    if rc not in (None, 0):
        raise Missing(f"exit status {rc}")
    log = read_text(log_path)
    if log is None:
        raise Missing("no log")
    steps = metrics_steps(os.path.join(out_dir, f"fusepack-{model}.metrics.jsonl")) or log_steps(log)
    if not steps:
        raise Missing("no step finished")
    numbers = [s[0] for s in steps]
    tokens = [s[1] for s in steps]
    seconds = [s[2] for s in steps]
    r = {"steps": len(steps), "first_step_seconds": seconds[0], "avg": average(tokens, seconds)}
    head = PROFILE_HEAD.search(log)
    profiled = int(head.group(1)) if head else profile_step
    index = numbers.index(profiled) if profiled in numbers else None
    r["steady"] = steady_median(tokens, seconds, warmup, index)
    peak = PEAK_LINE.search(log)
    r["peak_gib"] = float(peak.group(1)) if peak else None
    r["busy"] = r["busy_steady"] = r["kernels_per_token"] = None
    if head:
        block = log[head.start():]
        kernels, wall, kernel_time = (PROFILE_KERNELS.search(block), PROFILE_WALL.search(block),
                                      PROFILE_KERNEL_TIME.search(block))
        if wall and kernel_time and float(wall.group(1)) > 0:
            r["busy"] = float(kernel_time.group(1)) / float(wall.group(1))
        if kernel_time and index is not None:
            r["busy_steady"] = busy_steady(float(kernel_time.group(1)) / 1000, tokens[index], r["steady"])
        if kernels and index is not None and tokens[index] > 0:
            r["kernels_per_token"] = number(kernels.group(1)) / tokens[index]
    return r


def hf_run(out_dir, model, warmup):
    """The transformers baseline's numbers for `model` (ci/hf_baseline.py --json); raises Missing."""
    rc = exit_status(os.path.join(out_dir, f"hf-{model}.rc"))
    if rc not in (None, 0):
        raise Missing(f"exit status {rc}")
    text = read_text(os.path.join(out_dir, f"hf-{model}.json"))
    if text is None:
        raise Missing("no --json file")
    try:
        j = json.loads(text)
        tokens = [int(t) for t in j["step_tokens"]]
        seconds = [float(s) for s in j["step_seconds"]]
    except (ValueError, KeyError, TypeError) as e:
        raise Missing(f"unreadable --json file ({e})")
    if not tokens or len(tokens) != len(seconds):
        raise Missing("no step finished")
    profile = j.get("profile") or {}
    peak = j.get("peak_memory_bytes")
    steady = steady_median(tokens, seconds, warmup, profile.get("step"))
    return {"steps": len(tokens), "first_step_seconds": seconds[0], "avg": average(tokens, seconds),
            "steady": steady,
            "busy_steady": busy_steady(profile.get("gpu_kernel_seconds"), profile.get("tokens"), steady),
            "peak_gib": peak / 2 ** 30 if isinstance(peak, (int, float)) else None,
            "busy": profile.get("gpu_busy_share"),
            "kernels_per_token": profile.get("kernels_per_token"),
            "padding": j.get("padding")}


def fmt(value, kind):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "?"
    if kind == "rate":
        return f"{value:,.0f}"
    if kind == "ratio":
        return f"{value:.1f}×"
    if kind == "share":
        return f"{100 * value:.1f}%"
    if kind == "gib":
        return f"{value:.2f}"
    if kind == "clock":
        return f"{value['clock_mhz']:,.0f} ({100 * value['throttled']:.0f}%)"
    return f"{value:.3f}"


def pair(a, b, field, kind):
    """The cell 'fusepack / HF' of one field; a side that has no run shows as —."""
    return " / ".join(fmt(r.get(field), kind) if r is not None else "—" for r in (a, b))


def ratio(a, b, field):
    if a is None or b is None or not a.get(field) or not b.get(field):
        return "—"
    return fmt(a[field] / b[field], "ratio")


HEADER = ("| model | fusepack tokens/s (avg incl. first / steady median) "
          "| HF tokens/s (avg incl. first / steady median) | fusepack ÷ HF (avg / steady) "
          "| GPU busy, profiled step (fusepack / HF) | GPU busy, steady estimate (fusepack / HF) "
          "| peak memory GiB (fusepack / HF) "
          "| GPU kernels per token (fusepack / HF) | HF padding "
          "| SM clock under load, MHz (throttled share) (fusepack / HF) |")


def summary(out_dir, models, warmup=2, profile_step=3, skip_hf=False):
    """The table's text and the failures: (text, [(side, model, why, log path)])."""
    lines = [HEADER, "|" + "---|" * 10]
    failures = []
    for model in models:
        cells = {}
        runs = {}
        for side, read in (("fusepack", lambda: fusepack_run(out_dir, model, warmup, profile_step)),
                           ("HF", lambda: hf_run(out_dir, model, warmup))):
            if side == "HF" and skip_hf:
                runs[side], cells[side] = None, "skipped"
                continue
            try:
                runs[side] = read()
                cells[side] = f"{fmt(runs[side]['avg'], 'rate')} / {fmt(runs[side]['steady'], 'rate')}"
            except Missing as e:
                log = os.path.join(out_dir, f"{'fusepack' if side == 'fusepack' else 'hf'}-{model}.log")
                runs[side] = None
                cells[side] = f"FAILED ({e}): {log}"
                failures.append((side, model, str(e), log))
        f, h = runs["fusepack"], runs["HF"]
        ratios = "—" if f is None or h is None else f"{ratio(f, h, 'avg')} / {ratio(f, h, 'steady')}"
        padding = fmt(h.get("padding"), "share") if h is not None else "—"
        clocks = " / ".join(
            "—" if c is None else fmt(c, "clock")
            for c in (gpu_clocks(os.path.join(out_dir, f"{side}-{model}.gpu.csv")) for side in ("fusepack", "hf")))
        lines.append(f"| {model} | {cells['fusepack']} | {cells['HF']} | {ratios} | {pair(f, h, 'busy', 'share')} | {pair(f, h, 'busy_steady', 'share')} | "
                     f"{pair(f, h, 'peak_gib', 'gib')} | {pair(f, h, 'kernels_per_token', 'per_token')} | {padding} | "
                     f"{clocks} |")
    lines.append("")
    lines.append(f"avg incl. first: Σ tokens / Σ step times over all steps; steady median: median tokens/s of steps "
                 f"{warmup} on, the profiled step left out; tokens are real (non-padding) tokens; GPU busy: GPU kernel "
                 f"time / step wall time of the profiled step; steady estimate: the profiled step's GPU kernel time per "
                 f"token x the steady tokens/s (the profiler slows the host much more than the kernels, whose tracing "
                 f"adds a little: the estimate can pass 100%); SM clock: the median of the nvidia-smi samples drawing "
                 f"at least half the run's highest power, and the share of them throttled for power or heat (— where "
                 f"nothing was sampled).")
    for side, model, why, log in failures:
        lines.append(f"FAILED: {side} {model}: {why}; log {log}")
    return "\n".join(lines) + "\n", failures


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench_e2e_summary", description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("models", nargs="+")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the steady median (default 2)")
    p.add_argument("--profile-step", type=int, default=3,
                   help="fusepack's profiled step when its log does not name it (default 3)")
    p.add_argument("--skip-hf", action="store_true", help="the baseline was not run: its cells say skipped")
    a = p.parse_args(argv)
    if not os.path.isdir(a.out_dir):
        print(f"bench_e2e_summary: {a.out_dir}: no such folder", file=sys.stderr)
        return 2
    text, failures = summary(a.out_dir, a.models, a.warmup, a.profile_step, a.skip_hf)
    sys.stdout.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
