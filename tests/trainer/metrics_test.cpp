// --metrics: the run's settings, then one JSON line per step with what the log line shows (and the step's memory on
// a GPU), an eval line after each evaluated step, then the summary; read back, the steps and evals are the run's to the
// bit. A run interrupted and resumed with the same
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

TEST(Metrics, EachEvalFollowsItsStepAndReadsBackToTheBit) {
  std::string const path = test_temp_path("metrics_eval", ".jsonl");
  train::TrainConfig c = settings(path);
  c.eval_data = "synthetic:n=16,median=30,sigma=0.6,max=128,prompt=0.25,seed=11";
  c.eval_every = 4;
  train::RunResult const r = train::run_training(c);
  ASSERT_FALSE(r.evals.empty());
  std::vector<train::EvalMetrics> const evals = train::read_metrics_evals(path);
  ASSERT_EQ(evals.size(), r.evals.size());
  for (std::size_t i = 0; i < evals.size(); ++i) {
    EXPECT_EQ(evals[i].step, r.evals[i].step);
    EXPECT_EQ(evals[i].loss, r.evals[i].loss) << "eval after step " << r.evals[i].step;
    EXPECT_EQ(evals[i].targets, r.evals[i].targets);
    EXPECT_EQ(evals[i].tokens, r.evals[i].tokens);
    EXPECT_EQ(evals[i].examples, r.evals[i].examples);
    EXPECT_EQ(evals[i].micro_batches, r.evals[i].micro_batches);
  }
  expect_same_steps(train::read_metrics_steps(path), r.steps);  // the step reader skips the eval lines
  // Each eval line right after the line of its step; the settings line records the evaluation's.
  std::vector<std::string> const lines = lines_of(path);
  EXPECT_NE(lines.front().find("\"eval\":{\"data\":{"), std::string::npos) << lines.front();
  EXPECT_NE(lines.front().find("\"every\":4"), std::string::npos) << lines.front();
  std::size_t seen = 0;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].rfind("{\"eval\":", 0) != 0) continue;
    std::string const step = "\"step\":" + std::to_string(r.evals[seen++].step) + ",";
    EXPECT_NE(lines[i - 1].find(step), std::string::npos) << lines[i - 1] << "\n" << lines[i];
    EXPECT_EQ(lines[i - 1].rfind("{\"eval\":", 0), std::string::npos);
  }
  EXPECT_EQ(seen, r.evals.size());
}

}  // namespace
}  // namespace fusepack::test
