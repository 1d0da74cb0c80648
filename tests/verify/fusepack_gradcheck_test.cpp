// fusepack-gradcheck as a user runs it: arguments that leave nothing to check, that do not apply to the op or that ask
// for more memory than exists are errors (exit 2) naming the option, never a silent pass or a leaked std::bad_alloc.
#include "tests/support/run_binary.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#ifndef FUSEPACK_GRADCHECK_BINARY
#error "FUSEPACK_GRADCHECK_BINARY must name the fusepack-gradcheck executable"
#endif

namespace fusepack::test {
namespace {

// On the CPU, fp64, composite: what runs on a machine without a GPU.
std::string const kCpu = " --backend composite --dtype fp64";

BinaryResult run_gradcheck(std::string const& args) {
  return run_binary(FUSEPACK_GRADCHECK_BINARY, "fusepack-gradcheck", args);
}

void expect_usage_error(std::string const& args, std::string const& message) {
  BinaryResult const r = run_gradcheck(args);
  EXPECT_EQ(r.exit_code, 2) << args;
  EXPECT_NE(r.out.find(message), std::string::npos) << args << "\noutput: " << r.out;
}

TEST(FusepackGradcheck, PassesOnASmallCpuCase) {
  BinaryResult const r = run_gradcheck("rmsnorm --seqlens 3,5 --heads 2 --dim 8" + kCpu);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("3 passed, 0 failed"), std::string::npos) << r.out;
}

TEST(FusepackGradcheck, NothingToCheckIsAnErrorNotAPass) {
  // Each of these exited 0 over zero values.
  expect_usage_error("rmsnorm --seqlens ''" + kCpu, "--seqlens is empty: nothing to check");
  expect_usage_error("rmsnorm --seqlens 0" + kCpu, "--seqlens 1 example(s), all empty: nothing to check");
  expect_usage_error("rmsnorm --seqlens 0,0" + kCpu, "--seqlens 2 example(s), all empty: nothing to check");
  expect_usage_error("rmsnorm --heads 0" + kCpu, "--heads 0: item 1 is 0; it must be an integer >= 1");
  expect_usage_error("rmsnorm --dim 0" + kCpu, "--dim must be >= 1; got 0: nothing to check");
}

TEST(FusepackGradcheck, AnEmptyListItemIsNamedNotSkipped) {
  // "1,,2" was read as 1 2.
  expect_usage_error("rmsnorm --seqlens 1,,2" + kCpu, "--seqlens 1,,2: item 2 is empty");
  expect_usage_error("rmsnorm --seqlens 1,2," + kCpu, "--seqlens 1,2,: item 3 is empty");
  expect_usage_error("rmsnorm --seqlens 1,x" + kCpu, "--seqlens 1,x: item 2 is 'x', not an integer");
}

TEST(FusepackGradcheck, AnOptionOfAnotherOpIsAnError) {
  expect_usage_error("rmsnorm --no-silu" + kCpu, "--no-silu does not apply to rmsnorm (it applies to conv1d)");
  expect_usage_error("swiglu --heads 4" + kCpu,
                     "--heads does not apply to swiglu (it applies to rmsnorm, gated_rmsnorm, rope, attention, "
                     "gated_delta)");
  expect_usage_error("conv1d --kv-heads 2" + kCpu, "--kv-heads does not apply to conv1d (it applies to attention)");
  expect_usage_error("rmsnorm --schedule lean" + kCpu,
                     "--schedule does not apply to rmsnorm (it applies to gated_delta)");
}

TEST(FusepackGradcheck, AScheduleIsAFusedChoiceAndOneOfThree) {
  // The composite has one schedule: a forced one would be ignored, and the check would not be of what was asked.
  expect_usage_error("gated_delta --schedule lean" + kCpu,
                     "--schedule lean chooses the fused kernels' schedule; got --backend composite");
  expect_usage_error("gated_delta --schedule fast" + kCpu, "--schedule: fast not in {by-shape,full,lean}");
}

TEST(FusepackGradcheck, NegativeSizesNameTheOption) {
  // --heads -2 was reported as a negative tensor dimension.
  expect_usage_error("rmsnorm --heads -2" + kCpu, "--heads -2: item 1 is -2; it must be an integer >= 1");
  expect_usage_error("rmsnorm --seqlens 4,-1" + kCpu, "--seqlens 4,-1: item 2 is -1; it must be an integer >= 0");
  expect_usage_error("attention --kv-heads -1" + kCpu, "--kv-heads must be >= 1; got -1");
}

TEST(FusepackGradcheck, FusedOnlyRefusesTheCompositeBackend) {
  // --fused-only checks nothing: it must not turn a composite check into a silent exit 0.
  expect_usage_error("rmsnorm --fused-only" + kCpu, "--fused-only runs the fused backend; got --backend composite");
}

TEST(FusepackGradcheck, DigestNeedsFusedOnly) {
  // --digest prints the fused run's bits; without --fused-only it would be dropped silently from a check.
  BinaryResult const r = run_gradcheck("rmsnorm --digest" + kCpu);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--digest requires --fused-only"), std::string::npos) << r.out;
}

TEST(FusepackGradcheck, DigestsAreEqualForEqualRunsAndDifferForOthers) {
  std::string const args = "gated_delta --seqlens 5,70 --heads 1,2 --dim 64 --fused-only --digest";
  BinaryResult const a = run_gradcheck(args), b = run_gradcheck(args), c = run_gradcheck(args + " --seed 7");
  if (a.exit_code == 2 && a.out.find("the fused kernels need one") != std::string::npos) GTEST_SKIP() << a.out;
  ASSERT_EQ(a.exit_code, 0) << a.out;
  ASSERT_EQ(c.exit_code, 0) << c.out;
  // o, final_state, the six gradients, and o and final_state again from the forward without gradients: ten digests
  std::size_t digests = 0;
  for (std::size_t at = a.out.find(": digest "); at != std::string::npos; at = a.out.find(": digest ", at + 1)) {
    ++digests;
  }
  EXPECT_EQ(digests, 10u) << a.out;
  auto const digest_of = [&a](std::string const& line_start) {
    std::size_t const at = a.out.find(line_start);
    return at == std::string::npos ? "(no line '" + line_start + "')" : a.out.substr(at + line_start.size(), 16);
  };
  std::string const o = digest_of("  o bf16 [75, 2, 64]: digest ");
  EXPECT_EQ(o.size(), 16u) << a.out;
  EXPECT_NE(a.out.find("  dinitial_state fp32 [2, 2, 64, 64]: digest "), std::string::npos) << a.out;
  // The forward without gradients computes the same o and final state to the bit.
  EXPECT_EQ(digest_of("  o (no grad) bf16 [75, 2, 64]: digest "), o) << a.out;
  EXPECT_EQ(digest_of("  final_state (no grad) fp32 [2, 2, 64, 64]: digest "),
            digest_of("  final_state fp32 [2, 2, 64, 64]: digest ")) << a.out;
  EXPECT_EQ(a.out, b.out);  // the fused backward is bitwise deterministic
  EXPECT_NE(a.out, c.out);
}

TEST(FusepackGradcheck, RefusesANegativeSeedInsteadOfWrappingIt) {
  expect_usage_error("rmsnorm --seed -1" + kCpu, "must be a non-negative integer (0 to 2^64-1); got -1");
}

TEST(FusepackGradcheck, RefusesSizesThatCannotBeHeldInsteadOfThrowingBadAlloc) {
  expect_usage_error("rmsnorm --seqlens 2000000000" + kCpu,
                     "--seqlens (2000000000 tokens), --heads 4 and --dim 128 ask for a tensor of 1024000000000 "
                     "elements; at most 1073741824");
  expect_usage_error("swiglu --seqlens 2000000000,2000000000" + kCpu, "cu_seqlens are int32: at most 2147483647");
}

}  // namespace
}  // namespace fusepack::test
