// TrainConfig: every setting of one fine-tuning run (what fusepack-train's options set), each field documented and all
// of them checked together in validate(). Plain C++ (no torch), so the CLI and the tests read it cheaply.
#pragma once

#include "kernels/ops/backend.h"
#include "packing/packer.h"

#include <cstdint>
#include <string>

namespace fusepack::train {

// The batch layout a run trains on (docs/contracts.md, batches).
enum class Batching {
  kPacked,  // 1D packs of whole examples (the optimized path)
  kPadded,  // one example per row, right-padded to the longest (the baseline the goldens record)
};
char const* batching_name(Batching batching);        // "packed", "padded"
Batching parse_batching(std::string const& name);    // throws std::invalid_argument for anything else

// How the epoch is cut into micro-batches (packing::PlanMode): "paired" gives the padded layout exactly the examples
// of each packed batch (the one mode in which packed and padded runs see the same examples per step, so their losses
// compare step by step); "fill" plans each layout as dense as its budget allows.
char const* pairing_name(packing::PlanMode mode);       // "paired", "fill"
packing::PlanMode parse_pairing(std::string const& name);  // throws std::invalid_argument

// Numerics of a run. kBFloat16 is bf16 compute over fp32 master weights (ModelOptions.compute_dtype), on CUDA only.
enum class DType { kFloat64, kFloat32, kBFloat16 };
char const* dtype_name(DType dtype);         // "fp64", "fp32", "bf16" (the CLI's spelling)
char const* golden_dtype_name(DType dtype);  // "float64", "float32", "bfloat16" (golden/FORMAT.md's spelling)
DType parse_dtype(std::string const& name);  // fp64|float64, fp32|float32, bf16|bfloat16; throws otherwise

// AdamW's implementation (optim::AdamWKernel): auto = fusepack's one-pass kernel on CUDA, the foreach operations on
// the CPU; the others on request, to compare them (the CPU takes foreach or aten-fused; fusepack is CUDA only).
enum class OptimizerKernel { kAuto, kFusepack, kAtenFused, kForeach };
char const* optimizer_kernel_name(OptimizerKernel kernel);             // "auto", "fusepack", "aten-fused", "foreach"
OptimizerKernel parse_optimizer_kernel(std::string const& name);     // throws std::invalid_argument

// The CLI's --activation-checkpointing: "none" → 0, "full" → 1, "every-N" → N (N >= 1); throws std::invalid_argument
// for anything else. activation_checkpointing_name is its inverse.
std::int64_t parse_activation_checkpointing(std::string const& text);
std::string activation_checkpointing_name(std::int64_t checkpoint_every);

struct TrainConfig {
  // ---- The model: a named preset, or a Hugging Face config.json; exactly one of the two.
  std::string preset;        // model::preset_names(), e.g. "qwen35-tiny"
  std::string model_config;  // path to config.json, or to the folder holding it
  // Weights to start from: a safetensors file or a checkpoint folder (single file or sharded, Qwen3.5's
  // model.language_model. prefix accepted); converted to the run's dtype. Empty = init_parameters(seed).
  std::string weights;

  // ---- The data: a JSONL file ({"input_ids": [...], "labels": [...]} per line, ids checked against the model's
  // vocabulary) or a synthetic spec "synthetic:n=...,median=..." (packing/synthetic.h; vocab= defaults to the
  // model's vocab_size and may not exceed it).
  std::string data;

  // ---- Evaluation (optional): a held-out dataset in data's syntax (a synthetic spec's vocab= defaults to the
  // model's), cut into micro-batches by the batching settings below (the plan of its epoch 0). After every eval_every
  // optimizer steps and after the last step, the run computes its mean loss (Σ CE / targets over the whole set)
  // without gradients or an update, logs it and records it in the metrics file; the training is the same with or
  // without it. Both or neither: eval_every >= 1 with eval_data, 0 (no evaluation) without.
  std::string eval_data;
  std::int64_t eval_every = 0;

  // ---- Batching.
  Batching batching = Batching::kPacked;
  packing::PlanMode pairing = packing::PlanMode::kPaired;
  std::int64_t token_budget = 8192;  // >= 1: most tokens in a packed batch (fill mode: most rows x longest padded)
  std::int64_t lookahead = 64;       // >= 1: examples the packer may look past the oldest waiting one
  packing::OversizePolicy oversize = packing::OversizePolicy::kError;  // examples longer than the budget
  // Packed micro-batches completed to exactly token_budget tokens by a filler example of their own with no targets
  // (packing::complete_to_budget): every step's micro-batches have one shape; the loss, targets and gradients are
  // those of the examples alone. The filler's tokens count as padding in the log, not as tokens.
  bool complete_packs = false;
  std::int64_t micro_batches = 1;    // >= 1 micro-batches per optimizer step and rank (gradient accumulation): a step
                                     // takes world_size x micro_batches consecutive micro-batches of the epoch plan,
                                     // rank r the r-th run of micro_batches of them; its loss is Σ CE over all of
                                     // them / their targets, counted (over all ranks) before the first forward
  std::int64_t steps = 10;           // >= 1 optimizer steps; when they need more micro-batches than an epoch holds,
                                     // the next epoch (a new shuffle) follows. 0 with epochs > 0 (the two exclude
                                     // each other): derived from the data when the run starts (see epochs)
  // The run's length in passes over the data instead of `steps` (0 = off; then steps = 0): the micro-batches of
  // epochs 0..epochs-1 (each epoch's plan as packing::plan_epoch draws it for the run's settings and layout) divided
  // by the micro-batches of a step (micro_batches x world size), rounded down (PyTorch DataLoader's drop_last: a
  // short last step would be a step of a few tokens). run_training derives steps once the data is loaded and logs
  // how many micro-batches are left out; fewer micro-batches than one step takes is an error.
  std::int64_t epochs = 0;

  // ---- Optimizer (AdamW as torch.optim.AdamW; decay on every parameter of 2+ dims, optim::qwen35_decays) and the
  // learning-rate schedule (linear warmup to lr, cosine to min_lr at `steps`, optim::CosineSchedule).
  double lr = 1e-4;                 // > 0: the peak learning rate
  double min_lr = 0;                // in [0, lr]
  std::int64_t warmup_steps = 0;    // in [0, steps] (with epochs: checked against the derived steps); lr(0) = 0 when
                                    // > 0 (Hugging Face's convention)
  double weight_decay = 0.1;        // >= 0, decoupled
  double beta1 = 0.9;               // in [0, 1)
  double beta2 = 0.95;              // in [0, 1)
  double eps = 1e-8;                // >= 0
  double clip_norm = 1.0;           // >= 0: clip the global gradient norm to it; 0 = no clipping (still measured)
  OptimizerKernel optimizer_kernel = OptimizerKernel::kAuto;  // not part of the settings a golden or resume compares

  // ---- Reproducibility and placement.
  std::uint64_t seed = 0;           // the parameter init (when no weights are given) and the epoch shuffles
  ops::Backend backend = ops::Backend::kComposite;  // fused needs a CUDA device; nothing falls back
  std::string device = "cpu";       // "cpu", "cuda" or "cuda:N"
  DType dtype = DType::kFloat32;    // fp64 and fp32: parameters and compute; bf16: CUDA only
  std::int64_t threads = 0;         // in [0, kMaxThreads] ATen intra-op threads; 0 = ATen's default. 1 makes every
                                    // CPU reduction run in one order, so a golden regenerates bit for bit anywhere
  // Sharded runs (several ranks, trainer/parallel): free each layer's gathered weights after its forward and gather
  // them again for its backward (FSDP2's reshard_after_forward); false keeps them from forward to backward.
  bool reshard_after_forward = true;
  // Activation checkpointing (model::ModelOptions::checkpoint_every): 0 none; N >= 1 recomputes layers 0, N, 2N, ...
  // in the backward instead of keeping their activations (1: every layer). Same gradients, less memory, more compute.
  std::int64_t checkpoint_every = 0;

  // ---- Outputs.
  std::string output_dir;    // fine-tuned weights at the end (config.json + model.safetensors, HF names); empty = none
  std::string golden_write;  // write the run as a golden file (golden/FORMAT.md) with its provenance; empty = no
  std::string golden_check;  // compare the run with this golden step by step; empty = no
  // With golden_check, for low-precision runs: the golden's own run repeated in this run's dtype (a golden-format
  // file, e.g. the padded composite bf16 run written with golden_write). The run then passes a step when it is within
  // twice the baseline's drift from the golden plus one rounding step of its dtype (golden::compare_with_baseline,
  // the numerics rule of docs/contracts.md) instead of fixed tolerances. Empty = fixed tolerances (golden::derived_tolerance).
  std::string golden_baseline;
  // Training checkpoints (training_checkpoint.h): into save_dir every save_every steps (0: only at the end) and when
  // the run is interrupted (SIGINT, SIGTERM); the newest keep_checkpoints are kept. Empty save_dir: none.
  std::string save_dir;
  std::int64_t save_every = 0;
  std::int64_t keep_checkpoints = 3;
  // Continue from a training checkpoint: its folder, a save dir holding `latest`, or "latest" (save_dir's). The run
  // must repeat the checkpoint's settings (any world size); it trains the steps after it, as if never stopped.
  std::string resume;
  // Write output_dir even when it already holds files (they may be replaced); without it a non-empty output_dir is
  // refused before the first step, so no file fusepack did not write is ever deleted or overwritten.
  bool overwrite_output = false;
  std::int64_t profile_step = -1;  // profile optimizer step N (0-based, < steps, with epochs the derived steps); -1 =
                                   // no profiling
  // Per-step metrics as JSON Lines (metrics.h), written by rank 0 as the run goes; a resumed run appends to it. An
  // existing file is refused unless the run resumes or overwrite_output. Empty: none.
  std::string metrics;
  // Everything up to the first step (model config, data, checks, the plan), then print the plan (examples, tokens,
  // steps and micro-batches, epochs covered, tokens and examples per micro-batch, padding, the memory of weights,
  // gradients and AdamW state) instead of training. No output is written or created, neither the weights nor the
  // checkpoint of resume are read, and the model's parameters are never allocated (names and shapes only).
  bool dry_run = false;

  static constexpr std::int64_t kMaxThreads = 1024;  // more threads than any CPU has cores only hang the run

  // How validate() names the settings: by field ("token_budget") or by fusepack-train's option ("--budget").
  enum class Naming { kFields, kOptions };
  // Every rule above, checked at once: throws std::invalid_argument listing each broken one
  // ("TrainConfig is invalid: give exactly one of preset and model_config; lr must be > 0, got 0; ..."; with
  // Naming::kOptions "invalid options: give exactly one of --preset and --config; --lr must be > 0, got 0; ...").
  void validate(Naming naming = Naming::kFields) const;
};

}  // namespace fusepack::train
