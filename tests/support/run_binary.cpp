#include "tests/support/run_binary.h"

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

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
