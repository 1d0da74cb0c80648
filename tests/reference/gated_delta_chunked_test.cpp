// The chunked gated delta rule of reference/gated_delta_chunked.h (the kernels' decomposition, emulated in fp64),
// forward and backward, against the naive per-token recurrence of reference/gated_delta.h: the kernels' algorithm,
// proved without a GPU. Small chunk sizes put many chunk boundaries into short examples.
#include "reference/gated_delta.h"
#include "reference/gated_delta_chunked.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "verify/compare.h"
#include "verify/random.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using ref::Index;
using ref::Tensor;

struct ChunkedCase {
  std::string name;
  std::vector<int> lengths;  // 0 = an empty example
  Index Hk, Hv, K, V, chunk;
  bool use_qk_l2norm, with_initial_state, with_dfinal_state;
};

void PrintTo(ChunkedCase const& c, std::ostream* os) { *os << c.name; }

// Drawn as the model feeds the op (reference/gated_delta_test.cpp does the same): g in [−1.2, 0], β in (0, 1),
// scale = K^−1/2, unit-scale q and k without l2norm.
ref::GatedDeltaChunkedInputs draw(ChunkedCase const& c, std::mt19937_64& rng) {
  ref::GatedDeltaChunkedInputs in;
  in.cu_seqlens = cu_seqlens_from_lengths(c.lengths);
  Index const T = in.cu_seqlens.back(), N = Index(c.lengths.size());
  double const sd = c.use_qk_l2norm ? 1.0 : 1.0 / std::sqrt(double(c.K));
  in.q = randn({T, c.Hk, c.K}, rng, sd);
  in.k = randn({T, c.Hk, c.K}, rng, sd);
  in.v = randn({T, c.Hv, c.V}, rng);
  in.g = uniform({T, c.Hv}, rng, -1.2, 0.0);
  in.beta = uniform({T, c.Hv}, rng, 0.0, 1.0);
  if (c.with_initial_state) in.initial_state = randn({N, c.Hv, c.K, c.V}, rng, 0.5);
  in.scale = 1.0 / std::sqrt(double(c.K));
  in.use_qk_l2norm = c.use_qk_l2norm;
  return in;
}

// Both sides are fp64 and compute the same function; they differ in summation order and in the chunked algebra
// (a triangular solve for Ainv, exp(G) factors split across products). With |terms| up to ~10² times the results and
// at most a few thousand terms per result, fp64 (1.1e-16 per rounding) stays below ~1e-11 of each tensor's largest
// entry; 1e-10 of it leaves room. A dropped or wrong term errs by 1e-3 of it or more (checked while writing this test:
// removing the exp(G_last)·<h, dh_next> term of dg, or the −kβgᵀ y term of the recurrence, fails every case in
// which a chunk sees a nonzero state or state gradient, by 1e9 times the tolerance or more).
constexpr double kRelToMax = 1e-10;

void expect_close(std::string const& name, Tensor const& got, Tensor const& want, std::vector<std::int32_t> const& cu,
                  bool packed_tokens) {
  double const scale = want.numel() ? want.flat().cwiseAbs().maxCoeff() : 0.0;
  FUSEPACK_EXPECT_PASS(compare_allclose(name, got, want, {kRelToMax * std::max(scale, 1e-300), 0.0},
                                        packed_tokens ? packed_layout(want, cu) : plain_layout(want)));
}

void expect_chunked_matches_recurrence(ChunkedCase const& c, std::mt19937_64& rng) {
  ref::GatedDeltaChunkedInputs const in = draw(c, rng);
  ref::GatedDeltaChunkedOut const fwd = ref::gated_delta_chunked_fwd(in, c.chunk);
  ref::GatedDeltaOut const want = ref::gated_delta_fwd(in.q, in.k, in.v, in.g, in.beta, in.cu_seqlens, in.scale,
                                                       in.use_qk_l2norm, in.initial_state, true);
  auto const& cu = in.cu_seqlens;
  expect_close("o " + c.name, fwd.o, want.o, cu, true);
  expect_close("final_state " + c.name, fwd.final_state, want.final_state, cu, false);

  Tensor const dout = randn(want.o.shape(), rng);
  Tensor const dfinal_state = c.with_dfinal_state ? randn(want.final_state.shape(), rng) : Tensor();
  ref::GatedDeltaGrads const got = ref::gated_delta_chunked_bwd(in, fwd.saved, dout, dfinal_state, c.chunk);
  ref::GatedDeltaGrads const grads = ref::gated_delta_bwd(dout, dfinal_state, in.q, in.k, in.v, in.g, in.beta, cu,
                                                          in.scale, in.use_qk_l2norm, in.initial_state);
  expect_close("dq " + c.name, got.dq, grads.dq, cu, true);
  expect_close("dk " + c.name, got.dk, grads.dk, cu, true);
  expect_close("dv " + c.name, got.dv, grads.dv, cu, true);
  expect_close("dg " + c.name, got.dg, grads.dg, cu, true);
  expect_close("dbeta " + c.name, got.dbeta, grads.dbeta, cu, true);
  ASSERT_EQ(got.dinitial_state.defined(), grads.dinitial_state.defined()) << c.name;
  if (grads.dinitial_state.defined())
    expect_close("dinitial_state " + c.name, got.dinitial_state, grads.dinitial_state, cu, false);
}

class GatedDeltaChunked : public ::testing::TestWithParam<ChunkedCase> {};

TEST_P(GatedDeltaChunked, MatchesNaiveRecurrence) {
  auto rng = test_rng();
  expect_chunked_matches_recurrence(GetParam(), rng);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GatedDeltaChunked,
    ::testing::Values(
        // name, lengths, Hk, Hv, K, V, chunk, use_qk_l2norm, with_initial_state, with_dfinal_state
        // The kernels' chunk of 64: one token, one token short of a chunk, exactly one, one over, two and a bit,
        // and an empty example in the middle.
        ChunkedCase{"c64_seqs_1_63_64_65_130_0_gqa1", {1, 63, 64, 0, 65, 130}, 1, 1, 5, 4, 64, true, true, true},
        ChunkedCase{"c64_seqs_130_0_65_gqa2_no_l2norm", {130, 0, 65}, 2, 4, 4, 3, 64, false, false, true},
        ChunkedCase{"c64_seqs_64_1_gqa3_no_states", {64, 1}, 1, 3, 6, 5, 64, true, false, false},
        // Chunks of 4: a boundary every 4 tokens, lengths around multiples of it.
        ChunkedCase{"c4_seqs_1_3_4_5_9_0_gqa2", {1, 3, 4, 5, 0, 9}, 2, 4, 5, 3, 4, true, true, true},
        ChunkedCase{"c4_seqs_0_13_8_gqa3_no_l2norm_h0", {0, 13, 8}, 1, 3, 3, 4, 4, false, true, false},
        ChunkedCase{"c4_seqs_17_gqa1_dfinal_only", {17}, 2, 2, 4, 4, 4, true, false, true},
        // Chunks of 1: the delta rule token by token (A = 0, Ainv = I); chunks of 16 over a long example.
        ChunkedCase{"c1_seqs_5_2_gqa2", {5, 2}, 1, 2, 3, 3, 1, true, true, true},
        ChunkedCase{"c16_seqs_65_31_gqa3", {65, 31}, 2, 6, 4, 3, 16, true, true, true},
        // T = 0: only empty examples; their dinitial_state is dfinal_state.
        ChunkedCase{"c64_only_empty_examples", {0, 0}, 1, 2, 3, 2, 64, true, true, true}),
    [](auto const& tc) { return tc.param.name; });

TEST(GatedDeltaChunked, MatchesNaiveRecurrenceOnRandomShapes) {
  auto rng = test_rng();
  int const chunk_sizes[] = {1, 2, 4, 8, 64};
  for (int i = 0; i < cases(4, 40); ++i) {
    ChunkedCase c;
    c.chunk = chunk_sizes[uniform_int(rng, 0, 4)];
    c.lengths = random_lengths(rng, uniform_int(rng, 1, 4), 0, c.chunk == 64 ? 140 : 3 * int(c.chunk) + 1);
    c.Hk = uniform_int(rng, 1, 2);
    c.Hv = c.Hk * uniform_int(rng, 1, 3);
    c.K = uniform_int(rng, 1, 6);
    c.V = uniform_int(rng, 1, 5);
    c.use_qk_l2norm = uniform_int(rng, 0, 1) == 1;
    c.with_initial_state = uniform_int(rng, 0, 1) == 1;
    c.with_dfinal_state = uniform_int(rng, 0, 1) == 1;
    c.name = "random case " + std::to_string(i) + " (chunk " + std::to_string(c.chunk) + ")";
    expect_chunked_matches_recurrence(c, rng);
  }
}

}  // namespace
}  // namespace fusepack::test
