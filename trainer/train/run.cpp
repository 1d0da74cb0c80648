#include "trainer/train/run.h"

#include "packing/batch.h"
#include "packing/dataset.h"
#include "packing/packer.h"
#include "packing/synthetic.h"
#include "trainer/checkpoint/qwen35_names.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/model.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/schedule.h"
#include "trainer/parallel/collectives.h"
#include "trainer/parallel/fully_shard.h"
#include "trainer/parallel/sharded_checkpoint.h"
#include "trainer/checkpoint/files.h"
#include "trainer/train/device_memory.h"
#include "trainer/train/fingerprint.h"
#include "trainer/train/golden_check.h"
#include "trainer/train/metrics.h"
#include "trainer/train/profile.h"
#include "trainer/train/run_data.h"
#include "trainer/train/source_commit.h"
#include "trainer/train/trainer.h"
#include "trainer/train/training_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>

#ifndef FUSEPACK_VERSION
#error "FUSEPACK_VERSION must be defined (golden provenance.fusepack_version)"
#endif

namespace fusepack::train {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// A one-process run's weights, measuring on a CUDA device what the decoder layers' forward keeps for the backward:
// the allocated bytes when the head's weights are asked for minus those when the embedding's are released, the most
// over every micro-batch. That is what activation checkpointing trades for recomputation (the loss head's logits come
// after it and are not counted). Everything else is LocalWeights'.
class LayerActivationMeter final : public model::WeightSource {
 public:
  LayerActivationMeter(model::Qwen35ForCausalLM const& model)
      : inner_(model.config(), model.named_parameters(), model.mixed_precision()) {}

  model::GroupWeights acquire(model::WeightGroup const& group, bool recomputing) override {
    if (group.kind == model::WeightGroup::Kind::kHead && device().is_cuda()) {
      most_ = std::max(most_, allocated_bytes(device()).current - after_embedding_);
    }
    return inner_.acquire(group, recomputing);
  }
  void release(model::WeightGroup const& group, at::Tensor const& output, bool recomputing) override {
    inner_.release(group, output, recomputing);
    if (group.kind == model::WeightGroup::Kind::kEmbedding && device().is_cuda()) {
      after_embedding_ = allocated_bytes(device()).current;
    }
  }
  void finish_backward() override { inner_.finish_backward(); }
  c10::Device device() const override { return inner_.device(); }
  optim::ComputeCopies compute_copies() const override { return inner_.compute_copies(); }

  std::int64_t most_kept_by_layers() const { return most_; }  // -1 before the first forward on a GPU

 private:
  model::LocalWeights inner_;
  std::int64_t after_embedding_ = 0;
  std::int64_t most_ = -1;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---- Model

}  // namespace

model::Qwen35Config load_model_config(TrainConfig const& c) {
  if (!c.preset.empty()) return model::preset(c.preset);
  std::filesystem::path path = c.model_config;
  if (std::filesystem::is_directory(path)) path /= "config.json";
  if (!std::filesystem::is_regular_file(path)) {
    throw std::invalid_argument("model config: no file '" + path.string() + "'");
  }
  return model::Qwen35Config::from_json_file(path.string());
}

namespace {

model::ModelOptions model_options(TrainConfig const& c) {
  model::ModelOptions o;
  switch (c.dtype) {
    case DType::kFloat64: o.dtype = at::kDouble; break;
    case DType::kFloat32: o.dtype = at::kFloat; break;
    case DType::kBFloat16:  // bf16 compute over fp32 master weights
      o.dtype = at::kFloat;
      o.compute_dtype = at::kBFloat16;
      break;
  }
  o.device = c10::Device(c.device);
  o.backend = c.backend;
  o.seed = c.seed;
  o.checkpoint_every = c.checkpoint_every;
  return o;
}

void check_device(TrainConfig const& c) {
  if (c10::Device(c.device).is_cuda() && (!at::hasCUDA() || at::getNumGPUs() == 0)) {
    throw std::invalid_argument("device '" + c.device + "': no CUDA device is available here");
  }
}

// check_writable_dir for a dry run, which creates and writes nothing: `dir`, or where it is missing the nearest folder
// above it (where it would be created), must be a folder this process may write.
void check_could_write_dir(std::string const& dir, std::string const& what) {
  using checkpoint::PathKind;
  std::string existing = dir;
  while (checkpoint::path_kind(existing) == PathKind::kMissing) {
    std::string const up = checkpoint::parent_dir(existing);
    if (up == existing) break;
    existing = up;
  }
  if (checkpoint::path_kind(existing) != PathKind::kDirectory) {
    throw std::invalid_argument(what + " " + dir + ": cannot be created (" + existing + " is not a folder)");
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    throw std::invalid_argument(what + " " + dir + ": cannot write " +
                                (existing == dir ? std::string("a file there") : "into " + existing) + " (" +
                                std::strerror(errno) + ")");
  }
}

// Every output path before the first step, so a run never trains for hours and then cannot write. `writer`: this
// process writes the weights and golden files (rank 0); every rank writes its part of a training checkpoint. A dry
// run checks the same without creating a folder or writing a probe file (check_could_write_dir).
void check_outputs(TrainConfig const& c, bool writer) {
  using checkpoint::PathKind;
  auto* const check_writable = c.dry_run ? check_could_write_dir : checkpoint::check_writable_dir;
  if (writer && !c.output_dir.empty()) {
    PathKind const kind = checkpoint::path_kind(c.output_dir);
    if (kind != PathKind::kMissing && kind != PathKind::kDirectory) {
      throw std::invalid_argument("output " + c.output_dir + ": exists and is not a folder");
    }
    std::vector<std::string> const held = kind == PathKind::kDirectory ? checkpoint::list_dir(c.output_dir)
                                                                        : std::vector<std::string>{};
    if (!held.empty() && !c.overwrite_output) {
      std::string names;
      for (std::size_t i = 0; i < held.size() && i < 4; ++i) names += (i ? ", " : "") + held[i];
      if (held.size() > 4) names += ", and " + std::to_string(held.size() - 4) + " more";
      throw std::invalid_argument("output " + c.output_dir + ": the folder already holds files (" + names +
                                  "); fusepack writes config.json and model*.safetensors there and would replace "
                                  "them: give an empty or new folder, or --overwrite to replace them");
    }
    check_writable(c.output_dir, "output");
  }
  if (!c.save_dir.empty()) check_writable(c.save_dir, "save dir");
  if (writer && !c.metrics.empty()) {
    PathKind const kind = checkpoint::path_kind(c.metrics);
    if (kind == PathKind::kDirectory) throw std::invalid_argument("--metrics " + c.metrics + ": is a directory");
    if (kind != PathKind::kMissing && c.resume.empty() && !c.overwrite_output) {
      throw std::invalid_argument("--metrics " + c.metrics + ": exists (--overwrite replaces it; a run that resumes "
                                  "appends to it)");
    }
    std::string const folder = checkpoint::parent_dir(c.metrics);
    if (checkpoint::path_kind(folder) == PathKind::kMissing) {
      throw std::invalid_argument("--metrics " + c.metrics + ": its folder " + folder + " does not exist");
    }
    check_writable(folder, "metrics file " + c.metrics + ": folder");
  }
  if (writer && !c.golden_write.empty()) {
    // A golden goes into a folder that exists: a mistyped folder is named, not created.
    std::string const folder = checkpoint::parent_dir(c.golden_write);
    if (checkpoint::path_kind(c.golden_write) == PathKind::kDirectory) {
      throw std::invalid_argument("--golden-write " + c.golden_write + ": is a directory; give a file name");
    }
    if (checkpoint::path_kind(folder) == PathKind::kMissing) {
      throw std::invalid_argument("--golden-write " + c.golden_write + ": its folder " + folder +
                                  " does not exist; create it first");
    }
    check_writable(folder, "golden file " + c.golden_write + ": folder");
  }
}

// A NaN or infinity in the initial weights was found only as a NaN gradient, blamed on another tensor.
void check_finite_weight(std::string const& source, std::string const& name, at::Tensor const& t) {
  if (!t.defined() || !at::isFloatingType(t.scalar_type()) || t.numel() == 0) return;
  at::Tensor const bad = at::logical_not(at::isfinite(t));
  std::int64_t const count = bad.sum().item<std::int64_t>();
  if (count == 0) return;
  at::Tensor const flat = t.reshape({-1});
  std::int64_t const first = bad.reshape({-1}).nonzero()[0][0].item<std::int64_t>();
  std::ostringstream os;
  os << "weights " << source << ": tensor '" << name << "' holds " << count << " non-finite value(s) (NaN or "
     << "infinity) among its " << t.numel() << "; the first at flat index " << first << " is "
     << flat[first].item<double>() << "; initial weights must be finite";
  throw std::invalid_argument(os.str());
}

// ---- Provenance

// micro_batches_per_step counts every rank's: what decides which examples a step trains on.
Json batching_description(TrainConfig const& c, int world_size) {
  Json b;
  b["layout"] = batching_name(c.batching);
  b["pairing"] = pairing_name(c.pairing);
  b["token_budget"] = c.token_budget;
  b["lookahead"] = c.lookahead;
  b["oversize"] = packing::oversize_policy_name(c.oversize);
  b["micro_batches_per_step"] = c.micro_batches * world_size;
  b["steps"] = c.steps;
  // The steps derived from --epochs are those of the data and settings; the epochs still say what was asked for, so
  // a resume must repeat them (run_fingerprint). Absent without --epochs: the goldens written before it compare equal.
  if (c.epochs > 0) b["epochs"] = c.epochs;
  if (c.complete_packs) b["complete_packs"] = true;  // absent when off: goldens written before it compare equal
  b["backend"] = ops::backend_name(c.backend);
  // The optimizer and schedule have no provenance field of their own in FORMAT.md version 1: they ride here.
  b["optimizer"] = Json{{"name", "AdamW"},          {"lr", c.lr},
                        {"beta1", c.beta1},         {"beta2", c.beta2},
                        {"eps", c.eps},             {"weight_decay", c.weight_decay},
                        {"decay_rule", "qwen35_decays (2+ dims)"}, {"clip_norm", c.clip_norm}};
  b["schedule"] = Json{{"name", "warmup + cosine"}, {"peak_lr", c.lr}, {"min_lr", c.min_lr},
                       {"warmup_steps", c.warmup_steps}, {"total_steps", c.steps}};
  return b;
}

golden::Provenance make_provenance(TrainConfig const& c, model::Qwen35Config const& model_config, Data const& data,
                                   std::string const& command, int world_size, std::string const& device) {
  golden::Provenance p;
  p.command = command.empty() ? "(library call)" : command;
  p.commit = source_commit();
  p.fusepack_version = FUSEPACK_VERSION;
  p.date = golden::utc_now_iso8601();
  p.model_config = model_config.to_json();
  Json dataset = data.description;
  if (!c.weights.empty()) dataset["initial_weights"] = c.weights;  // where the run started from, not the data proper
  p.dataset = dataset.dump();
  p.seed = c.seed;
  p.dtype = golden_dtype_name(c.dtype);
  p.device = device;
  p.world_size = world_size;
  p.batching = batching_description(c, world_size).dump();
  return p;
}

// What every rank of a sharded run must agree on, as one JSON object: the settings that shape the model, the data,
// the batches and the update (not where outputs go, which only rank 0 writes).
Json run_fingerprint(TrainConfig const& c, model::Qwen35Config const& model_config, Data const& data, int world_size) {
  Json f;
  f["model"] = Json::parse(model_config.to_json());
  f["weights"] = c.weights;
  f["data"] = data.description;
  f["data_hash"] = std::to_string(data.content_hash);
  f["batching"] = batching_description(c, world_size);  // the step's micro-batches over all ranks
  f["seed"] = c.seed;
  f["backend"] = ops::backend_name(c.backend);
  f["dtype"] = dtype_name(c.dtype);
  f["threads"] = c.threads;
  f["reshard_after_forward"] = c.reshard_after_forward;
  f["activation_checkpointing"] = activation_checkpointing_name(c.checkpoint_every);  // changes the collectives' order
  f["profile_step"] = c.profile_step;
  f["fusepack"] = std::string(FUSEPACK_VERSION) + " " + source_commit();
  return f;
}

// The evaluation's settings: recorded in the metrics file's first line and compared between the ranks of a run.
Json eval_settings(EvalSet const& e, TrainConfig const& c) {
  Json j;
  j["data"] = e.data.description;
  j["data_hash"] = std::to_string(e.data.content_hash);
  j["every"] = c.eval_every;
  j["micro_batches"] = e.plans.size();
  return j;
}

// Every rank's fingerprint against rank 0's; throws the same message on every rank when any differ, so they all
// stop before the first collective of the run instead of training different things (or hanging).
void check_same_settings(parallel::Collectives& comm, std::string const& fingerprint) {
  std::vector<std::string> const all = comm.exchange(fingerprint, "exchange of the run's settings");
  std::string differences;
  for (std::size_t r = 1; r < all.size(); ++r) {
    std::string items;
    for (SettingDifference const& d : setting_differences(all[0], all[r])) {
      items += (items.empty() ? "" : "; ") + d.path + " " + d.first + " on rank 0, " + d.second + " on rank " +
               std::to_string(r);
    }
    if (!items.empty()) differences += "\n  rank " + std::to_string(r) + ": " + items;
  }
  if (!differences.empty()) {
    throw std::invalid_argument("the ranks were started with different settings (every rank needs the same model, "
                                "weights, data and options):" + differences);
  }
}

}  // namespace


namespace {

// ---- Output

class Log {
 public:
  Log(std::ostream* out, bool bar) : out_(out), bar_(bar) {}
  ~Log() { clear_bar(); }

  // A line of the log; the bar (if shown) is erased first and drawn again by the next bar().
  void line(std::string const& text) {
    clear_bar();
    if (out_) {
      *out_ << text << '\n';
      out_->flush();
    }
  }
  void text(std::string const& block) {
    clear_bar();
    if (out_) {
      *out_ << block;
      out_->flush();
    }
  }
  void bar(std::string const& text) {
    if (bar_) draw(text);
  }
  void clear_bar() {
    if (bar_ && shown_) {
      std::fputs("\r\033[K", stderr);
      std::fflush(stderr);
      shown_ = false;
    }
  }

 private:
  void draw(std::string const& text) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  std::ostream* out_;
  bool bar_;
  bool shown_ = false;
};

// Log lines stay within this many columns: the full settings are in the metrics file's first line and the golden's
// provenance, not in the log.
constexpr std::size_t kLineWidth = 120;

// `text` cut in the middle to `width` characters ("/data/very/lo...set/train.jsonl"); as it is when it fits or when
// `width` leaves no useful room.
std::string shortened(std::string const& text, std::size_t width) {
  if (text.size() <= width || width < 20) return text;
  std::size_t const head = (width - 3) / 2;
  return text.substr(0, head) + "..." + text.substr(text.size() - (width - 3 - head));
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Printed before the model is built (building a large one takes a while): what is built and its parameter count.
std::string describe_model(model::Qwen35Config const& c, std::int64_t parameters, TrainConfig const& tc) {
  std::ostringstream os;
  os << "model: " << (tc.preset.empty() ? tc.model_config : "preset " + tc.preset) << ", " << c.num_hidden_layers
     << " layers, hidden " << c.hidden_size << ", vocab " << c.vocab_size << ", " << grouped(parameters)
     << " parameters; " << dtype_name(tc.dtype) << " on " << tc.device << ", backend "
     << ops::backend_name(tc.backend)
     << (tc.checkpoint_every > 0 ? ", activation checkpointing " + activation_checkpointing_name(tc.checkpoint_every)
                                 : std::string());
  return os.str();
}

// "data: 128 examples, 5,120 tokens, 3,714 targets; synthetic:n=128,median=40" (the source as given, shortened to fit
// the line; the metrics file's first line has the resolved spec).
std::string data_line(Data const& d, std::string const& source) {
  Json const& j = d.description;
  std::string const counts = "data: " + grouped(j.at("examples").get<std::int64_t>()) + " examples, " +
                             grouped(j.at("tokens").get<std::int64_t>()) + " tokens, " +
                             grouped(j.at("targets").get<std::int64_t>()) + " targets; ";
  return counts + shortened(source, kLineWidth - counts.size());
}

// A warning line when examples, as trained (cut to the budget under --oversize truncate), are longer than the model's
// max_position_embeddings; empty otherwise. RoPE computes any position, so nothing fails, but a model pretrained up
// to that length has never seen the positions past it: usually a dataset or --budget meant for another model.
std::string positions_warning(std::vector<std::int64_t> const& kept, model::Qwen35Config const& m) {
  std::int64_t longest = 0, over = 0;
  for (std::int64_t len : kept) {
    longest = std::max(longest, len);
    over += len > m.max_position_embeddings;
  }
  if (over == 0) return {};
  return "warning: " + grouped(over) + (over == 1 ? " example is" : " examples are") +
         " longer than the model's max_position_embeddings " + grouped(m.max_position_embeddings) +
         " (the longest: " + grouped(longest) + " tokens); it never saw positions past it";
}

// "eval: 40 examples, 3,104 tokens, 2,990 targets, 3 micro-batches, every 5 steps; synthetic:n=40,seed=9": the
// tokens and targets as the micro-batches hold them (cut to the budget under --oversize truncate).
std::string eval_line(EvalSet const& e, TrainConfig const& c) {
  std::string const counts = "eval: " + grouped(static_cast<std::int64_t>(e.data.examples.size())) + " examples, " +
                             grouped(e.tokens) + " tokens, " + grouped(e.targets) + " targets, " +
                             grouped(static_cast<std::int64_t>(e.plans.size())) +
                             (e.plans.size() == 1 ? " micro-batch" : " micro-batches") + ", every " +
                             std::to_string(c.eval_every) + (c.eval_every == 1 ? " step; " : " steps; ");
  return counts + shortened(c.eval_data, kLineWidth - counts.size());
}

// "batching: packed (paired), budget 8,192, lookahead 64, oversize error; 10 steps of 2 micro-batches" and with
// several ranks "... of 4 micro-batches (2 per rank x 2 ranks)"; --complete-packs adds "(packs completed to it)" after
// the budget.
std::string batching_line(TrainConfig const& c, int world) {
  std::int64_t const per_step = c.micro_batches * world;
  return std::string("batching: ") + batching_name(c.batching) + " (" + pairing_name(c.pairing) + "), budget " +
         grouped(c.token_budget) + (c.complete_packs ? " (packs completed to it)" : "") + ", lookahead " +
         grouped(c.lookahead) + ", oversize " + packing::oversize_policy_name(c.oversize) + "; " + grouped(c.steps) +
         (c.steps == 1 ? " step" : " steps") +
         " of " + grouped(per_step) + (per_step == 1 ? " micro-batch" : " micro-batches") +
         (world > 1 ? " (" + grouped(c.micro_batches) + " per rank x " + std::to_string(world) + " ranks)"
                    : std::string()) +
         (c.epochs > 0 ? ", from --epochs " + std::to_string(c.epochs) : std::string());
}

// "optimizer: AdamW lr 0.003, betas 0.9/0.95, eps 1e-08, weight decay 0.1, clip 1; warmup 2, cosine to 0.0003 at step
// 10" (lr(steps) = min_lr: the end point of the decay, one past the last step).
std::string optimizer_line(TrainConfig const& c) {
  return "optimizer: AdamW lr " + number(c.lr) + ", betas " + number(c.beta1) + "/" + number(c.beta2) + ", eps " +
         number(c.eps) + ", weight decay " + number(c.weight_decay) +
         (c.clip_norm > 0 ? ", clip " + number(c.clip_norm) : std::string(", no clipping")) +
         (c.optimizer_kernel != OptimizerKernel::kAuto
              ? std::string(", kernel ") + optimizer_kernel_name(c.optimizer_kernel)
              : std::string()) +
         "; warmup " +
         std::to_string(c.warmup_steps) + ", cosine to " + number(c.min_lr) + " at step " + std::to_string(c.steps);
}

}  // namespace

std::vector<golden::StepRecord> RunResult::records() const {
  std::vector<golden::StepRecord> out;
  for (StepMetrics const& m : steps) out.push_back(m.record());
  return out;
}

void write_weights(std::string const& dir, model::Qwen35Config const& config,
                   std::vector<std::pair<std::string, at::Tensor>> const& parameters) {
  checkpoint::TensorMap tensors;
  for (auto const& [name, p] : parameters) tensors.emplace(name, p.detach());
  checkpoint::write_checkpoint(dir, tensors);
  checkpoint::write_file_atomically(checkpoint::join(dir, "config.json"), config.to_json() + "\n");
}


namespace {

// Sums small host-side counts over the ranks (through the collectives' device, which NCCL needs).
optim::AllReduceSum all_reduce_sum(std::shared_ptr<parallel::Collectives> const& comm, std::string what) {
  if (!comm) return {};
  return [comm, what](at::Tensor& t) {
    at::Tensor on_device = t.to(comm->device()).contiguous();
    comm->all_reduce_sum(on_device, what);
    t.copy_(on_device);
  };
}

// The mean loss over the whole evaluation set after step `step`, without gradients (Trainer::evaluate). Rank r of W
// evaluates micro-batches r, r + W, ...; losses and counts are summed over the ranks. Every rank runs the same number
// of forwards (a sharded forward's all-gathers are collectives): one left without a micro-batch in the last round
// evaluates the first one again and discards it.
EvalMetrics evaluate(Trainer& trainer, EvalSet const& eval, std::int64_t step, TrainConfig const& c,
                     packing::PackerOptions const& options, c10::Device device, int rank, int world,
                     optim::AllReduceSum const& sum) {
  Clock::time_point const start = Clock::now();
  double loss_sum = 0;
  std::int64_t targets = 0, tokens = 0, examples = 0;
  std::size_t const n = eval.plans.size();
  for (std::size_t first = 0; first < n; first += static_cast<std::size_t>(world)) {
    std::size_t const i = first + static_cast<std::size_t>(rank);
    packing::BatchPlan const& plan = eval.plans[i < n ? i : 0];
    Trainer::EvalSums r;
    std::int64_t batch_tokens = 0;
    if (c.batching == Batching::kPacked) {
      packing::PackedBatch const b = packing::packed_batch(eval.data.examples, plan, options);
      batch_tokens = b.num_example_tokens();
      r = trainer.evaluate(model::make_model_batch(b, device));
    } else {
      packing::PaddedBatch const b = packing::padded_batch(eval.data.examples, plan, options);
      batch_tokens = b.num_tokens();
      r = trainer.evaluate(model::make_model_batch(b, device));
    }
    if (i >= n) continue;  // the repeat that keeps this rank in step with the others
    loss_sum += r.loss_sum;
    targets += r.targets;
    tokens += batch_tokens;
    examples += static_cast<std::int64_t>(plan.size());
  }
  if (sum) {
    at::Tensor totals = at::tensor(std::vector<double>{loss_sum, static_cast<double>(targets),
                                                       static_cast<double>(tokens), static_cast<double>(examples)},
                                   at::TensorOptions().dtype(at::kDouble));
    sum(totals);
    loss_sum = totals[0].item<double>();
    targets = static_cast<std::int64_t>(totals[1].item<double>());
    tokens = static_cast<std::int64_t>(totals[2].item<double>());
    examples = static_cast<std::int64_t>(totals[3].item<double>());
  }
  EvalMetrics m;
  m.step = step;
  m.loss = loss_sum / static_cast<double>(targets);
  m.targets = targets;
  m.tokens = tokens;
  m.examples = examples;
  m.micro_batches = static_cast<std::int64_t>(n);
  m.seconds = seconds_since(start);
  return m;
}

// ---- Steps from --epochs, and the plan of a dry run

std::string plural(std::int64_t n, std::string const& one, std::string const& many) {
  return grouped(n) + " " + (n == 1 ? one : many);
}

// --epochs: `c` with its steps derived from the data: the micro-batches of epochs 0..epochs-1 (as MicroBatchStream
// draws them) over those of a step, rounded down (PyTorch DataLoader's drop_last: a short last step would be a step of
// a few tokens and a grad-norm spike). `line` says so and how many micro-batches that leaves out. Without epochs: `c`
// as given and no line. Throws std::invalid_argument when the epochs hold less than one step, or when --warmup or
// --profile-step do not fit in the derived steps.
TrainConfig resolve_steps(TrainConfig const& c, std::vector<std::int64_t> const& lengths, int world,
                          std::string& line, packing::Progress const* progress) {
  line.clear();
  if (c.epochs == 0) return c;
  packing::PackerOptions const popts = packer_options(c);
  std::vector<std::int64_t> sizes;
  std::int64_t total = 0;
  for (std::int64_t e = 0; e < c.epochs; ++e) {
    sizes.push_back(static_cast<std::int64_t>(
        epoch_micro_batches(lengths, popts, c.pairing, c.batching, static_cast<std::uint64_t>(e), progress)
            .size()));
    total += sizes.back();
  }
  // "1 epoch of 57 micro-batches", "2 epochs of 57 and 61 micro-batches", "3 epochs of 57, 61 and 60 micro-batches";
  // more than 4: "9 epochs of 57 to 61 micro-batches (530 in all)".
  std::string counts;
  if (sizes.size() <= 4) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      counts += (i == 0 ? "" : i + 1 == sizes.size() ? " and " : ", ") + grouped(sizes[i]);
    }
  } else {
    auto const [least, most] = std::minmax_element(sizes.begin(), sizes.end());
    counts = grouped(*least) + " to " + grouped(*most);
  }
  std::string const epochs = "--epochs " + std::to_string(c.epochs) + ": " + plural(c.epochs, "epoch", "epochs") +
                             " of " + counts + (total == 1 ? " micro-batch" : " micro-batches") +
                             (sizes.size() > 4 ? " (" + grouped(total) + " in all)" : std::string());
  std::int64_t const per_step = c.micro_batches * world;
  if (total < per_step) {
    throw std::invalid_argument(
        epochs + (sizes.size() > 1 && sizes.size() <= 4 ? " (" + grouped(total) + " in all)" : std::string()) +
        (c.epochs == 1 ? " holds" : " hold") + " fewer than one step takes (" + grouped(per_step) +
        " micro-batches: --micro-batches " + std::to_string(c.micro_batches) +
        (world > 1 ? " x " + std::to_string(world) + " ranks" : std::string()) +
        "); give more --epochs, fewer --micro-batches or a smaller --budget");
  }
  TrainConfig r = c;
  r.steps = total / per_step;
  std::int64_t const left = total - r.steps * per_step;
  line = epochs + "; " + plural(r.steps, "step", "steps") + " x " + plural(per_step, "micro-batch", "micro-batches") +
         ", " + (left == 0 ? std::string("none") : grouped(left)) + " left out";
  std::string problems;
  std::string const of = " the " + plural(r.steps, "step", "steps") + " of --epochs " + std::to_string(c.epochs);
  if (c.warmup_steps > r.steps) {
    problems += "--warmup " + std::to_string(c.warmup_steps) + " must be <=" + of;
  }
  if (c.profile_step >= r.steps) {
    problems += std::string(problems.empty() ? "" : "; ") + "--profile-step " + std::to_string(c.profile_step) +
                " must be <" + of + " (0-based)";
  }
  if (!problems.empty()) throw std::invalid_argument(problems + " (" + line + ")");
  return r;
}

// Least, median (the mean of the middle two for an even count) and most of a count over micro-batches: "3 / 4.5 / 6".
class Spread {
 public:
  void add(std::int64_t v) {
    ++counts_[v];
    ++n_;
  }
  std::string str() const {
    if (n_ == 0) return "-";
    return grouped(counts_.begin()->first) + " / " + median() + " / " + grouped(counts_.rbegin()->first);
  }

 private:
  std::string median() const {
    auto value_at = [this](std::int64_t index) {  // of the sorted values
      for (auto const& [v, k] : counts_) {
        if (index < k) return v;
        index -= k;
      }
      return counts_.rbegin()->first;
    };
    std::int64_t const a = value_at((n_ - 1) / 2), b = value_at(n_ / 2);
    return (a + b) % 2 == 0 ? grouped((a + b) / 2) : grouped((a + b) / 2) + ".5";
  }
  std::map<std::int64_t, std::int64_t> counts_;  // value → micro-batches: bounded by the budget, not the run's length
  std::int64_t n_ = 0;
};

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GiB", bytes / (1 << 30));
  return buf;
}

// --dry-run: the run's model, data and plan as it would train them, then nothing: no step, no file. The memory of the
// weights, gradients and AdamW state comes from the parameters' names and shapes (a model on the meta device, nothing
// allocated or initialised).
RunResult dry_run(TrainConfig const& c, RunResult result, Data const& data, std::vector<std::int64_t> const& lengths,
                  std::string const& epochs_line, EvalSet const* eval, parallel::Collectives const* comm, Log& log,
                  packing::Progress const* progress) {
  int const world = result.world_size;
  model::ModelOptions mopts = model_options(c);
  mopts.device = c10::kMeta;
  model::Qwen35ForCausalLM const model(result.model_config, mopts);
  log.line("dry run: planning the run without training it or writing any file");
  log.line(describe_model(result.model_config, model.num_parameters(), c) +
           (comm ? ", sharded over " + std::to_string(world) + " ranks (" + comm->backend_name() + ")" : ""));
  packing::PackerOptions const popts = packer_options(c);
  std::vector<std::int64_t> const kept = packing::budgeted_lengths(lengths, popts);  // cut to the budget: trained
  log.line(data_line(data, c.data));
  std::string const positions = positions_warning(kept, result.model_config);
  if (!positions.empty()) log.line(positions);
  log.line(batching_line(c, world));
  log.line(optimizer_line(c));
  if (!epochs_line.empty()) log.line(epochs_line);
  if (eval) log.line(eval_line(*eval, c));

  // Every micro-batch the run trains, over all ranks, in order.
  MicroBatchStream stream(lengths, popts, c.pairing, c.batching, progress);
  std::int64_t const per_step = c.micro_batches * world;
  std::int64_t const count = c.steps * per_step;
  Spread tokens, examples;
  std::int64_t all_tokens = 0, slots = 0, first_epoch = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    packing::BatchPlan const& plan = stream.next();
    if (i == 0) first_epoch = stream.epoch_size();
    std::int64_t n = 0, longest = 0;
    for (std::int64_t id : plan) {
      n += kept[static_cast<std::size_t>(id)];
      longest = std::max(longest, kept[static_cast<std::size_t>(id)]);
    }
    tokens.add(n);
    examples.add(static_cast<std::int64_t>(plan.size()));
    all_tokens += n;
    slots += c.batching == Batching::kPacked ? n : static_cast<std::int64_t>(plan.size()) * longest;
  }
  double const epochs = static_cast<double>(stream.epochs_started() - 1) +
                        static_cast<double>(stream.next_in_epoch()) / static_cast<double>(stream.epoch_size());
  std::ostringstream plan;
  plan << std::fixed << std::setprecision(2) << "plan: " << plural(c.steps, "step", "steps") << " x "
       << plural(per_step, "micro-batch", "micro-batches")
       << (world > 1 ? " (" + std::to_string(c.micro_batches) + " per rank x " + std::to_string(world) + " ranks)"
                     : std::string())
       << " = " << plural(count, "micro-batch", "micro-batches") << ", ";
  if (epochs < 1) {
    plan << epochs << " of an epoch (epoch 0: " << plural(first_epoch, "micro-batch", "micro-batches") << ")";
  } else if (epochs == std::floor(epochs)) {
    plan << plural(static_cast<std::int64_t>(epochs), "epoch", "epochs");
  } else {
    plan << epochs << " epochs";
  }
  log.line(plan.str());
  std::ostringstream per;
  per << std::fixed << std::setprecision(1) << "per micro-batch (min / median / max): tokens " << tokens.str()
      << ", examples " << examples.str() << "; padding "
      << (slots > 0 ? 100.0 * static_cast<double>(slots - all_tokens) / static_cast<double>(slots) : 0.0) << "% of "
      << grouped(slots) << " positions";
  log.line(per.str());

  // Held from step to step: weights, gradients (in the master dtype), AdamW's two moments, and with bf16 compute
  // the bf16 copy of the weights; a sharded run holds 1/world of each on every rank.
  std::int64_t const params = model.num_parameters();
  std::int64_t const master = static_cast<std::int64_t>(c10::elementSize(mopts.dtype));
  at::ScalarType const compute_dtype = mopts.compute_dtype.value_or(mopts.dtype);
  std::int64_t const compute =
      compute_dtype == mopts.dtype ? 0 : static_cast<std::int64_t>(c10::elementSize(compute_dtype));
  std::int64_t const per_param = 4 * master + compute;
  double const bytes = static_cast<double>(params) * static_cast<double>(per_param);
  std::string const master_name = mopts.dtype == at::kDouble ? "fp64" : "fp32";
  std::string memory = "memory: " + grouped(params) + " parameters x " + std::to_string(per_param) + " bytes = " +
                       gib(bytes);
  if (world > 1) memory += ", " + gib(bytes / world) + " per rank over " + std::to_string(world) + " ranks";
  log.line(memory + "; activations not included");
  log.line("  per parameter: " + master_name + " weights " + std::to_string(master) + " + gradients " +
           std::to_string(master) + " + AdamW moments 2 x " + std::to_string(master) +
           (compute > 0 ? " + " + std::string(dtype_name(c.dtype)) + " compute copy " + std::to_string(compute)
                        : std::string()) +
           " bytes");
  if (!c.weights.empty()) log.line("weights: " + c.weights + " (not read by a dry run)");
  if (!c.resume.empty()) log.line("resume: " + c.resume + " (not read by a dry run; the plan is the whole run's)");
  log.line("dry run: stopped before the first step; no file written");
  return result;
}

}  // namespace

RunResult run_training(TrainConfig const& given, RunOptions const& options) {
  Clock::time_point const start = Clock::now();
  given.validate();
  Log log(options.log, options.progress_bar);
  std::shared_ptr<parallel::Collectives> const& comm = options.comm;
  int const rank = comm ? comm->rank() : 0;
  int const world = comm ? comm->world_size() : 1;
  bool const writer = rank == 0;  // the rank that writes golden files and weights

  std::optional<GoldenCheck> const golden_check =
      given.golden_check.empty() ? std::nullopt : std::optional<GoldenCheck>(GoldenCheck(given, options.tolerance));
  at::Device const device = comm ? comm->device() : c10::Device(given.device);
  if (!comm) check_device(given);
  if (given.threads > 0) at::set_num_threads(static_cast<int>(given.threads));

  // Progress lines of long phases erase the progress bar first (both go to the terminal).
  packing::Progress progress_settings;
  packing::Progress const* reporting = nullptr;  // where long phases report; nullptr: silent
  if (options.progress != nullptr) {
    progress_settings = *options.progress;
    progress_settings.before_line = [&log, also = options.progress->before_line] {
      log.clear_bar();
      if (also) also();
    };
    reporting = &progress_settings;
  }

  RunResult result;
  result.rank = rank;
  result.world_size = world;
  result.model_config = load_model_config(given);
  Data const data = load_data(given.data, "--data", result.model_config.vocab_size, reporting);
  check_targets(data, given.data, given);
  std::vector<std::int64_t> const lengths = packing::example_lengths(data.examples);
  // From here on the run's settings are `config`: with --epochs, its steps are the derived ones (the schedule, the
  // loop, the fingerprint and the provenance all see them).
  std::string epochs_line;
  TrainConfig const config = resolve_steps(given, lengths, world, epochs_line, reporting);
  result.total_steps = config.steps;
  packing::PackerOptions const popts = packer_options(config);
  std::optional<EvalSet> const eval =
      config.eval_data.empty() ? std::nullopt
                               : std::optional<EvalSet>(plan_eval_set(config, result.model_config.vocab_size, popts,
                                                                      reporting));
  std::string const fingerprint = run_fingerprint(config, result.model_config, data, world).dump();
  if (comm) {
    // The ranks must also agree on the evaluation (its forwards gather weights collectively); a checkpoint does not
    // record it, so a resumed run may evaluate another set or none.
    Json ranks = Json::parse(fingerprint);
    if (eval) ranks["eval"] = eval_settings(*eval, config);
    check_same_settings(*comm, ranks.dump());
  }
  check_outputs(config, writer);
  if (config.dry_run) {
    return dry_run(config, std::move(result), data, lengths, epochs_line, eval ? &*eval : nullptr, comm.get(), log,
                   reporting);
  }

  log.line(describe_model(result.model_config, model::parameter_count(result.model_config), config) +
           (comm ? ", sharded over " + std::to_string(world) + " ranks (" + comm->backend_name() + ")" : ""));
  packing::ProgressPhase building(reporting, "building the model");
  model::ModelOptions mopts = model_options(config);
  if (comm) mopts.device = c10::kMeta;  // the forward reads the sharded weights; the model holds names and shapes
  model::Qwen35ForCausalLM model(result.model_config, mopts);
  std::unique_ptr<parallel::FullyShardedWeights> sharded;
  if (comm) {
    parallel::FullyShardOptions sopts;
    sopts.master_dtype = mopts.dtype;
    sopts.mixed_precision.param_dtype = mopts.compute_dtype;
    sopts.mixed_precision.reduce_dtype = mopts.dtype;  // gradients reduced in the master dtype (fp32, fp64 in tests)
    sopts.reshard_after_forward = config.reshard_after_forward;
    sharded = std::make_unique<parallel::FullyShardedWeights>(result.model_config, comm, sopts);
  }
  if (!config.weights.empty()) {
    if (sharded) {
      parallel::LoadedRows const loaded = parallel::load_sharded_checkpoint(*sharded, config.weights);
      for (optim::NamedParameter const& p : sharded->parameters()) check_finite_weight(config.weights, p.name, p.param);
      log.line("weights: " + config.weights + " (" + std::to_string(loaded.tensors) + " tensors from " +
               std::to_string(loaded.files) + " file(s), each rank reading its own rows; " +
               std::to_string(loaded.skipped) + " vision/MTP tensors skipped)");
    } else {
      checkpoint::Qwen35TextCheckpoint ckpt = checkpoint::read_qwen35_text_checkpoint(config.weights);
      for (auto const& [name, t] : ckpt.tensors) check_finite_weight(config.weights, name, t);
      model.load_state(ckpt.tensors, /*convert_dtype=*/true);
      log.line("weights: " + config.weights + " (" + std::to_string(ckpt.tensors.size()) + " tensors from " +
               std::to_string(ckpt.files.size()) + " file(s); " +
               std::to_string(ckpt.skipped_visual + ckpt.skipped_mtp) + " vision/MTP tensors skipped)");
    }
  } else if (sharded) {
    sharded->init_parameters(config.seed);
  }
  building.done(config.weights.empty() ? "initialised" : "weights loaded");

  log.line(data_line(data, config.data));
  std::string const positions = positions_warning(packing::budgeted_lengths(lengths, popts), result.model_config);
  if (!positions.empty()) log.line(positions);
  MicroBatchStream stream(lengths, popts, config.pairing, config.batching, reporting);
  log.line(batching_line(config, world));
  log.line(optimizer_line(config));
  if (!epochs_line.empty()) log.line(epochs_line);
  if (eval) log.line(eval_line(*eval, config));

  TrainerOptions topts;
  topts.adamw.beta1 = config.beta1;
  topts.adamw.beta2 = config.beta2;
  topts.adamw.eps = config.eps;
  topts.adamw.weight_decay = config.weight_decay;
  topts.adamw.decays = optim::qwen35_decays;
  topts.schedule.peak_lr = config.lr;
  topts.schedule.min_lr = config.min_lr;
  topts.schedule.warmup_steps = config.warmup_steps;
  topts.schedule.total_steps = config.steps;
  topts.clip_norm = config.clip_norm;
  switch (config.optimizer_kernel) {
    case OptimizerKernel::kAuto: topts.adamw.kernel = optim::AdamWKernel::kAuto; break;
    case OptimizerKernel::kFusepack: topts.adamw.kernel = optim::AdamWKernel::kFusepack; break;
    case OptimizerKernel::kAtenFused: topts.adamw.kernel = optim::AdamWKernel::kFused; break;
    case OptimizerKernel::kForeach: topts.adamw.kernel = optim::AdamWKernel::kForeach; break;
  }
  topts.all_reduce = all_reduce_sum(comm, "all-reduce of the step's targets, loss or gradient norm");
  std::unique_ptr<LayerActivationMeter> local;
  if (!sharded) local = std::make_unique<LayerActivationMeter>(model);
  std::unique_ptr<Trainer> trainer =
      sharded ? std::make_unique<Trainer>(model, *sharded, sharded->parameters(), topts)
              : std::make_unique<Trainer>(model, *local, model_parameters(model), topts);
  optim::AllReduceSum const sum_counts = all_reduce_sum(comm, "all-reduce of the step's token counts");
  optim::AllReduceSum const sum_eval = all_reduce_sum(comm, "all-reduce of the evaluation's loss and counts");

  // This rank's trainable tensors with their rows, as a training checkpoint stores them.
  std::vector<ParameterRows> rows;
  for (optim::NamedParameter const& p : trainer->optimizer().parameters()) {
    parallel::ShardLayout const l =
        sharded ? sharded->layout(p.name) : parallel::ShardLayout::of(p.param.sizes().vec(), 0, 1);
    rows.push_back({p.name, p.param, l.begin, l.rows});
  }
  std::int64_t first_step = 0;
  if (!config.resume.empty()) {
    std::string const from = config.resume == "latest" ? config.save_dir : config.resume;
    TrainingProgress const progress = load_training_checkpoint(from, rows, trainer->optimizer(), fingerprint);
    trainer->resume_after(progress.steps_taken);
    stream.restore(progress.epochs_started, progress.next_micro_batch);
    first_step = progress.steps_taken;
    log.line("resumed from " + progress.checkpoint + " after step " + std::to_string(first_step - 1) +
             " (" + std::to_string(first_step) + " steps taken)");
  }
  SaveOptions save;
  save.dir = config.save_dir;
  save.keep = config.keep_checkpoints;
  std::int64_t saved_after = first_step;  // steps taken at the last save (or the resume point)
  // The stream after the last step's micro-batches: it runs a step ahead once the next step's batches are built.
  std::pair<std::uint64_t, std::int64_t> stream_after_step{stream.epochs_started(), stream.next_in_epoch()};
  auto save_now = [&](std::int64_t steps_taken) {
    TrainingProgress const progress{steps_taken, stream_after_step.first, stream_after_step.second, {}};
    std::string const dir = save_training_checkpoint(save, progress, rows, trainer->optimizer(), fingerprint,
                                                     comm.get());
    saved_after = steps_taken;
    result.last_checkpoint = dir;
    log.line("checkpoint saved: " + dir);
  };

  std::ostringstream device_text;
  device_text << (comm ? c10::Device(device.type()) : device);
  std::optional<MetricsFile> metrics;
  if (writer && !config.metrics.empty()) {
    // The run's whole settings (the golden provenance's fields, and the evaluation's), which the log only summarises.
    Json run = Json::parse(golden::provenance_json(
        make_provenance(config, result.model_config, data, options.command, world, device_text.str())));
    if (eval) run["eval"] = eval_settings(*eval, config);
    metrics.emplace(config.metrics, run.dump(), /*append=*/!config.resume.empty());
  }
  result.setup_seconds = seconds_since(start);
  if (device.is_cuda()) {  // the peak reported at the end is the training steps', not the loading's
    reset_peak_allocated_bytes(device);
  }
  std::ostringstream ready;
  ready << "ready in " << std::fixed << std::setprecision(1) << result.setup_seconds << " s";
  log.line(ready.str());
  // A step's micro-batches: this rank's batches on the device, the step's counts, and where the stream stands after
  // them (what a checkpoint saved after the step records).
  struct PreparedStep {
    std::vector<model::ModelBatch> batches;
    StepMetrics counts;
    std::uint64_t epochs_started = 0;
    std::int64_t next_in_epoch = 0;
  };
  auto prepare_step = [&]() {
    PreparedStep p;
    StepMetrics& m = p.counts;
    m.micro_batches = config.micro_batches * world;
    for (std::int64_t i = 0; i < config.micro_batches * world; ++i) {
      packing::BatchPlan const& plan = stream.next();
      if (i / config.micro_batches != rank) continue;  // another rank's micro-batch
      if (config.batching == Batching::kPacked) {
        packing::PackedBatch const b = packing::packed_batch(data.examples, plan, popts);
        m.tokens += b.num_example_tokens();  // a filler's tokens are computed positions, not tokens
        m.slots += b.num_tokens();
        m.examples += b.num_examples();
        p.batches.push_back(model::make_model_batch(b, device));
      } else {
        packing::PaddedBatch const b = packing::padded_batch(data.examples, plan, popts);
        m.tokens += b.num_tokens();
        m.slots += b.num_slots();
        m.examples += b.rows;
        p.batches.push_back(model::make_model_batch(b, device));
      }
      if (options.edit_micro_batch) options.edit_micro_batch(p.batches.back());
    }
    p.epochs_started = stream.epochs_started();
    p.next_in_epoch = stream.next_in_epoch();
    return p;
  };
  // A step's batches are built during the step before, once its forwards and backwards are queued and before its
  // update waits for them, so the host packs and copies while the GPU computes; the first step's before the loop.
  std::optional<PreparedStep> next;
  if (first_step < config.steps) next = prepare_step();
  // --profile-step N prepares the profiler before step N - 1 (its warm-up, as torch.profiler's schedule does) and
  // measures step N alone: the profiler's own start-up is paid in the step before.
  std::optional<StepProfiler> profiler;
  for (std::int64_t s = first_step; s < config.steps; ++s) {
    if (comm) comm->set_step(s);
    if (!profiler && (s == config.profile_step - 1 || s == config.profile_step)) {
      profiler.emplace(config.profile_step, ops::backend_name(config.backend), device.is_cuda(),
                       device.has_index() ? device.index() : 0);
    }
    bool const profiled = s == config.profile_step;
    if (profiled) profiler->start();
    if (device.is_cuda()) {
      result.resident_device_bytes = std::max(result.resident_device_bytes, allocated_bytes(device).current);
    }
    Clock::time_point const step_start = Clock::now();
    PreparedStep const current = std::move(*next);
    next.reset();
    StepMetrics m = current.counts;
    trainer->begin_step(current.batches);
    if (s + 1 < config.steps) next = prepare_step();
    StepResult const r = trainer->finish_step();
    stream_after_step = {current.epochs_started, current.next_in_epoch};
    // A stop request (SIGINT, SIGTERM) ends the run after this step; it travels with the step's counts, so every rank
    // learns of any rank's request in the same all-reduce and all stop after the same step.
    int stop = options.stop_requested ? options.stop_requested() : 0;
    if (comm) {
      at::Tensor counts = at::tensor(std::vector<std::int64_t>{m.tokens, m.slots, m.examples, stop > 0 ? 1 : 0});
      sum_counts(counts);
      m.tokens = counts[0].item<std::int64_t>();
      m.slots = counts[1].item<std::int64_t>();
      m.examples = counts[2].item<std::int64_t>();
      if (stop == 0 && counts[3].item<std::int64_t>() > 0) stop = SIGTERM;  // another rank's request
    }
    m.step = r.step;
    m.loss = r.loss;
    m.grad_norm = r.grad_norm;
    m.lr = r.lr;
    m.targets = r.targets;
    m.seconds = seconds_since(step_start);
    result.steps.push_back(m);
    log.line(step_log_line(m, config.steps));
    if (metrics) metrics->step(m, device.is_cuda() ? allocated_bytes(device).current : -1);
    if (profiled) {
      result.profile = profiler->stop();
      profiler.reset();
      log.text(profile_text(*result.profile));
      if (result.profile->ops_not_on_backend > 0) {  // an op ran another implementation than asked: never silently
        throw std::runtime_error("--profile-step: " + std::to_string(result.profile->ops_not_on_backend) +
                                 " op calls did not run the requested backend " + ops::backend_name(config.backend));
      }
    }
    // Not when stopping: an interrupted run saves and exits at once.
    if (eval && stop == 0 && evaluates_after(config, s)) {
      EvalMetrics const e = evaluate(*trainer, *eval, s, config, popts, device, rank, world, sum_eval);
      result.evals.push_back(e);
      log.line(eval_log_line(e, config.steps));
      if (metrics) metrics->eval(e);
    }
    if (config.save_every > 0 && (s + 1) % config.save_every == 0) save_now(s + 1);
    if (stop > 0) {
      result.interrupted_by = stop;
      if (!config.save_dir.empty() && saved_after != s + 1) save_now(s + 1);
      log.line("interrupted before step " + std::to_string(s + 1) +
               (config.save_dir.empty() ? std::string(" (no save dir: nothing saved)")
                                        : "; resume with --resume " + result.last_checkpoint));
      break;
    }
    double const per_step = seconds_since(start) / static_cast<double>(s + 1 - first_step);
    log.bar(progress_bar(s + 1, config.steps, m.tokens_per_second(),
                         per_step * static_cast<double>(config.steps - s - 1)));
  }
  log.clear_bar();
  if (!config.save_dir.empty() && result.interrupted_by == 0 && saved_after != trainer->steps_taken()) {
    save_now(trainer->steps_taken());
  }
  if (device.is_cuda()) {
    result.peak_device_bytes = allocated_bytes(device).peak;
    // A profiled step measures its own peak, resetting the allocator's: the run's peak is the larger of the two.
    if (result.profile) result.peak_device_bytes = std::max(result.peak_device_bytes, result.profile->peak_bytes_before);
    auto gib = [](std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); };
    std::ostringstream peak;
    peak << "peak GPU memory: " << std::fixed << std::setprecision(2) << gib(result.peak_device_bytes)
         << " GiB allocated on " << device << (comm ? " (rank " + std::to_string(rank) + ")" : std::string());
    if (result.resident_device_bytes >= 0) {
      peak << "; " << gib(result.resident_device_bytes) << " GiB held between steps (weights, optimizer state), "
           << gib(result.peak_device_bytes - result.resident_device_bytes) << " GiB more during a step";
    }
    if (local && local->most_kept_by_layers() >= 0) {
      result.layer_activation_bytes = local->most_kept_by_layers();
      peak << "; the decoder layers kept " << gib(result.layer_activation_bytes) << " GiB for the backward";
    }
    log.line(peak.str());
  }

  if (!config.output_dir.empty() && result.interrupted_by == 0) {
    if (sharded) {
      parallel::save_sharded_checkpoint(*sharded, *comm, config.output_dir, result.model_config);
    } else {
      write_weights(config.output_dir, result.model_config, model.named_parameters());
    }
    log.line("weights written: " + config.output_dir + " (config.json, model.safetensors)");
  }

  result.golden.provenance = make_provenance(config, result.model_config, data, options.command, world,
                                             device_text.str());
  result.golden.steps = result.records();
  if (!config.golden_write.empty() && writer && result.interrupted_by == 0) {
    golden::write_golden(config.golden_write, result.golden);
    log.line("golden written: " + config.golden_write);
  }
  if (golden_check && result.interrupted_by == 0) {
    golden::GoldenFile const& reference = golden_check->reference();
    for (std::string const& note : provenance_differences(reference.provenance, result.golden.provenance)) {
      log.line("note: " + note);
    }
    result.comparison = golden_check->compare(result.golden.steps);
    std::string const layout = Json::parse(reference.provenance.batching).value("layout", "?");
    // The paths are shortened to keep the lines within kLineWidth wherever the files are.
    std::string const head = "golden check against ";
    bool const baseline = golden_check->has_baseline();
    std::string const tail = " (" + reference.provenance.dtype + ", " + layout + ")" + (baseline ? "," : ":");
    log.line(head + shortened(config.golden_check, kLineWidth - head.size() - tail.size()) + tail);
    if (baseline) {
      std::string const allowed = "  allowed 2x the drift of ";
      std::string const step = " + one " + std::string(dtype_name(config.dtype)) + " rounding step:";
      log.line(allowed + shortened(config.golden_baseline, kLineWidth - allowed.size() - step.size()) + step);
    }
    log.text(result.comparison->table());
  }
  if (!result.steps.empty()) {
    result.summary = summarize(result.steps, seconds_since(start));
    log.text(summary_text(result.summary));
    if (metrics) metrics->summary(result.summary);
  }
  return result;
}

}  // namespace fusepack::train
