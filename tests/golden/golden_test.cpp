// Golden files and the comparator: an exact write/read round trip; missing, mistyped, unknown and out-of-order
// fields rejected with the file and the field named; the comparator passes identical records, fails a value off by
// more than its tolerance at step k and names step k, fails any token-count difference, missing or extra steps.
#include "golden/compare.h"
#include "golden/golden_file.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/run_binary.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#ifndef FUSEPACK_GOLDEN_COMPARE_BINARY
#error "FUSEPACK_GOLDEN_COMPARE_BINARY must name the fusepack-golden-compare executable"
#endif

namespace fusepack::test {
namespace {

using golden::Comparison;
using golden::GoldenError;
using golden::GoldenFile;
using golden::StepRecord;
using golden::TolerancePolicy;

// A plausible run of `n` steps, with values that stress the number formatting (1/3, tiny and huge magnitudes).
GoldenFile sample(int n = 6) {
  GoldenFile f;
  golden::Provenance& p = f.provenance;
  p.command = "fusepack-train --preset qwen35-tiny --steps 6 --batching padded --seed 1234";
  p.commit = "5306f03c0ffee0000000000000000000000000ab-dirty";
  p.fusepack_version = "0.1.0";
  p.date = "2026-11-29T10:39:00Z";
  p.model_config = R"({"hidden_size":64,"num_hidden_layers":4,"layer_types":["linear_attention","full_attention"]})";
  p.dataset = R"({"synthetic":{"num_examples":256,"median_length":48,"seed":7}})";
  p.seed = 18446744073709551615ull;  // the largest seed: unsigned all the way through
  p.dtype = "float64";
  p.device = "cpu";
  p.world_size = 1;
  p.batching = R"({"layout":"padded","token_budget":1024,"micro_batches_per_step":2})";
  for (int k = 0; k < n; ++k) {
    StepRecord r;
    r.step = k;
    r.loss = 10.0 / 3.0 - 0.1 * k;
    r.grad_norm = k == 0 ? 1e-300 : 1.0 / (k + 2);
    r.tokens = 800 + 7 * k;
    r.lr = k == 0 ? 0.0 : 1e-4 * k / 3.0;
    f.steps.push_back(r);
  }
  return f;
}

std::string text_of(GoldenFile const& f) {
  std::ostringstream out;
  golden::write_golden(out, f);
  return out.str();
}

GoldenFile read_text(std::string const& text) {
  std::istringstream in(text);
  return golden::read_golden(in, "test.json");
}

// `text` with the one occurrence of `from` replaced by `to`.
std::string replaced(std::string text, std::string const& from, std::string const& to) {
  std::size_t const at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "'" << from << "' not in the file";
  EXPECT_EQ(text.find(from, at + 1), std::string::npos) << "'" << from << "' is not unique";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// Reading `text` must fail with GoldenError naming test.json and `field`, the message containing `substring`.
void expect_read_error(std::string const& text, std::string const& field, std::string const& substring) {
  try {
    read_text(text);
    ADD_FAILURE() << "expected GoldenError for field '" << field << "'";
  } catch (GoldenError const& e) {
    std::printf("[  error   ] %s\n", e.what());
    EXPECT_EQ(e.file(), "test.json");
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
  }
}

void expect_same(GoldenFile const& a, GoldenFile const& b) {
  golden::Provenance const &p = a.provenance, &q = b.provenance;
  EXPECT_EQ(p.command, q.command);
  EXPECT_EQ(p.commit, q.commit);
  EXPECT_EQ(p.fusepack_version, q.fusepack_version);
  EXPECT_EQ(p.date, q.date);
  EXPECT_EQ(p.model_config, q.model_config);
  EXPECT_EQ(p.dataset, q.dataset);
  EXPECT_EQ(p.seed, q.seed);
  EXPECT_EQ(p.dtype, q.dtype);
  EXPECT_EQ(p.device, q.device);
  EXPECT_EQ(p.world_size, q.world_size);
  EXPECT_EQ(p.batching, q.batching);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (std::size_t k = 0; k < a.steps.size(); ++k) {
    // Exact: the writer's shortest round-trip text reads back to the same double.
    EXPECT_EQ(a.steps[k].step, b.steps[k].step);
    EXPECT_EQ(a.steps[k].loss, b.steps[k].loss) << "step " << k;
    EXPECT_EQ(a.steps[k].grad_norm, b.steps[k].grad_norm) << "step " << k;
    EXPECT_EQ(a.steps[k].tokens, b.steps[k].tokens) << "step " << k;
    EXPECT_EQ(a.steps[k].lr, b.steps[k].lr) << "step " << k;
  }
}

// ------------------------------------------------------------------------------------------------------------------
// The file

TEST(GoldenFile, RoundTripIsExact) {
  GoldenFile const original = sample();
  std::string const text = text_of(original);
  std::printf("%s", text.c_str());
  GoldenFile const back = read_text(text);
  expect_same(original, back);
  EXPECT_EQ(text_of(back), text) << "writing what was read must give the same bytes";

  // Through a file on disk, with random doubles.
  auto rng = test_rng();
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  GoldenFile noisy = sample(20);
  for (StepRecord& r : noisy.steps) {
    r.loss = std::exp(20 * u(rng));
    r.grad_norm = std::fabs(u(rng)) * 1e-3;
    r.lr = std::fabs(u(rng)) * 1e-4;
  }
  std::string const path = ::testing::TempDir() + "golden_round_trip.json";
  golden::write_golden(path, noisy);
  expect_same(noisy, golden::read_golden(path));
}

TEST(GoldenFile, WritesOneStepRecordPerLine) {
  std::string const text = text_of(sample(3));
  EXPECT_NE(text.find("\n    {\"step\":1,\"loss\":"), std::string::npos) << text;
  EXPECT_NE(text.find("\"format\": \"fusepack-golden\""), std::string::npos) << text;
}

TEST(GoldenFile, MissingFieldIsAnErrorNamingIt) {
  std::string const text = text_of(sample(3));
  expect_read_error(replaced(text, "    \"seed\": 18446744073709551615,\n", ""), "provenance.seed", "is missing");
  expect_read_error(replaced(text, "    \"dtype\": \"float64\",\n", ""), "provenance.dtype", "is missing");
  expect_read_error(replaced(text, "    \"world_size\": 1,\n", ""), "provenance.world_size", "is missing");
  expect_read_error(replaced(text, "\"loss\":3.2333333333333334,", ""), "steps[1].loss", "is missing");
  expect_read_error(replaced(text, ",\"tokens\":814", ""), "steps[2].tokens", "is missing");
  expect_read_error(replaced(text, "\"step\":0,", ""), "steps[0].step", "is missing");
  expect_read_error(replaced(text, "\"version\": 1,", ""), "version", "is missing");
}

TEST(GoldenFile, MistypedOrInvalidFieldIsAnErrorNamingIt) {
  std::string const text = text_of(sample(3));
  expect_read_error(replaced(text, "\"loss\":3.2333333333333334", "\"loss\":\"10.2\""), "steps[1].loss",
                    "must be a number");
  expect_read_error(replaced(text, "\"loss\":3.2333333333333334", "\"loss\":null"), "steps[1].loss",
                    "NaN or infinity");
  expect_read_error(replaced(text, "\"tokens\":814", "\"tokens\":814.5"), "steps[2].tokens", "must be an integer");
  expect_read_error(replaced(text, "\"tokens\":814", "\"tokens\":0"), "steps[2].tokens", "must be >= 1");
  expect_read_error(replaced(text, "\"grad_norm\":0.25", "\"grad_norm\":-0.25"), "steps[2].grad_norm", ">= 0");
  expect_read_error(replaced(text, "\"step\":2", "\"step\":1"), "steps[2].step", "strictly increase");
  expect_read_error(replaced(text, "\"seed\": 18446744073709551615", "\"seed\": -1"), "provenance.seed",
                    "non-negative integer");
  expect_read_error(replaced(text, "\"world_size\": 1", "\"world_size\": 0"), "provenance.world_size", ">= 1");
  expect_read_error(replaced(text, "\"dtype\": \"float64\"", "\"dtype\": \"fp64\""), "provenance.dtype",
                    "expected float64, float32, bfloat16 or float16");
  expect_read_error(replaced(text, "\"device\": \"cpu\"", "\"device\": \"\""), "provenance.device", "is empty");
  expect_read_error(replaced(text, "\"dataset\": {", "\"dataset\": [{") , "", "malformed JSON");
  expect_read_error(replaced(text, "\"format\": \"fusepack-golden\"", "\"format\": \"other\""), "format",
                    "expected 'fusepack-golden'");
  expect_read_error(replaced(text, "\"version\": 1", "\"version\": 2"), "version", "knows version 1");
}

TEST(GoldenFile, ModelConfigMustBeAnObject) {
  std::string text = text_of(sample(2));
  std::size_t const at = text.find("\"model_config\": {");
  ASSERT_NE(at, std::string::npos);
  std::size_t const end = text.find("},\n", at);  // the object's closing brace
  ASSERT_NE(end, std::string::npos);
  text.replace(at, end + 1 - at, "\"model_config\": \"qwen35-tiny\"");
  expect_read_error(text, "provenance.model_config", "must be a JSON object");
}

TEST(GoldenFile, UnknownFieldIsAnErrorNotSilentlyDropped) {
  std::string const text = text_of(sample(2));
  expect_read_error(replaced(text, "\"tokens\":807", "\"tokens\":807,\"los\":3"), "steps[1].los",
                    "not a field of this format");
  expect_read_error(replaced(text, "\"seed\": 1844", "\"sed\": 1, \"seed\": 1844"), "provenance.sed", "known: command");
}

TEST(GoldenFile, BadFilesAreErrorsNamingTheFile) {
  try {
    golden::read_golden(::testing::TempDir() + "no_such_golden.json");
    ADD_FAILURE() << "expected GoldenError";
  } catch (GoldenError const& e) {
    std::printf("[  error   ] %s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("no_such_golden.json: cannot open"), std::string::npos) << e.what();
  }
  expect_read_error("{\"format\": \"fusepack-golden\",", "", "malformed JSON at byte");
  expect_read_error("[]", "", "must be a JSON object");
}

TEST(GoldenFile, DeeplyNestedJsonIsAnErrorNotACrash) {
  // nlohmann's parser recurses once per level: 100,000 levels overflowed the stack.
  std::string const text = text_of(sample(2));
  std::string const deep = std::string(100000, '[') + std::string(100000, ']');
  expect_read_error(replaced(text, "\"dataset\": {", "\"dataset\": {\"x\": " + deep + ", "), "",
                    "nests arrays and objects more than 64 levels deep");
}

TEST(GoldenFile, Utf16AndParseErrorsSayWhatWasExpected) {
  expect_read_error(std::string("\xFF\xFE{\0", 4), "", "is UTF-16 (byte order mark FF FE); JSON must be UTF-8");
  try {
    read_text("{\"format\": }");
    ADD_FAILURE() << "expected GoldenError";
  } catch (GoldenError const& e) {
    std::string const what = e.what();
    EXPECT_EQ(what.find("json.exception"), std::string::npos) << what;
    EXPECT_NE(what.find("parse error at line 1, column 12"), std::string::npos) << what;
    EXPECT_NE(what.find("expected a golden file: one JSON object {\"format\": \"fusepack-golden\""),
              std::string::npos)
        << what;
  }
}

TEST(GoldenFile, ADirectoryIsNamedAsADirectory) {
  // Was "basic_filebuf::underflow error reading the file: Is a directory", without the path.
  std::string const dir = ::testing::TempDir();
  try {
    golden::read_golden(dir);
    ADD_FAILURE() << "expected GoldenError";
  } catch (GoldenError const& e) {
    std::printf("[  error   ] %s\n", e.what());
    EXPECT_EQ(e.file(), dir);
    EXPECT_NE(std::string(e.what()).find(dir + ": is a directory; expected a golden file"), std::string::npos)
        << e.what();
  }
}

TEST(GoldenFile, WriterRefusesWhatTheReaderWouldReject) {
  GoldenFile bad = sample(3);
  bad.steps[1].loss = std::numeric_limits<double>::quiet_NaN();
  std::string const path = ::testing::TempDir() + "golden_refused.json";
  std::remove(path.c_str());
  try {
    golden::write_golden(path, bad);
    ADD_FAILURE() << "expected GoldenError";
  } catch (GoldenError const& e) {
    std::printf("[  error   ] %s\n", e.what());
    EXPECT_EQ(e.field(), "steps[1].loss");
  }
  EXPECT_FALSE(std::ifstream(path).good()) << "a refused golden must not leave a file behind";
  GoldenFile empty = sample(1);
  empty.steps.clear();
  EXPECT_THROW(text_of(empty), GoldenError);
  GoldenFile not_json = sample(1);
  not_json.provenance.batching = "{padded";
  EXPECT_THROW(text_of(not_json), GoldenError);
}

// ------------------------------------------------------------------------------------------------------------------
// The comparator

// Tolerances of a tight CPU fp64 comparison; the numbers only need to be distinct and positive here.
TolerancePolicy tight() {
  TolerancePolicy p;
  p.loss = {1e-10, 1e-9, 0};
  p.grad_norm = {1e-10, 1e-8, 0};
  p.lr = {0, 1e-15, 0};
  return p;
}

TEST(GoldenCompare, IdenticalRecordsPass) {
  GoldenFile const g = sample();
  Comparison const c = golden::compare(g, g.steps, TolerancePolicy{});  // zero tolerance: equality
  std::printf("%s", c.table().c_str());
  EXPECT_TRUE(c.passed()) << c.table();
  EXPECT_EQ(c.checks.size(), 4 * g.steps.size());
  EXPECT_EQ(c.first_failure(), nullptr);
  EXPECT_EQ(c.verdict().rfind("PASS", 0), 0u) << c.verdict();
}

TEST(GoldenCompare, ValueOffByMoreThanToleranceFailsAndNamesTheStep) {
  auto rng = test_rng();
  GoldenFile const g = sample(8);
  TolerancePolicy const policy = tight();
  int const k = std::uniform_int_distribution<int>(0, 7)(rng);
  for (char const* field : {"loss", "grad_norm", "lr"}) {
    for (double share : {0.5, 2.0}) {  // half the allowance passes, twice fails: the tolerance decides
      std::vector<StepRecord> run = g.steps;
      StepRecord& r = run[static_cast<std::size_t>(k)];
      std::string const f = field;
      golden::FieldTolerance const& tol = f == "loss" ? policy.loss : f == "grad_norm" ? policy.grad_norm : policy.lr;
      double& value = f == "loss" ? r.loss : f == "grad_norm" ? r.grad_norm : r.lr;
      double const golden_value = value;
      value += share * tol.allowed(golden_value, r.step);
      if (value == golden_value) continue;  // lr 0 at step 0 with no absolute allowance: nothing to perturb
      Comparison const c = golden::compare(g, run, policy);
      if (share < 1) {
        EXPECT_TRUE(c.passed()) << field << " at step " << k << "\n" << c.table();
        continue;
      }
      std::printf("%s\n", c.verdict().c_str());
      ASSERT_FALSE(c.passed()) << field << " at step " << k;
      ASSERT_NE(c.first_failure(), nullptr);
      EXPECT_EQ(c.first_failure()->step, k);
      EXPECT_EQ(c.first_failure()->field, f);
      EXPECT_NE(c.verdict().find("first failure at step " + std::to_string(k) + ": " + f), std::string::npos)
          << c.verdict();
      std::size_t failing = 0;
      for (golden::FieldCheck const& check : c.checks) failing += check.pass ? 0 : 1;
      EXPECT_EQ(failing, 1u) << c.table();
    }
  }
}

TEST(GoldenCompare, DriftAllowanceGrowsWithTheStep) {
  GoldenFile const g = sample(10);
  TolerancePolicy policy;
  policy.loss.drift_per_step = 1e-6;
  std::vector<StepRecord> run = g.steps;
  run[9].loss += 5e-6;  // within 9 · 1e-6 at step 9
  EXPECT_TRUE(golden::compare(g, run, policy).passed());
  run = g.steps;
  run[2].loss += 5e-6;  // beyond 2 · 1e-6 at step 2
  Comparison const c = golden::compare(g, run, policy);
  EXPECT_FALSE(c.passed());
  ASSERT_NE(c.first_failure(), nullptr);
  EXPECT_EQ(c.first_failure()->step, 2);
}

TEST(GoldenCompare, DifferentTokenCountsFailWhateverTheTolerances) {
  GoldenFile const g = sample(5);
  TolerancePolicy loose;
  loose.loss = loose.grad_norm = loose.lr = {1e6, 1e6, 1e6};
  std::vector<StepRecord> run = g.steps;
  run[3].tokens += 1;
  Comparison const c = golden::compare(g, run, loose);
  std::printf("%s", c.table().c_str());
  EXPECT_FALSE(c.passed());
  ASSERT_NE(c.first_failure(), nullptr);
  EXPECT_EQ(c.first_failure()->step, 3);
  EXPECT_EQ(c.first_failure()->field, "tokens");
  EXPECT_NE(c.verdict().find("target counts must match exactly"), std::string::npos) << c.verdict();
}

TEST(GoldenCompare, MissingExtraAndMisnumberedStepsFail) {
  GoldenFile const g = sample(5);
  std::vector<StepRecord> shorter(g.steps.begin(), g.steps.end() - 1);
  Comparison const missing = golden::compare(g, shorter, TolerancePolicy{});
  std::printf("%s\n", missing.verdict().c_str());
  EXPECT_FALSE(missing.passed());
  EXPECT_NE(missing.verdict().find("golden step 4 and later were not reproduced"), std::string::npos)
      << missing.verdict();

  std::vector<StepRecord> longer = g.steps;
  longer.push_back(longer.back());
  longer.back().step = 5;
  Comparison const extra = golden::compare(g, longer, TolerancePolicy{});
  EXPECT_FALSE(extra.passed());
  EXPECT_NE(extra.verdict().find("run step 5 and later have no golden value"), std::string::npos) << extra.verdict();

  std::vector<StepRecord> renumbered = g.steps;
  renumbered[2].step = 7;
  Comparison const misnumbered = golden::compare(g, renumbered, TolerancePolicy{});
  EXPECT_FALSE(misnumbered.passed());
  EXPECT_NE(misnumbered.verdict().find("record 2 is step 7 in the run but step 2 in the golden"), std::string::npos)
      << misnumbered.verdict();

  EXPECT_FALSE(golden::compare(g, {}, TolerancePolicy{}).passed()) << "an empty run reproduces nothing";
}

TEST(GoldenCompare, NonFiniteRunValueFails) {
  GoldenFile const g = sample(3);
  std::vector<StepRecord> run = g.steps;
  run[1].loss = std::numeric_limits<double>::quiet_NaN();
  TolerancePolicy loose;
  loose.loss = {1e6, 1e6, 1e6};
  Comparison const c = golden::compare(g, run, loose);
  EXPECT_FALSE(c.passed());
  ASSERT_NE(c.first_failure(), nullptr);
  EXPECT_EQ(c.first_failure()->step, 1);
  EXPECT_THROW(golden::compare(g, run, TolerancePolicy{{-1, 0, 0}, {}, {}}), std::invalid_argument);
}

// A baseline that drifts from the golden by a known amount per step: loss by 1e-3 relative, grad_norm by 2e-3.
std::vector<StepRecord> drifted(GoldenFile const& g) {
  std::vector<StepRecord> b = g.steps;
  for (StepRecord& r : b) {
    r.loss *= 1 + 1e-3;
    r.grad_norm *= 1 - 2e-3;
  }
  return b;
}

// The baseline's own budget in these tests: one bf16 rounding step, relative (drifted() stays within it).
constexpr double kLimit = 1.0 / 256;

TEST(GoldenCompareWithBaseline, AllowsTwiceTheBaselinesDriftPlusTheFloorPerStep) {
  GoldenFile const g = sample(6);
  std::vector<StepRecord> const baseline = drifted(g);
  double const floor_rel = 1.0 / 256;  // bf16's unit roundoff
  auto rng = test_rng();
  int const k = std::uniform_int_distribution<int>(0, 5)(rng);
  for (char const* field : {"loss", "grad_norm"}) {
    std::string const f = field;
    double const drift = f == "loss" ? 1e-3 : 2e-3;
    for (double share : {0.9, 1.1}) {  // just inside passes, just outside fails: the rule decides, not a constant
      std::vector<StepRecord> run = g.steps;
      double& value = f == "loss" ? run[static_cast<std::size_t>(k)].loss : run[static_cast<std::size_t>(k)].grad_norm;
      value += share * (2 * drift + floor_rel) * std::fabs(value);
      Comparison const c = golden::compare_with_baseline(g, baseline, run, floor_rel, kLimit);
      if (share < 1) {
        EXPECT_TRUE(c.passed()) << field << " at step " << k << "\n" << c.table();
        continue;
      }
      std::printf("%s\n", c.verdict().c_str());
      ASSERT_FALSE(c.passed()) << field << " at step " << k;
      EXPECT_EQ(c.first_failure()->step, k);
      EXPECT_EQ(c.first_failure()->field, f);
    }
  }
  // The baseline's drift is no licence for other target counts or another lr.
  std::vector<StepRecord> run = g.steps;
  run[1].tokens += 1;
  EXPECT_FALSE(golden::compare_with_baseline(g, baseline, run, floor_rel, kLimit).passed());
  run = g.steps;
  run[2].lr *= 1 + 1e-12;
  EXPECT_FALSE(golden::compare_with_baseline(g, baseline, run, floor_rel, kLimit).passed());
  // A baseline equal to the golden leaves only the floor.
  run = g.steps;
  run[3].loss *= 1 + 2 * floor_rel;
  EXPECT_FALSE(golden::compare_with_baseline(g, g.steps, run, floor_rel, kLimit).passed());
}

// The planted weaker baseline: one that drifts more than one rounding step would set a looser allowance for every run
// checked against it, so it fails the comparison itself, naming the step, even for a run equal to the golden.
TEST(GoldenCompareWithBaseline, ABaselineMoreThanOneRoundingStepFromTheGoldenFailsTheComparison) {
  GoldenFile const g = sample(6);
  double const floor_rel = 1.0 / 256;
  for (char const* field : {"loss", "grad_norm"}) {
    for (double steps : {0.9, 1.1}) {
      std::vector<StepRecord> baseline = g.steps;
      double& v = std::string(field) == "loss" ? baseline[4].loss : baseline[4].grad_norm;
      v *= 1 + steps * kLimit;
      Comparison const c = golden::compare_with_baseline(g, baseline, g.steps, floor_rel, kLimit);
      if (steps < 1) {
        EXPECT_TRUE(c.passed()) << field << ": " << c.verdict();
        continue;
      }
      std::printf("%s\n", c.verdict().c_str());
      EXPECT_FALSE(c.passed()) << field;
      ASSERT_EQ(c.problems.size(), 1u) << c.verdict();
      EXPECT_NE(c.problems[0].find("the baseline itself is"), std::string::npos) << c.problems[0];
      EXPECT_NE(c.problems[0].find("step 4's " + std::string(field)), std::string::npos) << c.problems[0];
    }
  }
}

TEST(GoldenCompareWithBaseline, RefusesABaselineThatIsNotTheGoldensRun) {
  GoldenFile const g = sample(4);
  std::vector<StepRecord> baseline = drifted(g);
  baseline[2].tokens += 3;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(golden::compare_with_baseline(g, baseline, g.steps, 0.0, kLimit),
                                   "does not repeat golden step 2");
  baseline = drifted(g);
  baseline.pop_back();
  FUSEPACK_EXPECT_INVALID_ARGUMENT(golden::compare_with_baseline(g, baseline, g.steps, 0.0, kLimit), "fewer than the 4");
  baseline = drifted(g);
  baseline[0].loss = std::numeric_limits<double>::infinity();
  FUSEPACK_EXPECT_INVALID_ARGUMENT(golden::compare_with_baseline(g, baseline, g.steps, 0.0, kLimit), "finite values");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(golden::compare_with_baseline(g, drifted(g), g.steps, -1.0, kLimit), "floor_rel");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(golden::compare_with_baseline(g, drifted(g), g.steps, 0.0, NAN),
                                   "baseline_limit_rel");
}

// ------------------------------------------------------------------------------------------------------------------
// fusepack-golden-compare, run as a user runs it

BinaryResult run_compare(std::string const& args) {
  return run_binary(FUSEPACK_GOLDEN_COMPARE_BINARY, "fusepack-golden-compare", args);
}

// Without tolerance options the tool applies what fusepack-train --golden-check derives for the files' dtypes, so
// both give one verdict on one run; --exact asks for equality; a low-precision run needs its baseline.
TEST(FusepackGoldenCompare, DefaultsToTheToleranceTheTrainerDerivesForTheDtypes) {
  std::string const dir = ::testing::TempDir() + "fusepack_golden_compare_default_" + std::to_string(::getpid()) + "_";
  GoldenFile const g = sample(4);
  GoldenFile run = g;
  run.steps[2].loss *= 1 + 1e-14;  // fp64 summation-order noise: inside the derived 1e-12 relative
  golden::write_golden(dir + "golden.json", g);
  golden::write_golden(dir + "run.json", run);
  BinaryResult const derived = run_compare(dir + "golden.json " + dir + "run.json");
  EXPECT_EQ(derived.exit_code, 0) << derived.out;
  EXPECT_NE(derived.out.find("tolerances: derived for a float64 run against a float64 golden"), std::string::npos)
      << derived.out;
  BinaryResult const exact = run_compare(dir + "golden.json " + dir + "run.json --exact");
  EXPECT_EQ(exact.exit_code, 1) << exact.out;
  EXPECT_EQ(run_compare(dir + "golden.json " + dir + "run.json --exact --loss-rtol 1").exit_code, 2);
  run.steps[2].loss *= 1 + 1e-9;  // 1000x the derived fp64 tolerance
  golden::write_golden(dir + "far.json", run);
  EXPECT_EQ(run_compare(dir + "golden.json " + dir + "far.json").exit_code, 1);
  run.provenance.dtype = "bfloat16";
  golden::write_golden(dir + "bf16.json", run);
  BinaryResult const bf16 = run_compare(dir + "golden.json " + dir + "bf16.json");
  EXPECT_EQ(bf16.exit_code, 2) << bf16.out;
  EXPECT_NE(bf16.out.find("no derived golden tolerance for a bfloat16 run"), std::string::npos) << bf16.out;
  for (char const* f : {"golden.json", "run.json", "far.json", "bf16.json"}) std::remove((dir + f).c_str());
}

TEST(FusepackGoldenCompare, ExitsZeroOnPassOneOnFailTwoOnError) {
  std::string const dir = ::testing::TempDir() + "fusepack_golden_compare_" + std::to_string(::getpid()) + "_";
  GoldenFile const g = sample(4);
  GoldenFile run = g;
  run.steps[2].loss += 1e-7;
  golden::write_golden(dir + "golden.json", g);
  golden::write_golden(dir + "run.json", run);

  BinaryResult const pass = run_compare(dir + "golden.json " + dir + "run.json --loss-atol 1e-6");
  EXPECT_EQ(pass.exit_code, 0);
  EXPECT_NE(pass.out.find("PASS: 16 checks over 4 steps"), std::string::npos) << pass.out;

  BinaryResult const fail = run_compare(dir + "golden.json " + dir + "run.json --loss-atol 1e-8");
  EXPECT_EQ(fail.exit_code, 1);
  EXPECT_NE(fail.out.find("first failure at step 2: loss"), std::string::npos) << fail.out;

  BinaryResult const missing = run_compare(dir + "golden.json " + dir + "absent.json");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.out.find("absent.json: cannot open"), std::string::npos) << missing.out;

  // floor 4e-8 at step 2's loss 3.13: 1.25e-7 allowed beyond twice the baseline's drift, and the baseline's own limit.
  std::string const floor = " --floor-rel 4e-8";
  GoldenFile baseline = g;
  baseline.steps[2].loss += 1e-7;  // the baseline drifted as far as the run: within 2x that plus the floor
  golden::write_golden(dir + "baseline.json", baseline);
  BinaryResult const within_drift =
      run_compare(dir + "golden.json " + dir + "run.json --baseline " + dir + "baseline.json" + floor);
  EXPECT_EQ(within_drift.exit_code, 0);
  EXPECT_NE(within_drift.out.find("PASS"), std::string::npos) << within_drift.out;
  GoldenFile far_run = g;
  far_run.steps[2].loss += 1e-6;  // > 2e-7 + 1.25e-7
  golden::write_golden(dir + "far_run.json", far_run);
  BinaryResult const beyond_drift =
      run_compare(dir + "golden.json " + dir + "far_run.json --baseline " + dir + "baseline.json" + floor);
  EXPECT_EQ(beyond_drift.exit_code, 1);
  // A baseline 1e-6 off (8 floors) is refused, however close the run: it would allow 2e-6.
  BinaryResult const weak_baseline =
      run_compare(dir + "golden.json " + dir + "run.json --baseline " + dir + "far_run.json" + floor);
  EXPECT_EQ(weak_baseline.exit_code, 1);
  EXPECT_NE(weak_baseline.out.find("the baseline itself is"), std::string::npos) << weak_baseline.out;
  for (char const* bad : {" --floor-rel -1", floor.c_str(), " --floor-rel nan"}) {
    std::string const extra = std::string(bad) == floor ? floor + " --baseline-limit-rel -1" : std::string(bad);
    BinaryResult const r =
        run_compare(dir + "golden.json " + dir + "run.json --baseline " + dir + "baseline.json" + extra);
    EXPECT_EQ(r.exit_code, 2) << extra << ": " << r.out;
    EXPECT_NE(r.out.find("must be a finite number >= 0"), std::string::npos) << r.out;
  }
  BinaryResult const no_floor = run_compare(dir + "golden.json " + dir + "run.json --baseline " + dir + "baseline.json");
  EXPECT_EQ(no_floor.exit_code, 2) << "--baseline needs --floor-rel";
  BinaryResult const mixed = run_compare(dir + "golden.json " + dir + "run.json --baseline " + dir +
                                         "baseline.json --loss-atol 1" + floor);
  EXPECT_EQ(mixed.exit_code, 2) << "fixed tolerances and a baseline exclude each other";

  BinaryResult const directory = run_compare(::testing::TempDir() + " " + dir + "run.json");
  EXPECT_EQ(directory.exit_code, 2);
  EXPECT_NE(directory.out.find(::testing::TempDir() + ": is a directory"), std::string::npos) << directory.out;

  BinaryResult const bad_tolerance = run_compare(dir + "golden.json " + dir + "run.json --lr-rtol -1");
  EXPECT_EQ(bad_tolerance.exit_code, 2);
  EXPECT_NE(bad_tolerance.out.find("lr.rtol must be finite and >= 0"), std::string::npos) << bad_tolerance.out;
}

}  // namespace
}  // namespace fusepack::test
