#include "trainer/train/source_commit.h"

#include <cstdio>
#include <string>

#ifndef FUSEPACK_SOURCE_DIR
#error "FUSEPACK_SOURCE_DIR must name the source tree (for the golden's provenance.commit)"
#endif

namespace fusepack::train {
namespace {

// `s` as one word for /bin/sh: as is when it has only safe characters, else in single quotes.
std::string shell_quoted(std::string const& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=.,:/+@%") ==
                        std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// The command's standard output, or "" when it could not run or exited non-zero.
std::string capture(std::string const& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return std::string();
  char buf[256];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  if (::pclose(pipe) != 0) return std::string();
  return out;
}

}  // namespace

std::string source_commit() {
  std::string const git = "git -C " + shell_quoted(FUSEPACK_SOURCE_DIR) + " ";
  std::string sha = capture(git + "rev-parse HEAD 2>/dev/null");
  while (!sha.empty() && (sha.back() == '\n' || sha.back() == '\r')) sha.pop_back();
  if (sha.size() != 40) return "unknown";
  std::string const status = capture(git + "status --porcelain 2>/dev/null");
  return status.empty() ? sha : sha + "-dirty";
}

}  // namespace fusepack::train
