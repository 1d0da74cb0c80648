// AdamW exactly as torch.optim.AdamW (amsgrad off, maximize off), one step over named fp32/fp64 parameters:
//   t ← t + 1;  p ← p·(1 − lr·wd);  m ← lerp(m, g, 1 − β1);  v ← β2·v + (1 − β2)·g²;
//   p ← p − (lr / (1 − β1^t)) · m / (sqrt(v) / sqrt(1 − β2^t) + eps)
// for all parameters of a device, dtype, decay choice and step count at once (NOTES.md, "List operations"):
//   - on CUDA, fusepack's multi-tensor kernel (kernels/optim/adamw.h): one pass reads p, g, m, v and writes p, m, v,
//     with clipping's factor applied as g is read; within a few roundings of the formula (tests/trainer/optim_test);
//   - ATen's fused AdamW (torch.optim.AdamW(fused=True)) on request (AdamWKernel::kFused), likewise one pass;
//   - on the CPU, torch's foreach operations in torch's order (one list operation per step of the formula): fp32 and
//     fp64 updates equal torch's default AdamW bit for bit (NOTES.md).
#pragma once

#include "trainer/optim/compute_copy.h"
#include "trainer/optim/parameters.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace fusepack::optim {

// Which parameters weight decay applies to, by Hugging Face name: true = decayed.
using DecayRule = std::function<bool(std::string const& name)>;

// HF Trainer's rule (transformers trainer_pt_utils get_decay_parameter_names): no decay when the lower-cased name
// contains "bias", "layernorm" or "rmsnorm", has a path component "norm" ("model.norm.weight",
// "linear_attn.norm.weight") or one ending in "_norm" ("q_norm.weight"). Everything else decays, embeddings, lm_head
// and the conv1d weight included; so does A_log, whose name matches none of the patterns.
bool hf_trainer_decays(std::string const& name);

// fusepack's default for Qwen3.5: HF Trainer's rule, and no decay on A_log either. A_log and dt_bias are the
// Gated DeltaNet's decay-rate parameters; Mamba (mamba_ssm) and flash-linear-attention mark both _no_weight_decay
// (decay would pull A = exp(A_log) towards 1, a fixed forgetting rate, which is not regularisation). dt_bias is
// already excluded by the "bias" pattern. In Qwen3.5 this is exactly "decay iff the parameter has 2 or more
// dimensions" (norm weights, A_log and dt_bias are the only 1-D ones), the GPT-2/nanoGPT/Megatron convention.
bool qwen35_decays(std::string const& name);

// Which implementation updates a list of parameters.
enum class AdamWKernel {
  kAuto,      // fusepack's kernel on CUDA (ATen's fused one in a build without CUDA kernels), foreach elsewhere
  kFusepack,  // fusepack's multi-tensor kernel; CUDA only (an error on another device or in a build without it)
  kFused,     // ATen's fused kernel on every device (torch ships a CPU one too)
  kForeach,   // the foreach operations on every device (torch's default AdamW, operation for operation)
};

struct AdamWOptions {
  double beta1 = 0.9;           // torch defaults
  double beta2 = 0.999;
  double eps = 1e-8;            // added to sqrt(v̂), not inside it
  double weight_decay = 1e-2;   // decoupled: p ← p·(1 − lr·wd), only on parameters the rule decays
  DecayRule decays = qwen35_decays;
  AdamWKernel kernel = AdamWKernel::kAuto;

  void validate() const;  // throws c10::Error: betas in [0, 1), eps >= 0, weight_decay >= 0, a rule
};

// torch's per-parameter state, created (zeros) at a parameter's first step.
struct AdamWState {
  std::int64_t step = 0;  // steps taken; bias corrections use it after the increment
  at::Tensor exp_avg;     // m, the parameter's shape, dtype and device
  at::Tensor exp_avg_sq;  // v, likewise
};

class AdamW {
 public:
  // Throws c10::Error for bad options or parameters (see check_parameters).
  AdamW(std::vector<NamedParameter> params, AdamWOptions options);

  // One update of every parameter with learning rate `lr` (>= 0; the schedule's lr(step) for this step), reading
  // every gradient as g·grad_scale (finite, > 0: gradient clipping's factor, so clipping costs no pass of its own).
  // fusepack's kernel reads the gradients scaled and leaves them as they are; the other paths scale them in place
  // first (_foreach_mul_, as clipping did): read gradients before the step, not after. Every parameter must have a
  // gradient of its own shape, dtype and device: one without is an error naming it (register only trainable
  // parameters), never a silent skip. Runs without autograd recording.
  void step(double lr, double grad_scale = 1.0);

  // Compute copies to write as the parameters they copy are updated (by name; names not registered here are
  // ignored). fusepack's kernel writes a defined copy of the parameter's shape, layout and device in the same pass
  // and records it valid; the other paths leave copies alone, and the master's changed version makes them stale.
  void set_compute_copies(ComputeCopies const& copies);

  std::vector<NamedParameter> const& parameters() const { return params_; }
  AdamWOptions const& options() const { return options_; }
  bool decays(std::string const& name) const;  // the rule's decision for a registered parameter
  bool has_state(std::string const& name) const;
  AdamWState const& state(std::string const& name) const;  // throws when the parameter has no state yet
  // Restores a checkpointed state: the tensors must match the parameter's shape, dtype and device; step >= 1.
  void load_state(std::string const& name, AdamWState state);

 private:
  std::size_t index_of(std::string const& name) const;
  struct Lists {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  };
  Lists lists(std::vector<std::size_t> const& members) const;
  // One list's update (members share device, dtype, decay choice and step count, already incremented).
  void bump_versions(std::vector<std::size_t> const& members);  // p, m and v of each, written outside ATen's ops
  void fusepack_update(std::vector<std::size_t> const& members, bool decayed, double lr, double grad_scale);
  void fused_update(std::vector<std::size_t> const& members, bool decayed, double lr);
  void foreach_update(std::vector<std::size_t> const& members, bool decayed, double lr);

  std::vector<NamedParameter> params_;
  std::vector<bool> decay_;              // [params]
  // The parameters of one device, dtype and decay choice, in registration order: one fused kernel or one list
  // operation per step of the formula each (split further only when their step counts differ, as after loading a
  // partial state).
  std::vector<std::vector<std::size_t>> groups_;
  std::vector<AdamWState> state_;        // [params]; step == 0 means no state yet
  std::vector<std::shared_ptr<ComputeCopy>> copies_;  // [params]; null: none to write
  std::unordered_map<std::string, std::size_t> index_;
  AdamWOptions options_;
};

}  // namespace fusepack::optim
