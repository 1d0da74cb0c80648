#include "tests/support/run_binary.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace fusepack::test {

BinaryResult run_binary(std::string const& binary, std::string const& display_name, std::string const& args) {
  std::string const command = binary + " " + args + " 2>&1";
  BinaryResult r;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  int const status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::printf("[   run    ] %s %s -> exit %d\n%s", display_name.c_str(), args.c_str(), r.exit_code, r.out.c_str());
  return r;
}

Process spawn_process(std::vector<std::string> const& argv, std::map<std::string, std::string> const& env,
                      std::string const& log) {
  Process p;
  p.log = log;
  // Emptied here, before the fork: opened in the child, a caller that reads the log right away (wait_for_step_lines)
  // could still find an earlier process's lines in it.
  int const fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("spawn_process: cannot open the log " + log + ": " + std::strerror(errno));
  p.pid = ::fork();
  if (p.pid == 0) {
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
  ::close(fd);
  return p;
}

int wait_process(Process const& p, std::chrono::seconds limit, double* seconds) {
  auto const start = std::chrono::steady_clock::now();
  int status = 0;
  while (::waitpid(p.pid, &status, WNOHANG) != p.pid) {
    if (std::chrono::steady_clock::now() - start > limit) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (seconds != nullptr) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_text_file(std::string const& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool wait_for_step_lines(std::string const& log, int count, std::chrono::seconds limit) {
  auto const start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < limit) {
    std::istringstream in(read_text_file(log));
    int steps = 0;
    for (std::string line; std::getline(in, line);) steps += line.rfind("step ", 0) == 0;
    if (steps >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int free_tcp_port() {
  int const fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  bool const ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (fd >= 0) ::close(fd);
  return ok ? ntohs(addr.sin_port) : 29500;
}

// Nothing from std::filesystem beyond temp_directory_path: remove_all crashes in binaries linked with libtorch (it
// resolves to libtorch's own copy), and train_test links both.
std::string test_temp_path(std::string const& prefix, std::string const& suffix) {
  auto const* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return (std::filesystem::temp_directory_path() /
          (prefix + "_" + std::string(info->name()) + "_" + std::to_string(::getpid()) + suffix))
      .string();
}

}  // namespace fusepack::test
