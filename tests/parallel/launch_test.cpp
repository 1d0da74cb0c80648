// fusepack-train as separate processes, launched the ways users launch them: by hand with RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT, and by torchrun --no-python. Two ranks pass the committed padded golden; a rank that is
// killed or stopped mid-run makes the other exit non-zero within a bounded time, naming it; ranks started with
// different settings refuse to start.
#include "tests/support/run_binary.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
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

using Clock = std::chrono::steady_clock;

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

struct Process {
  pid_t pid = -1;
  std::string log;  // stdout and stderr
};

// Starts `argv` with `env` added to this process's environment, its output into `log`.
Process spawn(std::vector<std::string> const& argv, std::map<std::string, std::string> const& env,
              std::string const& log) {
  Process p;
  p.log = log;
  p.pid = ::fork();
  if (p.pid == 0) {
    int const fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (auto const& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (std::string const& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::perror("execv");
    ::_exit(127);
  }
  return p;
}

// The exit code (128 + N when killed by signal N), or -1 when `limit` passed first (the process is then killed).
int wait_for(Process const& p, std::chrono::seconds limit, double* seconds = nullptr) {
  Clock::time_point const start = Clock::now();
  int status = 0;
  while (true) {
    pid_t const done = ::waitpid(p.pid, &status, WNOHANG);
    if (done == p.pid) break;
    if (Clock::now() - start > limit) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (seconds != nullptr) *seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_file(std::string const& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits until `log` holds `count` lines starting with "step " (or `limit` passes).
bool wait_for_steps(std::string const& log, int count, std::chrono::seconds limit) {
  Clock::time_point const start = Clock::now();
  while (Clock::now() - start < limit) {
    std::istringstream in(read_file(log));
    int steps = 0;
    for (std::string line; std::getline(in, line);) steps += line.rfind("step ", 0) == 0;
    if (steps >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
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
    ranks.push_back(spawn(argv, env, test_temp_path("rank" + std::to_string(r), ".log")));
  }
  return ranks;
}

void print_logs(std::vector<Process> const& ranks) {
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    std::printf("---- rank %zu (%s)\n%s", r, ranks[r].log.c_str(), read_file(ranks[r].log).c_str());
  }
}

TEST(FusepackTrainLaunch, TwoRanksStartedByHandPassTheCommittedPaddedGolden) {
  std::vector<std::string> args = golden_args();
  args.push_back("--golden-check");
  args.push_back(std::string(FUSEPACK_GOLDEN_DIR) + "/qwen35-tiny-padded.json");
  std::vector<Process> const ranks = launch(2, args);
  std::vector<int> codes;
  for (Process const& p : ranks) codes.push_back(wait_for(p, std::chrono::seconds(300)));
  print_logs(ranks);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  std::string const log0 = read_file(ranks[0].log);
  EXPECT_NE(log0.find("sharded over 2 ranks (gloo)"), std::string::npos);
  EXPECT_NE(log0.find("PASS: "), std::string::npos);
  EXPECT_EQ(read_file(ranks[1].log), "") << "only rank 0 logs";
}

TEST(FusepackTrainLaunch, TorchrunStartsTheRanksWithTheSameCommandLine) {
  std::string const torchrun = FUSEPACK_TORCHRUN;
  if (torchrun.empty()) GTEST_SKIP() << "torchrun was not found at configure time (ci/setup.sh installs it)";
  std::vector<std::string> argv{torchrun, "--standalone", "--nproc-per-node", "2", "--no-python",
                                FUSEPACK_TRAIN_BINARY};
  std::vector<std::string> const args = golden_args(3);
  argv.insert(argv.end(), args.begin(), args.end());
  Process const p = spawn(argv, {{"OMP_NUM_THREADS", "1"}}, test_temp_path("torchrun", ".log"));
  int const code = wait_for(p, std::chrono::seconds(300));
  std::string const log = read_file(p.log);
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
  ASSERT_TRUE(wait_for_steps(ranks[0].log, 3, std::chrono::seconds(120))) << read_file(ranks[0].log);
  ::kill(ranks[1].pid, signal);
  double seconds = 0;
  int const code = wait_for(ranks[0], std::chrono::seconds(60), &seconds);
  ::kill(ranks[1].pid, SIGKILL);
  wait_for(ranks[1], std::chrono::seconds(10));
  print_logs(ranks);
  std::string const log0 = read_file(ranks[0].log);
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
  for (Process const& p : ranks) codes.push_back(wait_for(p, std::chrono::seconds(120)));
  print_logs(ranks);
  EXPECT_EQ(codes, (std::vector<int>{2, 2}));
  for (Process const& p : ranks) {
    std::string const log = read_file(p.log);
    EXPECT_NE(log.find("different settings"), std::string::npos) << log;
    EXPECT_NE(log.find("/lr 0.003 on rank 0, 0.001 on rank 1"), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace fusepack::test
