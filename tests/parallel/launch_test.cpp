// fusepack-train as separate processes, launched the ways users launch them: by hand with RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT, and by torchrun --no-python. Two ranks pass the committed padded golden; a rank that is
// killed or stopped mid-run makes the other exit non-zero within a bounded time, naming it; ranks started with
// different settings refuse to start. And interrupted as users interrupt it: SIGINT saves a checkpoint at the next
// step boundary and the resumed run ends with the uninterrupted run's weights, byte for byte; a second signal ends it
// at once; SIGKILL in the middle of a save leaves the previous checkpoint loadable.
#include "tests/support/run_binary.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#ifndef FUSEPACK_TRAIN_BINARY
#error "FUSEPACK_TRAIN_BINARY must name the fusepack-train executable"
#endif
#ifndef FUSEPACK_TORCHRUN
#error "FUSEPACK_TORCHRUN must name torchrun, or be empty when it was not found"
#endif
#ifndef FUSEPACK_GOLDEN_DIR
#error "FUSEPACK_GOLDEN_DIR must name the golden/ folder of the source tree"
#endif

namespace fusepack::test {
namespace {

// golden/settings.sh's settings (e2e_support.h holds them as a TrainConfig), packed, composite fp64 on the CPU.
std::vector<std::string> golden_args(int steps = 10) {
  return {"--preset",  "qwen35-tiny", "--batching", "packed", "--backend", "composite", "--dtype", "fp64",
          "--device",  "cpu",         "--pairing",  "paired", "--threads", "1",
          "--data",    "synthetic:n=128,median=40,sigma=0.6,min=1,max=128,prompt=0.25,seed=7",
          "--budget",  "256",         "--micro-batches", "1", "--steps", std::to_string(steps),
          "--lr",      "3e-3",        "--warmup",   "2",      "--min-lr", "3e-4", "--weight-decay", "0.1",
          "--beta1",   "0.9",         "--beta2",    "0.95",   "--eps", "1e-8", "--clip-norm", "1.0",
          "--seed",    "1234",        "--no-progress"};
}

// `world` ranks of fusepack-train `args` started by hand; rank r's extra arguments from `extra(r)`.
std::vector<Process> launch(int world, std::vector<std::string> const& args,
                            std::vector<std::string> (*extra)(int) = nullptr) {
  int const port = free_tcp_port();
  std::vector<Process> ranks;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv{FUSEPACK_TRAIN_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    if (extra != nullptr) {
      std::vector<std::string> const more = extra(r);
      argv.insert(argv.end(), more.begin(), more.end());
    }
    std::map<std::string, std::string> const env{{"RANK", std::to_string(r)},
                                                 {"WORLD_SIZE", std::to_string(world)},
                                                 {"LOCAL_RANK", std::to_string(r)},
                                                 {"LOCAL_WORLD_SIZE", std::to_string(world)},
                                                 {"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", std::to_string(port)}};
    ranks.push_back(spawn_process(argv, env, test_temp_path("rank" + std::to_string(r), ".log")));
  }
  return ranks;
}

void print_logs(std::vector<Process> const& ranks) {
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    std::printf("---- rank %zu (%s)\n%s", r, ranks[r].log.c_str(), read_text_file(ranks[r].log).c_str());
  }
}

TEST(FusepackTrainLaunch, TwoRanksStartedByHandPassTheCommittedPaddedGolden) {
  std::vector<std::string> args = golden_args();
  args.push_back("--golden-check");
  args.push_back(std::string(FUSEPACK_GOLDEN_DIR) + "/qwen35-tiny-padded.json");
  std::vector<Process> const ranks = launch(2, args);
  std::vector<int> codes;
  for (Process const& p : ranks) codes.push_back(wait_process(p, std::chrono::seconds(300)));
  print_logs(ranks);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  std::string const log0 = read_text_file(ranks[0].log);
  EXPECT_NE(log0.find("sharded over 2 ranks (gloo)"), std::string::npos);
  EXPECT_NE(log0.find("PASS: "), std::string::npos);
  EXPECT_EQ(read_text_file(ranks[1].log), "") << "only rank 0 logs";
}

TEST(FusepackTrainLaunch, TorchrunStartsTheRanksWithTheSameCommandLine) {
  std::string const torchrun = FUSEPACK_TORCHRUN;
  if (torchrun.empty()) GTEST_SKIP() << "torchrun was not found at configure time (ci/setup.sh installs it)";
  std::vector<std::string> argv{torchrun, "--standalone", "--nproc-per-node", "2", "--no-python",
                                FUSEPACK_TRAIN_BINARY};
  std::vector<std::string> const args = golden_args(3);
  argv.insert(argv.end(), args.begin(), args.end());
  Process const p = spawn_process(argv, {{"OMP_NUM_THREADS", "1"}}, test_temp_path("torchrun", ".log"));
  int const code = wait_process(p, std::chrono::seconds(300));
  std::string const log = read_text_file(p.log);
  std::printf("%s", log.c_str());
  EXPECT_EQ(code, 0);
  EXPECT_NE(log.find("sharded over 2 ranks (gloo)"), std::string::npos);
  EXPECT_NE(log.find("step 2/3"), std::string::npos);
}

// Two ranks; rank 1 gets `signal` after rank 0's third step. Rank 0 must exit with code 2 within `bound` seconds,
// naming rank 1 as the rank whose heartbeat stopped.
void expect_rank_1_named_after(int signal, std::string const& collective_timeout, double bound) {
  std::vector<std::string> args = golden_args(100000);
  args.push_back("--collective-timeout");
  args.push_back(collective_timeout);
  std::vector<Process> const ranks = launch(2, args);
  ASSERT_TRUE(wait_for_step_lines(ranks[0].log, 3, std::chrono::seconds(120))) << read_text_file(ranks[0].log);
  ::kill(ranks[1].pid, signal);
  double seconds = 0;
  int const code = wait_process(ranks[0], std::chrono::seconds(60), &seconds);
  ::kill(ranks[1].pid, SIGKILL);
  wait_process(ranks[1], std::chrono::seconds(10));
  print_logs(ranks);
  std::string const log0 = read_text_file(ranks[0].log);
  EXPECT_EQ(code, 2) << "rank 0 must exit with an error, not hang or pass";
  EXPECT_LT(seconds, bound);
  EXPECT_NE(log0.find("rank 1: its heartbeat stopped"), std::string::npos) << log0;
}

// Killed mid-run (SIGKILL: no chance to say goodbye), rank 1's Gloo connections close; rank 0's next collective
// fails at once and its heartbeat check names rank 1. Bound: the failure is immediate, the check takes 2.5 s; 30 s
// leaves room for a loaded CI machine.
TEST(FusepackTrainLaunch, AKilledRankEndsTheOtherWithItsNameWithinSeconds) {
  expect_rank_1_named_after(SIGKILL, "60", 30.0);
}

// Stopped (SIGSTOP: alive, connections open, silent), rank 1 never joins the collective; rank 0 waits out the
// collective timeout (5 s here) and names it. Bound: the timeout + the 2.5 s heartbeat check + slack.
TEST(FusepackTrainLaunch, AStoppedRankIsNamedWhenTheCollectiveTimesOut) {
  expect_rank_1_named_after(SIGSTOP, "5", 30.0);
}

std::vector<std::string> other_lr(int rank) {
  return rank == 1 ? std::vector<std::string>{"--lr", "1e-3"} : std::vector<std::string>{};
}

TEST(FusepackTrainLaunch, RanksStartedWithDifferentSettingsExitNamingTheDifference) {
  std::vector<Process> const ranks = launch(2, golden_args(2), other_lr);
  std::vector<int> codes;
  for (Process const& p : ranks) codes.push_back(wait_process(p, std::chrono::seconds(120)));
  print_logs(ranks);
  EXPECT_EQ(codes, (std::vector<int>{2, 2}));
  for (Process const& p : ranks) {
    std::string const log = read_text_file(p.log);
    EXPECT_NE(log.find("different settings"), std::string::npos) << log;
    EXPECT_NE(log.find("/lr 0.003 on rank 0, 0.001 on rank 1"), std::string::npos) << log;
  }
}

// ---- Interrupting a run

std::vector<std::string> with(std::vector<std::string> args, std::vector<std::string> const& more) {
  args.insert(args.begin(), FUSEPACK_TRAIN_BINARY);
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

bool contains(std::string const& text, std::string const& part) { return text.find(part) != std::string::npos; }

// A step-N.tmp folder of an interrupted (or running) save in `dir`.
bool has_tmp_folder(std::string const& dir) {
  DIR* d = ::opendir(dir.c_str());
  bool found = false;
  while (dirent const* e = d != nullptr ? ::readdir(d) : nullptr) {
    std::string const name = e->d_name;
    found = found || (name.rfind("step-", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0);
  }
  if (d != nullptr) ::closedir(d);
  return found;
}

TEST(FusepackTrainSignals, SigintSavesAtTheStepBoundaryAndTheResumedRunEndsWithTheSameWeights) {
  std::string const uninterrupted = test_temp_path("uninterrupted", "");
  std::string const save_dir = test_temp_path("saves", ""), resumed = test_temp_path("resumed", "");
  Process const whole = spawn_process(with(golden_args(), {"--output", uninterrupted}), {}, test_temp_path("a", ".log"));
  ASSERT_EQ(wait_process(whole, std::chrono::seconds(300)), 0) << read_text_file(whole.log);

  Process const first = spawn_process(with(golden_args(), {"--save-dir", save_dir}), {}, test_temp_path("b", ".log"));
  ASSERT_TRUE(wait_for_step_lines(first.log, 3, std::chrono::seconds(120))) << read_text_file(first.log);
  ::kill(first.pid, SIGINT);
  int const code = wait_process(first, std::chrono::seconds(120));
  std::string const log = read_text_file(first.log);
  std::printf("%s", log.c_str());
  EXPECT_EQ(code, 128 + SIGINT);
  EXPECT_TRUE(contains(log, "interrupted before step")) << log;
  EXPECT_TRUE(contains(log, "checkpoint saved: " + save_dir + "/step-")) << log;
  EXPECT_FALSE(contains(log, "step 9/10")) << "the run went on to the end";

  Process const second = spawn_process(with(golden_args(), {"--save-dir", save_dir, "--resume", "latest", "--output",
                                                            resumed}),
                                       {}, test_temp_path("c", ".log"));
  ASSERT_EQ(wait_process(second, std::chrono::seconds(300)), 0) << read_text_file(second.log);
  EXPECT_TRUE(contains(read_text_file(second.log), "resumed from " + save_dir)) << read_text_file(second.log);
  EXPECT_EQ(read_text_file(resumed + "/model.safetensors"), read_text_file(uninterrupted + "/model.safetensors"))
      << "the resumed run's weights differ from the uninterrupted run's";
}

TEST(FusepackTrainSignals, ASecondSignalEndsTheRunAtOnceWithoutSaving) {
  std::string const save_dir = test_temp_path("saves", "");
  // 16 micro-batches a step: a step lasts long enough for both signals to arrive within it.
  std::vector<std::string> args = golden_args(100000);
  args.push_back("--micro-batches");
  args.push_back("16");
  Process const p = spawn_process(with(args, {"--save-dir", save_dir}), {}, test_temp_path("run", ".log"));
  ASSERT_TRUE(wait_for_step_lines(p.log, 1, std::chrono::seconds(120))) << read_text_file(p.log);
  ::kill(p.pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(p.pid, SIGINT);
  double seconds = 0;
  EXPECT_EQ(wait_process(p, std::chrono::seconds(60), &seconds), 128 + SIGINT);
  std::string const log = read_text_file(p.log);
  EXPECT_FALSE(contains(log, "checkpoint saved")) << log;
  EXPECT_LT(seconds, 5.0);
}

// The save is killed while its step-N.tmp folder exists (before the rename): `latest` still names the previous,
// complete checkpoint, a run resumes from it, and its first save removes the .tmp folder.
TEST(FusepackTrainSignals, SigkillDuringASaveLeavesThePreviousCheckpointLoadable) {
  std::vector<std::string> const args = with(golden_args(100000), {"--save-every", "1", "--save-dir"});
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::string const save_dir = test_temp_path("saves_" + std::to_string(attempt), "");
    std::vector<std::string> argv = args;
    argv.push_back(save_dir);
    Process const p = spawn_process(argv, {}, test_temp_path("run", ".log"));
    ASSERT_TRUE(wait_for_step_lines(p.log, 2, std::chrono::seconds(120))) << read_text_file(p.log);
    auto const until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!has_tmp_folder(save_dir) && std::chrono::steady_clock::now() < until) {}
    ::kill(p.pid, SIGKILL);
    wait_process(p, std::chrono::seconds(10));
    if (!has_tmp_folder(save_dir)) continue;  // the save finished before the kill: not the case under test
    std::string const latest = read_text_file(save_dir + "/latest");
    ASSERT_EQ(latest.rfind("step-", 0), 0u) << "`latest` is gone or damaged: '" << latest << "'";
    argv.insert(argv.end(), {"--resume", "latest"});
    Process const resumed = spawn_process(argv, {}, test_temp_path("resumed", ".log"));
    ASSERT_TRUE(wait_for_step_lines(resumed.log, 1, std::chrono::seconds(120))) << read_text_file(resumed.log);
    ::kill(resumed.pid, SIGINT);
    EXPECT_EQ(wait_process(resumed, std::chrono::seconds(60)), 128 + SIGINT);
    std::string const log = read_text_file(resumed.log);
    EXPECT_TRUE(contains(log, "resumed from " + save_dir + "/" + latest.substr(0, 13))) << log;
    EXPECT_FALSE(has_tmp_folder(save_dir)) << "the interrupted save's .tmp folder is still there";
    return;
  }
  FAIL() << "in 20 attempts no SIGKILL landed during a save";
}

}  // namespace
}  // namespace fusepack::test
