// fusepack-pack as a user runs it: the table on a synthetic set and a JSONL file, exit code 2 with a message on
// stderr (never a crash) for every bad input, and the model presets' vocabularies (--preset, the default's hint).
#include "tests/support/env.h"
#include "tests/support/run_binary.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

// The presets as the one preset table names them: fusepack-pack's message for an unknown preset lists them.
std::vector<std::string> preset_names() {
  BinaryResult const r = run_pack("--synthetic synthetic:n=5 --preset no-such-preset");
  EXPECT_EQ(r.exit_code, 2);
  std::string const known = "(known: ";
  std::size_t const from = r.out.find(known);
  EXPECT_NE(from, std::string::npos) << r.out;
  if (from == std::string::npos) return {};
  std::string const list = r.out.substr(from + known.size(), r.out.find(')', from) - from - known.size());
  std::vector<std::string> names;
  std::istringstream in(list);
  for (std::string name; std::getline(in, name, ',');) names.push_back(name.substr(name.find_first_not_of(' ')));
  return names;
}

std::string jsonl_with_ids_up_to(int largest) {
  std::string const path = temp_path(".jsonl");
  std::ofstream out(path);
  for (int first = 0; first <= largest; first += 50) {
    out << "{\"input_ids\": [";
    for (int id = first; id < first + 50 && id <= largest; ++id) out << (id == first ? "" : ",") << id;
    out << "]}\n";
  }
  return path;
}

std::string line_with(std::string const& out, std::string const& text) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.find(text) != std::string::npos) return line;
  }
  return {};
}

TEST(FusepackPack, HelpListsEveryPresetOfThePresetTable) {
  std::vector<std::string> const names = preset_names();
  ASSERT_GE(names.size(), 2u);
  BinaryResult const help = run_pack("--help");
  ASSERT_EQ(help.exit_code, 0);
  for (std::string const& name : names) {
    EXPECT_NE(help.out.find(name + " (vocab "), std::string::npos) << "--help does not list preset " << name;
  }
}

// The default vocabulary (the largest preset's) lets through ids that a smaller preset's model refuses: a one-line hint
// names exactly the presets whose --preset check refuses the file, and --preset checks as fusepack-train --preset does.
TEST(FusepackPack, TheDefaultVocabularyHintsAtEveryPresetThatWouldRefuseTheIds) {
  std::string const path = jsonl_with_ids_up_to(300);
  std::vector<std::string> refusing, accepting;
  for (std::string const& name : preset_names()) {
    BinaryResult const r = run_pack("--data " + path + " --preset " + name);
    ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 2) << r.out;
    if (r.exit_code == 2) {
      EXPECT_NE(r.out.find("outside the vocabulary [0, "), std::string::npos) << r.out;
      refusing.push_back(name);
    } else {
      EXPECT_EQ(line_with(r.out, "hint:"), "") << "no hint once a preset is chosen";
      accepting.push_back(name);
    }
  }
  ASSERT_FALSE(refusing.empty()) << "ids up to 300 should exceed the smallest preset's vocabulary";
  ASSERT_FALSE(accepting.empty());
  BinaryResult const by_default = run_pack("--data " + path);
  std::remove(path.c_str());
  ASSERT_EQ(by_default.exit_code, 0) << by_default.out;
  std::string const hint = line_with(by_default.out, "hint:");
  ASSERT_NE(hint, "") << by_default.out;
  EXPECT_LE(hint.size(), 120u) << hint;
  EXPECT_NE(hint.find("ids reach 300"), std::string::npos) << hint;
  // A name is followed by its vocabulary or, when the next preset shares it, a comma.
  auto names = [&hint](std::string const& name) {
    return hint.find(name + " (") != std::string::npos || hint.find(name + ", ") != std::string::npos;
  };
  for (std::string const& name : refusing) EXPECT_TRUE(names(name)) << name << " missing in: " << hint;
  for (std::string const& name : accepting) EXPECT_FALSE(names(name)) << name << " named in: " << hint;
}

TEST(FusepackPack, IdsEveryPresetTakesGiveNoHint) {
  std::string const path = jsonl_with_ids_up_to(9);
  BinaryResult const r = run_pack("--data " + path);
  std::remove(path.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(line_with(r.out, "hint:"), "") << r.out;
}

TEST(FusepackPack, PresetErrorsNameTheFlag) {
  expect_usage_error("--synthetic synthetic:n=5 --preset qwen35-9000b",
                     "--preset: unknown model preset 'qwen35-9000b'");
  expect_usage_error("--synthetic synthetic:n=5 --preset qwen35-tiny --vocab 10", "--vocab excludes --preset");
  // As fusepack-train refuses a synthetic vocab= beyond the model's.
  BinaryResult const fits = run_pack("--synthetic synthetic:n=5,vocab=1 --preset " + preset_names().front());
  EXPECT_EQ(fits.exit_code, 0) << fits.out;
  expect_usage_error("--synthetic synthetic:n=5,vocab=2147483648 --preset " + preset_names().front(),
                     "exceeds the vocab_size");
}

}  // namespace
}  // namespace fusepack::test
