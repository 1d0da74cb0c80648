#include "trainer/train/config.h"

#include "trainer/model/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace fusepack::train {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool is_cuda_device(std::string const& device) { return device.rfind("cuda", 0) == 0; }

// "cpu", "cuda", "cuda:N" with N a non-negative decimal integer.
bool valid_device(std::string const& device) {
  if (device == "cpu" || device == "cuda") return true;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5 || device.size() > 8) return false;
  return std::all_of(device.begin() + 5, device.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

}  // namespace

char const* batching_name(Batching batching) { return batching == Batching::kPacked ? "packed" : "padded"; }

Batching parse_batching(std::string const& name) {
  if (name == "packed") return Batching::kPacked;
  if (name == "padded") return Batching::kPadded;
  throw std::invalid_argument("batching must be packed or padded; got '" + name + "'");
}

char const* pairing_name(packing::PlanMode mode) { return mode == packing::PlanMode::kPaired ? "paired" : "fill"; }

packing::PlanMode parse_pairing(std::string const& name) {
  if (name == "paired") return packing::PlanMode::kPaired;
  if (name == "fill") return packing::PlanMode::kFill;
  throw std::invalid_argument("pairing must be paired or fill; got '" + name + "'");
}

char const* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return "fp64";
    case DType::kFloat32: return "fp32";
    case DType::kBFloat16: return "bf16";
  }
  return "?";
}

char const* golden_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return "float64";
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
  }
  return "?";
}

DType parse_dtype(std::string const& name) {
  if (name == "fp64" || name == "float64") return DType::kFloat64;
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  throw std::invalid_argument("dtype must be fp64, fp32 or bf16; got '" + name + "'");
}

std::int64_t parse_activation_checkpointing(std::string const& text) {
  if (text == "none") return 0;
  if (text == "full") return 1;
  std::string const prefix = "every-";
  if (text.rfind(prefix, 0) == 0 && text.size() > prefix.size() &&
      text.find_first_not_of("0123456789", prefix.size()) == std::string::npos && text.size() < prefix.size() + 10) {
    std::int64_t const n = std::stoll(text.substr(prefix.size()));
    if (n >= 1) return n;
  }
  throw std::invalid_argument("activation checkpointing must be none, full or every-N with N >= 1 (every-2: layers 0, "
                              "2, 4, ...); got '" + text + "'");
}

std::string activation_checkpointing_name(std::int64_t checkpoint_every) {
  if (checkpoint_every == 0) return "none";
  if (checkpoint_every == 1) return "full";
  return "every-" + std::to_string(checkpoint_every);
}

void TrainConfig::validate() const {
  std::vector<std::string> problems;
  auto require = [&](bool ok, std::string const& rule) {
    if (!ok) problems.push_back(rule);
  };

  require(preset.empty() != model_config.empty(),
          "give exactly one of preset and model_config (config.json)" +
              std::string(preset.empty() ? "; got neither" : "; got both"));
  if (!preset.empty()) {
    std::vector<std::string> const names = model::preset_names();
    if (std::find(names.begin(), names.end(), preset) == names.end()) {
      std::string known;
      for (std::string const& n : names) known += (known.empty() ? "" : ", ") + n;
      problems.push_back("unknown preset '" + preset + "' (known: " + known + ")");
    }
  }
  require(!data.empty(), "data is required: a JSONL file or a synthetic:... spec");

  require(token_budget >= 1, "token_budget must be >= 1; got " + std::to_string(token_budget));
  require(lookahead >= 1, "lookahead must be >= 1; got " + std::to_string(lookahead));
  require(micro_batches >= 1, "micro_batches must be >= 1; got " + std::to_string(micro_batches));
  require(steps >= 1, "steps must be >= 1; got " + std::to_string(steps));

  require(std::isfinite(lr) && lr > 0, "lr must be finite and > 0; got " + number(lr));
  require(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr,
          "min_lr must be in [0, lr = " + number(lr) + "]; got " + number(min_lr));
  require(warmup_steps >= 0 && warmup_steps <= steps,
          "warmup_steps must be in [0, steps = " + std::to_string(steps) + "]; got " + std::to_string(warmup_steps));
  require(std::isfinite(weight_decay) && weight_decay >= 0, "weight_decay must be >= 0; got " + number(weight_decay));
  require(beta1 >= 0 && beta1 < 1, "beta1 must be in [0, 1); got " + number(beta1));
  require(beta2 >= 0 && beta2 < 1, "beta2 must be in [0, 1); got " + number(beta2));
  require(std::isfinite(eps) && eps >= 0, "eps must be >= 0; got " + number(eps));
  require(std::isfinite(clip_norm) && clip_norm >= 0,
          "clip_norm must be >= 0 (0 = no clipping); got " + number(clip_norm));

  require(valid_device(device), "device must be cpu, cuda or cuda:N; got '" + device + "'");
  bool const cuda = is_cuda_device(device);
  require(backend != ops::Backend::kFused || cuda,
          "backend fused runs fusepack's CUDA kernels and needs device cuda; got device '" + device +
              "' (the composite backend runs on the CPU)");
  require(dtype != DType::kBFloat16 || cuda,
          "dtype bf16 (bf16 compute over fp32 master weights) needs device cuda; on the CPU use fp32 or fp64");
  require(threads >= 0, "threads must be >= 0 (0 = ATen's default); got " + std::to_string(threads));
  require(save_every >= 0, "save_every must be >= 0 (0 = only at the end); got " + std::to_string(save_every));
  require(save_every == 0 || !save_dir.empty(), "save_every is given but save_dir, where checkpoints go, is not");
  require(keep_checkpoints >= 1, "keep_checkpoints must be >= 1; got " + std::to_string(keep_checkpoints));
  require(resume != "latest" || !save_dir.empty(), "resume latest needs save_dir (the folder holding `latest`)");
  require(resume.empty() || (golden_write.empty() && golden_check.empty()),
          "a golden records (or is checked against) a whole run; a resumed run holds only the steps after its "
          "checkpoint: give resume or golden_write/golden_check, not both");
  require(checkpoint_every >= 0, "checkpoint_every must be >= 0 (0 = no activation checkpointing); got " +
                                     std::to_string(checkpoint_every));

  require(golden_write.empty() || golden_write != golden_check,
          "golden_write and golden_check name the same file '" + golden_write + "'");
  require(golden_baseline.empty() || !golden_check.empty(),
          "golden_baseline '" + golden_baseline + "' is the drift allowance of a golden check: give golden_check too");
  require(profile_step == -1 || (profile_step >= 0 && profile_step < steps),
          "profile_step must be in [0, steps = " + std::to_string(steps) + ") or -1 (off); got " +
              std::to_string(profile_step));

  if (!problems.empty()) {
    std::string msg = "TrainConfig is invalid: ";
    for (std::size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    throw std::invalid_argument(msg);
  }
}

}  // namespace fusepack::train
