// fusepack-train: fine-tunes a Qwen3.5 model (a preset, or config.json + safetensors) on a JSONL or synthetic dataset,
// packed or padded, and optionally writes the run as a golden file or checks it against one step by step. Launched
// by torchrun (or with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set), each process is one rank of a sharded run.
// Exit code 0 on success, 1 when --golden-check fails, 2 on any error (message on stderr), 128 + N when signal N
// stopped the run between two steps (after saving a training checkpoint when --save-dir is given).
#include "trainer/model/config.h"
#include "trainer/parallel/collectives.h"
#include "trainer/parallel/dist_env.h"
#include "trainer/train/config.h"
#include "trainer/train/run.h"

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <string>

namespace {

using namespace fusepack;

// The first SIGINT/SIGTERM asks the run to stop at the next step boundary (saving a checkpoint when --save-dir is
// given); a second one ends the process at once.
std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int signal) {
  if (g_stop_signal.exchange(signal) != 0) std::_Exit(128 + signal);
  static char const message[] =
      "\nfusepack-train: stopping after the current step (again to stop at once)\n";
  ssize_t const ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
  (void)ignored;
}
using train::TrainConfig;

struct Args {
  TrainConfig config;
  std::string batching = "packed";
  std::string pairing = "paired";
  std::string oversize = "error";
  std::string backend = "composite";
  std::string dtype = "fp32";
  golden::TolerancePolicy tolerance;
  bool progress = true;
  double collective_timeout = 600;  // seconds
  std::string activation_checkpointing = "none";
  std::string optimizer_kernel = "auto";
};

void add_tolerance(CLI::App& app, std::string const& field, golden::FieldTolerance& tol) {
  app.add_option("--" + field + "-atol", tol.atol, "golden check, " + field + ": absolute tolerance");
  app.add_option("--" + field + "-rtol", tol.rtol, "golden check, " + field + ": tolerance relative to |golden|");
  app.add_option("--" + field + "-drift", tol.drift_per_step, "golden check, " + field + ": extra allowance per step");
}

std::string command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    std::string const a = i == 0 ? std::string("fusepack-train") : std::string(argv[i]);
    bool const plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=.,:/+@%") ==
                                         std::string::npos;
    std::string quoted = "'";
    for (char ch : a) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    out += (i ? " " : "") + (plain ? a : quoted + "'");
  }
  return out;
}

// A seed is an unsigned 64-bit integer; CLI11 reads "-1" as 2^64 - 1, so a sign is refused before it converts.
std::string non_negative_integer(std::string& text) {
  if (text.find('-') == std::string::npos) return {};
  return "must be a non-negative integer (0 to 2^64-1); got " + text;
}

// CLI11 reports a bad value as "Could not convert: --budget = 64,1e12", every value of a repeated option joined:
// name the value that does not convert, and say that the option was given more than once (the last one counts).
std::string parse_error_message(CLI::App const& app, CLI::ParseError const& e) {
  std::string const what = e.what();
  std::string const prefix = "Could not convert: ";
  if (what.rfind(prefix, 0) != 0) return what;
  std::size_t const eq = what.find(" = ");
  std::string const name =
      what.substr(prefix.size(), eq == std::string::npos ? std::string::npos : eq - prefix.size());
  CLI::Option const* o = app.get_option_no_throw(name);
  if (o == nullptr || o->results().empty()) return what;
  std::string message = name + ": '" + o->results().back() + "' is not a valid " + o->get_type_name() + " value";
  if (o->results().size() > 1) {
    std::string values;
    for (std::string const& v : o->results()) values += (values.empty() ? "" : ", ") + v;
    message += " (" + name + " was given " + std::to_string(o->results().size()) + " times: " + values +
               "; the last one counts)";
  }
  return message;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fine-tunes a Qwen3.5 model on packed or padded batches; writes or checks golden loss files.",
               "fusepack-train"};
  // A repeated option: the last one wins, as in most command-line tools (a script can append an override).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  Args args;
  TrainConfig& c = args.config;
  std::string presets;
  for (std::string const& name : model::preset_names()) presets += (presets.empty() ? "" : ", ") + name;
  app.add_option("--preset", c.preset, "model preset: " + presets);
  app.add_option("--config", c.model_config, "Hugging Face config.json (or the folder holding it), instead of --preset");
  app.add_option("--weights", c.weights,
                 "initial weights: a safetensors file or a checkpoint folder (default: init from --seed)");
  app.add_option("--data", c.data, "JSONL file ({\"input_ids\": [...], \"labels\": [...]} per line) or "
                                   "synthetic:n=1000,median=900,sigma=0.9,min=1,max=8192,prompt=0,seed=1 "
                                   "(required, except with --print-config)");
  app.add_option("--eval-data", c.eval_data,
                 "evaluation set, as --data: its mean loss (no gradient, no update) is logged and recorded in "
                 "--metrics every --eval-every steps and after the last; cut into micro-batches as the training data");
  app.add_option("--eval-every", c.eval_every, "with --eval-data: evaluate after every N optimizer steps (N >= 1)");
  app.add_option("--batching", args.batching, "packed or padded")->capture_default_str();
  app.add_option("--pairing", args.pairing,
                 "paired (padded batches hold exactly the packed batches' examples) or fill")
      ->capture_default_str();
  app.add_option("--budget", c.token_budget, "token budget of a micro-batch")->capture_default_str();
  app.add_option("--lookahead", c.lookahead, "examples the packer may look ahead")->capture_default_str();
  app.add_option("--oversize", args.oversize, "examples longer than the budget: error or truncate")
      ->capture_default_str();
  app.add_flag("--complete-packs", c.complete_packs,
               "packed batching: complete every micro-batch to exactly --budget tokens with a filler example of its "
               "own that has no targets (one shape for every step; the loss and gradients are the examples' alone)");
  app.add_option("--micro-batches", c.micro_batches, "micro-batches per optimizer step (gradient accumulation)")
      ->capture_default_str();
  app.add_option("--steps", c.steps, "optimizer steps (or --epochs)")->capture_default_str();
  app.add_option("--epochs", c.epochs,
                 "train N passes over the data instead of --steps: steps = the micro-batches of N epochs / "
                 "micro-batches per step, rounded down (the left-out micro-batches are logged)");
  app.add_option("--lr", c.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", c.min_lr, "learning rate at the end of the cosine decay")->capture_default_str();
  app.add_option("--warmup", c.warmup_steps, "linear warmup steps")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "AdamW decoupled weight decay (parameters of 2+ dims)")
      ->capture_default_str();
  app.add_option("--beta1", c.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", c.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--eps", c.eps, "AdamW eps")->capture_default_str();
  app.add_option("--clip-norm", c.clip_norm, "clip the global gradient norm (0: no clipping)")->capture_default_str();
  app.add_option("--optimizer-kernel", args.optimizer_kernel,
                 "AdamW's implementation: auto (fusepack's one-pass kernel on CUDA, ATen's foreach operations on "
                 "the CPU), fusepack, aten-fused (torch's fused=True kernel) or foreach")
      ->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the parameter init and the epoch shuffles")
      ->capture_default_str()
      ->check(CLI::Validator(non_negative_integer, "UINT64"));
  app.add_option("--backend", args.backend, "composite (ATen, CPU or GPU) or fused (fusepack's CUDA kernels)")
      ->capture_default_str();
  app.add_option("--device", c.device, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--dtype", args.dtype, "fp64, fp32 or bf16 (bf16 compute, fp32 master weights; CUDA)")
      ->capture_default_str();
  app.add_option("--threads", c.threads, "ATen CPU threads (0: ATen's default; 1: reproducible to the bit)")
      ->capture_default_str();
  app.add_option("--output", c.output_dir,
                 "write the fine-tuned weights here (config.json + model.safetensors); the folder must be new or "
                 "empty unless --overwrite");
  app.add_flag("--overwrite", c.overwrite_output, "let --output replace the files of a folder that holds some");
  app.add_option("--save-dir", c.save_dir,
                 "training checkpoints (weights, optimizer state, data position) go here, in step-N folders, with "
                 "`latest` naming the newest; saved at the end, every --save-every steps and on SIGINT/SIGTERM");
  app.add_option("--save-every", c.save_every, "save a training checkpoint every N steps (0: only at the end)")
      ->capture_default_str();
  app.add_option("--keep-checkpoints", c.keep_checkpoints, "how many of the newest training checkpoints to keep")
      ->capture_default_str();
  app.add_option("--resume", c.resume,
                 "continue from a training checkpoint: its folder, a save dir, or `latest` (--save-dir's); the run "
                 "must repeat its settings (any number of ranks)");
  app.add_option("--metrics", c.metrics,
                 "write every step's loss, grad norm, lr, tokens, tokens/s and memory here as JSON Lines (after a "
                 "first line with the run's settings; a resumed run appends)");
  app.add_option("--golden-write", c.golden_write, "write the run as a golden loss file");
  app.add_option("--golden-check", c.golden_check, "compare the run with a golden loss file step by step (exit 1 on "
                                                   "failure)");
  app.add_option("--golden-baseline", c.golden_baseline,
                 "with --golden-check, for bf16 runs: the golden's own run repeated in this dtype (written with "
                 "--golden-write); allowed = 2x its drift from the golden + one rounding step of the dtype");
  add_tolerance(app, "loss", args.tolerance.loss);
  add_tolerance(app, "grad-norm", args.tolerance.grad_norm);
  add_tolerance(app, "lr", args.tolerance.lr);
  app.add_option("--profile-step", c.profile_step, "profile optimizer step N (0-based)");
  app.add_option("--activation-checkpointing", args.activation_checkpointing,
                 "none, full (every decoder layer) or every-N (layers 0, N, 2N, ...): keep only a checkpointed layer's "
                 "input and run its forward again in the backward (same gradients, less memory)")
      ->capture_default_str();
  app.add_option("--reshard-after-forward", c.reshard_after_forward,
                 "sharded runs (torchrun): free each layer's gathered weights after its forward and gather them again "
                 "for its backward (true), or keep them until the backward (false: more memory, less traffic)")
      ->capture_default_str();
  app.add_option("--collective-timeout", args.collective_timeout,
                 "sharded runs: seconds any collective or rendezvous may take before every rank stops with an error "
                 "naming the rank that did not take part")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("!--no-progress", args.progress,
               "no progress bar (drawn only when stderr is a terminal) and no progress lines of long phases (reading "
               "a large dataset, planning epochs, building a large model: on stderr every 2 s)");
  bool print_config = false;
  app.add_flag("--print-config", print_config,
               "print the model's Hugging Face config.json (of --preset or --config) on stdout and exit: what "
               "transformers' Qwen3_5TextConfig reads, so a baseline can be built on the same model");
  app.add_flag("--dry-run", c.dry_run,
               "load the model config and data, check every setting, plan the run, print the plan (steps, epochs, "
               "tokens and examples per micro-batch, padding, memory of weights + gradients + AdamW state) and exit "
               "without training or writing anything");
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "fusepack-train: %s\nRun with --help for more information.\n",
                 parse_error_message(app, e).c_str());
    return 2;
  }
  // An empty path would mean "none" to TrainConfig: `--output ''` (an unset shell variable) then wrote nothing.
  for (char const* path_option : {"--preset", "--config", "--weights", "--data", "--eval-data", "--output",
                                  "--save-dir", "--resume", "--golden-write", "--golden-check", "--golden-baseline",
                                  "--metrics"}) {
    CLI::Option const* o = app.get_option(path_option);
    if (o->count() > 0 && o->results().back().empty()) {
      std::fprintf(stderr, "fusepack-train: %s is given an empty value; give one, or leave the option out\n",
                   path_option);
      return 2;
    }
  }

  if (print_config) {
    if (c.preset.empty() == c.model_config.empty()) {
      std::fprintf(stderr, "fusepack-train: --print-config: give exactly one of --preset and --config\n");
      return 2;
    }
    try {
      std::cout << train::load_model_config(c).to_json() << "\n";
      return 0;
    } catch (std::exception const& e) {
      std::fprintf(stderr, "fusepack-train: --print-config: %s\n", e.what());
      return 2;
    }
  }
  if (app.count("--data") == 0) {
    std::fprintf(stderr, "fusepack-train: --data is required\nRun with --help for more information.\n");
    return 2;
  }

  // TrainConfig reads eval_every 0 as "not given": a given 0 (or less) is named here.
  if (app.count("--eval-every") > 0 && c.eval_every < 1) {
    std::fprintf(stderr, "fusepack-train: --eval-every must be >= 1 (evaluate every N steps); got %lld\n",
                 static_cast<long long>(c.eval_every));
    return 2;
  }

  // --epochs derives the steps from the data: --steps is left at 0 for it, and giving both is refused.
  if (c.epochs > 0 && app.count("--steps") > 0) {
    std::fprintf(stderr, "fusepack-train: give --steps or --epochs, not both (--epochs derives the steps from the "
                         "data); got --steps %lld and --epochs %lld\n",
                 static_cast<long long>(c.steps), static_cast<long long>(c.epochs));
    return 2;
  }
  if (c.epochs > 0) c.steps = 0;

  parallel::DistEnv env;
  std::shared_ptr<parallel::Collectives> comm;
  // A rank's errors say which rank they come from; a failed sharded run ends at once (_Exit), since tearing down a
  // process group whose peer died can block.
  auto fail = [&](char const* what) {
    std::string const who = env.launched ? "fusepack-train (rank " + std::to_string(env.rank) + ")" : "fusepack-train";
    std::fprintf(stderr, "%s: %s\n", who.c_str(), what);
    std::fflush(stdout);
    std::fflush(stderr);
    if (comm) std::_Exit(2);
    return 2;
  };
  try {
    c.batching = train::parse_batching(args.batching);
    c.pairing = train::parse_pairing(args.pairing);
    c.oversize = packing::parse_oversize_policy(args.oversize);
    c.backend = ops::parse_backend(args.backend);
    c.dtype = train::parse_dtype(args.dtype);
    c.checkpoint_every = train::parse_activation_checkpointing(args.activation_checkpointing);
    c.optimizer_kernel = train::parse_optimizer_kernel(args.optimizer_kernel);
    c.validate(train::TrainConfig::Naming::kOptions);
    env = parallel::DistEnv::from_environment();

    train::RunOptions options;
    options.command = command_line(argc, argv);
    options.log = env.rank == 0 ? &std::cout : nullptr;
    options.progress_bar = env.rank == 0 && args.progress && ::isatty(STDERR_FILENO) == 1;
    packing::Progress progress;  // long phases (a large dataset, epoch plans, a large model) report every 2 s
    progress.out = &std::cerr;
    if (env.rank == 0 && args.progress) options.progress = &progress;
    bool const tolerance_given = !app.get_options([](CLI::Option const* o) {
                                        std::string const n = o->get_name();
                                        return o->count() > 0 && (n.find("-atol") != std::string::npos ||
                                                                  n.find("-rtol") != std::string::npos ||
                                                                  n.find("-drift") != std::string::npos);
                                      })
                                      .empty();
    if (tolerance_given) {
      if (c.golden_check.empty()) return fail("tolerance options apply to --golden-check, which is not given");
      if (!c.golden_baseline.empty()) return fail("give either tolerance options or --golden-baseline, not both");
      options.tolerance = args.tolerance;  // every field not given is 0 (exact), as fusepack-golden-compare's
    }
    if (env.launched) {
      // Each rank of a node takes the GPU of its LOCAL_RANK, as torchrun users expect.
      c10::Device device(c.device);
      if (device.is_cuda()) {
        if (device.has_index() && env.local_world_size > 1) {
          return fail(("--device " + c.device + " names one GPU for " + std::to_string(env.local_world_size) +
                       " ranks on this node; give --device cuda: each rank takes cuda:LOCAL_RANK")
                          .c_str());
        }
        if (!device.has_index()) device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
      }
      parallel::CollectivesOptions copts;
      copts.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(args.collective_timeout * 1000));
      comm = parallel::init_collectives(env, device, copts);
      options.comm = comm;
    }
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    options.stop_requested = [] { return g_stop_signal.load(); };
    train::RunResult const result = train::run_training(c, options);
    if (comm) comm->shutdown();
    if (result.interrupted_by != 0) return 128 + result.interrupted_by;  // the shell's code for a signalled process
    return result.passed() ? 0 : 1;
  } catch (c10::Error const& e) {
    return fail(e.what_without_backtrace());
  } catch (std::exception const& e) {
    return fail(e.what());
  }
}
