#!/usr/bin/env python3
"""The Hugging Face transformers baseline of the end-to-end benchmark (ci/bench_e2e.sh): fine-tuning steps of
transformers' Qwen3_5ForCausalLM as users run it today, on the same model and the same data law as fusepack-train's
run, so the two can be put side by side on one GPU.

The model is built from a Hugging Face config.json (what `fusepack-train --preset M --print-config` prints), with bf16
weights, sdpa attention and fused AdamW (lr 1e-4, weight decay 0.1, gradient norm clipped to 1.0: fusepack-train's
defaults); activation checkpointing only with --checkpointing. The data follows fusepack's synthetic spec
synthetic:n=4000,median=900,sigma=0.8,min=16,max=8192: example lengths median * exp(sigma * N(0, 1)), rounded to the
nearest integer as fusepack does and clamped to [min, max] (this script's own seeded draw: the same law, not the same
lengths), random token ids in [0, vocab). Batches are padded the way users batch with
transformers: examples in drawn order, a batch takes examples while rows x longest <= --budget (at least one row), right
padding, attention_mask on the real tokens, labels -100 on the padding. Tokens counted are real (non-padding) tokens.

Measured: each step's wall time (GPU synchronised before and after; building the batch and copying it to the GPU
included, as in fusepack-train's step time), tokens/s over all --steps steps including the
first (Σ tokens / Σ step times) and the first step's time on its own, the median tokens/s of the steady steps (after
--warmup, the profiled step left out), the peak GPU memory allocated during the steps, and one step under
torch.profiler (--profile-step, one of the --steps steps, timed like the others): GPU kernels (memcpy/memset not
counted), their summed time, the step's wall time, GPU-busy share = kernel time / wall time, kernels per token.
With --device cpu (a smoke test on a tiny config) the CUDA-only measurements (peak memory, the profile) are skipped.

usage: hf_baseline.py --config CONFIG.json [--steps 20] [--warmup 2] [--budget 8192] [--checkpointing]
                      [--device cuda] [--profile-step 3] [--json OUT.json]
Exit status: 0 done, 1 the run failed (out of memory, a non-finite loss), 2 bad usage, a bad config, no transformers,
no CUDA device."""
import argparse
import importlib.util
import json
import math
import os
import random
import re
import statistics
import sys
import time
import warnings

PROG = "hf_baseline"


class UsageError(Exception):
    """An expected failure (bad arguments, bad config, missing package or device): one line on stderr, exit 2."""


class RunFailure(Exception):
    """The run itself failed in an expected way (a non-finite loss): one line on stderr, exit 1."""


def fail(message, code=2):
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(code)


def one_line(error, limit=400):
    """An exception's message on one line (validation errors span several), shortened to `limit` characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def grouped(n):
    return f"{int(round(n)):,}"


# ---------------------------------------------------------------------------------------------------------------------
# Data: lengths and padded batches (pure Python, no torch)


def draw_lengths(n, median, sigma, min_length, max_length, seed):
    """n example lengths of the log-normal law of fusepack's synthetic spec (median * exp(sigma * N(0, 1)), rounded to
    the nearest integer, clamped to [min_length, max_length]), drawn from this script's own seeded generator."""
    rng = random.Random(seed)
    lengths = []
    for _ in range(n):
        z = sigma * rng.gauss(0.0, 1.0)
        x = median * math.exp(min(z, 700.0))  # exp(710) overflows; anything that large is clamped anyway
        lengths.append(int(min(max(math.floor(x + 0.5), min_length), max_length)))
    return lengths


def padded_batches(lengths, budget):
    """The examples in drawn order cut into batches: a batch takes the next example while (rows + 1) x longest stays
    within budget; a batch has at least one row, so an example longer than the budget is a batch of its own."""
    batches, rows, longest = [], [], 0
    for n in lengths:
        if rows and max(longest, n) * (len(rows) + 1) > budget:
            batches.append(rows)
            rows, longest = [], 0
        rows.append(n)
        longest = max(longest, n)
    if rows:
        batches.append(rows)
    return batches


def padding_share(batches):
    real = sum(sum(b) for b in batches)
    slots = sum(len(b) * max(b) for b in batches)
    return (slots - real) / slots if slots else 0.0


def steady_median(tokens, seconds, warmup, skip_step=-1):
    """Median tokens/s of the steps from index `warmup` on, leaving out `skip_step` (the profiled step); None when no
    step is left."""
    rates = [t / s for i, (t, s) in enumerate(zip(tokens, seconds)) if i >= warmup and i != skip_step and s > 0]
    return statistics.median(rates) if rates else None


# ---------------------------------------------------------------------------------------------------------------------
# Config and model


def read_config(path):
    """The config.json at `path` as the keyword arguments of Qwen3_5TextConfig; raises UsageError naming the problem."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise UsageError(f"--config {path}: cannot be read ({e.strerror or e})")
    except ValueError as e:
        raise UsageError(f"--config {path}: not JSON ({e})")
    if not isinstance(doc, dict):
        raise UsageError(f"--config {path}: not a JSON object")
    # A full multimodal Qwen3.5 config keeps the text model's fields under text_config.
    if isinstance(doc.get("text_config"), dict):
        doc = doc["text_config"]
    d = dict(doc)
    for key in ("architectures", "model_type", "torch_dtype", "dtype", "transformers_version"):
        d.pop(key, None)  # the class is chosen here, and the weights are bf16 whatever the file says
    # fusepack writes attn_output_gate; transformers' Qwen3.5 attention always has the output gate.
    if d.pop("attn_output_gate", True) is False:
        raise UsageError(f"--config {path}: attn_output_gate is false, but transformers' Qwen3.5 attention always "
                         "gates its output: the baseline would be another model")
    if "vocab_size" not in d or "hidden_size" not in d:
        raise UsageError(f"--config {path}: no vocab_size or hidden_size: not a Qwen3.5 text model config")
    return d


def import_transformers():
    """transformers' Qwen3.5 config and causal LM classes; raises UsageError when they cannot be imported."""
    if importlib.util.find_spec("transformers") is None:
        raise UsageError(f"transformers is not installed for {sys.executable} (pip install transformers)")
    try:
        import transformers
        from transformers.models.qwen3_5 import modeling_qwen3_5
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    except ImportError as e:
        raise UsageError(f"transformers cannot build Qwen3.5 ({e}); a version with transformers.models.qwen3_5 is "
                         "needed")
    return transformers, Qwen3_5TextConfig, modeling_qwen3_5.Qwen3_5ForCausalLM


def linear_attention_implementations():
    """Which optional packages transformers' GatedDeltaNet picks up instead of its torch fallbacks (it imports them when
    installed): the baseline's speed depends on them."""
    return {name: importlib.util.find_spec(name) is not None for name in ("fla", "causal_conv1d")}


# ---------------------------------------------------------------------------------------------------------------------
# Profiling


CUDA_API = re.compile(r"^cu(da)?[A-Z]")  # cudaLaunchKernel, cuLaunchKernel, cudaMemcpyAsync: runtime and driver calls


def profiled_counts(prof):
    """Counts of a torch.profiler run: CPU op calls, CUDA API calls (the host's side of launches and copies), GPU
    kernels (memcpy/memset and user annotations not counted), GPU memory operations, and the kernels' summed duration
    in seconds."""
    counts = {"cpu_op_calls": 0, "cuda_api_calls": 0, "gpu_kernels": 0, "gpu_memory_ops": 0, "gpu_kernel_seconds": 0.0}
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    cpu = torch.autograd.DeviceType.CPU
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is not None:  # the raw Kineto events: faster than building FunctionEvents
        events = [(e.name(), e.device_type(), e.duration_ns() * 1e-9, e.is_async(), e.is_user_annotation(),
                   e.is_hidden_event() if hasattr(e, "is_hidden_event") else False) for e in results.events()]
    else:
        events = [(e.name, e.device_type, e.time_range.elapsed_us() * 1e-6, e.is_async,
                   bool(getattr(e, "is_user_annotation", False)), False) for e in prof.events()]
    for name, device_type, seconds, is_async, annotation, hidden in events:
        if device_type == cpu:
            if not (is_async or hidden or annotation):
                counts["cuda_api_calls" if CUDA_API.match(name) else "cpu_op_calls"] += 1
        elif device_type == cuda and not annotation:
            if name.startswith(("Memcpy", "Memset", "cudaMemcpy", "cudaMemset")):
                counts["gpu_memory_ops"] += 1
            else:
                counts["gpu_kernels"] += 1
                counts["gpu_kernel_seconds"] += seconds
    return counts


# ---------------------------------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="Hugging Face config.json of a Qwen3.5 text model")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--warmup", type=int, default=2,
                   help="steps left out of the steady median (default 2)")
    p.add_argument("--budget", type=int, default=8192, help="rows x longest of a batch at most (default 8192)")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing (default off)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--profile-step", type=int,
                   help="0-based step profiled with torch.profiler (default 3, none with --steps 3 or fewer; -1: none; "
                        "CUDA only)")
    p.add_argument("--json", help="write all numbers to this file as one JSON object")
    p.add_argument("--seed", type=int, default=1, help="seed of the lengths, token ids and weights (default 1)")
    # The data law: fusepack's synthetic:n=4000,median=900,sigma=0.8,min=16,max=8192 unless changed (smoke tests).
    p.add_argument("--examples", type=int, default=4000, help="examples drawn (default 4000)")
    p.add_argument("--median", type=float, default=900.0, help="median example length (default 900)")
    p.add_argument("--sigma", type=float, default=0.8, help="log-normal shape (default 0.8)")
    p.add_argument("--min-length", type=int, default=16, help="shortest example (default 16)")
    p.add_argument("--max-length", type=int, default=8192, help="longest example (default 8192)")
    a = p.parse_args(argv)
    if a.profile_step is None:
        a.profile_step = 3 if a.steps > 3 else -1
    checks = [(a.steps >= 1, f"--steps must be >= 1; got {a.steps}"),
              (a.warmup >= 0, f"--warmup must be >= 0; got {a.warmup}"),
              (a.profile_step == -1 or 0 <= a.profile_step < a.steps,
               f"--profile-step must be -1 or in [0, steps); got {a.profile_step}"),
              (a.budget >= 1, f"--budget must be >= 1; got {a.budget}"),
              (a.examples >= 1, f"--examples must be >= 1; got {a.examples}"),
              (a.median > 0 and a.sigma >= 0, "--median must be > 0 and --sigma >= 0"),
              (1 <= a.min_length <= a.max_length, "--min-length and --max-length need 1 <= min <= max")]
    for ok, message in checks:
        if not ok:
            p.error(message)
    return a


def run(a):
    if a.json and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
        raise UsageError(f"--json {a.json}: its folder does not exist")
    config_kwargs = read_config(a.config)
    if importlib.util.find_spec("torch") is None:
        raise UsageError(f"torch is not installed for {sys.executable}")
    import torch

    transformers, TextConfig, CausalLM = import_transformers()
    try:
        device = torch.device(a.device)
    except RuntimeError as e:
        raise UsageError(f"--device {a.device}: {e}")
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise UsageError(f"--device {a.device}: no CUDA device is available to torch {torch.__version__}")
    if cuda and (device.index or 0) >= torch.cuda.device_count():
        raise UsageError(f"--device {a.device}: only {torch.cuda.device_count()} CUDA device(s)")
    if device.type not in ("cuda", "cpu"):
        raise UsageError(f"--device {a.device}: give cuda, cuda:N or cpu")
    if cuda:
        # "cuda" means the current device; torch.cuda.set_device needs an index.
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(device)

    try:
        config = TextConfig(**config_kwargs)
    except Exception as e:  # transformers' config validation: the message names the field
        raise UsageError(f"--config {a.config}: transformers rejects it: {one_line(e)}")
    config._attn_implementation = "sdpa"
    config.use_cache = False  # training: no KV / recurrent state cache

    torch.manual_seed(a.seed)
    started = time.perf_counter()
    with torch.device(device):  # initialised where it trains: a multi-billion-parameter model inits slowly on a CPU
        model = CausalLM(config)
    model = model.to(torch.bfloat16)
    if a.checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    parameters = sum(p.numel() for p in model.parameters())
    setup_seconds = time.perf_counter() - started

    lengths = draw_lengths(a.examples, a.median, a.sigma, a.min_length, a.max_length, a.seed)
    batches = padded_batches(lengths, a.budget)
    step_batches = [batches[s % len(batches)] for s in range(a.steps)]  # past the last batch: the next epoch
    vocab = config.vocab_size
    token_rng = torch.Generator().manual_seed(a.seed)

    def make_batch(rows):
        """A padded batch on the host, as a data collator gives it, moved to the device."""
        longest = max(rows)
        ids = torch.randint(0, vocab, (len(rows), longest), generator=token_rng)
        mask = (torch.arange(longest)[None, :] < torch.tensor(rows)[:, None]).long()
        ids = ids.masked_fill(mask == 0, 0)
        labels = ids.masked_fill(mask == 0, -100)
        return {k: v.to(device, non_blocking=cuda) for k, v in
                (("input_ids", ids), ("attention_mask", mask), ("labels", labels))}

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def train_step(rows):
        batch = make_batch(rows)
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    dev_name = torch.cuda.get_device_name(device) if cuda else "CPU"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {dev_name}")
    kernels = linear_attention_implementations()
    print(f"model: {os.path.basename(a.config)}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab "
          f"{grouped(vocab)}, {grouped(parameters)} parameters, bf16, sdpa, fused AdamW, activation checkpointing "
          f"{'on' if a.checkpointing else 'off'}; built in {setup_seconds:.1f} s")
    print("linear attention: " + ", ".join(f"{k} {'installed (used)' if v else 'not installed'}"
                                           for k, v in kernels.items()) +
          ("" if any(kernels.values()) else ": transformers' torch fallbacks"))
    print(f"data: {grouped(len(lengths))} examples, log-normal lengths (median {a.median:g}, sigma {a.sigma:g}, "
          f"{a.min_length}..{a.max_length}), {grouped(sum(lengths))} tokens in {grouped(len(batches))} padded batches "
          f"of rows x longest <= {grouped(a.budget)}; padding {100 * padding_share(batches):.1f}% of the positions")

    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats(device)
    seconds, tokens, slots, losses = [], [], [], []
    profile = None
    for s, rows in enumerate(step_batches):
        profiler = None
        if cuda and s == a.profile_step:
            from torch.profiler import ProfilerActivity, profile as torch_profile

            sync()  # nothing of earlier steps in the profiled window
            profiler = torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            with warnings.catch_warnings():  # one profiling cycle: its warning about clearing events between cycles
                warnings.filterwarnings("ignore", message=".*Profiler clears events")
                profiler.__enter__()
        sync()
        t0 = time.perf_counter()
        loss = train_step(rows)
        sync()
        dt = time.perf_counter() - t0
        if profiler is not None:
            profiler.__exit__(None, None, None)
            c = profiled_counts(profiler)
            real = sum(rows)
            profile = dict(step=s, tokens=real, wall_seconds=dt, **c,
                           gpu_busy_share=c["gpu_kernel_seconds"] / dt if dt > 0 else 0.0,
                           kernels_per_token=c["gpu_kernels"] / real)
        if not math.isfinite(loss):
            raise RunFailure(f"step {s}: the loss is {loss}")
        seconds.append(dt)
        tokens.append(sum(rows))
        slots.append(len(rows) * max(rows))
        losses.append(loss)
        print(f"step {s:{len(str(a.steps))}d}/{a.steps}  loss {loss:.6f}  rows {len(rows)} x {max(rows)}  tokens "
              f"{grouped(tokens[-1])}  {dt * 1e3:.1f} ms  {grouped(tokens[-1] / dt)} tok/s  padding "
              f"{100 * (slots[-1] - tokens[-1]) / slots[-1]:.1f}%", flush=True)

    total_tokens, total_seconds = sum(tokens), sum(seconds)
    result = {
        "baseline": "transformers Qwen3_5ForCausalLM, padded",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": dev_name,
        "config": a.config,
        "parameters": parameters,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": vocab,
        "checkpointing": a.checkpointing,
        "linear_attention_packages": kernels,
        "setup_seconds": setup_seconds,
        "data": {"examples": len(lengths), "median": a.median, "sigma": a.sigma, "min": a.min_length,
                 "max": a.max_length, "seed": a.seed, "tokens": sum(lengths), "batches": len(batches),
                 "padding": padding_share(batches)},
        "budget": a.budget,
        "steps": a.steps,
        "warmup": a.warmup,
        "step_seconds": seconds,
        "step_tokens": tokens,
        "step_slots": slots,
        "step_losses": losses,
        "tokens": total_tokens,
        "slots": sum(slots),
        "padding": (sum(slots) - total_tokens) / sum(slots),
        "first_step_seconds": seconds[0],
        "tokens_per_second": total_tokens / total_seconds if total_seconds > 0 else 0.0,
        "tokens_per_second_steady_median": steady_median(tokens, seconds, a.warmup,
                                                         profile["step"] if profile else -1),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "profile": profile,
    }
    steady = result["tokens_per_second_steady_median"]
    print(f"throughput: {grouped(result['tokens_per_second'])} tokens/s over all {a.steps} steps including the first "
          f"({grouped(total_tokens)} real tokens in {total_seconds:.2f} s); first step {seconds[0]:.2f} s")
    print("steady: " + (f"median {grouped(steady)} tokens/s over steps {a.warmup}..{a.steps - 1}"
                        + (" (the profiled step left out)" if profile else "") if steady is not None else
                        "no step after the warm-up"))
    print(f"padding: {100 * result['padding']:.1f}% of {grouped(result['slots'])} computed positions")
    if cuda:
        print(f"peak GPU memory: {result['peak_memory_bytes'] / 2 ** 30:.2f} GiB allocated")
        if profile:
            print(f"profile of step {profile['step']} ({grouped(profile['tokens'])} tokens)\n"
                  f"  CPU op calls:   {grouped(profile['cpu_op_calls'])} (+ {grouped(profile['cuda_api_calls'])} CUDA "
                  f"API calls)\n"
                  f"  GPU kernels:    {grouped(profile['gpu_kernels'])} (+ {grouped(profile['gpu_memory_ops'])} "
                  f"memcpy/memset), {profile['kernels_per_token']:.3f} per token\n"
                  f"  step wall time: {profile['wall_seconds'] * 1e3:.3f} ms\n"
                  f"  GPU kernel time: {profile['gpu_kernel_seconds'] * 1e3:.3f} ms "
                  f"({100 * profile['gpu_busy_share']:.1f}% of the wall time)")
    else:
        result["skipped"] = "peak GPU memory and the profiled step are CUDA-only measurements"
        print("on the CPU: peak GPU memory and the profiled step are skipped (CUDA-only measurements)")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(a)
    except UsageError as e:
        fail(str(e), 2)
    except RunFailure as e:
        fail(f"the run failed: {e}", 1)
    except OSError as e:  # --json cannot be written
        fail(f"{e.filename or ''}: {e.strerror or e}", 1)
    except RuntimeError as e:
        if type(e).__name__ != "OutOfMemoryError":  # anything else is unexpected: its traceback helps
            raise
        fail(f"the run failed: out of memory ({one_line(e)})", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
