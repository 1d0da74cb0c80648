// Sharded training (FSDP2 semantics over Gloo, the ranks as threads of this process) against one process training
// the whole model on the same examples: N ranks × M micro-batches must give every step's loss, target count and grad
// norm, and the final weights, of one process × N·M micro-batches; a packed 2-rank run must pass the committed
// padded golden; planted reduction bugs (an averaging reduce-scatter, a target count not summed over ranks) must fail
// it; ranks started with different settings must refuse to start.
//
// Why 1e-12 relative: in fp64 the gathered weights are the master values bit for bit (no cast), and each micro-batch
// runs the same ops on the same shapes in both runs, so each micro-batch's gradient is the same to the bit. Only sums
// are reordered: the micro-batches' gradients (accumulated in one buffer vs reduce-scattered across ranks), the
// squared norms, the loss. Each reordering moves a value by a few ulps (1e-16 relative); AdamW carries that into the
// weights (its update moves an element by at most lr·|δg|/eps for a gradient difference δg), < 1e-13 relative per
// step for the tiny model's gradients of ~1e-3: over 10 steps well inside 1e-12, and 1e9× below what the planted
// bugs move (they halve the gradients or change the loss's divisor).
#include "golden/compare.h"
#include "golden/golden_file.h"
#include "tests/golden/e2e_support.h"
#include "packing/batch.h"
#include "packing/synthetic.h"
#include "tests/support/env.h"
#include "tests/support/run_binary.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/model.h"
#include "trainer/parallel/collectives.h"
#include "trainer/parallel/fully_shard.h"
#include "trainer/parallel/sharded_checkpoint.h"
#include "trainer/train/config.h"
#include "trainer/train/run.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef FUSEPACK_GOLDEN_DIR
#error "FUSEPACK_GOLDEN_DIR must name the golden/ folder of the source tree"
#endif

namespace fusepack::test {
namespace {

using parallel::Collectives;
using parallel::CollectivesOptions;
using train::DType;
using train::TrainConfig;

std::string const kGolden = std::string(FUSEPACK_GOLDEN_DIR) + "/qwen35-tiny-padded.json";
constexpr double kRtol = 1e-12;  // see the top of the file

CollectivesOptions test_options() {
  CollectivesOptions o;
  o.timeout = std::chrono::seconds(120);
  return o;
}

// Runs fn(rank, comm) on every rank of `group` in threads; returns each rank's result or its error message.
template <typename Result>
struct Outcome {
  Result value{};
  std::string error;
};

template <typename Result>
std::vector<Outcome<Result>> on_ranks(std::vector<std::shared_ptr<Collectives>> const& group,
                                      std::function<Result(int, std::shared_ptr<Collectives> const&)> const& fn) {
  std::vector<Outcome<Result>> out(group.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        out[r].value = fn(static_cast<int>(r), group[r]);
      } catch (std::exception const& e) {
        out[r].error = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// golden/settings.sh's run, packed, composite fp64 on the CPU, with `micro_batches` per rank.
TrainConfig settings(std::int64_t micro_batches, std::int64_t steps = 10) {
  TrainConfig c = golden_settings("qwen35-tiny", train::Batching::kPacked, ops::Backend::kComposite, DType::kFloat64,
                                  "cpu");
  c.micro_batches = micro_batches;
  c.steps = steps;
  c.warmup_steps = std::min(c.warmup_steps, steps);
  return c;
}

train::RunResult train_alone(TrainConfig const& config) {
  train::RunOptions o;
  o.command = "fsdp_test (one process)";
  return train::run_training(config, o);
}

// Trains `config_of(rank)` on `world` ranks; fails the test on any rank's error.
std::vector<train::RunResult> train_sharded(int world, std::function<TrainConfig(int)> const& config_of,
                                            parallel::MakeCollectives const& make = {}) {
  auto const group = parallel::local_gloo_group(world, test_options(), make);
  auto const outcomes = on_ranks<train::RunResult>(group, [&](int rank, std::shared_ptr<Collectives> const& comm) {
    train::RunOptions o;
    o.command = "fsdp_test (rank " + std::to_string(rank) + ")";
    o.comm = comm;
    return train::run_training(config_of(rank), o);
  });
  std::vector<train::RunResult> results;
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    EXPECT_TRUE(outcomes[r].error.empty()) << "rank " << r << ": " << outcomes[r].error;
    results.push_back(outcomes[r].value);
  }
  return results;
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-300); }

// Every step of `sharded` against `alone`: targets exact, loss and grad norm within rtol; returns the worst relative
// difference seen.
double expect_same_steps(train::RunResult const& sharded, train::RunResult const& alone, double rtol) {
  EXPECT_EQ(sharded.steps.size(), alone.steps.size());
  double worst = 0;
  for (std::size_t s = 0; s < std::min(sharded.steps.size(), alone.steps.size()); ++s) {
    train::StepMetrics const& a = sharded.steps[s];
    train::StepMetrics const& b = alone.steps[s];
    EXPECT_EQ(a.targets, b.targets) << "step " << s;
    EXPECT_EQ(a.tokens, b.tokens) << "step " << s;
    EXPECT_EQ(a.examples, b.examples) << "step " << s;
    EXPECT_LE(rel(a.loss, b.loss), rtol) << "step " << s << ": loss " << a.loss << " vs " << b.loss;
    EXPECT_LE(rel(a.grad_norm, b.grad_norm), rtol) << "step " << s << ": grad norm " << a.grad_norm << " vs "
                                                   << b.grad_norm;
    EXPECT_EQ(a.lr, b.lr) << "step " << s;
    worst = std::max({worst, rel(a.loss, b.loss), rel(a.grad_norm, b.grad_norm)});
  }
  return worst;
}

// Every tensor of two checkpoints: max |a − b| ≤ rtol · max |b| (relative to the tensor's scale, since single elements
// near zero have no meaningful relative error); returns the worst such ratio.
double expect_same_weights(std::string const& a_dir, std::string const& b_dir, double rtol) {
  checkpoint::Safetensors const a = checkpoint::read_checkpoint(a_dir);
  checkpoint::Safetensors const b = checkpoint::read_checkpoint(b_dir);
  EXPECT_EQ(a.tensors.size(), b.tensors.size());
  double worst = 0;
  for (auto const& [name, tb] : b.tensors) {
    auto const it = a.tensors.find(name);
    if (it == a.tensors.end()) {
      ADD_FAILURE() << name << " is missing from " << a_dir;
      continue;
    }
    EXPECT_EQ(it->second.sizes(), tb.sizes()) << name;
    EXPECT_EQ(it->second.scalar_type(), tb.scalar_type()) << name;
    if (it->second.sizes() != tb.sizes()) continue;
    double const scale = tb.abs().max().item<double>();
    double const diff = (it->second - tb).abs().max().item<double>();
    double const ratio = scale > 0 ? diff / scale : diff;
    EXPECT_LE(ratio, rtol) << name << ": max |diff| " << diff << " at scale " << scale;
    worst = std::max(worst, ratio);
  }
  return worst;
}

void expect_ranks_reproduce_one_process(int world, std::int64_t micro_batches) {
  std::string const alone_dir = test_temp_path("alone", "");
  std::string const sharded_dir = test_temp_path("sharded", "");
  TrainConfig alone_config = settings(micro_batches * world);
  alone_config.output_dir = alone_dir;
  TrainConfig sharded_config = settings(micro_batches);
  sharded_config.output_dir = sharded_dir;

  train::RunResult const alone = train_alone(alone_config);
  std::vector<train::RunResult> const ranks = train_sharded(world, [&](int) { return sharded_config; });
  ASSERT_EQ(ranks.size(), static_cast<std::size_t>(world));
  double const steps_worst = expect_same_steps(ranks[0], alone, kRtol);
  for (int r = 1; r < world; ++r) {  // every rank reports the same global step
    for (std::size_t s = 0; s < ranks[r].steps.size(); ++s) {
      EXPECT_EQ(ranks[r].steps[s].loss, ranks[0].steps[s].loss) << "rank " << r << " step " << s;
      EXPECT_EQ(ranks[r].steps[s].grad_norm, ranks[0].steps[s].grad_norm) << "rank " << r << " step " << s;
    }
  }
  double const weights_worst = expect_same_weights(sharded_dir, alone_dir, kRtol);
  std::printf("[ measured ] %d ranks x %lld vs 1 x %lld micro-batches: max rel diff of loss/grad norm %.3g, of the "
              "final weights (max |diff| / max |w| per tensor) %.3g\n",
              world, static_cast<long long>(micro_batches), static_cast<long long>(micro_batches * world),
              steps_worst, weights_worst);
  EXPECT_GT(alone.steps.front().loss, alone.steps.back().loss) << "the run should learn something";
}

TEST(FullyShardedWeights, ShardsHoldTheWholeModelsInitialRowsOnEveryWorldSize) {
  model::Qwen35Config const config = model::preset("qwen35-tiny");
  model::ModelOptions mo;
  mo.dtype = at::kDouble;
  mo.seed = 77;
  model::Qwen35ForCausalLM const whole(config, mo);
  for (int world = 1; world <= 4; ++world) {
    auto const group = parallel::local_gloo_group(world, test_options());
    auto const outcomes = on_ranks<int>(group, [&](int rank, std::shared_ptr<Collectives> const& comm) {
      parallel::FullyShardOptions so;
      so.master_dtype = at::kDouble;
      parallel::FullyShardedWeights w(config, comm, so);
      w.init_parameters(77);
      int mismatches = 0;
      for (optim::NamedParameter const& p : w.parameters()) {
        parallel::ShardLayout const& l = w.layout(p.name);
        at::Tensor const rows = whole.parameter(p.name).detach().narrow(0, l.begin, l.local_rows);
        if (!at::equal(p.param.detach(), rows)) ++mismatches;
        at::Tensor const gathered = w.gather_parameter(p.name);  // collective, same order on every rank
        if (!at::equal(gathered, whole.parameter(p.name).detach())) ++mismatches;
        (void)rank;
      }
      return mismatches;
    });
    for (std::size_t r = 0; r < outcomes.size(); ++r) {
      EXPECT_TRUE(outcomes[r].error.empty()) << outcomes[r].error;
      EXPECT_EQ(outcomes[r].value, 0) << "world " << world << " rank " << r << ": shards or gathered parameters "
                                      << "differ from the whole model's initial values";
    }
  }
}

// A unit's all-gather input is its shards cast to their gather dtypes (bf16 compute; A_log and dt_bias stay fp32) in
// list operations, one per dtype: the weights a forward acquires equal the whole model's masters cast per parameter,
// to the bit, on 1, 2 and 3 ranks (3: uneven shards with padding). Catches, planted in gather_into: the bf16 list's
// copy left out (its slots hold whatever the buffer held).
TEST(FullyShardedWeights, AcquiredWeightsAreTheMastersCastToTheirComputeDtype) {
  model::Qwen35Config const config = model::preset("qwen35-tiny");
  model::ModelOptions mo;
  mo.dtype = at::kFloat;
  mo.seed = 11;
  mo.compute_dtype = at::kBFloat16;
  model::Qwen35ForCausalLM const whole(config, mo);
  for (int world = 1; world <= 3; ++world) {
    auto const group = parallel::local_gloo_group(world, test_options());
    auto const outcomes = on_ranks<int>(group, [&](int, std::shared_ptr<Collectives> const& comm) {
      parallel::FullyShardOptions so;
      so.master_dtype = at::kFloat;
      so.mixed_precision = whole.mixed_precision();
      parallel::FullyShardedWeights w(config, comm, so);
      w.init_parameters(11);
      at::NoGradGuard no_grad;
      int mismatches = 0;
      for (model::WeightGroup const& g : model::weight_groups(config)) {
        model::GroupWeights const got = w.acquire(g);
        for (auto const& [name, t] : got) {
          at::Tensor const master = whole.parameter(name).detach();
          at::Tensor const want = master.to(so.mixed_precision.compute_dtype(name, at::kFloat));
          if (t.scalar_type() != want.scalar_type() || !at::equal(t, want)) ++mismatches;
        }
        w.release(g, at::Tensor());
      }
      return mismatches;
    });
    for (std::size_t r = 0; r < outcomes.size(); ++r) {
      EXPECT_TRUE(outcomes[r].error.empty()) << outcomes[r].error;
      EXPECT_EQ(outcomes[r].value, 0) << "world " << world << " rank " << r << ": acquired weights differ from the "
                                      << "masters' casts";
    }
  }
}

struct OneBackward {
  std::int64_t all_gathers = 0, reduce_scatters = 0;
  std::vector<at::Tensor> grads;  // rank 0's shard gradients
};

// One forward and backward of qwen35-tiny (fp64) on 2 ranks, each with its own packed batch.
OneBackward one_backward(bool reshard_after_forward, std::int64_t checkpoint_every) {
  model::Qwen35Config const config = model::preset("qwen35-tiny");
  auto const group = parallel::local_gloo_group(2, test_options());
  auto const outcomes = on_ranks<OneBackward>(group, [&](int rank, std::shared_ptr<Collectives> const& comm) {
    parallel::FullyShardOptions so;
    so.master_dtype = at::kDouble;
    so.reshard_after_forward = reshard_after_forward;
    parallel::FullyShardedWeights w(config, comm, so);
    w.init_parameters(5);
    model::ModelOptions mo;
    mo.dtype = at::kDouble;
    mo.device = c10::kMeta;
    mo.checkpoint_every = checkpoint_every;
    model::Qwen35ForCausalLM const m(config, mo);
    packing::SyntheticSpec spec;
    spec.vocab_size = config.vocab_size;
    spec.num_examples = 6;
    spec.median_length = 20;
    spec.max_length = 64;
    spec.seed = 3 + static_cast<std::uint64_t>(rank);
    packing::PackedBatch const b = packing::make_packed_batch(packing::make_synthetic(spec));
    model::ForwardOutput const out = m.forward(model::make_model_batch(b, at::kCPU), w);
    out.loss_sum.backward();
    w.finish_backward();
    OneBackward r{w.all_gathers(), w.reduce_scatters(), {}};
    for (optim::NamedParameter const& p : w.parameters()) r.grads.push_back(p.param.grad().clone());
    return r;
  });
  for (auto const& o : outcomes) EXPECT_TRUE(o.error.empty()) << o.error;
  return outcomes[0].value;
}

void expect_same_gradients(OneBackward const& a, OneBackward const& b) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(at::equal(a.grads[i], b.grads[i])) << "parameter " << i;
}

// One forward and backward: every unit is gathered once for the forward; with reshard_after_forward every layer is
// gathered again for the backward (the embedding's backward needs no weights, the head is kept); each unit's gradient
// is reduce-scattered once. The gradients agree either way.
TEST(FullyShardedWeights, GathersEachLayerAgainForTheBackwardUnlessKeptAndReducesEachUnitOnce) {
  std::int64_t const layers = model::preset("qwen35-tiny").num_hidden_layers;
  OneBackward const resharded = one_backward(true, 0), kept = one_backward(false, 0);
  EXPECT_EQ(resharded.all_gathers, 2 * layers + 2);
  EXPECT_EQ(kept.all_gathers, layers + 2);
  EXPECT_EQ(resharded.reduce_scatters, layers + 2);
  EXPECT_EQ(kept.reduce_scatters, layers + 2);
  expect_same_gradients(resharded, kept);
}

// With activation checkpointing a layer's forward runs without a graph (its weights freed at once) and again in the
// backward, gathering its weights anew and keeping them for the backward that follows: one more all-gather per layer
// even when weights are kept, none extra when they are resharded anyway; the same gradients to the bit.
TEST(FullyShardedWeights, ActivationCheckpointingGathersEachLayerForItsRecomputationWithTheSameGradients) {
  std::int64_t const layers = model::preset("qwen35-tiny").num_hidden_layers;
  OneBackward const plain = one_backward(true, 0);
  for (bool reshard : {true, false}) {
    OneBackward const checkpointed = one_backward(reshard, 1);
    EXPECT_EQ(checkpointed.all_gathers, 2 * layers + 2) << "reshard " << reshard;
    EXPECT_EQ(checkpointed.reduce_scatters, layers + 2);
    expect_same_gradients(checkpointed, plain);
  }
}

TEST(ShardedTraining, ActivationCheckpointingChangesNoBitOfTheSteps) {
  TrainConfig plain = settings(1, 4);
  TrainConfig checkpointed = plain;
  checkpointed.checkpoint_every = 1;
  std::vector<train::RunResult> const a = train_sharded(2, [&](int) { return plain; });
  std::vector<train::RunResult> const b = train_sharded(2, [&](int) { return checkpointed; });
  EXPECT_EQ(expect_same_steps(b[0], a[0], 0.0), 0.0);
}

TEST(ShardedTraining, TwoRanksReproduceOneProcessOnTheSameExamplesInFp64) { expect_ranks_reproduce_one_process(2, 1); }

TEST(ShardedTraining, ThreeRanksWithUnevenShardsReproduceOneProcessInFp64) {
  // hidden 64, vocab 256, 4 DeltaNet value heads: every parameter's rows split unevenly over 3 ranks.
  expect_ranks_reproduce_one_process(3, 1);
}

TEST(ShardedTraining, TwoRanksTimesTwoMicroBatchesEqualOneProcessTimesFour) {
  expect_ranks_reproduce_one_process(2, 2);
}

TEST(ShardedTraining, KeepingTheGatheredWeightsForTheBackwardChangesNoBit) {
  TrainConfig resharded = settings(1, 4);
  TrainConfig kept = resharded;
  kept.reshard_after_forward = false;
  std::vector<train::RunResult> const a = train_sharded(2, [&](int) { return resharded; });
  std::vector<train::RunResult> const b = train_sharded(2, [&](int) { return kept; });
  EXPECT_EQ(expect_same_steps(a[0], b[0], 0.0), 0.0);
}

TEST(ShardedTraining, PackedTwoRankRunPassesTheCommittedPaddedGolden) {
  TrainConfig c = settings(1);  // 2 ranks × 1 = the golden's 2 micro-batches per step
  c.golden_check = kGolden;
  std::vector<train::RunResult> const ranks = train_sharded(2, [&](int) { return c; });
  ASSERT_TRUE(ranks[0].comparison.has_value());
  std::printf("%s", ranks[0].comparison->table().c_str());
  EXPECT_TRUE(ranks[0].comparison->passed()) << ranks[0].comparison->verdict();
  EXPECT_EQ(ranks[0].golden.provenance.world_size, 2);
  golden::GoldenFile const g = golden::read_golden(kGolden);
  for (std::string const& d : train::provenance_differences(g.provenance, ranks[0].golden.provenance)) {
    ADD_FAILURE() << d;
  }
}

// The planted bugs: each is what a plausible data-parallel implementation gets wrong.
class AveragingReduceScatter final : public Collectives {  // AVG where the pre-normalised loss needs the SUM
 public:
  using Collectives::Collectives;
  void reduce_scatter_sum(at::Tensor& out, at::Tensor& in, std::string const& what) override {
    Collectives::reduce_scatter_sum(out, in, what);
    out.div_(world_size());
  }
};

class UnsummedCounts final : public Collectives {  // integer counts (the step's targets) left per rank
 public:
  using Collectives::Collectives;
  void all_reduce_sum(at::Tensor& t, std::string const& what) override {
    if (t.scalar_type() != at::kLong) Collectives::all_reduce_sum(t, what);
  }
};

template <typename Planted>
void expect_planted_bug_fails_the_golden() {
  TrainConfig c = settings(1);
  c.golden_check = kGolden;
  parallel::MakeCollectives const make = [](auto store, auto backend, c10::Device device, CollectivesOptions o) {
    return std::make_shared<Planted>(store, backend, device, o);
  };
  std::vector<train::RunResult> const ranks = train_sharded(2, [&](int) { return c; }, make);
  ASSERT_TRUE(ranks[0].comparison.has_value());
  std::printf("%s", ranks[0].comparison->table().c_str());
  EXPECT_FALSE(ranks[0].comparison->passed()) << "the planted reduction bug went unnoticed";
}

TEST(ShardedTraining, PlantedAveragingReduceScatterFailsTheGolden) {
  expect_planted_bug_fails_the_golden<AveragingReduceScatter>();
}

TEST(ShardedTraining, PlantedPerRankTargetCountFailsTheGolden) { expect_planted_bug_fails_the_golden<UnsummedCounts>(); }

TEST(ShardedTraining, RanksStartedWithDifferentSettingsRefuseToStartNamingTheDifference) {
  auto const group = parallel::local_gloo_group(3, test_options());
  auto const outcomes = on_ranks<int>(group, [&](int rank, std::shared_ptr<Collectives> const& comm) {
    TrainConfig c = settings(1, 2);
    if (rank == 2) c.lr = 1e-3;
    train::RunOptions o;
    o.comm = comm;
    train::run_training(c, o);
    return 0;
  });
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    std::string const& e = outcomes[r].error;
    EXPECT_NE(e.find("different settings"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("rank 2"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("/lr 0.003 on rank 0, 0.001 on rank 2"), std::string::npos) << "rank " << r << ": " << e;
  }
}

// A training checkpoint of 2 ranks (each its own file of rows and AdamW moments) resumed on 2 ranks continues to the
// bit; resumed on 3 ranks (the rows regrouped from both files; the same 6 micro-batches per step) within 1e-12, the
// reordered sums of the top of this file.
TEST(ShardedResume, OnTheSameWorldSizeToTheBitAndOnAnotherWithin1e12) {
  std::string const save_dir = test_temp_path("sharded_saves", "");
  std::string const weights = test_temp_path("sharded_weights", "");
  TrainConfig c = settings(3, 6);
  c.save_dir = save_dir;
  c.save_every = 3;
  c.output_dir = weights;
  std::vector<train::RunResult> const uninterrupted = train_sharded(2, [&](int) { return c; });
  char step3[32];
  std::snprintf(step3, sizeof step3, "/step-%08d", 3);
  for (int world : {2, 3}) {
    TrainConfig r = settings(6 / world, 6);
    r.resume = save_dir + step3;
    r.output_dir = test_temp_path("resumed_on_" + std::to_string(world), "");
    std::vector<train::RunResult> const resumed = train_sharded(world, [&](int) { return r; });
    ASSERT_EQ(resumed[0].steps.size(), 3u);
    double const rtol = world == 2 ? 0.0 : kRtol;
    double worst = 0;
    for (std::size_t i = 0; i < 3; ++i) {
      train::StepMetrics const& a = resumed[0].steps[i];
      train::StepMetrics const& b = uninterrupted[0].steps[3 + i];
      EXPECT_EQ(a.step, b.step);
      EXPECT_EQ(a.targets, b.targets);
      EXPECT_LE(rel(a.loss, b.loss), rtol) << "world " << world << " step " << a.step;
      EXPECT_LE(rel(a.grad_norm, b.grad_norm), rtol) << "world " << world << " step " << a.step;
      worst = std::max({worst, rel(a.loss, b.loss), rel(a.grad_norm, b.grad_norm)});
    }
    double const weights_worst = expect_same_weights(r.output_dir, weights, rtol);
    std::printf("[ measured ] 2 ranks' checkpoint resumed on %d: max rel diff of loss/grad norm %.3g, final weights "
                "%.3g\n", world, worst, weights_worst);
  }
}

TEST(ShardedCheckpoint, SavedByTwoRanksLoadsOnThreeRanksRowByRow) {
  std::string const dir = test_temp_path("saved", "");
  TrainConfig c = settings(1, 2);
  c.output_dir = dir;
  train_sharded(2, [&](int) { return c; });
  checkpoint::Safetensors const saved = checkpoint::read_checkpoint(dir);
  auto const group = parallel::local_gloo_group(3, test_options());
  auto const outcomes = on_ranks<int>(group, [&](int, std::shared_ptr<Collectives> const& comm) {
    parallel::FullyShardOptions so;
    so.master_dtype = at::kDouble;
    parallel::FullyShardedWeights w(model::preset("qwen35-tiny"), comm, so);
    parallel::load_sharded_checkpoint(w, dir);
    int mismatches = 0;
    for (optim::NamedParameter const& p : w.parameters()) {
      parallel::ShardLayout const& l = w.layout(p.name);
      if (!at::equal(p.param.detach(), saved.tensors.at(p.name).narrow(0, l.begin, l.local_rows))) ++mismatches;
    }
    return mismatches;
  });
  for (auto const& o : outcomes) {
    EXPECT_TRUE(o.error.empty()) << o.error;
    EXPECT_EQ(o.value, 0);
  }
}

TEST(ShardedCheckpoint, ACheckpointOfAnotherModelIsRefusedOnEveryRankNamingTheTensors) {
  std::string const dir = test_temp_path("other", "");
  TrainConfig c = settings(1, 1);
  c.preset = "qwen35-tiny64";
  c.output_dir = dir;
  train_alone(c);
  auto const group = parallel::local_gloo_group(2, test_options());
  auto const outcomes = on_ranks<int>(group, [&](int, std::shared_ptr<Collectives> const& comm) {
    parallel::FullyShardOptions so;
    so.master_dtype = at::kDouble;
    parallel::FullyShardedWeights w(model::preset("qwen35-tiny"), comm, so);
    parallel::load_sharded_checkpoint(w, dir);
    return 0;
  });
  for (auto const& o : outcomes) {
    EXPECT_NE(o.error.find("in_proj_qkv.weight has shape"), std::string::npos) << o.error;
  }
}

TEST(Collectives, ReduceScatterSumsAndAllGatherConcatenatesInRankOrder) {
  auto const group = parallel::local_gloo_group(3, test_options());
  auto const outcomes = on_ranks<int>(group, [&](int rank, std::shared_ptr<Collectives> const& comm) {
    at::Tensor in = at::full({2}, static_cast<double>(rank + 1), at::kDouble);
    at::Tensor out = at::empty({6}, at::kDouble);
    comm->all_gather(out, in, "test all-gather");
    int bad = at::equal(out, at::tensor({1., 1., 2., 2., 3., 3.}, at::kDouble)) ? 0 : 1;
    at::Tensor rs_in = at::arange(6, at::kDouble) * (rank + 1);  // chunk r: [2r, 2r+1] · (rank+1)
    at::Tensor rs_out = at::empty({2}, at::kDouble);
    comm->reduce_scatter_sum(rs_out, rs_in, "test reduce-scatter");
    at::Tensor const expected = at::tensor({2. * rank, 2. * rank + 1}, at::kDouble) * 6;  // Σ (rank+1) = 6
    bad += at::equal(rs_out, expected) ? 0 : 1;
    std::vector<std::string> const all = comm->exchange("r" + std::to_string(rank), "test exchange");
    bad += all == std::vector<std::string>{"r0", "r1", "r2"} ? 0 : 1;
    return bad;
  });
  for (auto const& o : outcomes) {
    EXPECT_TRUE(o.error.empty()) << o.error;
    EXPECT_EQ(o.value, 0);
  }
}

}  // namespace
}  // namespace fusepack::test
