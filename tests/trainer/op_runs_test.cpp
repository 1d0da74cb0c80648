// No silent fallback, checked where the ops run (kernels/ops/op_scope.h): every op of a training step records the
// implementation that ran, in its composite body or its fused autograd function's forward and backward; a step covers
// every op of the model on the requested backend; and a step in which any op ran another implementation is refused
// before its update. The planted fallback is an op run of the other implementation inside the step (from the weight
// source the model's forward calls): on the GPU a real composite rmsnorm in a fused step, on the CPU a recorded fused
// run in a composite step. Without a CUDA device the GPU cases report SKIPPED.
#include "kernels/ops/op_scope.h"
#include "kernels/ops/rmsnorm.h"
#include "packing/batch.h"
#include "packing/synthetic.h"
#include "tests/support/torch_bridge.h"
#include "trainer/model/batch.h"
#include "trainer/model/model.h"
#include "trainer/model/weights.h"
#include "trainer/train/trainer.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <stdexcept>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using ops::Backend;
using ops::Pass;

// The ops of a Qwen3.5 decoder (both layer types) and its head with the loss.
std::set<std::string> const kModelOps = {"attention", "conv1d", "gated_delta",          "gated_rmsnorm",
                                         "rmsnorm",   "rope",   "linear_cross_entropy", "swiglu"};

// The model's own weights; `during_forward` runs when the forward asks for layer 0's weights (inside the step).
class WeightsWithAnExtraOp final : public model::WeightSource {
 public:
  WeightsWithAnExtraOp(model::Qwen35ForCausalLM const& m, std::function<void()> during_forward)
      : inner_(m.config(), m.named_parameters(), m.mixed_precision()), during_forward_(std::move(during_forward)) {}
  model::GroupWeights acquire(model::WeightGroup const& group, bool recomputing) override {
    if (group == model::WeightGroup::decoder_layer(0) && during_forward_) during_forward_();
    return inner_.acquire(group, recomputing);
  }
  void release(model::WeightGroup const& group, at::Tensor const& output, bool recomputing) override {
    inner_.release(group, output, recomputing);
  }
  c10::Device device() const override { return inner_.device(); }

 private:
  model::LocalWeights inner_;
  std::function<void()> during_forward_;
};

struct TinyModel {
  std::unique_ptr<model::Qwen35ForCausalLM> model;
  model::ModelBatch batch;
};

// qwen35-tiny (fp64 composite on the CPU) or qwen35-tiny64 (fp32 masters, bf16 fused on the GPU), and a packed batch
// of five synthetic examples.
TinyModel tiny_model(Backend backend) {
  model::ModelOptions o;
  o.backend = backend;
  o.seed = 3;
  bool const fused = backend == Backend::kFused;
  o.dtype = fused ? at::kFloat : at::kDouble;
  if (fused) o.compute_dtype = at::kBFloat16;
  o.device = fused ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  TinyModel s;
  s.model = std::make_unique<model::Qwen35ForCausalLM>(model::preset(fused ? "qwen35-tiny64" : "qwen35-tiny"), o);
  packing::SyntheticSpec spec;
  spec.num_examples = 5;
  spec.vocab_size = 256;
  spec.median_length = 12;
  spec.max_length = 40;
  spec.seed = 11;
  std::vector<packing::Example> const data = packing::make_synthetic(spec);
  s.batch = model::make_model_batch(packing::make_packed_batch(data), o.device);
  return s;
}

train::TrainerOptions options() {
  train::TrainerOptions t;
  t.schedule.peak_lr = 1e-3;
  t.schedule.warmup_steps = 0;
  t.schedule.total_steps = 2;
  return t;
}

// Every op of the model ran `backend` in the step just taken (forward; the fused ones also backward), nothing else.
void expect_every_op_ran(Backend backend) {
  std::set<std::string> forward, backward;
  for (ops::OpRunCount const& r : ops::op_run_counts()) {
    EXPECT_EQ(r.implementation, backend) << ops::describe_op_runs({r});
    (r.pass == Pass::kForward ? forward : backward).insert(r.op);
  }
  EXPECT_EQ(forward, kModelOps);
  // The composite backward is autograd through ATen ops, recorded by none of fusepack's.
  EXPECT_EQ(backward, backend == Backend::kFused ? kModelOps : std::set<std::string>{});
}

// The step was refused before its update: every parameter as it was.
void expect_refused_without_update(train::Trainer& trainer, TinyModel const& s, std::string const& what) {
  std::vector<at::Tensor> before;
  for (auto const& [name, p] : s.model->named_parameters()) before.push_back(p.detach().clone());
  try {
    trainer.step({s.batch});
    ADD_FAILURE() << "the step was taken; expected an error naming '" << what << "'";
  } catch (std::runtime_error const& e) {
    std::printf("[  error   ] %s\n", e.what());
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
  std::size_t i = 0;
  for (auto const& [name, p] : s.model->named_parameters()) EXPECT_TRUE(at::equal(p, before[i++])) << name;
  EXPECT_EQ(trainer.steps_taken(), 0);
}

TEST(OpRuns, ACompositeStepRunsEveryOpOfTheModelComposite) {
  TinyModel const s = tiny_model(Backend::kComposite);
  train::Trainer trainer(*s.model, options());
  trainer.step({s.batch});
  expect_every_op_ran(Backend::kComposite);
}

TEST(OpRuns, ACompositeStepInWhichAFusedRunIsRecordedIsRefusedBeforeItsUpdate) {
  TinyModel const s = tiny_model(Backend::kComposite);
  WeightsWithAnExtraOp weights(*s.model, [] { ops::count_op_run("conv1d", Pass::kForward, Backend::kFused); });
  train::Trainer trainer(*s.model, weights, train::model_parameters(*s.model), options());
  expect_refused_without_update(trainer, s, "conv1d forward ran fused 1 time");
}

TEST(OpRuns, AFusedStepRunsEveryOpOfTheModelFusedForwardAndBackward) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  TinyModel const s = tiny_model(Backend::kFused);
  train::Trainer trainer(*s.model, options());
  trainer.step({s.batch});
  expect_every_op_ran(Backend::kFused);
}

TEST(OpRuns, AFusedStepInWhichAnOpRanCompositeIsRefusedBeforeItsUpdate) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  TinyModel const s = tiny_model(Backend::kFused);
  at::Tensor const x = at::randn({4, 64}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16));
  at::Tensor const w = at::zeros({64}, x.options());
  WeightsWithAnExtraOp weights(*s.model, [&] { ops::rmsnorm(x, w, 1e-6, Backend::kComposite); });
  train::Trainer trainer(*s.model, weights, train::model_parameters(*s.model), options());
  expect_refused_without_update(trainer, s, "rmsnorm forward ran composite 1 time");
}

}  // namespace
}  // namespace fusepack::test
