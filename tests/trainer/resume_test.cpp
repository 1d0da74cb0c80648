// Training checkpoints and resume (trainer/train/training_checkpoint.h), in the process: a run resumed from any of
// its checkpoints continues as if never stopped (every later step's loss and grad norm, and the final weights, equal
// to the bit in fp64); saving every step or every third gives the same checkpoints; only the newest K are kept; every
// way a checkpoint can be wrong (other settings, a missing, truncated or damaged file, a file of another model) is
// refused naming the file; outputs that cannot be written, or would replace files fusepack did not write, are refused
// before the first step.
#include "tests/golden/e2e_support.h"
#include "tests/support/expect.h"
#include "tests/support/run_binary.h"
#include "trainer/checkpoint/files.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/train/config.h"
#include "trainer/train/run.h"
#include "trainer/train/training_checkpoint.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using train::TrainConfig;

// golden/settings.sh's run (qwen35-tiny, packed, composite fp64, 10 steps of 2 micro-batches), saving every
// `save_every` steps into `save_dir`.
TrainConfig config(std::string const& save_dir, std::int64_t save_every) {
  TrainConfig c = golden_settings("qwen35-tiny", train::Batching::kPacked, ops::Backend::kComposite,
                                  train::DType::kFloat64, "cpu");
  c.save_dir = save_dir;
  c.save_every = save_every;
  c.keep_checkpoints = 100;
  return c;
}

std::string step_dir(std::string const& save_dir, int steps) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", steps);
  return checkpoint::join(save_dir, name);
}

// The uninterrupted run, saving every step, with its final weights: what every resumed run must reproduce.
struct Uninterrupted {
  std::string save_dir, output;
  train::RunResult result;
};

Uninterrupted const& uninterrupted() {
  static Uninterrupted const u = [] {
    Uninterrupted x;
    x.save_dir = ::testing::TempDir() + "fusepack_resume_uninterrupted_" + std::to_string(::getpid());
    x.output = x.save_dir + "_weights";
    TrainConfig c = config(x.save_dir, 1);
    c.output_dir = x.output;
    x.result = train::run_training(c);
    return x;
  }();
  return u;
}

TEST(Resume, FromAnyCheckpointContinuesAsIfNeverStoppedBitForBit) {
  Uninterrupted const& u = uninterrupted();
  for (int k : {1, 4, 7, 9}) {
    TrainConfig c = config("", 0);
    c.resume = step_dir(u.save_dir, k);
    c.output_dir = test_temp_path("resumed_" + std::to_string(k), "");
    train::RunResult const r = train::run_training(c);
    ASSERT_EQ(r.steps.size(), static_cast<std::size_t>(10 - k)) << "resumed after step " << k;
    for (std::size_t i = 0; i < r.steps.size(); ++i) {
      train::StepMetrics const& a = r.steps[i];
      train::StepMetrics const& b = u.result.steps[static_cast<std::size_t>(k) + i];
      EXPECT_EQ(a.step, b.step);
      EXPECT_EQ(a.loss, b.loss) << "step " << a.step << " resumed after step " << k;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << a.step;
      EXPECT_EQ(a.targets, b.targets) << "step " << a.step;
      EXPECT_EQ(a.lr, b.lr) << "step " << a.step;
    }
    expect_same_tensors(c.output_dir, u.output);
  }
}

TEST(Resume, SavingEveryThirdStepWritesTheCheckpointsOfSavingEveryStep) {
  Uninterrupted const& u = uninterrupted();
  std::string const dir = test_temp_path("every3", "");
  train::run_training(config(dir, 3));
  for (int k : {3, 6, 9, 10}) {
    std::string const mine = checkpoint::join(step_dir(dir, k), "rank-00000-of-00001.safetensors");
    std::string const theirs = checkpoint::join(step_dir(u.save_dir, k), "rank-00000-of-00001.safetensors");
    expect_same_tensors(mine, theirs);
  }
  EXPECT_EQ(checkpoint::path_kind(step_dir(dir, 4)), checkpoint::PathKind::kMissing);
}

TEST(Resume, KeepsOnlyTheNewestCheckpointsAndLatestNamesTheLast) {
  std::string const dir = test_temp_path("keep", "");
  TrainConfig c = config(dir, 2);
  c.keep_checkpoints = 2;
  c.steps = 7;
  c.warmup_steps = 2;
  checkpoint::make_dirs(step_dir(dir, 3) + ".tmp");  // left by an interrupted save: removed by the next one
  train::run_training(c);
  std::vector<std::string> held = checkpoint::list_dir(dir);
  std::sort(held.begin(), held.end());
  EXPECT_EQ(held, (std::vector<std::string>{"latest", "step-00000006", "step-00000007"}));
  std::ifstream latest(checkpoint::join(dir, "latest"));
  std::string name;
  std::getline(latest, name);
  EXPECT_EQ(name, "step-00000007");
  EXPECT_EQ(train::resolve_checkpoint(dir), step_dir(dir, 7));
}

// A copy of the uninterrupted run's checkpoint after 5 steps, to damage.
std::string copy_of_step5() {
  std::string const dir = test_temp_path("damaged", "");
  checkpoint::make_dirs(dir);
  for (char const* f : {"meta.json", "rank-00000-of-00001.safetensors"}) {
    std::ifstream in(checkpoint::join(step_dir(uninterrupted().save_dir, 5), f), std::ios::binary);
    std::ofstream out(checkpoint::join(dir, f), std::ios::binary);
    out << in.rdbuf();
  }
  return dir;
}

void expect_resume_refused(std::string const& checkpoint_dir, std::string const& expected,
                           TrainConfig c = config("", 0)) {
  c.resume = checkpoint_dir;
  c.output_dir = test_temp_path("never_written", "");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::run_training(c), expected);
  EXPECT_TRUE(checkpoint::list_dir(c.output_dir).empty()) << "a refused resume wrote " << c.output_dir;
}

TEST(Resume, RefusesACheckpointOfOtherSettingsNamingEachDifference) {
  TrainConfig c = config("", 0);
  c.lr = 1e-3;
  c.seed = 99;
  expect_resume_refused(step_dir(uninterrupted().save_dir, 5), "/seed: 1234 in the checkpoint, 99 in this run", c);
  expect_resume_refused(step_dir(uninterrupted().save_dir, 5), "/batching/optimizer/lr: 0.003 in the checkpoint", c);
}

TEST(Resume, RefusesAMissingTruncatedOrDamagedFileNamingIt) {
  std::string const rank_file = "rank-00000-of-00001.safetensors";
  std::string dir = copy_of_step5();
  std::remove(checkpoint::join(dir, rank_file).c_str());
  expect_resume_refused(dir, "the rank file " + checkpoint::join(dir, rank_file) + " is missing");

  dir = copy_of_step5();
  std::int64_t bytes = 0;
  checkpoint::path_kind(checkpoint::join(dir, rank_file), &bytes);
  ASSERT_EQ(::truncate(checkpoint::join(dir, rank_file).c_str(), bytes - 100), 0);
  expect_resume_refused(dir, "(truncated or replaced)");

  dir = copy_of_step5();  // one byte of a weight changed: the size and the header still fit
  {
    std::fstream f(checkpoint::join(dir, rank_file), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(bytes - 3);
    f.put('\x5a');
  }
  expect_resume_refused(dir, checkpoint::join(dir, rank_file) + " is damaged: its checksum is");

  dir = copy_of_step5();
  std::remove(checkpoint::join(dir, "meta.json").c_str());
  expect_resume_refused(dir, "holds neither meta.json (a checkpoint) nor `latest`");
}

TEST(RunOutputs, ANonEmptyOutputFolderIsRefusedBeforeTheFirstStepUnlessOverwrite) {
  std::string const dir = test_temp_path("vlm_folder", "");
  checkpoint::make_dirs(dir);
  // A Qwen3.5 VLM checkpoint folder: fusepack would replace its config.json and drop the vision tensors.
  checkpoint::write_file_atomically(checkpoint::join(dir, "config.json"), "{\"model_type\": \"qwen3_5\"}\n");
  checkpoint::write_safetensors(checkpoint::join(dir, "model.safetensors"),
                                {{"model.visual.patch_embed.weight", at::ones({2, 2})}});
  TrainConfig c = config("", 0);
  c.output_dir = dir;
  train::RunOptions o;
  std::ostringstream log;
  o.log = &log;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::run_training(c, o), "the folder already holds files");
  EXPECT_EQ(log.str().find("step 0/"), std::string::npos) << "refused only after training: " << log.str();
  checkpoint::Safetensors const kept = checkpoint::read_checkpoint(dir);
  EXPECT_EQ(kept.tensors.count("model.visual.patch_embed.weight"), 1u);
  c.overwrite_output = true;
  c.steps = 1;
  c.warmup_steps = 0;
  EXPECT_NO_THROW(train::run_training(c));
}

TEST(RunOutputs, AnUnwritableOutputIsRefusedBeforeTheFirstStep) {
  std::string const file = test_temp_path("a_file", "");
  checkpoint::write_file_atomically(file, "not a folder\n");
  TrainConfig c = config("", 0);
  c.save_dir = checkpoint::join(file, "checkpoints");  // below a regular file: cannot be created
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::run_training(c), "save dir " + c.save_dir + ": cannot be created");
  c.save_dir.clear();
  c.output_dir = file;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::run_training(c), "output " + file + ": exists and is not a folder");
}

}  // namespace
}  // namespace fusepack::test
