#!/usr/bin/env python3
# The Hugging Face golden (golden/FORMAT.md, "What goldens are for"): a tiny random Qwen3_5ForCausalLM computed by transformers itself, in
# float64 on the CPU with transformers' torch fallbacks, written as config.json + model.safetensors + golden.json.
# Regenerate with the command in golden/hf/README.md; never edit the outputs by hand.
import argparse
import collections
import datetime
import hashlib
import json
import logging
import math
import os
import platform
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import safetensors
import transformers
from safetensors import safe_open
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5 import modeling_qwen3_5

FORMAT = "fusepack-hf-golden/1"
SEED = 20261129
IGNORE = -100
PAD_TOKEN = 0

# The model: every Qwen3.5 mechanism at toy size (GQA in both mixers: 4 query / 2 KV heads, 2 key / 4 value heads).
CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
    # rotary_dim = int(32 * 0.25) = 8, so 4 frequencies; the M-RoPE section (T, H, W) splits those 4 as 2 + 1 + 1
    # (text-only positions make the three identical: plain 1-D RoPE). theta 1e4 so that all 4 frequencies turn by a
    # visible angle within 90 positions (1e7, the released value, leaves the last one at 5e-4 rad).
    rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                         mrope_interleaved=True, mrope_section=[2, 1, 1]),
    max_position_embeddings=128,
)

# Data: example lengths (1 has no target at all; 17, 33, 64 and 90 straddle the GDN fallback's chunk of 64) and, per
# example index, how many leading positions are a prompt whose labels are -100.
LENGTHS = [1, 5, 17, 33, 64, 90]
PROMPT_LENGTHS = {2: 4, 4: 20}
MICRO_BATCHES = [[0, 1, 2], [3, 4, 5]]  # the training step's two micro-batches (example indices)
LOGITS_EXAMPLE, LOGITS_ROWS, LOGITS_COLS = 2, [0, 8, 16], 8

TRAIN = dict(steps=3, optimizer="torch.optim.AdamW", lr=1e-3, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1,
             amsgrad=False, foreach=False, fused=False, param_groups="one group: every parameter, weight decay on all",
             schedule="none (constant lr)", grad_clip="torch.nn.utils.clip_grad_norm_(max_norm=1.0, norm_type=2), "
             "applied after both micro-batches' backward, before optimizer.step()")


class Fp32Census(TorchFunctionMode):
    """Counts, per transformers function (qualified name), the torch calls that return a float32 tensor. Forward only:
    the backward runs in the autograd engine, outside function modes, in the dtypes the forward chose."""

    def __init__(self):
        super().__init__()
        self.sites = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if any(isinstance(o, torch.Tensor) and o.dtype == torch.float32 for o in outs):
            frame, site = sys._getframe(1), "?"
            while frame is not None:
                path = frame.f_code.co_filename
                if "/transformers/" in path and "<" not in frame.f_code.co_qualname:
                    site = os.path.basename(path) + ":" + frame.f_code.co_qualname
                    break
                frame = frame.f_back
            self.sites[site] += 1
        return out


class PromoteFp32(TorchFunctionMode):
    """Rewrites every request for float32 (x.float(), x.to(torch.float32), dtype=torch.float32) into float64, so
    transformers' code computes what it computes, every step in float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            return args[0].to(torch.float64)
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


class RecurrentGdn:
    """Promotes float32 to float64 (PromoteFp32) and runs the GDN through HF's per-token reference
    torch_recurrent_gated_delta_rule instead of the chunked torch_chunk_gated_delta_rule: the same math by another
    algorithm, which shows how far two correct float64 implementations drift apart."""

    def __enter__(self):
        self.saved = modeling_qwen3_5.torch_chunk_gated_delta_rule
        modeling_qwen3_5.torch_chunk_gated_delta_rule = modeling_qwen3_5.torch_recurrent_gated_delta_rule
        self.promote = PromoteFp32()
        self.promote.__enter__()
        return self

    def __exit__(self, *exc):
        self.promote.__exit__(*exc)
        modeling_qwen3_5.torch_chunk_gated_delta_rule = self.saved
        return False


class NoMode:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def make_model():
    """Qwen3_5ForCausalLM in float64 with every parameter drawn from a seeded generator (not HF's init, which sets
    the norms to 0/1 and A_log/dt_bias to fixed ranges: here each parameter changes the loss)."""
    torch.manual_seed(SEED)
    config = Qwen3_5TextConfig(**CONFIG)
    model = Qwen3_5ForCausalLM(config).to(torch.float64)
    gen = torch.Generator().manual_seed(SEED + 1)
    zero_centred = ("input_layernorm.weight", "post_attention_layernorm.weight", "model.norm.weight",
                    "q_norm.weight", "k_norm.weight")
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            normal = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name.endswith("embed_tokens.weight"):
                p.copy_(normal)
            elif name.endswith(zero_centred):
                p.copy_(0.2 * normal)  # effective gain 1 + w
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * normal)  # plain gain
            elif name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen, dtype=torch.float64).mul(0.99).add(0.01).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * normal)
            else:  # projections, conv1d [C, 1, 4], lm_head: unit-variance outputs for unit-variance inputs
                fan_in = math.prod(p.shape[1:])
                p.copy_(normal / math.sqrt(fan_in))
    return model


def make_examples():
    gen = torch.Generator().manual_seed(SEED + 2)
    examples = []
    for i, length in enumerate(LENGTHS):
        ids = torch.randint(0, CONFIG["vocab_size"], (length,), generator=gen)
        labels = ids.clone()
        labels[: PROMPT_LENGTHS.get(i, 0)] = IGNORE
        examples.append((ids.tolist(), labels.tolist()))
    return examples


def targets(labels):
    """Number of shifted targets: label t is the target of logits t-1, so position 0 never is one."""
    return sum(1 for t in range(1, len(labels)) if labels[t] != IGNORE)


def pad_batch(examples):
    """Right padding to the longest example: tokens PAD_TOKEN, attention_mask 0, labels -100."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), PAD_TOKEN, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for b, (i, l) in enumerate(examples):
        ids[b, : len(i)] = torch.tensor(i)
        mask[b, : len(i)] = 1
        labels[b, : len(l)] = torch.tensor(l)
    return ids, mask, labels


def ce_sum(logits, labels):
    """Sum of token cross-entropies of one row, computed here in the logits' dtype: logits [L, V], labels [L]."""
    shift = labels[1:]
    keep = shift != IGNORE
    if not bool(keep.any()):
        return 0.0
    return float(F.cross_entropy(logits[:-1][keep], shift[keep], reduction="sum"))


def forward_record(model, examples, mode):
    """The padded batch loss as HF computes it, and each example alone."""
    record = {}
    with torch.no_grad(), mode:
        ids, mask, labels = pad_batch(examples)
        out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
        record["padded_batch"] = {
            "shape": list(ids.shape),
            "hf_loss": out.loss.item(),
            "hf_loss_dtype": str(out.loss.dtype).replace("torch.", ""),
            "target_tokens": sum(targets(l) for _, l in examples),
            "loss_sum": sum(ce_sum(out.logits[b, : len(examples[b][0])], labels[b, : len(examples[b][0])])
                                 for b in range(len(examples))),
        }
        padded_logits = out.logits
        per_example, max_pad_diff = [], 0.0
        for b, (i, l) in enumerate(examples):
            alone = model(input_ids=torch.tensor([i]), labels=torch.tensor([l]), use_cache=False)
            logits = alone.logits[0]
            max_pad_diff = max(max_pad_diff, (logits - padded_logits[b, : len(i)]).abs().max().item())
            n = targets(l)
            per_example.append({
                "length": len(i),
                "target_tokens": n,
                "loss_sum": ce_sum(logits, torch.tensor(l)),
                "hf_loss": None if n == 0 else alone.loss.item(),  # HF's mean over 0 targets is NaN
                "logits_sum": logits.sum().item(),
                "logits_sum_squares": logits.pow(2).sum().item(),
            })
            if b == LOGITS_EXAMPLE:
                record["logits"] = {
                    "example": b,
                    "rows": LOGITS_ROWS,
                    "first_columns": LOGITS_COLS,
                    "values": [logits[r, :LOGITS_COLS].tolist() for r in LOGITS_ROWS],
                }
        record["per_example"] = per_example
        record["max_abs_logits_diff_padded_vs_alone"] = max_pad_diff
    return record


def train_record(model, examples, mode):
    """TRAIN["steps"] AdamW steps on the same data; each step runs MICRO_BATCHES (padded each) and normalises the
    sum of token cross-entropies by the step's target-token count (golden/FORMAT.md, "The loss of a step") via HF's num_items_in_batch."""
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN["lr"], betas=tuple(TRAIN["betas"]), eps=TRAIN["eps"],
                            weight_decay=TRAIN["weight_decay"], amsgrad=False, foreach=False, fused=False)
    n_step = sum(targets(l) for _, l in examples)
    steps = []
    for step in range(TRAIN["steps"]):
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for mb in MICRO_BATCHES:
            ids, mask, labels = pad_batch([examples[i] for i in mb])
            with mode:
                out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False,
                            num_items_in_batch=n_step)
            out.loss.backward()
            loss += out.loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, foreach=False).item()
        opt.step()
        steps.append({"step": step + 1, "loss": loss, "grad_norm": grad_norm, "target_tokens": n_step})
    with torch.no_grad(), mode:
        loss_after = 0.0
        for mb in MICRO_BATCHES:
            ids, mask, labels = pad_batch([examples[i] for i in mb])
            loss_after += model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False,
                                num_items_in_batch=n_step).loss.item()
    params = {name: {"sum": p.detach().sum().item(), "sum_squares": p.detach().pow(2).sum().item()}
              for name, p in sorted(model.named_parameters())}
    return {"steps": steps, "loss_after_last_step": loss_after, "parameters_after_last_step": params}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def main():
    parser = argparse.ArgumentParser(description="Writes the Hugging Face golden (config.json, model.safetensors, golden.json).")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen35-tiny"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: reductions in one order, so two runs are bitwise identical
    torch.use_deterministic_algorithms(True)

    warnings = []

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger("transformers").addHandler(Collect(level=logging.WARNING))

    examples = make_examples()
    model = make_model()
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)  # config.json + model.safetensors (float64), HF's own writer
    os.remove(os.path.join(args.out, "generation_config.json"))  # generation defaults: nothing a trainer reads

    # transformers must load what it wrote, bit for bit.
    reloaded = Qwen3_5ForCausalLM.from_pretrained(args.out, dtype=torch.float64)
    for (n1, p1), (n2, p2) in zip(sorted(model.named_parameters()), sorted(reloaded.named_parameters())):
        assert n1 == n2 and torch.equal(p1, p2), f"reload changed {n1}"
    with safe_open(os.path.join(args.out, "model.safetensors"), "pt") as f:
        tensors = {k: {"shape": list(f.get_slice(k).get_shape()), "dtype": f.get_slice(k).get_dtype(),
                       "sum": f.get_tensor(k).sum().item()}
                   for k in sorted(f.keys())}
        file_metadata = f.metadata()
    with open(os.path.join(args.out, "model.safetensors"), "rb") as f:
        sha256 = hashlib.sha256(f.read()).hexdigest()

    # Where HF's float64 run drops to float32: a census of the forward of one padded batch.
    census = Fp32Census()
    with torch.no_grad(), census:
        ids, mask, labels = pad_batch(examples)
        model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
    promoted_census = Fp32Census()
    with torch.no_grad(), PromoteFp32(), promoted_census:
        model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
    assert not promoted_census.sites, f"float32 left in the promoted run: {dict(promoted_census.sites)}"

    # The promoted model also recomputes RoPE's inv_freq in float64 (HF builds it in float32 at construction).
    def promoted_copy():
        m = make_model()
        rope = m.model.rotary_emb
        dim = len(rope.inv_freq) * 2
        theta = CONFIG["rope_parameters"]["rope_theta"]
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        rope.inv_freq.copy_(inv)
        rope.original_inv_freq.copy_(inv)
        return m

    runs = {
        "hf_as_is": {"forward": forward_record(model, examples, NoMode()),
                     "training": train_record(make_model(), examples, NoMode())},
        "hf_fp64": {"forward": forward_record(promoted_copy(), examples, PromoteFp32()),
                    "training": train_record(promoted_copy(), examples, PromoteFp32())},
        "hf_fp64_recurrent": {"forward": forward_record(promoted_copy(), examples, RecurrentGdn()),
                              "training": train_record(promoted_copy(), examples, RecurrentGdn())},
    }
    def rel_diffs(a, b):
        return {
            "padded_batch_hf_loss": rel(a["forward"]["padded_batch"]["hf_loss"], b["forward"]["padded_batch"]["hf_loss"]),
            "per_example_loss_sum_max": max(rel(x["loss_sum"], y["loss_sum"])
                                            for x, y in zip(a["forward"]["per_example"], b["forward"]["per_example"])
                                            if y["target_tokens"] > 0),
            "logits_values_max_abs": max(abs(u - v) for ra, rb in zip(a["forward"]["logits"]["values"],
                                                                      b["forward"]["logits"]["values"])
                                         for u, v in zip(ra, rb)),
            "training_loss_max": max(rel(x["loss"], y["loss"])
                                     for x, y in zip(a["training"]["steps"], b["training"]["steps"])),
            "training_grad_norm_max": max(rel(x["grad_norm"], y["grad_norm"])
                                          for x, y in zip(a["training"]["steps"], b["training"]["steps"])),
            "loss_after_last_step": rel(a["training"]["loss_after_last_step"], b["training"]["loss_after_last_step"]),
        }

    precision = {
        "fp32_islands_in_hf_as_is_forward": dict(sorted(census.sites.items())),
        "rel_diff_hf_as_is_vs_hf_fp64": rel_diffs(runs["hf_as_is"], runs["hf_fp64"]),
        "rel_diff_hf_fp64_recurrent_vs_hf_fp64": rel_diffs(runs["hf_fp64_recurrent"], runs["hf_fp64"]),
    }
    a, b = runs["hf_as_is"], runs["hf_fp64"]

    golden = {
        "format": FORMAT,
        "provenance": {
            "command": "PYTHONPATH=/tmp/hfpkgs ~/.cache/fusepack/venv/bin/python golden/hf/make_hf_golden.py",
            "argv": sys.argv,
            "generator": "golden/hf/make_hf_golden.py",
            "generator_sha256": hashlib.sha256(open(os.path.abspath(__file__), "rb").read()).hexdigest(),
            "fusepack_commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
                                              capture_output=True, text=True).stdout.strip() or "unknown",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "safetensors": safetensors.__version__,
            "seed": SEED,
            "dtype": "float64",
            "device": "cpu",
            "torch_threads": torch.get_num_threads(),
            "attn_implementation": model.config._attn_implementation,
            "fallback_warnings": warnings,
            "date": datetime.date.today().isoformat(),
        },
        "model": {
            "class": "Qwen3_5ForCausalLM",
            "config": CONFIG,
            "files": {"config": "config.json", "weights": "model.safetensors", "weights_sha256": sha256,
                      "weights_metadata": file_metadata},
            "parameters": tensors,
            "weights": "drawn from torch.Generator seed+1 in sorted-name order (not HF's init): embeddings N(0,1); "
                       "zero-centred norm weights (input/post_attention_layernorm, model.norm, q_norm, k_norm) "
                       "0.2*N(0,1); linear_attn.norm.weight 1+0.2*N(0,1); A_log log(U(0.01,1)); dt_bias 0.5*N(0,1); "
                       "every other weight N(0,1)/sqrt(fan_in)",
        },
        "data": {
            "seed": SEED + 2,
            "labels": "Hugging Face convention: unshifted, same length as input_ids, -100 = not a target; label t is "
                      "the target of logits t-1 (HF shifts), so an example of length L has at most L-1 targets",
            "padding": {"side": "right", "pad_token": PAD_TOKEN, "attention_mask": "1 real, 0 padding",
                        "labels": -100},
            "examples": [{"input_ids": i, "labels": l} for i, l in examples],
            "micro_batches": MICRO_BATCHES,
        },
        "training": TRAIN,
        "precision": precision,
        "runs": runs,
    }
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    fa, fb = a["forward"]["padded_batch"], b["forward"]["padded_batch"]
    print(f"wrote {args.out}: padded loss hf_as_is {fa['hf_loss']:.17g}  hf_fp64 {fb['hf_loss']:.17g}")
    for x, y in zip(a["training"]["steps"], b["training"]["steps"]):
        print(f"step {x['step']}: loss {x['loss']:.17g} / {y['loss']:.17g}  grad_norm {x['grad_norm']:.17g} / "
              f"{y['grad_norm']:.17g}")
    print("as_is vs fp64:", json.dumps(precision["rel_diff_hf_as_is_vs_hf_fp64"]))
    print("fp64 recurrent vs chunked:", json.dumps(precision["rel_diff_hf_fp64_recurrent_vs_hf_fp64"]))
    print("fallback warnings:", *warnings, sep="\n  ")


if __name__ == "__main__":
    main()
