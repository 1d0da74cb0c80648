// Running a tool as a user runs it, for the tests of fusepack's command-line binaries: its exit code and its output,
// and per-test temporary file names. No LibTorch here: the torch-free tests link it too.
#pragma once

#include <string>

namespace fusepack::test {

struct BinaryResult {
  int exit_code = -1;  // the tool's exit status, 128 + N when killed by signal N, -1 when it could not be started
  std::string out;     // stdout and stderr together
};

// Runs `binary args 2>&1` through the shell and prints "[   run    ] display_name args -> exit N" and the output, so
// the test log shows what a user would see.
BinaryResult run_binary(std::string const& binary, std::string const& display_name, std::string const& args);

// A TCP port on the loopback interface that was free a moment ago (for a rendezvous store); 29500 if none is found.
int free_tcp_port();

// <temp dir>/<prefix>_<current GoogleTest test name>_<pid><suffix>: distinct per test and per process.
std::string test_temp_path(std::string const& prefix, std::string const& suffix);

}  // namespace fusepack::test
