// End to end on the GPU (docs/contracts.md, goldens, label gpu): the packed fused path in bf16 on qwen35-tiny64 stays
// within the drift of the padded composite bf16 run from the same fp64 golden (golden/qwen35-tiny64-padded.json):
// per step, |fused − golden| <= 2·|composite − golden| + one bf16 rounding step (golden::compare_with_baseline,
// docs/contracts.md, numerics's rule on the training curve), target counts exact. A planted packing bug must fail it.
// Without a CUDA device every test reports SKIPPED with the reason.
#include "golden/compare.h"
#include "golden/golden_file.h"
#include "tests/golden/e2e_support.h"
#include "tests/support/expect.h"
#include "tests/support/run_binary.h"
#include "tests/support/torch_bridge.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/parallel/collectives.h"
#include "trainer/parallel/dist_env.h"
#include "trainer/train/config.h"
#include "trainer/train/run.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#ifndef FUSEPACK_GOLDEN_DIR
#error "FUSEPACK_GOLDEN_DIR must name the golden/ folder of the source tree"
#endif

namespace fusepack::test {
namespace {

using train::Batching;
using train::DType;
using train::TrainConfig;

std::string const kGolden = std::string(FUSEPACK_GOLDEN_DIR) + "/qwen35-tiny64-padded.json";

train::RunResult run(TrainConfig const& config, train::MicroBatchEdit edit = {}) {
  return run_and_print(config, "e2e_gpu_golden_test", std::move(edit));
}

// The padded composite bf16 run of the golden's settings, written as a golden-format file: the baseline. Run once.
std::string const& baseline_file() {
  static std::string const path = [] {
    std::string const p = ::testing::TempDir() + "fusepack_e2e_gpu_baseline_" + std::to_string(::getpid()) + ".json";
    TrainConfig c = golden_settings("qwen35-tiny64", Batching::kPadded, ops::Backend::kComposite, DType::kBFloat16,
                                    "cuda");
    c.golden_write = p;
    train::RunResult const r = run(c);
    golden::GoldenFile const g = golden::read_golden(kGolden);
    // The baseline's own drift from the fp64 golden, reported so the allowance can be re-measured.
    golden::Comparison const drift = golden::compare(g, r.golden.steps, golden::TolerancePolicy{});
    std::printf("[ measured ] padded composite bf16 vs fp64 golden: max rel diff loss %.3g, grad_norm %.3g\n",
                max_rel_diff(drift, "loss"), max_rel_diff(drift, "grad_norm"));
    return p;
  }();
  return path;
}

TrainConfig fused_config() {
  TrainConfig c = golden_settings("qwen35-tiny64", Batching::kPacked, ops::Backend::kFused, DType::kBFloat16, "cuda");
  c.golden_check = kGolden;
  c.golden_baseline = baseline_file();
  return c;
}

TEST(E2EGpuGolden, TheGoldenRecordsThePaddedCompositeFp64RunOfTheseSettings) {
  golden::GoldenFile const g = golden::read_golden(kGolden);
  EXPECT_EQ(g.provenance.dtype, "float64");
  EXPECT_EQ(g.provenance.device, "cpu");
  EXPECT_NE(g.provenance.batching.find("\"layout\":\"padded\""), std::string::npos) << g.provenance.batching;
  EXPECT_NE(g.provenance.batching.find("\"backend\":\"composite\""), std::string::npos) << g.provenance.batching;
  EXPECT_EQ(g.steps.size(), 10u);
  EXPECT_LT(g.steps.back().loss, g.steps.front().loss) << "the golden run should learn something";
}

TEST(E2EGpuGolden, PackedFusedBf16StaysWithinTwiceThePaddedCompositeBf16Drift) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  train::RunResult const r = run(fused_config());
  golden::GoldenFile const g = golden::read_golden(kGolden);
  for (std::string const& d : train::provenance_differences(g.provenance, r.golden.provenance)) ADD_FAILURE() << d;
  ASSERT_TRUE(r.comparison.has_value());
  std::printf("[ measured ] packed fused bf16 vs fp64 golden: max rel diff loss %.3g, grad_norm %.3g\n",
              max_rel_diff(*r.comparison, "loss"), max_rel_diff(*r.comparison, "grad_norm"));
  EXPECT_TRUE(r.comparison->passed()) << r.comparison->verdict();
  EXPECT_EQ(r.summary.padding_share(), 0.0);
}

// One rank on NCCL runs the sharded path (gather into bf16, the weights freed after each layer's forward and
// gathered again for its backward, fp32 reduce-scatter, the all-gathers and reduce-scatters on side streams): the
// same bf16 weights and the same deterministic kernels as the unsharded run, and gradients reduced over one rank, so
// the steps agree with the unsharded run's; and it passes the golden as that run does.
TEST(E2EGpuGolden, OneNcclRankTrainsLikeTheUnshardedRunAndPassesTheFusedGolden) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  train::RunResult const alone = run(fused_config());
  parallel::DistEnv const env = parallel::DistEnv::from_map({{"WORLD_SIZE", "1"},
                                                             {"RANK", "0"},
                                                             {"MASTER_ADDR", "127.0.0.1"},
                                                             {"MASTER_PORT", std::to_string(free_tcp_port())}});
  auto comm = parallel::init_collectives(env, c10::Device(c10::kCUDA, 0), parallel::CollectivesOptions{});
  train::RunOptions o;
  o.command = "e2e_gpu_golden_test (1 NCCL rank)";
  o.comm = comm;
  train::RunResult const sharded = train::run_training(fused_config(), o);
  comm->shutdown();
  ASSERT_TRUE(sharded.comparison.has_value());
  std::printf("%s", sharded.comparison->table().c_str());
  EXPECT_TRUE(sharded.comparison->passed()) << sharded.comparison->verdict();
  EXPECT_EQ(sharded.golden.provenance.world_size, 1);
  ASSERT_EQ(sharded.steps.size(), alone.steps.size());
  double worst = 0;
  for (std::size_t s = 0; s < alone.steps.size(); ++s) {
    EXPECT_EQ(sharded.steps[s].targets, alone.steps[s].targets);
    for (auto [a, b] : {std::pair{sharded.steps[s].loss, alone.steps[s].loss},
                        std::pair{sharded.steps[s].grad_norm, alone.steps[s].grad_norm}}) {
      worst = std::max(worst, std::fabs(a - b) / std::fabs(b));
    }
  }
  std::printf("[ measured ] 1 NCCL rank vs unsharded, fused bf16: max rel diff of loss / grad norm %.3g\n", worst);
  // Measured 0 on the H200 (same bits in, the same deterministic kernels, gradient shards aligned as fresh tensors);
  // 1e-6 would leave room only for a reordered fp32 sum.
  EXPECT_LE(worst, 1e-6);
}

// The bf16 allowance is ~1e13 times the fp64 one: the planted bug must still stand out of it.
TEST(E2EGpuGolden, PlantedLabelsShiftedAcrossThePackFailTheFusedComparison) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  train::RunResult const r = run(fused_config(), shift_labels_across_boundaries);
  ASSERT_TRUE(r.comparison.has_value());
  EXPECT_FALSE(r.comparison->passed()) << "the planted bug went unnoticed";
  bool step0_tokens_fail = false;
  for (golden::FieldCheck const& c : r.comparison->checks) {
    if (c.step == 0 && c.field == "tokens") step0_tokens_fail = !c.pass;
  }
  EXPECT_TRUE(step0_tokens_fail) << "the extra cross-boundary targets must change the step's target count";
}

// Every step of `resumed` equal to the bit to the step of `whole` with the same number (loss, grad norm, targets, lr).
void expect_same_steps(std::vector<train::StepMetrics> const& resumed, std::vector<train::StepMetrics> const& whole,
                       std::string const& what) {
  ASSERT_LE(resumed.size(), whole.size()) << what;
  std::size_t const offset = whole.size() - resumed.size();
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    train::StepMetrics const& a = resumed[i];
    train::StepMetrics const& b = whole[offset + i];
    EXPECT_EQ(a.step, b.step) << what;
    EXPECT_EQ(a.loss, b.loss) << what << ", step " << a.step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << what << ", step " << a.step;
    EXPECT_EQ(a.targets, b.targets) << what << ", step " << a.step;
    EXPECT_EQ(a.lr, b.lr) << what << ", step " << a.step;
  }
}

// The golden's settings, packed, fused, bf16 on the GPU, writing the final weights to `output`, saving every step
// into `save_dir` when one is given.
TrainConfig fused_run(std::string const& save_dir, std::string const& output) {
  TrainConfig c = golden_settings("qwen35-tiny64", Batching::kPacked, ops::Backend::kFused, DType::kBFloat16, "cuda");
  c.save_dir = save_dir;
  c.save_every = save_dir.empty() ? 0 : 1;
  c.keep_checkpoints = 100;
  c.output_dir = output;
  return c;
}

// A fused bf16 run resumed from its checkpoint after step k continues as if never stopped: every later step and the
// final weights equal to the bit. That needs the fused kernels to repeat themselves bit for bit, which is checked
// first (a second uninterrupted run), so a failure says which of the two broke.
TEST(E2EGpuGolden, AFusedBf16RunResumedFromACheckpointContinuesAsIfNeverStoppedBitForBit) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  std::string const saves = test_temp_path("gpu_resume_saves", "");
  TrainConfig const whole_config = fused_run(saves, test_temp_path("gpu_resume_whole", ""));
  train::RunResult const whole = run(whole_config);
  TrainConfig const again_config = fused_run("", test_temp_path("gpu_resume_again", ""));
  train::RunResult const again = run(again_config);
  ASSERT_EQ(again.steps.size(), whole.steps.size());
  expect_same_steps(again.steps, whole.steps, "a second uninterrupted run (the kernels must be deterministic)");
  expect_same_tensors(again_config.output_dir, whole_config.output_dir);
  for (int k : {3, 8}) {
    char step[32];
    std::snprintf(step, sizeof step, "step-%08d", k);
    TrainConfig c = fused_run("", test_temp_path("gpu_resumed_" + std::to_string(k), ""));
    c.resume = saves + "/" + step;
    train::RunResult const resumed = run(c);
    ASSERT_EQ(resumed.steps.size(), whole.steps.size() - static_cast<std::size_t>(k));
    expect_same_steps(resumed.steps, whole.steps, "resumed after step " + std::to_string(k));
    expect_same_tensors(c.output_dir, whole_config.output_dir);
  }
}

// Activation checkpointing recomputes each layer's forward in the backward with the same deterministic kernels on
// the same bf16 inputs: the gradients, hence every step, equal to the bit to the run without it.
TEST(E2EGpuGolden, ActivationCheckpointingLeavesEveryFusedBf16StepUnchangedBitForBit) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  train::RunResult const plain = run(fused_run("", ""));
  for (std::int64_t every : {1, 2}) {
    TrainConfig c = fused_run("", "");
    c.checkpoint_every = every;
    train::RunResult const checkpointed = run(c);
    ASSERT_EQ(checkpointed.steps.size(), plain.steps.size());
    expect_same_steps(checkpointed.steps, plain.steps,
                      "activation checkpointing " + train::activation_checkpointing_name(every));
    // What it is for: the layers keep their inputs, not their activations. Checkpointing every layer, a layer keeps
    // one [T, hidden] tensor instead of its norms, projections, convolution, recurrence and MLP intermediates
    // (dozens of them), so 3x is far below what it must save; every-2 keeps half the layers' activations.
    std::printf("[ measured ] the decoder layers kept %lld bytes without checkpointing, %lld with %s\n",
                static_cast<long long>(plain.layer_activation_bytes),
                static_cast<long long>(checkpointed.layer_activation_bytes),
                train::activation_checkpointing_name(every).c_str());
    ASSERT_GT(plain.layer_activation_bytes, 0);
    EXPECT_LE(checkpointed.layer_activation_bytes * (every == 1 ? 3 : 1), plain.layer_activation_bytes);
    EXPECT_LT(checkpointed.layer_activation_bytes, plain.layer_activation_bytes);
  }
}

TEST(E2EGpuGolden, ABaselineInAnotherDtypeIsRefused) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  TrainConfig c = fused_config();
  c.golden_baseline = kGolden;  // fp64: its drift would be 0 and allow nothing but the floor
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::run_training(c), "the baseline must be repeated in the run's dtype");
}

}  // namespace
}  // namespace fusepack::test
