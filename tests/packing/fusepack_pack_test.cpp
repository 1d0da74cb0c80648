// fusepack-pack as a user runs it: the table on a synthetic set and a JSONL file, exit code 2 with a message on
// stderr (never a crash) for every bad input.
#include "tests/support/env.h"
#include "tests/support/run_binary.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#ifndef FUSEPACK_PACK_BINARY
#error "FUSEPACK_PACK_BINARY must name the fusepack-pack executable"
#endif

namespace fusepack::test {
namespace {

BinaryResult run_pack(std::string const& args) { return run_binary(FUSEPACK_PACK_BINARY, "fusepack-pack", args); }

std::string temp_path(std::string const& suffix) { return test_temp_path("fusepack_pack", suffix); }

void expect_usage_error(std::string const& args, std::string const& message) {
  BinaryResult const r = run_pack(args);
  EXPECT_EQ(r.exit_code, 2) << args;
  EXPECT_NE(r.out.find(message), std::string::npos) << "output: " << r.out;
}

TEST(FusepackPack, PrintsPaddedAndPackedFiguresForASyntheticSet) {
  BinaryResult const r = run_pack("--synthetic synthetic:n=500,median=200,max=1024 --budget 1024 --seed 3");
  ASSERT_EQ(r.exit_code, 0);
  for (char const* text : {"examples", "500", "padded (2D)", "packed (1D)", "batches", "padding fraction",
                           "tokens per batch", "fewer batches than padding"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << "missing '" << text << "'";
  }
}

// fusepack-train's spelling works too: --data takes a synthetic spec, with the same figures as --synthetic.
TEST(FusepackPack, DataTakesASyntheticSpecAsTheTrainerDoes) {
  std::string const spec = "synthetic:n=500,median=200,max=1024 --budget 1024 --seed 3";
  BinaryResult const data = run_pack("--data " + spec), synthetic = run_pack("--synthetic " + spec);
  ASSERT_EQ(data.exit_code, 0) << data.out;
  EXPECT_EQ(data.out, synthetic.out);
}

TEST(FusepackPack, ReadsAJsonlFile) {
  std::string const path = temp_path(".jsonl");
  {
    std::ofstream out(path);
    for (int i = 1; i <= 20; ++i) {
      out << "{\"input_ids\": [";
      for (int p = 0; p < i; ++p) out << (p ? "," : "") << p;
      out << "]}\n";
    }
  }
  BinaryResult const r = run_pack("--data " + path + " --budget 64 --vocab 32");
  std::remove(path.c_str());
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("210"), std::string::npos) << "1 + 2 + ... + 20 = 210 tokens";
}

TEST(FusepackPack, ExitsWithCode2AndAMessageOnBadInput) {
  std::string const path = temp_path(".jsonl");
  std::ofstream(path) << "{\"input_ids\": [1, 2]}\n{\"input_ids\": [3, 1.5]}\n";
  expect_usage_error("--data " + path, path + ":2: field 'input_ids': element 1 is 1.5");
  std::remove(path.c_str());
  expect_usage_error("", "give exactly one of --data FILE.jsonl or --synthetic SPEC");
  expect_usage_error("--data a.jsonl --synthetic synthetic:n=5", "excludes");
  expect_usage_error("--data /nonexistent/x.jsonl", "/nonexistent/x.jsonl: cannot open");
  expect_usage_error("--synthetic synthetic:n=5,colour=red", "unknown key 'colour'");
  expect_usage_error("--synthetic nonsense", "must start with 'synthetic:'");
  expect_usage_error("--synthetic synthetic:n=50 --budget 100", "more than the token budget of 100");
  expect_usage_error("--synthetic synthetic:n=5 --budget lots", "--budget");
  expect_usage_error("--synthetic synthetic:n=5 --budget 0", "--budget must be in [1, 2^30]; got 0");
  expect_usage_error("--synthetic synthetic:n=5 --lookahead 0", "--lookahead must be >= 1; got 0");
  expect_usage_error("--synthetic synthetic:n=5 --oversize drop", "must be 'error' or 'truncate'");
  expect_usage_error("--synthetic synthetic:n=5 --vocab 0", "--vocab must be >= 1");
  expect_usage_error("--synthetic synthetic:n=5 --frobnicate", "frobnicate");
}

TEST(FusepackPack, RefusesAHugeSyntheticSetInsteadOfLeakingBadAlloc) {
  expect_usage_error("--synthetic synthetic:n=1000000000000", "n must be in [1, 100000000]; got 1000000000000");
}

TEST(FusepackPack, ADirectoryAsDataIsNamedAsADirectory) {
  std::string const dir = ::testing::TempDir();
  expect_usage_error("--data " + dir, dir + ": is a directory; expected a JSON Lines file");
}

TEST(FusepackPack, RefusesANegativeSeedInsteadOfWrappingIt) {
  expect_usage_error("--synthetic synthetic:n=5 --seed -1", "must be a non-negative integer (0 to 2^64-1); got -1");
}

TEST(FusepackPack, ARepeatedOptionIsNamedAsGivenTwice) {
  // Was "Could not convert: --budget = 64,1e12".
  expect_usage_error("--synthetic synthetic:n=5 --budget 64 --budget 1e12", "--budget was given 2 times (64, 1e12)");
  expect_usage_error("--synthetic synthetic:n=5 --budget 64 --budget 128", "--budget was given 2 times (64, 128)");
}

TEST(FusepackPack, TruncatePolicyReportsTheExamplesOverTheBudget) {
  BinaryResult const r = run_pack("--synthetic synthetic:n=50,median=900 --budget 100 --oversize truncate");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("examples over the budget"), std::string::npos);
}

}  // namespace
}  // namespace fusepack::test
