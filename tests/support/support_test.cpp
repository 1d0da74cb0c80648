// The test helpers are themselves tested: a checker that cannot fail would make every test built on it worthless.
#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/run_binary.h"
#include "verify/compare.h"
#include "verify/dtype.h"
#include "verify/gradcheck.h"
#include "verify/random.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace fusepack::test {
namespace {

using ref::Tensor;

TEST(Gradcheck, AcceptsTheTrueGradient) {
  auto rng = test_rng();
  Tensor x = randn({3, 4}, rng);
  Tensor const dy = randn({3, 4}, rng);
  auto loss = [&] {  // L = Σ dy · sin(x)
    double s = 0;
    for (ref::Index i = 0; i < x.numel(); ++i) s += dy.data()[i] * std::sin(x.data()[i]);
    return s;
  };
  Tensor grad({3, 4});
  for (ref::Index i = 0; i < x.numel(); ++i) grad.data()[i] = dy.data()[i] * std::cos(x.data()[i]);
  FUSEPACK_EXPECT_PASS(check_gradient("dx", loss, x, grad));
}

TEST(Gradcheck, CatchesAPlantedWrongGradient) {
  auto rng = test_rng();
  Tensor x = randn({3, 4}, rng);
  auto loss = [&] {  // L = Σ x² · x₀  (the planted backward forgets the x₀ cross term)
    return x.flat().squaredNorm() * x.data()[0];
  };
  Tensor grad({3, 4});
  for (ref::Index i = 0; i < x.numel(); ++i) grad.data()[i] = 2 * x.data()[i] * x.data()[0];
  ErrorReport const r = check_gradient("dx", loss, x, grad);
  std::printf("[ planted  ] the checker must reject: %s\n", r.str().c_str());
  EXPECT_FALSE(r.passed()) << "the checker accepted a gradient missing a term";
  EXPECT_EQ(r.worst, 0) << "the error sits in element 0 only";
}

TEST(Compare, DecodesTheWorstIndexAsExamplePositionHeadChannel) {
  Tensor ref({6, 2, 3});
  Tensor got = ref;
  got({4, 1, 2}) = 1.0;  // token 4 is position 1 of example 1 when cu_seqlens = {0, 3, 6}
  ErrorReport const r = compare_allclose("o", got, ref, {1e-3, 0}, packed_layout(got, {0, 3, 6}));
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.worst_where, "(example 1, position 1, head 1, channel 2)");
  EXPECT_DOUBLE_EQ(r.max_abs, 1.0);
  EXPECT_DOUBLE_EQ(r.budget_used, 1.0 / 1e-3);
  EXPECT_NE(r.str().find("FAIL o"), std::string::npos) << r.str();
}

TEST(Compare, ReportsNonFiniteValuesAsFailures) {
  Tensor ref({4});
  Tensor got = ref;
  got.data()[2] = std::nan("");
  ErrorReport const r = compare_allclose("y", got, ref, {1.0, 1.0});
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.nonfinite, 1);
  EXPECT_EQ(r.worst, 2);
}

TEST(Compare, BaselineRuleAllowsTwiceTheBaselineErrorPlusTheFloor) {
  double const ref[] = {1.0, -2.0, 0.5};
  double const baseline[] = {1.0, -2.0 + 0.01, 0.5};  // baseline error 0.01
  double const floor = 0.001;
  double const inside[] = {1.0 + 0.0205, -2.0, 0.5};  // 0.0205 ≤ 2·0.01 + 0.001
  double const outside[] = {1.0, -2.0, 0.5 - 0.0215};
  ErrorReport const ok = compare_with_baseline("o", inside, baseline, ref, 3, floor);
  ErrorReport const bad = compare_with_baseline("o", outside, baseline, ref, 3, floor);
  EXPECT_TRUE(ok.passed()) << ok.str();
  EXPECT_NEAR(ok.budget_used, 0.0205 / 0.021, 1e-12);
  EXPECT_FALSE(bad.passed()) << bad.str();
  EXPECT_DOUBLE_EQ(design_budget(0.01, 0.001), 0.021);
}

TEST(Dtype, RoundsToNearestEvenLikeTheHardwareCasts) {
  // bf16 keeps 8 significant bits: around 1 the spacing is 2^-7.
  EXPECT_EQ(round_to(Dtype::kBF16, 1.0 + std::ldexp(1.0, -8)), 1.0);  // tie, rounds to even
  EXPECT_EQ(round_to(Dtype::kBF16, 1.0 + 3 * std::ldexp(1.0, -8)), 1.0 + std::ldexp(1.0, -6));  // tie, to even
  EXPECT_EQ(round_to(Dtype::kBF16, 1.0 + std::ldexp(1.0, -7)), 1.0 + std::ldexp(1.0, -7));
  EXPECT_EQ(round_to(Dtype::kF16, 65519.0), 65504.0);
  EXPECT_TRUE(std::isinf(round_to(Dtype::kF16, 65520.0)));
  EXPECT_EQ(round_to(Dtype::kF32, 0.1), static_cast<double>(0.1f));
  EXPECT_EQ(rounding_step(Dtype::kBF16, 3.0), std::ldexp(1.0, -6));
  EXPECT_EQ(rounding_step(Dtype::kF32, 1.0), std::ldexp(1.0, -23));
}

TEST(Env, SeedComesFromTheEnvironmentAndBadValuesAreRejected) {
  char const* old = std::getenv("FUSEPACK_SEED");
  std::string const saved = old ? old : "";
  setenv("FUSEPACK_SEED", "42", 1);
  EXPECT_EQ(global_seed(), 42u);
  setenv("FUSEPACK_SEED", "abc", 1);
  FUSEPACK_EXPECT_INVALID_ARGUMENT(global_seed(), "FUSEPACK_SEED must be an unsigned integer");
  if (old) setenv("FUSEPACK_SEED", saved.c_str(), 1); else unsetenv("FUSEPACK_SEED");
}

TEST(Env, TestSeedDependsOnTheTestNotOnOrder) {
  std::uint64_t const a = test_seed();
  EXPECT_EQ(a, test_seed());
  EXPECT_NE(a, global_seed());
}

// A log reused by a later process holds none of the earlier one's lines once spawn_process returns: a caller waiting
// for step lines (wait_for_step_lines) would otherwise count the earlier run's. Planted: the log opened (and so
// emptied) in the child after the fork, as it was; a read right after the return then found the earlier lines in 12
// of 20 single tries, so the test tries 10 times (all 10 missing it: ~1e-4 at that rate).
TEST(SpawnProcess, TheLogHoldsNothingOfAnEarlierProcessWhenItReturns) {
  std::string const log = test_temp_path("spawn", ".log");
  for (int attempt = 0; attempt < 10; ++attempt) {
    {
      std::ofstream out(log);
      out << "step 0/2 of an earlier run\nstep 1/2 of an earlier run\n";
    }
    Process const p = spawn_process({"/bin/sh", "-c", "sleep 0.05; echo step 0/1"}, {}, log);
    EXPECT_EQ(read_text_file(log), "") << "attempt " << attempt;
    EXPECT_EQ(wait_process(p, std::chrono::seconds(30)), 0);
    EXPECT_EQ(read_text_file(log), "step 0/1\n");
  }
  EXPECT_THROW(spawn_process({"/bin/true"}, {}, test_temp_path("no_such_dir", "") + "/run.log"), std::runtime_error);
}

}  // namespace
}  // namespace fusepack::test
