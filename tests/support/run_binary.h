// Running a tool as a user runs it, for the tests of fusepack's command-line binaries: its exit code and its output,
// and per-test temporary file names. No LibTorch here: the torch-free tests link it too.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace fusepack::test {

struct BinaryResult {
  int exit_code = -1;  // the tool's exit status, 128 + N when killed by signal N, -1 when it could not be started
  std::string out;     // stdout and stderr together
};

// Runs `binary args 2>&1` through the shell and prints "[   run    ] display_name args -> exit N" and the output, so
// the test log shows what a user would see.
BinaryResult run_binary(std::string const& binary, std::string const& display_name, std::string const& args);

// A process started in the background, its stdout and stderr going to `log`.
struct Process {
  int pid = -1;
  std::string log;
};

// Starts `argv` (argv[0]: the executable's path) with `env` added to this process's environment. `log` is empty when
// it returns (an earlier process's output there is gone); std::runtime_error when it cannot be opened.
Process spawn_process(std::vector<std::string> const& argv, std::map<std::string, std::string> const& env,
                      std::string const& log);
// Its exit code (128 + N when killed by signal N), or -1 when `limit` passed first (it is then killed). `seconds`,
// when given, receives how long it took.
int wait_process(Process const& p, std::chrono::seconds limit, double* seconds = nullptr);
// Waits until `log` holds `count` lines starting with "step " (a training log's step lines), or `limit` passes.
bool wait_for_step_lines(std::string const& log, int count, std::chrono::seconds limit);
std::string read_text_file(std::string const& path);

// A TCP port on the loopback interface that was free a moment ago (for a rendezvous store); 29500 if none is found.
int free_tcp_port();

// <temp dir>/<prefix>_<current GoogleTest test name>_<pid><suffix>: distinct per test and per process.
std::string test_temp_path(std::string const& prefix, std::string const& suffix);

}  // namespace fusepack::test
