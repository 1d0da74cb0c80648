// A step's gradients are its own: the trainer sets every gradient to none before the step's first backward, so the
// same batch on the same weights gives the same gradient norm however many steps came before. The witness: step 0
// runs at learning rate 0 (warmup), so step 1 sees step 0's weights; had step 0's gradients been kept (clipped in
// place), step 1's would be its own plus those: with the reset removed the norm grows 1.47x. fp64: equal to the bit.
#include "packing/batch.h"
#include "packing/synthetic.h"
#include "trainer/model/batch.h"
#include "trainer/model/model.h"
#include "trainer/train/trainer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace fusepack::test {
namespace {

// qwen35-tiny in fp64, and a packed batch of 4 synthetic examples in its vocabulary, from one seed.
model::ModelOptions fp64_options(std::uint64_t seed) {
  model::ModelOptions o;
  o.dtype = at::kDouble;
  o.seed = seed;
  return o;
}

model::ModelBatch small_batch(std::uint64_t seed) {
  packing::SyntheticSpec spec;
  spec.num_examples = 4;
  spec.vocab_size = 256;
  spec.median_length = 10;
  spec.max_length = 30;
  spec.seed = seed;
  return model::make_model_batch(packing::make_packed_batch(packing::make_synthetic(spec)), at::kCPU);
}

TEST(TrainerStep, TheSameBatchOnTheSameWeightsGivesTheSameGradientsAfterAnEarlierStep) {
  model::Qwen35ForCausalLM m(model::preset("qwen35-tiny"), fp64_options(5));
  model::ModelBatch const b = small_batch(5);
  train::TrainerOptions t;
  t.schedule.peak_lr = 1e-2;
  t.schedule.warmup_steps = 2;  // lr(0) = 0: step 0 leaves the weights as they are
  t.schedule.total_steps = 3;
  t.adamw.weight_decay = 0.1;   // times lr 0: no decay either
  train::Trainer trainer(m, t);
  train::StepResult const first = trainer.step({b});
  ASSERT_EQ(first.lr, 0.0);
  train::StepResult const second = trainer.step({b});
  EXPECT_GT(second.lr, 0.0);
  EXPECT_EQ(second.loss, first.loss) << "step 0 changed the weights";
  EXPECT_EQ(second.grad_norm, first.grad_norm) << "step 1's gradients include step 0's (ratio "
                                               << second.grad_norm / first.grad_norm << ")";
  // Step 2 runs on the weights step 1 changed: a different loss, so the equality above is not a constant.
  EXPECT_NE(trainer.step({b}).loss, first.loss);
}

// The run loop builds the next step's batches between begin_step and finish_step. The halves are one step: the same
// loss, norm and weights as step() on an identical model, with host work and another batch built in between; a
// second begin before the finish, or a finish without a begin, is refused, and a refused call leaves the step as it
// was. Planted and caught: finish_step leaving the step pending (the next begin is refused), begin_step without its
// check (a second begin goes through).
TEST(TrainerStep, BeginAndFinishAreOneStepWithTheNextBatchBuiltBetween) {
  model::Qwen35ForCausalLM whole(model::preset("qwen35-tiny"), fp64_options(7)),
      halves(model::preset("qwen35-tiny"), fp64_options(7));
  model::ModelBatch const b = small_batch(7);
  train::TrainerOptions t;
  t.schedule.peak_lr = 1e-2;
  t.schedule.total_steps = 2;
  train::Trainer a(whole, t), c(halves, t);
  for (int step = 0; step < 2; ++step) {
    train::StepResult const ra = a.step({b});
    EXPECT_THROW(c.finish_step(), std::logic_error);
    EXPECT_FALSE(c.step_begun());
    c.begin_step({b});
    EXPECT_TRUE(c.step_begun());
    EXPECT_THROW(c.begin_step({b}), std::logic_error);
    model::ModelBatch const next = small_batch(8 + step);  // the next step's batch, built while this one is pending
    EXPECT_GT(next.num_targets, 0);
    train::StepResult const rc = c.finish_step();
    EXPECT_FALSE(c.step_begun());
    EXPECT_EQ(rc.step, ra.step);
    EXPECT_EQ(rc.loss, ra.loss) << "step " << step;
    EXPECT_EQ(rc.grad_norm, ra.grad_norm) << "step " << step;
    EXPECT_EQ(rc.targets, ra.targets);
    EXPECT_EQ(rc.lr, ra.lr);
  }
  EXPECT_EQ(a.steps_taken(), 2);
  EXPECT_EQ(c.steps_taken(), 2);
  ASSERT_EQ(whole.named_parameters().size(), halves.named_parameters().size());
  for (std::size_t i = 0; i < whole.named_parameters().size(); ++i) {
    EXPECT_TRUE(at::equal(whole.named_parameters()[i].second, halves.named_parameters()[i].second))
        << whole.named_parameters()[i].first;
  }
}

}  // namespace
}  // namespace fusepack::test
