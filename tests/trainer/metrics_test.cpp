// --metrics: the run's settings, then one JSON line per step with what the log line shows (and the step's memory on
// a GPU), then the summary; read back, the steps are the run's to the bit. A run interrupted and resumed with the same
// file leaves one continuous curve equal to the uninterrupted run's. An existing file is refused unless the run
// resumes or --overwrite is given.
#include "tests/golden/e2e_support.h"
#include "tests/support/expect.h"
#include "tests/support/run_binary.h"
#include "trainer/train/metrics.h"
#include "trainer/train/run.h"

#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

train::TrainConfig settings(std::string const& metrics) {
  train::TrainConfig c = golden_settings("qwen35-tiny", train::Batching::kPacked, ops::Backend::kComposite,
                                         train::DType::kFloat64, "cpu");
  c.metrics = metrics;
  return c;
}

std::vector<std::string> lines_of(std::string const& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

void expect_same_steps(std::vector<train::StepMetrics> const& got, std::vector<train::StepMetrics> const& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].step, want[i].step);
    EXPECT_EQ(got[i].loss, want[i].loss) << "step " << want[i].step;
    EXPECT_EQ(got[i].grad_norm, want[i].grad_norm) << "step " << want[i].step;
    EXPECT_EQ(got[i].lr, want[i].lr) << "step " << want[i].step;
    EXPECT_EQ(got[i].targets, want[i].targets) << "step " << want[i].step;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "step " << want[i].step;
  }
}

TEST(Metrics, ARunWritesItsSettingsEveryStepAndTheSummary) {
  std::string const path = test_temp_path("metrics", ".jsonl");
  train::RunResult const r = train::run_training(settings(path));
  std::vector<std::string> const lines = lines_of(path);
  ASSERT_EQ(lines.size(), r.steps.size() + 2);
  EXPECT_EQ(lines.front().rfind("{\"run\":", 0), 0u) << lines.front();
  EXPECT_NE(lines.front().find("\"batching\":{"), std::string::npos) << "the settings as objects: " << lines.front();
  EXPECT_EQ(lines.back().rfind("{\"summary\":", 0), 0u) << lines.back();
  EXPECT_NE(lines[1].find("\"tokens_per_second\":"), std::string::npos) << lines[1];
  expect_same_steps(train::read_metrics_steps(path), r.steps);
}

TEST(Metrics, AnInterruptedRunResumedWithTheSameFileLeavesOneContinuousCurve) {
  std::vector<train::StepMetrics> const whole = train::run_training(settings("")).steps;
  std::string const path = test_temp_path("metrics_resumed", ".jsonl");
  train::TrainConfig first = settings(path);
  first.save_dir = test_temp_path("metrics_saves", "");
  train::RunOptions stop_after_4;
  int polls = 0;
  stop_after_4.stop_requested = [&polls] { return ++polls == 4 ? SIGTERM : 0; };
  train::RunResult const stopped = train::run_training(first, stop_after_4);
  ASSERT_EQ(stopped.steps.size(), 4u);
  train::TrainConfig second = settings(path);
  second.save_dir = first.save_dir;
  second.resume = "latest";
  train::run_training(second);
  expect_same_steps(train::read_metrics_steps(path), whole);
}

TEST(Metrics, AnExistingFileIsRefusedBeforeTheFirstStepUnlessOverwrite) {
  std::string const path = test_temp_path("metrics_exists", ".jsonl");
  std::ofstream(path) << "{\"run\": {}}\n";
  FUSEPACK_EXPECT_INVALID_ARGUMENT(train::run_training(settings(path)), "exists (--overwrite replaces it");
  EXPECT_EQ(lines_of(path).size(), 1u) << "the file was touched";
  train::TrainConfig c = settings(path);
  c.overwrite_output = true;
  EXPECT_EQ(train::read_metrics_steps(path).size(), 0u);
  train::RunResult const r = train::run_training(c);
  EXPECT_EQ(train::read_metrics_steps(path).size(), r.steps.size());
}

}  // namespace
}  // namespace fusepack::test
