#include "trainer/train/config.h"

#include "trainer/model/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
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

char const* optimizer_kernel_name(OptimizerKernel kernel) {
  switch (kernel) {
    case OptimizerKernel::kAuto: return "auto";
    case OptimizerKernel::kFusepack: return "fusepack";
    case OptimizerKernel::kAtenFused: return "aten-fused";
    case OptimizerKernel::kForeach: return "foreach";
  }
  return "?";
}

OptimizerKernel parse_optimizer_kernel(std::string const& name) {
  for (OptimizerKernel k : {OptimizerKernel::kAuto, OptimizerKernel::kFusepack, OptimizerKernel::kAtenFused,
                            OptimizerKernel::kForeach}) {
    if (name == optimizer_kernel_name(k)) return k;
  }
  throw std::invalid_argument("optimizer kernel must be auto, fusepack, aten-fused or foreach; got '" + name + "'");
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

// The command-line option that sets each field, for fusepack-train's messages.
constexpr std::pair<char const*, char const*> kOptionOfField[] = {
    {"preset", "--preset"},
    {"model_config", "--config"},
    {"data", "--data"},
    {"eval_data", "--eval-data"},
    {"eval_every", "--eval-every"},
    {"token_budget", "--budget"},
    {"lookahead", "--lookahead"},
    {"micro_batches", "--micro-batches"},
    {"steps", "--steps"},
    {"epochs", "--epochs"},
    {"lr", "--lr"},
    {"min_lr", "--min-lr"},
    {"warmup_steps", "--warmup"},
    {"weight_decay", "--weight-decay"},
    {"beta1", "--beta1"},
    {"beta2", "--beta2"},
    {"eps", "--eps"},
    {"clip_norm", "--clip-norm"},
    {"optimizer_kernel", "--optimizer-kernel"},
    {"device", "--device"},
    {"backend", "--backend"},
    {"dtype", "--dtype"},
    {"threads", "--threads"},
    {"save_every", "--save-every"},
    {"save_dir", "--save-dir"},
    {"keep_checkpoints", "--keep-checkpoints"},
    {"resume", "--resume"},
    {"checkpoint_every", "--activation-checkpointing"},
    {"batching", "--batching"},
    {"complete_packs", "--complete-packs"},
    {"golden_write", "--golden-write"},
    {"golden_check", "--golden-check"},
    {"golden_baseline", "--golden-baseline"},
    {"profile_step", "--profile-step"},
    {"output_dir", "--output"},
};

void TrainConfig::validate(Naming naming) const {
  auto n = [naming](char const* field) -> std::string {
    if (naming == Naming::kOptions) {
      for (auto const& [f, option] : kOptionOfField) {
        if (std::string(f) == field) return option;
      }
    }
    return field;
  };
  std::vector<std::string> problems;
  auto require = [&](bool ok, std::string const& rule) {
    if (!ok) problems.push_back(rule);
  };

  require(preset.empty() != model_config.empty(),
          "give exactly one of " + n("preset") + " and " + n("model_config") + " (config.json)" +
              std::string(preset.empty() ? "; got neither" : "; got both"));
  if (!preset.empty()) {
    std::vector<std::string> const names = model::preset_names();
    if (std::find(names.begin(), names.end(), preset) == names.end()) {
      std::string known;
      for (std::string const& name : names) known += (known.empty() ? "" : ", ") + name;
      problems.push_back("unknown " + n("preset") + " '" + preset + "' (known: " + known + ")");
    }
  }
  require(!data.empty(), n("data") + " is required: a JSONL file or a synthetic:... spec");

  if (eval_every < 0) {
    problems.push_back(n("eval_every") + " must be >= 1 (evaluate every N steps); got " + std::to_string(eval_every));
  } else if (eval_every > 0 && eval_data.empty()) {
    problems.push_back(n("eval_every") + " " + std::to_string(eval_every) + " is given but " + n("eval_data") +
                       ", the dataset to evaluate, is not");
  } else if (eval_every == 0 && !eval_data.empty()) {
    problems.push_back(n("eval_data") + " is given but " + n("eval_every") + " N, how often to evaluate it (every N "
                       "steps and after the last), is not");
  }

  require(token_budget >= 1, n("token_budget") + " must be >= 1; got " + std::to_string(token_budget));
  require(lookahead >= 1, n("lookahead") + " must be >= 1; got " + std::to_string(lookahead));
  require(micro_batches >= 1, n("micro_batches") + " must be >= 1; got " + std::to_string(micro_batches));
  // With epochs the run's steps are derived from the data (run_training): steps stays 0, and the rules that bound a
  // setting by the steps are checked once they are known.
  bool const by_epochs = epochs > 0;
  require(epochs >= 0, n("epochs") + " must be >= 1 (or 0: the run's length is " + n("steps") + "); got " +
                           std::to_string(epochs));
  require(by_epochs || steps >= 1, n("steps") + " must be >= 1; got " + std::to_string(steps));
  require(!by_epochs || steps == 0,
          "give " + n("steps") + " or " + n("epochs") + ", not both (" + n("epochs") +
              " derives the steps from the data" + (naming == Naming::kFields ? ": leave steps 0" : "") + "); got " +
              n("steps") + " " + std::to_string(steps) + " and " + n("epochs") + " " + std::to_string(epochs));

  require(std::isfinite(lr) && lr > 0, n("lr") + " must be finite and > 0; got " + number(lr));
  require(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr,
          n("min_lr") + " must be in [0, " + n("lr") + " = " + number(lr) + "]; got " + number(min_lr));
  require(warmup_steps >= 0 && (by_epochs || warmup_steps <= steps),
          n("warmup_steps") +
              (by_epochs ? std::string(" must be >= 0")
                         : " must be in [0, " + n("steps") + " = " + std::to_string(steps) + "]") +
              "; got " + std::to_string(warmup_steps));
  require(std::isfinite(weight_decay) && weight_decay >= 0,
          n("weight_decay") + " must be >= 0; got " + number(weight_decay));
  require(beta1 >= 0 && beta1 < 1, n("beta1") + " must be in [0, 1); got " + number(beta1));
  require(beta2 >= 0 && beta2 < 1, n("beta2") + " must be in [0, 1); got " + number(beta2));
  require(std::isfinite(eps) && eps >= 0, n("eps") + " must be >= 0; got " + number(eps));
  require(std::isfinite(clip_norm) && clip_norm >= 0,
          n("clip_norm") + " must be >= 0 (0 = no clipping); got " + number(clip_norm));

  require(valid_device(device), n("device") + " must be cpu, cuda or cuda:N; got '" + device + "'");
  bool const cuda = is_cuda_device(device);
  require(optimizer_kernel != OptimizerKernel::kFusepack || cuda,
          n("optimizer_kernel") + " fusepack runs on CUDA only and needs " + n("device") + " cuda; got " +
              n("device") + " '" + device + "'");
  require(backend != ops::Backend::kFused || cuda,
          n("backend") + " fused runs fusepack's CUDA kernels and needs " + n("device") + " cuda; got " +
              n("device") + " '" + device + "' (the composite backend runs on the CPU)");
  require(dtype != DType::kBFloat16 || cuda, n("dtype") + " bf16 (bf16 compute over fp32 master weights) needs " +
                                                 n("device") + " cuda; on the CPU use fp32 or fp64");
  require(threads >= 0 && threads <= kMaxThreads,
          n("threads") + " must be >= 0 and <= " + std::to_string(kMaxThreads) + " (0 = ATen's default); got " +
              std::to_string(threads));
  require(save_every >= 0,
          n("save_every") + " must be >= 0 (0 = only at the end); got " + std::to_string(save_every));
  require(save_every == 0 || !save_dir.empty(),
          n("save_every") + " is given but " + n("save_dir") + ", where checkpoints go, is not");
  require(keep_checkpoints >= 1, n("keep_checkpoints") + " must be >= 1; got " + std::to_string(keep_checkpoints));
  require(resume != "latest" || !save_dir.empty(),
          n("resume") + " latest needs " + n("save_dir") + " (the folder holding `latest`)");
  require(resume.empty() || (golden_write.empty() && golden_check.empty()),
          "a golden records (or is checked against) a whole run; a resumed run holds only the steps after its "
          "checkpoint: give " + n("resume") + " or " + n("golden_write") + "/" + n("golden_check") + ", not both");
  require(checkpoint_every >= 0, n("checkpoint_every") + " must be >= 0 (0 = no activation checkpointing); got " +
                                     std::to_string(checkpoint_every));
  require(!complete_packs || batching == Batching::kPacked,
          n("complete_packs") + " completes packed micro-batches to the token budget; got " + n("batching") + " " +
              batching_name(batching));

  require(golden_write.empty() || golden_write != golden_check,
          n("golden_write") + " and " + n("golden_check") + " name the same file '" + golden_write + "'");
  require(golden_baseline.empty() || !golden_check.empty(),
          n("golden_baseline") + " '" + golden_baseline + "' is the drift allowance of a golden check: give " +
              n("golden_check") + " too");
  require(profile_step == -1 || (profile_step >= 0 && (by_epochs || profile_step < steps)),
          n("profile_step") +
              (by_epochs ? std::string(" must be >= 0")
                         : " must be in [0, " + n("steps") + " = " + std::to_string(steps) + ")") +
              " or -1 (off); got " + std::to_string(profile_step));

  if (!problems.empty()) {
    std::string msg = naming == Naming::kOptions ? "invalid options: " : "TrainConfig is invalid: ";
    for (std::size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    throw std::invalid_argument(msg);
  }
}

}  // namespace fusepack::train
