// Training (trainer/train): TrainConfig validation naming every broken rule; the step log line, progress bar and
// summary; gradient accumulation (two micro-batches in one step == the same examples in one micro-batch, fp64);
// the schedule's rate reaching each update; and fusepack-train run as a user runs it: a golden write → check round trip
// (exit 0, PASS), a changed run failing the check (exit 1), fine-tuned weights written in HF format and loaded back,
// and exit code 2 with a message for bad input. Evaluation (--eval-data) leaves the training unchanged to the bit and
// reports the mean loss of its examples; the start lines are short summaries; long phases report their progress.
#include "golden/golden_file.h"
#include "packing/batch.h"
#include "packing/packer.h"
#include "packing/synthetic.h"
#include "trainer/checkpoint/files.h"
#include "trainer/checkpoint/qwen35_names.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/batch.h"
#include "trainer/model/config.h"
#include "trainer/model/model.h"
#include "trainer/parallel/collectives.h"
#include "kernels/ops/op_scope.h"
#include "kernels/ops/rmsnorm.h"
#include "packing/progress.h"
#include "trainer/train/config.h"
#include "trainer/train/profile.h"
#include "trainer/train/report.h"
#include "trainer/train/run.h"
#include "trainer/train/trainer.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/run_binary.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef FUSEPACK_TRAIN_BINARY
#error "FUSEPACK_TRAIN_BINARY must name the fusepack-train executable"
#endif

namespace fusepack::test {
namespace {

using train::TrainConfig;

// ------------------------------------------------------------------------------------------------------------------
// TrainConfig

TrainConfig valid_config() {
  TrainConfig c;
  c.preset = "qwen35-tiny";
  c.data = "synthetic:n=8,median=16";
  return c;
}

TEST(TrainConfig, DefaultsWithAPresetAndDataAreValid) { EXPECT_NO_THROW(valid_config().validate()); }

TEST(TrainConfig, ListsEveryBrokenRuleAtOnce) {
  TrainConfig c;  // neither preset nor config.json, no data
  c.lr = 0;
  c.steps = 0;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(c.validate(), "give exactly one of preset and model_config");
  try {
    c.validate();
  } catch (std::invalid_argument const& e) {
    std::string const msg = e.what();
    for (char const* rule : {"data is required", "lr must be finite and > 0; got 0", "steps must be >= 1; got 0"}) {
      EXPECT_NE(msg.find(rule), std::string::npos) << "missing '" << rule << "' in: " << msg;
    }
  }
}

TEST(TrainConfig, EachBadFieldIsNamedWithItsValue) {
  struct Case {
    void (*edit)(TrainConfig&);
    char const* message;
  };
  Case const cases[] = {
      {[](TrainConfig& c) { c.model_config = "config.json"; }, "got both"},
      {[](TrainConfig& c) { c.preset = "qwen35-9000b"; }, "unknown preset 'qwen35-9000b' (known: qwen35-tiny"},
      {[](TrainConfig& c) { c.token_budget = 0; }, "token_budget must be >= 1; got 0"},
      {[](TrainConfig& c) { c.lookahead = 0; }, "lookahead must be >= 1; got 0"},
      {[](TrainConfig& c) { c.micro_batches = -1; }, "micro_batches must be >= 1; got -1"},
      {[](TrainConfig& c) { c.min_lr = 1.0; }, "min_lr must be in [0, lr = 0.0001]; got 1"},
      {[](TrainConfig& c) { c.warmup_steps = 11; }, "warmup_steps must be in [0, steps = 10]; got 11"},
      {[](TrainConfig& c) { c.weight_decay = -0.1; }, "weight_decay must be >= 0; got -0.1"},
      {[](TrainConfig& c) { c.beta2 = 1.0; }, "beta2 must be in [0, 1); got 1"},
      {[](TrainConfig& c) { c.clip_norm = -1; }, "clip_norm must be >= 0 (0 = no clipping); got -1"},
      {[](TrainConfig& c) { c.device = "gpu"; }, "device must be cpu, cuda or cuda:N; got 'gpu'"},
      {[](TrainConfig& c) { c.backend = ops::Backend::kFused; }, "backend fused runs fusepack's CUDA kernels and needs"},
      {[](TrainConfig& c) { c.optimizer_kernel = train::OptimizerKernel::kFusepack; },
       "optimizer_kernel fusepack runs on CUDA only and needs device cuda; got device 'cpu'"},
      {[](TrainConfig& c) { c.dtype = train::DType::kBFloat16; }, "dtype bf16 (bf16 compute over fp32 master "},
      {[](TrainConfig& c) { c.threads = -2; }, "threads must be >= 0"},
      {[](TrainConfig& c) {
         c.complete_packs = true;
         c.batching = train::Batching::kPadded;
       },
       "complete_packs completes packed micro-batches to the token budget; got batching padded"},
      {[](TrainConfig& c) { c.golden_write = c.golden_check = "g.json"; }, "name the same file 'g.json'"},
      {[](TrainConfig& c) { c.profile_step = 10; }, "profile_step must be in [0, steps = 10) or -1 (off); got 10"},
      {[](TrainConfig& c) { c.eval_every = 5; }, "eval_every 5 is given but eval_data, the dataset to evaluate, is not"},
      {[](TrainConfig& c) { c.eval_data = "eval.jsonl"; }, "eval_data is given but eval_every N, how often"},
      {[](TrainConfig& c) {
         c.eval_data = "eval.jsonl";
         c.eval_every = -1;
       },
       "eval_every must be >= 1 (evaluate every N steps); got -1"},
  };
  for (Case const& k : cases) {
    TrainConfig c = valid_config();
    k.edit(c);
    FUSEPACK_EXPECT_INVALID_ARGUMENT(c.validate(), k.message);
  }
  TrainConfig cuda = valid_config();
  cuda.device = "cuda:1";
  cuda.backend = ops::Backend::kFused;
  cuda.dtype = train::DType::kBFloat16;
  EXPECT_NO_THROW(cuda.validate()) << "fused bf16 on a CUDA device is a valid configuration";
}

TEST(TrainConfig, ParsersAcceptTheCliSpellingsAndRejectTheRest) {
  EXPECT_EQ(train::parse_batching("padded"), train::Batching::kPadded);
  EXPECT_EQ(train::parse_pairing("fill"), packing::PlanMode::kFill);
  EXPECT_EQ(train::parse_dtype("float64"), train::DType::kFloat64);
  EXPECT_EQ(train::parse_dtype("bf16"), train::DType::kBFloat16);
  EXPECT_STREQ(train::golden_dtype_name(train::DType::kFloat32), "float32");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::parse_batching("diagonal"), "batching must be packed or padded");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::parse_pairing("sorted"), "pairing must be paired or fill");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::parse_dtype("fp16"), "dtype must be fp64, fp32 or bf16; got 'fp16'");
  for (train::OptimizerKernel k : {train::OptimizerKernel::kAuto, train::OptimizerKernel::kFusepack,
                                   train::OptimizerKernel::kAtenFused, train::OptimizerKernel::kForeach}) {
    EXPECT_EQ(train::parse_optimizer_kernel(train::optimizer_kernel_name(k)), k);
  }
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::parse_optimizer_kernel("fused"),
                                   "optimizer kernel must be auto, fusepack, aten-fused or foreach; got 'fused'");
  EXPECT_EQ(train::parse_activation_checkpointing("none"), 0);
  EXPECT_EQ(train::parse_activation_checkpointing("full"), 1);
  EXPECT_EQ(train::parse_activation_checkpointing("every-3"), 3);
  for (std::int64_t n : {0, 1, 2, 7}) {
    EXPECT_EQ(train::parse_activation_checkpointing(train::activation_checkpointing_name(n)), n);
  }
  for (char const* bad : {"every-0", "every-", "every-x", "partial", "every--1", "every-99999999999"}) {
    FUSEPACK_EXPECT_INVALID_ARGUMENT(train::parse_activation_checkpointing(bad),
                                     "activation checkpointing must be none, full or every-N");
  }
}

// ------------------------------------------------------------------------------------------------------------------
// Log line, progress bar, summary

train::StepMetrics sample_step() {
  train::StepMetrics m;
  m.step = 3;
  m.loss = 5.4123456;
  m.grad_norm = 1.23456;
  m.lr = 3e-4;
  m.targets = 1498;
  m.tokens = 1600;
  m.slots = 2000;
  m.examples = 12;
  m.micro_batches = 2;
  m.seconds = 0.5;
  return m;
}

TEST(Report, StepLogLineCarriesLossGradNormLrThroughputAndPadding) {
  std::string const line = train::step_log_line(sample_step(), 10);
  std::printf("%s\n", line.c_str());
  for (char const* text : {"step  3/10", "loss 5.412346", "grad norm 1.2346", "lr 3.000e-04", "targets 1,498",
                           "tokens 1,600", "3,200 tok/s", "padding 20.0%"}) {
    EXPECT_NE(line.find(text), std::string::npos) << "missing '" << text << "' in: " << line;
  }
}

TEST(Report, EvalLogLineLinesUpWithTheStepLineOfItsStep) {
  train::EvalMetrics e;
  e.step = 3;
  e.loss = 5.3987654;
  e.targets = 2990;
  e.tokens = 3104;
  e.examples = 40;
  e.seconds = 1.3;
  std::string const line = train::eval_log_line(e, 10), step = train::step_log_line(sample_step(), 10);
  std::printf("%s\n%s\n", step.c_str(), line.c_str());
  EXPECT_EQ(line.rfind("eval  3/10  loss 5.398765  ", 0), 0u) << line;
  EXPECT_EQ(line.find("  loss "), step.find("  loss ")) << "the loss columns line up";
  for (char const* text : {"targets 2,990", "tokens 3,104", "examples 40", "1.3 s"}) {
    EXPECT_NE(line.find(text), std::string::npos) << "missing '" << text << "' in: " << line;
  }
}

TEST(Report, ProgressBarShowsTheShareDoneThroughputAndEta) {
  std::string const bar = train::progress_bar(5, 10, 1234.4, 7.2, 10);
  EXPECT_EQ(bar, "[#####-----] 5/10 steps  1,234 tok/s  eta 7 s");
}

TEST(Report, SummaryCarriesStepsTokensThroughputPaddingWallTimeAndFinalLoss) {
  train::StepMetrics a = sample_step(), b = sample_step();
  a.step = 0;
  a.loss = 5.5;
  b.step = 1;
  b.loss = 4.25;
  train::RunSummary const s = train::summarize({a, b}, 2.5);
  EXPECT_EQ(s.tokens, 3200);
  EXPECT_DOUBLE_EQ(s.padding_share(), 0.2);
  EXPECT_DOUBLE_EQ(s.tokens_per_second(), 3200.0);
  std::string const text = train::summary_text(s);
  std::printf("%s", text.c_str());
  for (char const* t : {"2 steps", "2,996 targets", "3,200 tokens in 24 examples", "3,200 tokens/s",
                        "wall time 2.50 s", "padding: 20.0% of 4,000 computed positions", "5.500000 (step 0)",
                        "4.250000 (step 1, final)"}) {
    EXPECT_NE(text.find(t), std::string::npos) << "missing '" << t << "' in:\n" << text;
  }
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::summarize({}, 1.0), "no step");
}

// ------------------------------------------------------------------------------------------------------------------
// The optimizer step

std::unique_ptr<model::Qwen35ForCausalLM> tiny_fp64(std::uint64_t seed) {
  model::ModelOptions o;
  o.dtype = at::kDouble;
  o.seed = seed;
  return std::make_unique<model::Qwen35ForCausalLM>(model::preset("qwen35-tiny"), o);
}

train::TrainerOptions trainer_options(std::int64_t steps) {
  train::TrainerOptions t;
  t.adamw.beta2 = 0.95;
  t.adamw.weight_decay = 0.1;
  t.schedule.peak_lr = 1e-3;
  t.schedule.min_lr = 1e-4;
  t.schedule.warmup_steps = 1;
  t.schedule.total_steps = steps;
  t.clip_norm = 1.0;
  return t;
}

std::vector<packing::Example> small_dataset(std::uint64_t seed) {
  packing::SyntheticSpec spec;
  spec.num_examples = 5;
  spec.vocab_size = 256;
  spec.median_length = 12;
  spec.sigma = 0.5;
  spec.max_length = 40;
  spec.prompt_fraction = 0.25;
  spec.seed = seed;
  return packing::make_synthetic(spec);
}

TEST(Trainer, TwoMicroBatchesInOneStepEqualTheSameExamplesInOneMicroBatch) {
  std::uint64_t const seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::vector<packing::Example> const data = small_dataset(seed);
  // Step 0 has warmup lr 0: take the step 1 (lr = peak) so the update is visible.
  auto one = tiny_fp64(seed), two = tiny_fp64(seed);
  train::Trainer t1(*one, trainer_options(2)), t2(*two, trainer_options(2));
  model::ModelBatch const all = model::make_model_batch(packing::make_packed_batch(data, {0, 1, 2, 3, 4}), at::kCPU);
  model::ModelBatch const first = model::make_model_batch(packing::make_packed_batch(data, {0, 1}), at::kCPU);
  model::ModelBatch const rest = model::make_model_batch(packing::make_padded_batch(data, {2, 3, 4}), at::kCPU);
  // Micro-batches of different target counts: a per-micro-batch mean (the classic accumulation bug) would differ.
  ASSERT_NE(first.num_targets, rest.num_targets);
  for (int s = 0; s < 2; ++s) {
    train::StepResult const a = t1.step({all});
    train::StepResult const b = t2.step({first, rest});
    EXPECT_EQ(a.targets, b.targets);
    EXPECT_EQ(a.lr, b.lr);
    std::printf("[ measured ] step %d: loss rel diff %.3g, grad norm rel diff %.3g\n", s,
                std::fabs(a.loss - b.loss) / a.loss, std::fabs(a.grad_norm - b.grad_norm) / a.grad_norm);
    // The same per-example sums in another order: a few ulps of fp64 at most (measured: equal here); 1e-13 relative
    // leaves a wide margin and is 1e10 below a normalisation bug (a ratio of target counts, here >= 1e-2 off).
    EXPECT_NEAR(a.loss, b.loss, 1e-13 * std::fabs(a.loss)) << "step " << s;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-13 * a.grad_norm) << "step " << s;
  }
  // Weights after two updates: AdamW's update lr·m̂/(sqrt(v̂)+eps) moves an element by at most ~lr·|δg|/eps for a
  // gradient difference δg, and δg is a few ulps of gradients of <= 1e-3: below 1e-18·1e-3/1e-8 = 1e-13 absolute.
  // Measured max |diff| 2.4e-14; 1e-12 absolute on weights of scale 0.02..1.
  double worst = 0;
  for (std::size_t i = 0; i < one->named_parameters().size(); ++i) {
    at::Tensor const& p = one->named_parameters()[i].second;
    at::Tensor const& q = two->named_parameters()[i].second;
    worst = std::max(worst, (p - q).abs().max().item<double>());
  }
  std::printf("[ measured ] max |weight difference| after 2 steps: %.3g\n", worst);
  EXPECT_LE(worst, 1e-12);
}

// A pack completed to a budget by a filler (its own example, no targets) trains as the pack alone: the filler's
// positions get no loss and a gradient of exactly zero, and no op lets it reach the examples.
TEST(Trainer, APackCompletedByAFillerTrainsAsThePackAlone) {
  std::uint64_t const seed = test_seed();
  std::vector<packing::Example> const data = small_dataset(seed);
  auto plain = tiny_fp64(seed), filled = tiny_fp64(seed);
  train::Trainer t1(*plain, trainer_options(2)), t2(*filled, trainer_options(2));
  packing::PackedBatch pack = packing::make_packed_batch(data, {0, 1, 2, 3, 4});
  model::ModelBatch const alone = model::make_model_batch(pack, at::kCPU);
  packing::complete_to_budget(pack, pack.num_tokens() + 37, 3);
  model::ModelBatch const completed = model::make_model_batch(pack, at::kCPU);
  ASSERT_EQ(completed.num_examples, alone.num_examples + 1);
  for (int s = 0; s < 2; ++s) {
    train::StepResult const a = t1.step({alone});
    train::StepResult const b = t2.step({completed});
    EXPECT_EQ(a.targets, b.targets);
    std::printf("[ measured ] step %d: loss rel diff %.3g, grad norm rel diff %.3g\n", s,
                std::fabs(a.loss - b.loss) / a.loss, std::fabs(a.grad_norm - b.grad_norm) / a.grad_norm);
    // The filler adds exact zeros to every gradient sum; only the GEMMs' longer sums may be blocked differently: a
    // few ulps of fp64. 1e-13 relative, as for the micro-batch split above.
    EXPECT_NEAR(a.loss, b.loss, 1e-13 * std::fabs(a.loss)) << "step " << s;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-13 * a.grad_norm) << "step " << s;
  }
  double worst = 0;  // same bound as above
  for (std::size_t i = 0; i < plain->named_parameters().size(); ++i) {
    worst = std::max(worst, (plain->named_parameters()[i].second - filled->named_parameters()[i].second)
                                .abs()
                                .max()
                                .item<double>());
  }
  std::printf("[ measured ] max |weight difference| after 2 steps: %.3g\n", worst);
  EXPECT_LE(worst, 1e-12);
}

TEST(Trainer, EachUpdateUsesTheSchedulesRateAndTheStepsAreCountedFromZero) {
  auto m = tiny_fp64(1);
  std::vector<packing::Example> const data = small_dataset(1);
  train::TrainerOptions const opts = trainer_options(3);
  train::Trainer t(*m, opts);
  model::ModelBatch const b = model::make_model_batch(packing::make_packed_batch(data, {0, 1, 2}), at::kCPU);
  for (std::int64_t s = 0; s < 3; ++s) {
    train::StepResult const r = t.step({b});
    EXPECT_EQ(r.step, s);
    EXPECT_EQ(r.lr, opts.schedule.lr(s));
  }
  EXPECT_EQ(t.steps_taken(), 3);
  EXPECT_THROW(t.step({b}), std::out_of_range) << "a step past the schedule's end";
  FUSEPACK_EXPECT_INVALID_ARGUMENT(t.step({}), "at least one micro-batch");
}

// ------------------------------------------------------------------------------------------------------------------
// run_training in the process

// A dozen short examples, budget 64, two micro-batches per step: well under a second a step.
TrainConfig small_run(std::int64_t steps) {
  TrainConfig c = valid_config();
  c.data = "synthetic:n=12,median=12,sigma=0.5,max=40,seed=3";
  c.token_budget = 64;
  c.micro_batches = 2;
  c.steps = steps;
  c.lr = 1e-3;
  c.threads = 1;
  return c;
}

TEST(RunTraining, LogsOneLinePerStepThenTheSummary) {
  TrainConfig const c = small_run(3);
  std::ostringstream log;
  train::RunOptions o;
  o.log = &log;
  train::RunResult const r = train::run_training(c, o);
  std::printf("%s", log.str().c_str());
  ASSERT_EQ(r.steps.size(), 3u);
  for (std::string const& text : {std::string("model: preset qwen35-tiny"), std::string("step 0/3  loss "),
                                  std::string("step 2/3"), std::string("tok/s  padding 0.0%"),
                                  std::string("summary: 3 steps"), std::string("loss: ")}) {
    EXPECT_NE(log.str().find(text), std::string::npos) << "missing '" << text << "'";
  }
  EXPECT_EQ(r.golden.steps.size(), 3u);
  EXPECT_EQ(r.golden.provenance.dtype, "float32");
  EXPECT_EQ(r.golden.provenance.world_size, 1);
  EXPECT_FALSE(r.comparison.has_value());
}

// --complete-packs: every micro-batch computes exactly the budget's positions; the step's tokens, targets and loss are
// the examples' alone (the filler shows as padding), and the setting is part of the run's provenance.
TEST(RunTraining, CompletedPacksTrainTheSameStepsAndCountTheFillerAsPadding) {
  TrainConfig c = small_run(2);
  c.dtype = train::DType::kFloat64;
  train::RunResult const plain = train::run_training(c, {});
  c.complete_packs = true;
  std::ostringstream log;
  train::RunOptions o;
  o.log = &log;
  train::RunResult const completed = train::run_training(c, o);
  EXPECT_NE(log.str().find("budget 64 (packs completed to it)"), std::string::npos) << log.str();
  ASSERT_EQ(completed.steps.size(), plain.steps.size());
  for (std::size_t s = 0; s < plain.steps.size(); ++s) {
    train::StepMetrics const& a = plain.steps[s];
    train::StepMetrics const& b = completed.steps[s];
    EXPECT_EQ(b.tokens, a.tokens) << "step " << s;
    EXPECT_EQ(b.examples, a.examples) << "step " << s;
    EXPECT_EQ(b.targets, a.targets) << "step " << s;
    EXPECT_EQ(b.slots, 2 * c.token_budget) << "step " << s;
    EXPECT_GT(b.padding_share(), 0.0) << "step " << s;
    EXPECT_NEAR(b.loss, a.loss, 1e-13 * a.loss) << "step " << s;  // as in Trainer.APackCompletedByAFiller...
  }
  EXPECT_NE(completed.golden.provenance.batching.find("\"complete_packs\":true"), std::string::npos)
      << completed.golden.provenance.batching;
  EXPECT_EQ(plain.golden.provenance.batching.find("complete_packs"), std::string::npos);
}

// ------------------------------------------------------------------------------------------------------------------
// fusepack-train as a user runs it

BinaryResult run_train(std::string const& args) { return run_binary(FUSEPACK_TRAIN_BINARY, "fusepack-train", args); }

std::string temp_path(std::string const& suffix) { return test_temp_path("fusepack_train", suffix); }

// The log's lines stay within 120 columns (the full settings are in the metrics file and the golden).
void expect_short_lines(std::string const& out) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) EXPECT_LE(line.size(), 120u) << line;
}

// Two steps of two micro-batches on a dozen short examples: about a second.
std::string const kSmallRun =
    "--preset qwen35-tiny --data synthetic:n=12,median=12,sigma=0.5,max=40,prompt=0.25,seed=3 --budget 64 "
    "--micro-batches 2 --steps 2 --lr 1e-3 --threads 1 --seed 5";

TEST(FusepackTrain, GoldenWriteThenCheckRoundTripsAndAChangedRunFails) {
  std::string const golden_path = temp_path(".json");
  BinaryResult const w = run_train(kSmallRun + " --batching padded --dtype fp64 --golden-write " + golden_path);
  ASSERT_EQ(w.exit_code, 0);
  for (char const* text : {"step 0/2", "step 1/2", "summary: 2 steps", "golden written"}) {
    EXPECT_NE(w.out.find(text), std::string::npos) << "missing '" << text << "'";
  }
  golden::GoldenFile const g = golden::read_golden(golden_path);
  EXPECT_EQ(g.steps.size(), 2u);
  EXPECT_EQ(g.provenance.dtype, "float64");
  EXPECT_EQ(g.provenance.device, "cpu");
  EXPECT_EQ(g.provenance.world_size, 1);
  EXPECT_EQ(g.provenance.seed, 5u);
  EXPECT_EQ(g.provenance.command.rfind("fusepack-train --preset qwen35-tiny", 0), 0u) << g.provenance.command;
  EXPECT_FALSE(g.provenance.commit.empty());
  for (char const* text : {"\"layout\":\"padded\"", "\"micro_batches_per_step\":2", "\"token_budget\":64"}) {
    EXPECT_NE(g.provenance.batching.find(text), std::string::npos) << g.provenance.batching;
  }
  EXPECT_NE(g.provenance.dataset.find("synthetic:n=12"), std::string::npos) << g.provenance.dataset;
  EXPECT_NE(g.provenance.model_config.find("\"hidden_size\":64"), std::string::npos) << g.provenance.model_config;

  // The packed path of the same run passes the padded golden.
  BinaryResult const packed = run_train(kSmallRun + " --batching packed --dtype fp64 --golden-check " + golden_path);
  EXPECT_EQ(packed.exit_code, 0);
  EXPECT_NE(packed.out.find("PASS"), std::string::npos);

  // Another learning rate changes step 1's loss (step 0 is before any update: it must still pass).
  BinaryResult const changed = run_train(kSmallRun + " --batching packed --dtype fp64 --lr 2e-3 --golden-check " +
                                         golden_path);
  EXPECT_EQ(changed.exit_code, 1);
  EXPECT_NE(changed.out.find("FAIL"), std::string::npos);
  EXPECT_NE(changed.out.find("note: the batching differs beyond the layout: /optimizer/lr 0.001 in the golden, 0.002 "
                             "in the run\n"),
            std::string::npos)
      << "the lr differs from the golden's";
  expect_short_lines(packed.out);
  expect_short_lines(changed.out);
  std::remove(golden_path.c_str());
}

TEST(FusepackTrain, WritesFineTunedWeightsThatLoadBackAsACheckpoint) {
  std::string const dir = temp_path("_out");
  BinaryResult const r = run_train(kSmallRun + " --steps 1 --output " + dir);  // a repeated option: the last one wins
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("summary: 1 step,"), std::string::npos);
  model::Qwen35Config const config = model::Qwen35Config::from_json_file(dir + "/config.json");
  EXPECT_EQ(config, model::preset("qwen35-tiny"));
  checkpoint::Safetensors const st = checkpoint::read_checkpoint(dir);
  model::ModelOptions o;
  o.device = at::kMeta;
  model::Qwen35ForCausalLM const shapes(config, o);
  EXPECT_EQ(st.tensors.size(), shapes.named_parameters().size());
  for (auto const& [name, p] : shapes.named_parameters()) {
    ASSERT_EQ(st.tensors.count(name), 1u) << name;
    EXPECT_EQ(st.tensors.at(name).sizes(), p.sizes()) << name;
    EXPECT_EQ(st.tensors.at(name).scalar_type(), at::kFloat) << name << ": fp32 master weights";
  }
  EXPECT_EQ(st.metadata.at("format"), "pt");
  // And fusepack-train starts from them.
  BinaryResult const again =
      run_train("--config " + dir + " --weights " + dir +
                " --data synthetic:n=12,median=12,sigma=0.5,max=40,seed=3 --budget 64 --steps 1");
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_NE(again.out.find("weights: " + dir), std::string::npos);
  // Not std::filesystem::remove_all: in a binary linked with libtorch it resolves to libtorch's own copy and crashes.
  for (char const* file : {"/config.json", "/model.safetensors"}) std::remove((dir + file).c_str());
  ::rmdir(dir.c_str());
}

TEST(FusepackTrain, ProfileStepPrintsOpCallsKernelsTimesAndTheBackend) {
  BinaryResult const r = run_train(kSmallRun + " --profile-step 1");
  ASSERT_EQ(r.exit_code, 0);
  for (char const* text : {"profile of step 1 (backend composite", "CPU op calls:", "GPU kernels:    0",
                           "step wall time:", "GPU kernel time:", "most frequent CPU ops:", "aten::",
                           // which implementation ran, as each op recorded it (kernels/ops/op_scope.h)
                           "rmsnorm [composite]", "gated_delta [composite]", "attention [composite]",
                           "conv1d [composite]", "swiglu [composite]", "ran composite"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << "missing '" << text << "'";
  }
  // The profile follows its own step's line and precedes the next step's.
  EXPECT_LT(r.out.find("step 1/2"), r.out.find("profile of step 1"));
  // No kernels on the CPU, but each kind of decoder layer's host time, forward and backward, from its named ranges.
  std::size_t const table = r.out.find("per decoder layer");
  ASSERT_NE(table, std::string::npos) << r.out;
  for (char const* kind : {"linear_attention", "full_attention"}) {
    std::size_t const row = r.out.find(std::string("    ") + kind, table);
    ASSERT_NE(row, std::string::npos) << "no row for " << kind << " in\n" << r.out;
    double layers = 0, fwd = 0, bwd = 0;
    std::string const line = r.out.substr(row, r.out.find('\n', row) - row);
    ASSERT_EQ(std::sscanf(line.c_str() + 4 + 18, " %lf layers host %lf + %lf", &layers, &fwd, &bwd), 3) << line;
    EXPECT_GT(layers, 0) << line;
    EXPECT_GT(fwd, 0) << line;
    EXPECT_GT(bwd, 0) << line;
  }
}

TEST(FusepackTrain, PrintConfigWritesThePresetsConfigJsonAndExits) {
  BinaryResult const r = run_train("--preset qwen35-tiny --print-config");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(model::Qwen35Config::from_json(r.out).to_json(), model::preset("qwen35-tiny").to_json());
  BinaryResult const none = run_train("--print-config");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.out.find("give exactly one of --preset and --config"), std::string::npos) << none.out;
}

// A CPU range of a hand-built profiler trace; sequence numbers count thread 1's (the forward's) ops.
train::TraceEvent trace_range(std::string name, std::uint64_t thread, std::uint64_t start, std::uint64_t end,
                              std::int64_t seq = -1, std::uint64_t correlation = 0) {
  train::TraceEvent e;
  e.name = std::move(name);
  e.thread = thread;
  e.start_ns = start;
  e.end_ns = end;
  e.sequence_nr = seq;
  e.forward_thread = 1;
  e.correlation = correlation;
  return e;
}

// attribute_time on a hand-built trace: forward ops take their innermost named range; a backward node takes the scope
// and layer of the forward op that created it (the LAST forward op carrying its sequence number: ops that create no
// node before it carry the same number); kernels count toward their launching op's scope and layer.
TEST(StepProfiler, AttributesKernelsToScopesAndLayersThroughTheirLaunchingOps) {
  using train::TraceEvent;
  auto kernel = [](std::uint64_t correlation, std::uint64_t ns) {
    TraceEvent e;
    e.name = "kernel";
    e.kernel = true;
    e.start_ns = 1000;
    e.end_ns = 1000 + ns;
    e.correlation = correlation;
    return e;
  };
  std::vector<TraceEvent> const trace = {
      // forward, thread 1
      trace_range(FUSEPACK_RANGE_PREFIX "layer 0 linear_attention", 1, 0, 100),
      trace_range(FUSEPACK_RANGE_PREFIX "gemm projections", 1, 10, 30),
      trace_range("aten::linear", 1, 11, 29, 5, 101),
      trace_range("aten::mm", 1, 12, 28, 5, 102),
      trace_range("aten::mul", 1, 32, 35, 6, 108),  // creates no node: carries the next number, 6
      trace_range(FUSEPACK_OP_SCOPE_PREFIX "gated_delta [fused]", 1, 40, 60, -1, 103),
      trace_range("aten::empty", 1, 41, 42, 6, 109),  // inside the op whose node gets 6
      trace_range("aten::add", 1, 70, 80, 7, 104),
      trace_range("aten::to", 1, 82, 90, 8, 105),
      trace_range("aten::copy_", 1, 83, 89, -1, 106),
      trace_range(FUSEPACK_RANGE_PREFIX "optimizer", 1, 300, 400),
      trace_range("aten::_foreach_mul_", 1, 310, 320, -1, 107),
      // backward, thread 2
      trace_range("autograd::engine::evaluate_function: MmBackward0", 2, 200, 250, 5),
      trace_range("aten::mm", 2, 205, 245, -1, 201),
      trace_range("autograd::engine::evaluate_function: ToCopyBackward0", 2, 251, 260, 8),
      trace_range("aten::to", 2, 252, 259, -1, 202),
      trace_range("autograd::engine::evaluate_function: AccumulateGrad", 2, 261, 270, -1),
      trace_range("aten::add_", 2, 262, 269, -1, 203),
      trace_range("autograd::engine::evaluate_function: GatedDeltaBackward", 2, 271, 290, 6),
      trace_range("aten::bmm", 2, 272, 289, -1, 204),
  };
  std::vector<TraceEvent> events = trace;
  for (auto [correlation, ns] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
           {102, 10}, {103, 20}, {104, 5}, {106, 3}, {107, 4}, {201, 15}, {202, 2}, {203, 1}, {204, 6}, {999, 7}}) {
    events.push_back(kernel(correlation, ns));
  }
  train::TimeAttribution const t = train::attribute_time(events);
  std::map<std::string, train::ScopeTime> by_scope;
  for (train::ScopeTime const& s : t.scopes) by_scope[s.scope] = s;
  auto expect_scope = [&](std::string const& scope, double fwd_ns, double bwd_ns, std::int64_t kernels) {
    ASSERT_EQ(by_scope.count(scope), 1u) << "no scope '" << scope << "'";
    train::ScopeTime const& s = by_scope[scope];
    EXPECT_DOUBLE_EQ(s.forward_seconds, fwd_ns * 1e-9) << scope;
    EXPECT_DOUBLE_EQ(s.backward_seconds, bwd_ns * 1e-9) << scope;
    EXPECT_EQ(s.kernels, kernels) << scope;
  };
  expect_scope("GEMM projections", 10, 15, 2);
  expect_scope("gated_delta", 20, 6, 2);  // the backward found through the last op numbered 6, not aten::mul
  expect_scope("other: aten::add", 5, 0, 1);
  expect_scope("other: aten::to", 3, 0, 1);  // the outermost op, not the copy_ inside it
  expect_scope("optimizer", 4, 0, 1);
  expect_scope("other: ToCopyBackward0", 0, 2, 1);
  expect_scope("other: AccumulateGrad", 0, 1, 1);
  expect_scope("other: (no launching op recorded)", 7, 0, 1);
  EXPECT_EQ(by_scope.size(), 8u);
  EXPECT_EQ(t.scopes.front().scope, "gated_delta");  // most GPU time first (26 ns)

  ASSERT_EQ(t.layers.size(), 1u);
  train::LayerTime const& l = t.layers[0];
  EXPECT_EQ(l.type, "linear_attention");
  EXPECT_EQ(l.layers, 1);
  EXPECT_DOUBLE_EQ(l.forward_host_seconds, 100e-9);
  EXPECT_DOUBLE_EQ(l.backward_host_seconds, (50 + 9 + 19) * 1e-9);  // its three nodes; AccumulateGrad has no layer
  EXPECT_DOUBLE_EQ(l.forward_gpu_seconds, (10 + 20 + 5 + 3) * 1e-9);
  EXPECT_DOUBLE_EQ(l.backward_gpu_seconds, (15 + 2 + 6) * 1e-9);
}

// A checkpointed layer's recomputation runs inside the backward node of the checkpoint. Its host time counts once
// toward the layer: the whole node when the node's creator is known to be in the layer (the layer ran under no-grad
// before the node was made, so its ops carry the node's number), else the recomputed layer range and the nodes the
// recomputation created.
TEST(StepProfiler, CountsACheckpointedLayersRecomputationOnceAsItsBackward) {
  using train::TraceEvent;
  auto const range = [](std::string name, std::uint64_t start, std::uint64_t end, std::int64_t seq = -1) {
    return trace_range(std::move(name), 1, start, end, seq);
  };
  for (bool creator_in_layer : {true, false}) {
    std::vector<TraceEvent> const events = {
        range(FUSEPACK_RANGE_PREFIX "layer 0 full_attention", 1, 4),
        range("aten::linear", 2, 3, creator_in_layer ? 3 : -1),
        range("aten::checkpoint_node", 5, 6, creator_in_layer ? -1 : 3),
        range("autograd::engine::evaluate_function: CheckpointBackward", 100, 200, 3),
        range(FUSEPACK_RANGE_PREFIX "layer 0 full_attention", 110, 150),
        range("aten::linear", 120, 130, 9),  // the recomputation creates node 9
        range("autograd::engine::evaluate_function: MmBackward0", 160, 190, 9),
    };
    train::TimeAttribution const t = train::attribute_time(events);
    ASSERT_EQ(t.layers.size(), 1u);
    EXPECT_EQ(t.layers[0].layers, 1);
    EXPECT_DOUBLE_EQ(t.layers[0].forward_host_seconds, 3e-9);
    EXPECT_DOUBLE_EQ(t.layers[0].backward_host_seconds, (creator_in_layer ? 100 : 40 + 30) * 1e-9)
        << "creator in the layer: " << creator_in_layer;
  }
}

// host_self_time on a hand-built trace: a range's self time is its duration less its direct children's (a CUDA call
// inside an op is the call's), summed per name over calls and threads; kernels are not host time. Counting whole
// durations instead (each nested range counted again in its parents) would give aten::linear 55 and the layer 100.
TEST(StepProfiler, HostSelfTimeLeavesNestedRangesToThemselves) {
  using train::TraceEvent;
  std::vector<TraceEvent> events = {
      trace_range(FUSEPACK_RANGE_PREFIX "layer 0 linear_attention", 1, 0, 100),
      trace_range("aten::linear", 1, 10, 50),
      trace_range("aten::mm", 1, 12, 42),
      trace_range("cudaMalloc", 1, 15, 40),  // a CUDA call inside aten::mm
      trace_range("aten::linear", 1, 60, 70),
      trace_range("aten::mm", 1, 60, 70),  // starts with its parent: the longer (equal here) range is the parent
      trace_range("aten::linear", 2, 0, 5),  // another thread
  };
  TraceEvent kernel;
  kernel.name = "kernel";
  kernel.kernel = true;
  kernel.start_ns = 0;
  kernel.end_ns = 1000;
  events.push_back(kernel);
  std::vector<train::NamedTime> const h = train::host_self_time(events, 10);
  std::map<std::string, train::NamedTime> by_name;
  for (train::NamedTime const& t : h) by_name[t.name] = t;
  ASSERT_EQ(by_name.size(), 4u);
  auto expect = [&](std::string const& name, double self_ns, std::int64_t calls) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    EXPECT_NEAR(by_name[name].seconds, self_ns * 1e-9, 1e-15) << name;
    EXPECT_EQ(by_name[name].count, calls) << name;
  };
  expect(FUSEPACK_RANGE_PREFIX "layer 0 linear_attention", 100 - 40 - 10, 1);
  expect("aten::linear", (40 - 30) + (10 - 10) + 5, 3);
  expect("aten::mm", (30 - 25) + 10, 2);
  expect("cudaMalloc", 25, 1);
  EXPECT_EQ(h.front().name, FUSEPACK_RANGE_PREFIX "layer 0 linear_attention");  // the most self time first (50 ns)
  EXPECT_EQ(train::host_self_time(events, 2).size(), 2u);
}

// gpu_idle on a hand-built trace (times in ns, window [0, 1000)): the GPU is busy where any kernel, copy or set runs
// (overlaps merged); each idle stretch between two is put down to where the host was when it began, on the thread of
// the op that launched the activity ending it, or to "(launched in time)" when that op had returned by then.
// Computed by hand: before the first activity 100, after the last 150, between 70 + 80 + 5 + 210 + 40.
// Planted and caught: the memset counted as idle (between 455); the host's place read at the stretch's end ("layer 0 >
// aten::mm" for the 70); every stretch put down to the host (no "(launched in time)").
TEST(StepProfiler, GpuIdleSplitsTheWindowAndFindsWhereTheHostWas) {
  using train::TraceEvent;
  auto activity = [](std::string name, std::uint64_t start, std::uint64_t end, std::uint64_t correlation) {
    TraceEvent e;
    e.name = std::move(name);
    e.kernel = true;
    e.start_ns = start;
    e.end_ns = end;
    e.correlation = correlation;
    return e;
  };
  std::vector<TraceEvent> const events = {
      trace_range(FUSEPACK_RANGE_PREFIX "layer 0", 1, 0, 400),
      trace_range("aten::mm", 1, 10, 20, -1, 1),
      trace_range("aten::zero_", 1, 30, 40, -1, 5),
      trace_range("aten::mm", 1, 300, 310, -1, 3),  // launched after the GPU ran dry at 250
      trace_range("autograd::engine::evaluate_function: MmBackward0", 2, 410, 480),
      trace_range("aten::mm", 2, 415, 470, -1, 2),
      trace_range("aten::add", 1, 490, 495, -1, 6),
      trace_range(FUSEPACK_RANGE_PREFIX "optimizer", 1, 500, 900),
      trace_range("aten::item", 1, 505, 700),
      trace_range("cudaStreamSynchronize", 1, 506, 690),
      trace_range("aten::_foreach_add_", 1, 700, 720, -1, 4),
      activity("k1", 100, 200, 1),
      activity("k1b", 110, 150, 1),          // overlaps k1
      activity("Memset (Device)", 200, 250, 5),  // busy, not idle
      activity("k3", 320, 400, 3),
      activity("k2", 480, 500, 2),
      activity("k6", 505, 510, 6),
      activity("k4", 720, 760, 4),
      activity("k5", 800, 850, 99),  // its launching op is not in the trace
  };
  train::GpuIdle const idle = train::gpu_idle(events, 0, 1000, 10);
  EXPECT_DOUBLE_EQ(idle.window_seconds, 1000e-9);
  EXPECT_DOUBLE_EQ(idle.before_first_seconds, 100e-9);
  EXPECT_DOUBLE_EQ(idle.before_first_host_seconds, 0);  // the layer's range began with the window
  // Before the first activity (0..100) the host ran the layer's range (self 100 - 10 - 10), aten::mm and aten::zero_;
  // a range not clipped to the stretch would give the layer 400 - 20 - 10.
  std::map<std::string, double> before;
  for (train::NamedTime const& t : idle.before_first_host) before[t.name] = t.seconds;
  EXPECT_EQ(before.size(), 3u);
  EXPECT_NEAR(before[FUSEPACK_RANGE_PREFIX "layer 0"], 80e-9, 1e-18);
  EXPECT_NEAR(before["aten::mm"], 10e-9, 1e-18);
  EXPECT_NEAR(before["aten::zero_"], 10e-9, 1e-18);
  EXPECT_DOUBLE_EQ(idle.after_last_seconds, 150e-9);
  EXPECT_DOUBLE_EQ(idle.between_seconds, (70 + 80 + 5 + 210 + 40) * 1e-9);
  EXPECT_DOUBLE_EQ(idle.idle_seconds, (100 + 150 + 70 + 80 + 5 + 210 + 40) * 1e-9);
  EXPECT_EQ(idle.stretches, 5);
  std::vector<std::pair<std::string, double>> const expected = {
      {FUSEPACK_RANGE_PREFIX "optimizer > cudaStreamSynchronize", 210},
      {"(in no range)", 80},  // thread 2 had not entered the backward node yet
      {FUSEPACK_RANGE_PREFIX "layer 0", 70},
      {"(launching op not recorded)", 40},
      {"(launched in time)", 5},
  };
  ASSERT_EQ(idle.by_host.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(idle.by_host[i].name, expected[i].first) << i;
    EXPECT_NEAR(idle.by_host[i].seconds, expected[i].second * 1e-9, 1e-18) << i;
    EXPECT_EQ(idle.by_host[i].count, 1) << i;
  }
  EXPECT_EQ(train::gpu_idle(events, 0, 1000, 2).by_host.size(), 2u);

  // Activities are clipped to the window; a window without any is idle before the first.
  train::GpuIdle const clipped = train::gpu_idle({activity("k", 0, 60, 0)}, 50, 100, 4);
  EXPECT_DOUBLE_EQ(clipped.before_first_seconds, 0);
  EXPECT_DOUBLE_EQ(clipped.after_last_seconds, 40e-9);
  EXPECT_EQ(clipped.stretches, 0);
  // Before the first activity, the part before any host range began (here: the first range starts at 30).
  train::GpuIdle const late_host =
      train::gpu_idle({trace_range("aten::add", 1, 30, 35, -1, 1), activity("k", 40, 60, 1)}, 0, 100, 4);
  EXPECT_DOUBLE_EQ(late_host.before_first_seconds, 40e-9);
  EXPECT_DOUBLE_EQ(late_host.before_first_host_seconds, 30e-9);
  ASSERT_EQ(late_host.before_first_host.size(), 1u);  // aten::add ran 30..35, its kernel began at 40
  EXPECT_EQ(late_host.before_first_host[0].name, "aten::add");
  EXPECT_NEAR(late_host.before_first_host[0].seconds, 5e-9, 1e-18);
  train::GpuIdle const empty = train::gpu_idle({activity("k", 0, 60, 0)}, 100, 200, 4);
  EXPECT_DOUBLE_EQ(empty.before_first_seconds, 100e-9);
  EXPECT_DOUBLE_EQ(empty.idle_seconds, 100e-9);
}

// A real profile on the CPU lists where the step's host time went.
TEST(StepProfiler, ReportsTheHostTimeOfTheStepByName) {
  at::Tensor const x = at::randn({64, 256}, at::kDouble), w = at::zeros({256}, at::kDouble);
  train::StepProfiler profiler(0, "composite", /*cuda=*/false, 0);
  profiler.start();
  for (int i = 0; i < 4; ++i) ops::rmsnorm(x, w, 1e-6, ops::Backend::kComposite);
  train::StepProfile const p = profiler.stop();
  ASSERT_FALSE(p.host_self.empty());
  double total = 0;
  for (train::NamedTime const& h : p.host_self) {
    EXPECT_GT(h.count, 0) << h.name;
    EXPECT_GE(h.seconds, 0) << h.name;
    total += h.seconds;
  }
  EXPECT_GT(total, 0);
  EXPECT_LE(total, p.wall_seconds * 1.01) << "self times of one thread cannot add up to more than the step";
  EXPECT_NE(train::profile_text(p).find("host time by name, self"), std::string::npos) << train::profile_text(p);
}

// The profile's guard against an op running another implementation than the run asked for: a profiler told the run
// is fused sees a composite rmsnorm call (the planted mismatch) and counts it; the fused one it does not.
TEST(StepProfiler, CountsOpCallsThatDidNotRunTheRequestedBackend) {
  at::Tensor const x = at::randn({4, 8}, at::kDouble), w = at::zeros({8}, at::kDouble);
  train::StepProfiler profiler(0, "fused", /*cuda=*/false, 0);
  profiler.start();
  ops::rmsnorm(x, w, 1e-6, ops::Backend::kComposite);
  train::StepProfile const p = profiler.stop();
  EXPECT_EQ(p.ops_not_on_backend, 1);
  ASSERT_EQ(p.op_implementations.size(), 1u);
  EXPECT_EQ(p.op_implementations[0].first, "rmsnorm [composite]");
  EXPECT_NE(train::profile_text(p).find("ERROR: 1 of 1 op calls did not run fused"), std::string::npos)
      << train::profile_text(p);

  train::StepProfiler matching(0, "composite", /*cuda=*/false, 0);
  matching.start();
  ops::rmsnorm(x, w, 1e-6, ops::Backend::kComposite);
  EXPECT_EQ(matching.stop().ops_not_on_backend, 0);
}

// Between construction (the profiler's warm-up) and start() nothing is recorded: the composite call made then, which a
// profiler told the run is fused would count, is not in the profile; the one after start() is.
TEST(StepProfiler, RecordsNothingOfItsWarmUp) {
  at::Tensor const x = at::randn({4, 8}, at::kDouble), w = at::zeros({8}, at::kDouble);
  train::StepProfiler profiler(0, "fused", /*cuda=*/false, 0);
  ops::rmsnorm(x, w, 1e-6, ops::Backend::kComposite);
  ops::rmsnorm(x, w, 1e-6, ops::Backend::kComposite);
  profiler.start();
  ops::rmsnorm(x, w, 1e-6, ops::Backend::kComposite);
  EXPECT_EQ(profiler.stop().ops_not_on_backend, 1);
}

// A profiler prepared and never started (the warm-up step threw) ends cleanly, and the next one runs.
TEST(StepProfiler, APreparedProfilerNeverStartedEndsCleanly) {
  { train::StepProfiler const prepared(0, "composite", /*cuda=*/false, 0); }
  train::StepProfiler next(1, "composite", /*cuda=*/false, 0);
  next.start();
  ops::rmsnorm(at::ones({2, 4}, at::kDouble), at::zeros({4}, at::kDouble), 1e-6, ops::Backend::kComposite);
  EXPECT_GT(next.stop().cpu_op_calls, 0);
}

TEST(FusepackTrain, ExitsWithCode2AndAMessageOnBadInput) {
  struct Case {
    std::string args, message;
  };
  std::vector<Case> const cases = {
      {"--preset qwen35-tiny", "--data is required"},
      {"--data synthetic:n=4", "give exactly one of --preset and --config"},
      {kSmallRun + " --dtype fp16", "dtype must be fp64, fp32 or bf16; got 'fp16'"},
      {kSmallRun + " --batching diagonal", "batching must be packed or padded"},
      {kSmallRun + " --steps 0", "steps must be >= 1; got 0"},
      {kSmallRun + " --backend fused", "needs --device cuda"},
      {"--preset qwen35-tiny --data /nonexistent/data.jsonl", "no file '/nonexistent/data.jsonl'"},
      {"--preset qwen35-tiny --data synthetic:n=4,vocab=1000", "exceeds the model's vocab_size 256"},
      {"--preset qwen35-tiny --data synthetic:n=4,median=100,max=100 --budget 16", "more than the token budget"},
      {kSmallRun + " --golden-check /nonexistent/golden.json", "/nonexistent/golden.json"},
      {kSmallRun + " --loss-rtol 1e-3", "tolerance options apply to --golden-check"},
      {kSmallRun + " --golden-baseline /tmp/baseline.json", "give --golden-check too"},
      {kSmallRun + " --golden-check /tmp/g.json --golden-baseline /tmp/b.json --loss-rtol 1e-3",
       "either tolerance options or --golden-baseline"},
      {kSmallRun + " --weights /nonexistent/weights", "/nonexistent/weights"},
      // Messages name the option typed, not TrainConfig's fields.
      {kSmallRun + " --budget 0", "invalid options: --budget must be >= 1; got 0"},
      {kSmallRun + " --warmup 3", "--warmup must be in [0, --steps = 2]; got 3"},
      // The evaluation's two options come together, N >= 1.
      {kSmallRun + " --eval-every 2", "--eval-every 2 is given but --eval-data, the dataset to evaluate, is not"},
      {kSmallRun + " --eval-data synthetic:n=4", "--eval-data is given but --eval-every N, how often to evaluate it"},
      {kSmallRun + " --eval-data synthetic:n=4 --eval-every 0", "--eval-every must be >= 1 (evaluate every N steps); "
                                                                 "got 0"},
      {kSmallRun + " --eval-data synthetic:n=4 --eval-every -3", "--eval-every must be >= 1"},
      {kSmallRun + " --eval-every 1 --eval-data synthetic:n=4,vocab=1000", "--eval-data synthetic:n=4,vocab=1000: "
                                                                          "vocab=1000 exceeds the model's vocab_size"},
      {kSmallRun + " --eval-every 1 --eval-data /nonexistent/eval.jsonl", "--eval-data: no file '/nonexistent/eval"},
      {kSmallRun + " --eval-every 1 --eval-data synthetic:n=4,min=100,median=100,max=100",
       "--eval-data synthetic:n=4,min=100,median=100,max=100: example 0 has 100 tokens, more than the token budget "
       "of 64"},
  };
  for (Case const& c : cases) {
    BinaryResult const r = run_train(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\noutput: " << r.out;
    EXPECT_EQ(r.out.find("Exception raised from"), std::string::npos) << "a C++ backtrace reached the user";
  }
}

void expect_usage_error(std::string const& args, std::string const& message) {
  BinaryResult const r = run_train(args);
  EXPECT_EQ(r.exit_code, 2) << args;
  EXPECT_NE(r.out.find(message), std::string::npos) << args << "\noutput: " << r.out;
  EXPECT_EQ(r.out.find("std::bad_alloc"), std::string::npos) << r.out;
}

TEST(FusepackTrain, RefusesAHugeSyntheticSetInsteadOfLeakingBadAlloc) {
  expect_usage_error("--preset qwen35-tiny --data synthetic:n=1000000000000",
                     "n must be in [1, 100000000]; got 1000000000000");
  expect_usage_error("--preset qwen35-tiny --data synthetic:n=100000,min=20000,median=20000,max=20000",
                     "draws 2000000000 tokens; at most 1073741824");
}

TEST(FusepackTrain, ADirectoryGivenAsAFileIsNamedAsADirectory) {
  std::string const dir = ::testing::TempDir();
  expect_usage_error("--preset qwen35-tiny --data " + dir, "--data " + dir + ": is a directory");
  // Was "basic_filebuf::underflow error reading the file: Is a directory", without the path.
  expect_usage_error(kSmallRun + " --golden-check " + dir, dir + ": is a directory; expected a golden file");
  expect_usage_error(kSmallRun + " --golden-check " + dir + " --golden-baseline " + dir,
                     dir + ": is a directory; expected a golden file");
}

TEST(FusepackTrain, GoldenWriteIntoAMissingFolderNamesTheFolder) {
  std::string const missing = temp_path("_missing");
  expect_usage_error(kSmallRun + " --golden-write " + missing + "/golden.json",
                     "--golden-write " + missing + "/golden.json: its folder " + missing + " does not exist");
  EXPECT_NE(::access(missing.c_str(), F_OK), 0) << "the folder was created";
  expect_usage_error(kSmallRun + " --golden-write " + ::testing::TempDir(), ": is a directory; give a file name");
}

TEST(FusepackTrain, RefusesANegativeSeedInsteadOfWrappingIt) {
  expect_usage_error(kSmallRun + " --seed -1", "--seed: must be a non-negative integer (0 to 2^64-1); got -1");
}

TEST(FusepackTrain, BoundsThreadsInsteadOfHanging) {
  expect_usage_error(kSmallRun + " --threads 100000", "--threads must be >= 0 and <= 1024 (0 = ATen's default); got "
                                                      "100000");
}

TEST(FusepackTrain, AnEmptyPathIsAnErrorNotNoOutput) {
  // `--output ''` (an unset shell variable) exited 0 and wrote nothing.
  expect_usage_error(kSmallRun + " --output ''", "--output is given an empty value");
  expect_usage_error(kSmallRun + " --golden-write ''", "--golden-write is given an empty value");
}

TEST(FusepackTrain, ARepeatedOptionWithABadValueSaysItWasGivenTwice) {
  // Was "Could not convert: --budget = 64,1e12".
  expect_usage_error(kSmallRun + " --budget 1e12",
                     "--budget: '1e12' is not a valid INT value (--budget was given 2 times: 64, 1e12; the last one "
                     "counts)");
}

std::string write_jsonl_file(std::string const& suffix, std::string const& text) {
  std::string const path = temp_path(suffix);
  std::ofstream(path) << text;
  return path;
}

TEST(FusepackTrain, AnExampleWithoutATargetIsReportedAtLoadNamingItsLine) {
  // Was found only at the step holding it: "the step has no target token on any rank".
  std::string const path = write_jsonl_file(".jsonl",
                                            "{\"input_ids\": [1, 2, 3]}\n"
                                            "\n"
                                            "{\"input_ids\": [4, 5, 6], \"labels\": [-100, -100, -100]}\n"
                                            "{\"input_ids\": [7, 8]}\n");
  expect_usage_error("--preset qwen35-tiny --steps 1 --data " + path,
                     "1 example(s) have no target token (a label other than -100 after the first token), so a step "
                     "made of them has no loss: line 3 (every label is -100)");
  std::remove(path.c_str());
  // --oversize truncate keeps an example's first --budget tokens: with prompt=0.9 those are all prompt.
  expect_usage_error("--preset qwen35-tiny --steps 1 --budget 16 --oversize truncate "
                     "--data synthetic:n=3,min=100,median=100,max=100,prompt=0.9",
                     "3 example(s) have no target token (a label other than -100 after the first token), so a step "
                     "made of them has no loss: example 0 (its 10 targets lie past the first 16 tokens, which "
                     "--oversize truncate keeps at --budget 16)");
}

TEST(FusepackTrain, NonFiniteInitialWeightsAreRefusedNamingTheTensor) {
  std::string const dir = temp_path("_nan");
  ASSERT_EQ(run_train(kSmallRun + " --steps 1 --output " + dir).exit_code, 0);
  checkpoint::Safetensors st = checkpoint::read_checkpoint(dir);
  std::string const name = "model.layers.2.mlp.down_proj.weight";
  ASSERT_EQ(st.tensors.count(name), 1u);
  st.tensors.at(name).view({-1})[7] = std::nan("");
  checkpoint::write_safetensors(dir + "/model.safetensors", st.tensors, st.metadata);
  expect_usage_error("--config " + dir + " --weights " + dir + " --data synthetic:n=12,median=12,max=40 --steps 1",
                     "tensor '" + name + "' holds 1 non-finite value(s) (NaN or infinity) among its 8192; the first "
                     "at flat index 7 is nan");
  for (char const* file : {"/config.json", "/model.safetensors"}) std::remove((dir + file).c_str());
  ::rmdir(dir.c_str());
}

// ------------------------------------------------------------------------------------------------------------------
// --epochs and --dry-run

// kSmallRun's model, data and optimizer without its --steps and --micro-batches.
std::string const kSmallData =
    "--preset qwen35-tiny --data synthetic:n=12,median=12,sigma=0.5,max=40,prompt=0.25,seed=3 --budget 64 --lr 1e-3 "
    "--threads 1 --seed 5";

// The packed micro-batches of epochs 0..epochs-1 as packing::plan_epoch plans them for kSmallData (lookahead and
// pairing at their defaults), each as its examples' lengths: what the trainer's epochs hold, computed on their own.
std::vector<std::vector<std::int64_t>> planned_epochs(int epochs) {
  packing::SyntheticSpec base;
  base.vocab_size = model::preset("qwen35-tiny").vocab_size;
  std::vector<std::int64_t> const lengths = packing::example_lengths(
      packing::make_synthetic(packing::parse_synthetic_spec("synthetic:n=12,median=12,sigma=0.5,max=40,prompt=0.25,"
                                                            "seed=3",
                                                            base)));
  packing::PackerOptions o;
  o.token_budget = 64;
  o.seed = 5;
  std::vector<std::vector<std::int64_t>> out;
  for (int e = 0; e < epochs; ++e) {
    packing::EpochPlan const plan = packing::plan_epoch(lengths, o, packing::PlanMode::kPaired, e);
    std::vector<std::int64_t> tokens;
    for (packing::BatchPlan const& b : plan.packed) {
      std::int64_t n = 0;
      for (std::int64_t id : b) n += lengths[static_cast<std::size_t>(id)];
      tokens.push_back(n);
    }
    out.push_back(tokens);
  }
  return out;
}

TEST(TrainConfig, EpochsAndStepsExcludeEachOther) {
  TrainConfig c = valid_config();
  c.epochs = 2;  // steps keeps its default 10
  FUSEPACK_EXPECT_INVALID_ARGUMENT(c.validate(), "give steps or epochs, not both");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(c.validate(TrainConfig::Naming::kOptions),
                                   "give --steps or --epochs, not both (--epochs derives the steps from the data); "
                                   "got --steps 10 and --epochs 2");
  c.steps = 0;
  c.warmup_steps = 100;  // checked against the derived steps, once the data is loaded
  EXPECT_NO_THROW(c.validate());
  c.epochs = -1;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(c.validate(), "epochs must be >= 1 (or 0: the run's length is steps); got -1");
}

// fusepack-train's messages name options, not fields: one that names a field without an option in the table reads
// "got batching padded" (as this one did before --batching was added to it).
TEST(TrainConfig, MessagesForTheCommandLineNameTheOptions) {
  TrainConfig c = valid_config();
  c.complete_packs = true;
  c.batching = train::Batching::kPadded;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(c.validate(TrainConfig::Naming::kOptions),
                                   "--complete-packs completes packed micro-batches to the token budget; got "
                                   "--batching padded");
}

TEST(FusepackTrain, EpochsDeriveTheStepsFromTheEpochPlansDroppingAPartialLastStep) {
  std::vector<std::vector<std::int64_t>> const epochs = planned_epochs(3);
  std::int64_t const total = static_cast<std::int64_t>(epochs[0].size() + epochs[1].size() + epochs[2].size());
  std::int64_t const per_step = 2;
  std::int64_t const steps = total / per_step, left = total % per_step;
  ASSERT_GT(left, 0) << "the test needs a partial last step to drop";
  BinaryResult const r = run_train(kSmallData + " --micro-batches 2 --epochs 3");
  ASSERT_EQ(r.exit_code, 0);
  std::string const line = "--epochs 3: 3 epochs of " + std::to_string(epochs[0].size()) + ", " +
                           std::to_string(epochs[1].size()) + " and " + std::to_string(epochs[2].size()) +
                           " micro-batches; " + std::to_string(steps) + " steps x 2 micro-batches, " +
                           std::to_string(left) + " left out\n";
  EXPECT_NE(r.out.find(line), std::string::npos) << "missing '" << line << "'";
  std::string const last = "step " + std::to_string(steps - 1) + "/" + std::to_string(steps) + "  loss";
  EXPECT_NE(r.out.find(last), std::string::npos) << "missing '" << last << "'";
  EXPECT_NE(r.out.find("summary: " + std::to_string(steps) + " steps,"), std::string::npos);
  EXPECT_NE(r.out.find(" steps of 2 micro-batches, from --epochs 3\n"), std::string::npos)
      << "the batching line records the epochs";
  EXPECT_NE(r.out.find(" at step " + std::to_string(steps) + "\n"), std::string::npos)
      << "the schedule ends at the derived steps";
}

TEST(FusepackTrain, EpochsRefuseStepsAndRunsShorterThanOneStepNamingTheNumbers) {
  expect_usage_error(kSmallRun + " --epochs 2", "give --steps or --epochs, not both (--epochs derives the steps from "
                                                "the data); got --steps 2 and --epochs 2");
  std::vector<std::vector<std::int64_t>> const epochs = planned_epochs(2);
  std::int64_t const first = static_cast<std::int64_t>(epochs[0].size());
  expect_usage_error(kSmallData + " --epochs 1 --micro-batches " + std::to_string(first + 1),
                     "--epochs 1: 1 epoch of " + std::to_string(first) + " micro-batches holds fewer than one step "
                     "takes (" + std::to_string(first + 1) + " micro-batches: --micro-batches " +
                     std::to_string(first + 1) + "); give more --epochs");
  // --warmup and --profile-step are checked against the derived steps.
  std::int64_t const steps = static_cast<std::int64_t>(epochs[0].size() + epochs[1].size());  // one micro-batch each
  expect_usage_error(kSmallData + " --epochs 2 --warmup " + std::to_string(steps + 1),
                     "--warmup " + std::to_string(steps + 1) + " must be <= the " + std::to_string(steps) +
                         " steps of --epochs 2");
  expect_usage_error(kSmallData + " --epochs 2 --profile-step " + std::to_string(steps),
                     "--profile-step " + std::to_string(steps) + " must be < the " + std::to_string(steps) +
                         " steps of --epochs 2 (0-based)");
}

bool exists(std::string const& path) { return ::access(path.c_str(), F_OK) == 0; }

// qwen35-tiny's max_position_embeddings is 128: some examples of a set with median 130 (budget 512) pass it, and
// the run counts them, as this test counts them in the same synthetic set; the small run's examples (at most 40)
// do not.
TEST(FusepackTrain, ExamplesLongerThanTheModelsPositionsAreWarnedAbout) {
  std::int64_t const max_positions = model::preset("qwen35-tiny").max_position_embeddings;
  ASSERT_EQ(max_positions, 128);
  std::string const spec = "synthetic:n=40,median=130,sigma=0.3,max=300,seed=3";
  packing::SyntheticSpec base;
  base.vocab_size = model::preset("qwen35-tiny").vocab_size;
  std::int64_t over = 0, longest = 0;
  for (packing::Example const& e : packing::make_synthetic(packing::parse_synthetic_spec(spec, base))) {
    auto const len = static_cast<std::int64_t>(e.input_ids.size());
    over += len > max_positions;
    longest = std::max(longest, len);
  }
  ASSERT_GT(over, 1);
  ASSERT_LT(over, 40);  // some, not all: the count is the examples', not the set's
  BinaryResult const r = run_train("--preset qwen35-tiny --data " + spec + " --budget 512 --steps 1 --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: " + std::to_string(over) + " examples are longer than the model's "
                       "max_position_embeddings 128 (the longest: " + std::to_string(longest) + " tokens)"),
            std::string::npos)
      << r.out;
  BinaryResult const small = run_train(kSmallRun + " --dry-run");
  ASSERT_EQ(small.exit_code, 0) << small.out;
  EXPECT_EQ(small.out.find("max_position_embeddings"), std::string::npos) << small.out;
}

TEST(FusepackTrain, DryRunPrintsThePlanAndWritesNothing) {
  std::string const out_parent = temp_path("_out"), metrics = temp_path(".jsonl"), golden = temp_path(".json"),
                    save_dir = temp_path("_save");
  std::string const output = out_parent + "/weights";  // neither folder exists: a real run would create both
  BinaryResult const r = run_train(kSmallRun + " --dry-run --output " + output + " --metrics " + metrics +
                                   " --golden-write " + golden + " --save-dir " + save_dir + " --save-every 1");
  ASSERT_EQ(r.exit_code, 0);
  // kSmallRun: 2 steps of 2 micro-batches, the first 4 micro-batches of the epochs.
  std::vector<std::vector<std::int64_t>> const epochs = planned_epochs(2);
  std::vector<std::int64_t> tokens;
  for (auto const& e : epochs) tokens.insert(tokens.end(), e.begin(), e.end());
  ASSERT_GE(tokens.size(), 4u);
  tokens.resize(4);
  std::vector<std::int64_t> sorted = tokens;
  std::sort(sorted.begin(), sorted.end());
  std::int64_t const middle_two = sorted[1] + sorted[2];  // the median of 4: the mean of the middle two
  std::string const median = train::grouped(middle_two / 2) + (middle_two % 2 == 0 ? "" : ".5");
  ASSERT_EQ(epochs[0].size(), 3u) << "the epochs covered below assume 3 micro-batches in epoch 0";
  model::ModelOptions meta;
  meta.device = at::kMeta;
  std::int64_t const parameters = model::Qwen35ForCausalLM(model::preset("qwen35-tiny"), meta).num_parameters();
  for (std::string const& text :
       {std::string("dry run: planning the run without training it or writing any file"),
        std::string("model: preset qwen35-tiny"),
        std::string("plan: 2 steps x 2 micro-batches = 4 micro-batches, 1.33 epochs\n"),
        "per micro-batch (min / median / max): tokens " + train::grouped(sorted.front()) + " / " + median + " / " +
            train::grouped(sorted.back()) + ", examples ",
        std::string("; padding 0.0% of "),
        "memory: " + train::grouped(parameters) + " parameters x 16 bytes = ",
        std::string("; activations not included\n  per parameter: fp32 weights 4 + gradients 4 + AdamW moments 2 x 4 "
                    "bytes\n"),
        std::string("dry run: stopped before the first step; no file written")}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << "missing '" << text << "'";
  }
  EXPECT_EQ(r.out.find("step 0/"), std::string::npos) << "a dry run trains no step";
  expect_short_lines(r.out);
  for (std::string const& path : {out_parent, output, metrics, golden, save_dir}) {
    EXPECT_FALSE(exists(path)) << path << " was created by a dry run";
  }
  // The padded layout counts its padding; fp64 weights, gradients and moments take 8 bytes each.
  BinaryResult const padded = run_train(kSmallRun + " --dry-run --batching padded --dtype fp64");
  ASSERT_EQ(padded.exit_code, 0);
  EXPECT_EQ(padded.out.find("; padding 0.0% of "), std::string::npos) << padded.out;
  EXPECT_NE(padded.out.find(" parameters x 32 bytes = "), std::string::npos);
  EXPECT_NE(padded.out.find("per parameter: fp64 weights 8 + gradients 8 + AdamW moments 2 x 8 bytes"),
            std::string::npos);
  // The checks of a real run still apply: an existing metrics file is refused, as it would be by the run.
  std::ofstream(metrics) << "{}\n";
  expect_usage_error(kSmallRun + " --dry-run --metrics " + metrics, "--metrics " + metrics + ": exists");
  std::remove(metrics.c_str());
}

TEST(FusepackTrain, ADryRunDerivesTheStepsOfTheRealRun) {
  std::string const args = kSmallData + " --micro-batches 2 --epochs 3";
  BinaryResult const dry = run_train(args + " --dry-run");
  BinaryResult const real = run_train(args);
  ASSERT_EQ(dry.exit_code, 0);
  ASSERT_EQ(real.exit_code, 0);
  auto line_of = [](std::string const& out, std::string const& start) {
    std::size_t const at = out.find("\n" + start);
    if (at == std::string::npos) return std::string();
    return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  };
  std::string const epochs_line = line_of(dry.out, "--epochs 3: ");
  ASSERT_FALSE(epochs_line.empty());
  EXPECT_EQ(epochs_line, line_of(real.out, "--epochs 3: "));
  std::string const summary = line_of(real.out, "summary: ");  // "summary: 4 steps, ..."
  ASSERT_FALSE(summary.empty());
  std::int64_t const steps = std::stoll(summary.substr(9));
  ASSERT_GT(steps, 0);
  EXPECT_NE(dry.out.find("plan: " + std::to_string(steps) + " steps x 2 micro-batches = " +
                         std::to_string(2 * steps) + " micro-batches"),
            std::string::npos)
      << dry.out;
  // In the process: the dry run's total_steps are the steps the real run trains.
  TrainConfig c = valid_config();
  c.data = "synthetic:n=12,median=12,sigma=0.5,max=40,prompt=0.25,seed=3";
  c.token_budget = 64;
  c.micro_batches = 2;
  c.seed = 5;
  c.threads = 1;
  c.steps = 0;
  c.epochs = 3;
  c.dry_run = true;
  train::RunResult const planned = train::run_training(c);
  EXPECT_EQ(planned.total_steps, steps);
  EXPECT_TRUE(planned.steps.empty());
}

TEST(FusepackTrain, AnEpochsRunResumesOnlyWithItsEpochs) {
  std::string const save_dir = temp_path("_save");
  std::string const args = kSmallData + " --micro-batches 2 --epochs 3 --save-dir " + save_dir;
  BinaryResult const first = run_train(args + " --save-every 1");
  ASSERT_EQ(first.exit_code, 0);
  std::string const step2 = save_dir + "/step-00000002";
  BinaryResult const resumed = run_train(args + " --resume " + step2);
  EXPECT_EQ(resumed.exit_code, 0);
  EXPECT_NE(resumed.out.find("resumed from " + step2 + " after step 1"), std::string::npos) << resumed.out;
  // The same number of steps given as --steps is another run's settings: the epochs must be repeated.
  std::size_t const summary = first.out.find("summary: ");
  ASSERT_NE(summary, std::string::npos);
  std::string const steps = std::to_string(std::stoll(first.out.substr(summary + 9)));
  expect_usage_error(kSmallData + " --micro-batches 2 --steps " + steps + " --resume " + step2,
                     "/batching/epochs: 3 in the checkpoint, (absent) in this run");
  checkpoint::remove_tree(save_dir);
}

// ------------------------------------------------------------------------------------------------------------------
// Evaluation (--eval-data, --eval-every)

std::string const kEvalData = "synthetic:n=20,median=16,sigma=0.5,max=40,prompt=0.25,seed=9";

// Five fp64 steps on one thread (reproducible to the bit) writing their final weights to `output`.
TrainConfig eval_settings(std::string const& output) {
  TrainConfig c = valid_config();
  c.data = "synthetic:n=24,median=16,sigma=0.5,max=40,prompt=0.25,seed=3";
  c.token_budget = 64;
  c.micro_batches = 2;
  c.steps = 5;
  c.lr = 1e-3;
  c.dtype = train::DType::kFloat64;
  c.threads = 1;
  c.seed = 5;
  c.output_dir = output;
  return c;
}

TEST(Eval, LeavesTheTrainingUnchangedToTheBit) {
  std::string const plain_dir = temp_path("_plain"), eval_dir = temp_path("_eval");
  TrainConfig const plain = eval_settings(plain_dir);
  TrainConfig with_eval = eval_settings(eval_dir);
  with_eval.eval_data = kEvalData;
  with_eval.eval_every = 2;
  train::RunResult const a = train::run_training(plain);
  train::RunResult const b = train::run_training(with_eval);

  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i;
    EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << "step " << i;
    EXPECT_EQ(a.steps[i].lr, b.steps[i].lr) << "step " << i;
    EXPECT_EQ(a.steps[i].targets, b.steps[i].targets) << "step " << i;
    EXPECT_EQ(a.steps[i].tokens, b.steps[i].tokens) << "step " << i;
  }
  // The eval's tokens are counted in its own lines only.
  EXPECT_EQ(a.summary.tokens, b.summary.tokens);
  EXPECT_EQ(a.summary.targets, b.summary.targets);
  EXPECT_EQ(a.summary.examples, b.summary.examples);
  EXPECT_TRUE(a.evals.empty());
  // After every eval_every steps and after the last (0-based step numbers).
  std::vector<std::int64_t> expected_steps, got_steps;
  for (std::int64_t s = 0; s < with_eval.steps; ++s) {
    if ((s + 1) % with_eval.eval_every == 0 || s + 1 == with_eval.steps) expected_steps.push_back(s);
  }
  for (train::EvalMetrics const& e : b.evals) got_steps.push_back(e.step);
  EXPECT_EQ(got_steps, expected_steps);

  checkpoint::Safetensors const x = checkpoint::read_checkpoint(plain_dir), y = checkpoint::read_checkpoint(eval_dir);
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (auto const& [name, t] : x.tensors) {
    ASSERT_EQ(y.tensors.count(name), 1u) << name;
    EXPECT_TRUE(at::equal(t, y.tensors.at(name))) << name << ": the final weights differ";
  }
  checkpoint::remove_tree(plain_dir);
  checkpoint::remove_tree(eval_dir);
}

// The last evaluation runs on the final weights, which the run writes: loaded into a fresh fp64 model, each eval
// example alone (a padded batch of one row) gives its summed cross-entropy; their sum over their targets is the mean
// the run reported.
TEST(Eval, TheLossIsTheMeanCrossEntropyOfTheEvalExamplesUnderTheFinalWeights) {
  std::string const dir = temp_path("_eval_final");
  TrainConfig c = eval_settings(dir);
  c.eval_data = kEvalData;
  c.eval_every = 100;  // only after the last step
  train::RunResult const r = train::run_training(c);
  ASSERT_EQ(r.evals.size(), 1u);
  train::EvalMetrics const& e = r.evals.back();
  EXPECT_EQ(e.step, c.steps - 1);

  model::ModelOptions o;
  o.dtype = at::kDouble;
  model::Qwen35ForCausalLM m(model::preset(c.preset), o);
  checkpoint::Qwen35TextCheckpoint const weights = checkpoint::read_qwen35_text_checkpoint(dir);
  m.load_state(weights.tensors);
  checkpoint::remove_tree(dir);
  packing::SyntheticSpec base;
  base.vocab_size = m.config().vocab_size;
  std::vector<packing::Example> const examples =
      packing::make_synthetic(packing::parse_synthetic_spec(kEvalData, base));
  double loss_sum = 0;
  std::int64_t targets = 0, tokens = 0;
  for (std::size_t i = 0; i < examples.size(); ++i) {
    packing::PaddedBatch const alone =
        packing::make_padded_batch(examples, {static_cast<std::int64_t>(i)}, packing::kNoLengthLimit);
    model::ForwardOutput const out = m.forward(model::make_model_batch(alone, at::kCPU));
    loss_sum += out.loss_sum.item<double>();
    targets += out.num_targets;
    tokens += static_cast<std::int64_t>(examples[i].input_ids.size());
  }
  EXPECT_EQ(e.targets, targets);
  EXPECT_EQ(e.tokens, tokens);
  EXPECT_EQ(e.examples, static_cast<std::int64_t>(examples.size()));
  double const mean = loss_sum / static_cast<double>(targets);
  std::printf("eval loss %.17g, examples alone %.17g, rel diff %.2e\n", e.loss, mean, std::fabs(e.loss - mean) / mean);
  // Only the summation order differs (packed micro-batches vs one example at a time), in fp64.
  EXPECT_NEAR(e.loss, mean, 1e-12 * mean);
  // Not the initial weights' loss: the evaluation saw the trained model.
  model::Qwen35ForCausalLM fresh(model::preset(c.preset), [&] {
    model::ModelOptions f = o;
    f.seed = c.seed;
    return f;
  }());
  double fresh_sum = 0;
  for (std::size_t i = 0; i < examples.size(); ++i) {
    packing::PaddedBatch const alone =
        packing::make_padded_batch(examples, {static_cast<std::int64_t>(i)}, packing::kNoLengthLimit);
    fresh_sum += fresh.forward(model::make_model_batch(alone, at::kCPU)).loss_sum.item<double>();
  }
  EXPECT_GT(std::fabs(fresh_sum / static_cast<double>(targets) - e.loss), 1e-6);
}

// Three ranks (Gloo, in threads) evaluate micro-batches r, r + 3, ... of the set and sum; one left without one in the
// last round repeats the first and discards it, so all run the same forwards (their all-gathers are collectives).
TEST(Eval, ShardedRanksReportTheOneProcessLossAndCounts) {
  TrainConfig sharded = eval_settings("");
  sharded.micro_batches = 1;
  sharded.steps = 3;
  sharded.eval_data = "synthetic:n=22,median=16,sigma=0.5,max=40,prompt=0.25,seed=9";  // 8 micro-batches at budget 64
  sharded.eval_every = 2;
  TrainConfig alone = sharded;  // 3 ranks x 1 micro-batch train the examples of one process with 3
  alone.micro_batches = 3;
  train::RunResult const three_alone = train::run_training(alone);
  ASSERT_EQ(three_alone.evals.size(), 2u);
  ASSERT_NE(three_alone.evals[0].micro_batches % 3, 0) << "the set should leave a rank without one in a round";

  parallel::CollectivesOptions copts;
  copts.timeout = std::chrono::seconds(120);
  auto const group = parallel::local_gloo_group(3, copts);
  std::vector<train::RunResult> ranks(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        train::RunOptions o;
        o.comm = group[static_cast<std::size_t>(r)];
        ranks[static_cast<std::size_t>(r)] = train::run_training(sharded, o);
      } catch (std::exception const& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) ASSERT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  for (train::RunResult const& rank : ranks) {
    ASSERT_EQ(rank.evals.size(), three_alone.evals.size());
    for (std::size_t i = 0; i < rank.evals.size(); ++i) {
      train::EvalMetrics const& got = rank.evals[i];
      train::EvalMetrics const& want = three_alone.evals[i];
      EXPECT_EQ(got.step, want.step);
      EXPECT_EQ(got.targets, want.targets);
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.examples, want.examples);
      EXPECT_NEAR(got.loss, want.loss, 1e-12 * want.loss) << "eval after step " << want.step;
    }
  }
}

// "step 1/2  loss ..." and "eval 1/2  loss ...": the eval line follows its step's line, its columns lined up.
TEST(FusepackTrain, EvalLinesFollowTheirStepsLinedUpWithTheStepLines) {
  BinaryResult const r = run_train(kSmallRun + " --eval-data " + kEvalData + " --eval-every 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  int evals = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("eval ", 0) != 0 || lines[i].find("  loss ") == std::string::npos) continue;
    ++evals;
    ASSERT_GT(i, 0u);
    std::string const& step = lines[i - 1];
    ASSERT_EQ(step.rfind("step ", 0), 0u) << "an eval line follows its step's line: " << step;
    EXPECT_EQ(step.substr(4, step.find("  loss") - 4), lines[i].substr(4, lines[i].find("  loss") - 4));
    EXPECT_EQ(step.find("  loss "), lines[i].find("  loss ")) << step << "\n" << lines[i];
  }
  EXPECT_EQ(evals, 2) << r.out;
  expect_short_lines(r.out);
  EXPECT_NE(r.out.find("eval: 20 examples, "), std::string::npos) << r.out;
}

// ------------------------------------------------------------------------------------------------------------------
// Short start lines, presets from the one table, progress of long phases

TEST(FusepackTrain, StartLinesAreShortSummariesAndTheMetricsFileKeepsTheFullSettings) {
  std::string const metrics = temp_path(".jsonl");
  BinaryResult const r = run_train(kSmallRun + " --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  expect_short_lines(r.out);
  packing::SyntheticSpec base;
  base.vocab_size = model::preset("qwen35-tiny").vocab_size;
  std::int64_t tokens = 0;
  std::string const data = "synthetic:n=12,median=12,sigma=0.5,max=40,prompt=0.25,seed=3";
  for (packing::Example const& e : packing::make_synthetic(packing::parse_synthetic_spec(data, base))) {
    tokens += static_cast<std::int64_t>(e.input_ids.size());
  }
  for (std::string const& text :
       {"\ndata: 12 examples, " + train::grouped(tokens) + " tokens, ", "; " + data + "\n",
        std::string("\nbatching: packed (paired), budget 64, lookahead 64, oversize error; 2 steps of 2 "
                    "micro-batches\n"),
        std::string("\noptimizer: AdamW lr 0.001, betas 0.9/0.95, eps 1e-08, weight decay 0.1, clip 1; warmup 0, "
                    "cosine to 0 at step 2\n")}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << "missing '" << text << "' in:\n" << r.out;
  }
  std::ifstream file(metrics);
  std::string header;
  std::getline(file, header);
  std::remove(metrics.c_str());
  for (char const* setting : {"\"batching\":{", "\"optimizer\":{", "\"schedule\":{", "\"token_budget\":64",
                              "\"dataset\":{", "\"synthetic\":\"synthetic:n=12,vocab=256,median=12"}) {
    EXPECT_NE(header.find(setting), std::string::npos) << "missing " << setting << " in the metrics header: " << header;
  }
}

TEST(FusepackTrain, HelpListsEveryPresetOfThePresetTable) {
  BinaryResult const help = run_train("--help");
  ASSERT_EQ(help.exit_code, 0);
  for (std::string const& name : model::preset_names()) {
    EXPECT_NE(help.out.find(name), std::string::npos) << "--help does not list preset " << name;
  }
}

// A clock that moves on `step` seconds at every read makes every phase look long; the steady clock keeps a small
// run's phases (milliseconds) below the 2 s interval, so they print nothing.
TEST(RunTraining, LongPhasesReportThroughTheProgressOptionAndFastOnesPrintNothing) {
  TrainConfig c = valid_config();
  c.data = "synthetic:n=12,median=12,sigma=0.5,max=40,seed=3";
  c.token_budget = 64;
  c.steps = 1;
  c.threads = 1;
  std::ostringstream fast_out;
  packing::Progress fast;
  fast.out = &fast_out;
  train::RunOptions o;
  o.progress = &fast;
  train::run_training(c, o);
  EXPECT_EQ(fast_out.str(), "");

  std::ostringstream slow_out;
  double now = 0;
  packing::Progress slow;
  slow.out = &slow_out;
  slow.clock = [&now] { return now += 10; };
  o.progress = &slow;
  train::run_training(c, o);
  std::printf("%s", slow_out.str().c_str());
  for (std::string const& text : {"drawing " + c.data + ": 12 examples in ", std::string("planning epoch 0 (packed): "),
                                  std::string("building the model: initialised in ")}) {
    EXPECT_NE(slow_out.str().find(text), std::string::npos) << "missing '" << text << "'";
  }
}

}  // namespace
}  // namespace fusepack::test
