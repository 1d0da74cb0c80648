// gated_delta reference: backward vs finite differences (every input, the initial state, a gradient flowing into the
// final state), closed-form and hand-computed cases, the GQA head mapping, packed == examples stitched, bad arguments.
#include "reference/gated_delta.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "verify/compare.h"
#include "verify/gradcheck.h"
#include "verify/random.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using ref::Index;
using ref::Shape;
using ref::Tensor;

constexpr Tolerance kExact{0, 0};  // the same arithmetic on the same inputs must give the same bits

struct GatedDeltaCase {
  std::string name;
  std::vector<int> lengths;  // example lengths; 0 = a zero-length example
  Index Hk, Hv, K, V;
  bool use_qk_l2norm;
  bool with_initial_state;
  bool output_final_state;  // the loss then also reads the final state, with a random nonzero dfinal_state
};

// The arguments of one call. Drawn as the model feeds the op: g in [−1.2, 0] (exp(g) spans (0.3, 1]), β in (0, 1),
// scale = K^−1/2. Without l2norm, q and k are drawn with stddev K^−1/2 (unit expected norm) so that I − β k kᵀ does
// not blow the state up over a few tokens. With l2norm, every q and k vector has norm ≥ 0.5: x / sqrt(|x|² + 1e-6) has
// derivatives growing like 1/|x|^n near x = 0, and a K = 2 vector of norm ~0.05 already pushes the central
// difference's truncation error past its 1e-6 tolerance (1 seed in 200 at the full level without this rule).
struct GatedDeltaArgs {
  Tensor q, k, v, g, beta, initial_state;
  std::vector<std::int32_t> cu_seqlens;
  double scale = 1;
  bool use_qk_l2norm = true;
  bool output_final_state = false;

  ref::GatedDeltaOut fwd() const {
    return ref::gated_delta_fwd(q, k, v, g, beta, cu_seqlens, scale, use_qk_l2norm, initial_state, output_final_state);
  }
  ref::GatedDeltaGrads bwd(Tensor const& dout, Tensor const& dfinal_state) const {
    return ref::gated_delta_bwd(dout, dfinal_state, q, k, v, g, beta, cu_seqlens, scale, use_qk_l2norm, initial_state);
  }
};

GatedDeltaArgs random_args(GatedDeltaCase const& c, std::mt19937_64& rng) {
  GatedDeltaArgs a;
  a.cu_seqlens = cu_seqlens_from_lengths(c.lengths);
  Index const T = a.cu_seqlens.back(), N = static_cast<Index>(c.lengths.size());
  if (c.use_qk_l2norm) {
    a.q = randn_rows_away_from_zero({T, c.Hk, c.K}, rng, 0.5);
    a.k = randn_rows_away_from_zero({T, c.Hk, c.K}, rng, 0.5);
  } else {
    a.q = randn({T, c.Hk, c.K}, rng, 1.0 / std::sqrt(static_cast<double>(c.K)));
    a.k = randn({T, c.Hk, c.K}, rng, 1.0 / std::sqrt(static_cast<double>(c.K)));
  }
  a.v = randn({T, c.Hv, c.V}, rng);
  a.g = uniform({T, c.Hv}, rng, -1.2, 0.0);
  a.beta = uniform({T, c.Hv}, rng, 0.0, 1.0);
  if (c.with_initial_state) a.initial_state = randn({N, c.Hv, c.K, c.V}, rng, 0.5);
  a.scale = 1.0 / std::sqrt(static_cast<double>(c.K));
  a.use_qk_l2norm = c.use_qk_l2norm;
  a.output_final_state = c.output_final_state;
  return a;
}

// Every gradient of loss = <dout, o> + <dfinal_state, final_state> against central finite differences.
void expect_backward_matches_finite_differences(GatedDeltaArgs& a, std::mt19937_64& rng, std::string const& tag) {
  ref::GatedDeltaOut const out = a.fwd();
  Tensor const dout = randn(out.o.shape(), rng);
  Tensor const dfinal_state = a.output_final_state ? randn(out.final_state.shape(), rng) : Tensor();
  auto loss = [&] {
    ref::GatedDeltaOut const y = a.fwd();
    return dot(dout, y.o) + (a.output_final_state ? dot(dfinal_state, y.final_state) : 0.0);
  };
  ref::GatedDeltaGrads const grads = a.bwd(dout, dfinal_state);
  auto const& cu = a.cu_seqlens;
  FUSEPACK_EXPECT_PASS(check_gradient("dq " + tag, loss, a.q, grads.dq, packed_layout(a.q, cu)));
  FUSEPACK_EXPECT_PASS(check_gradient("dk " + tag, loss, a.k, grads.dk, packed_layout(a.k, cu)));
  FUSEPACK_EXPECT_PASS(check_gradient("dv " + tag, loss, a.v, grads.dv, packed_layout(a.v, cu)));
  FUSEPACK_EXPECT_PASS(check_gradient("dg " + tag, loss, a.g, grads.dg, packed_layout(a.g, cu)));
  FUSEPACK_EXPECT_PASS(check_gradient("dbeta " + tag, loss, a.beta, grads.dbeta, packed_layout(a.beta, cu)));
  if (a.initial_state.defined()) {
    FUSEPACK_EXPECT_PASS(check_gradient("dinitial_state " + tag, loss, a.initial_state, grads.dinitial_state,
                                        plain_layout(a.initial_state)));
  } else {
    EXPECT_FALSE(grads.dinitial_state.defined()) << "dinitial_state without an initial_state " << tag;
  }
}

std::string describe(GatedDeltaCase const& c) {
  std::string s = "seqs";
  for (int len : c.lengths) s += "_" + std::to_string(len);
  s += " Hk" + std::to_string(c.Hk) + " Hv" + std::to_string(c.Hv) + " K" + std::to_string(c.K) + " V" +
       std::to_string(c.V) + (c.use_qk_l2norm ? " l2norm" : " no_l2norm") + (c.with_initial_state ? " h0" : "") +
       (c.output_final_state ? " final" : "");
  return s;
}

// How GoogleTest prints a case when a test fails (instead of the struct's bytes).
void PrintTo(GatedDeltaCase const& c, std::ostream* os) { *os << c.name << " (" << describe(c) << ")"; }

class GatedDeltaRef : public ::testing::TestWithParam<GatedDeltaCase> {};

TEST_P(GatedDeltaRef, BackwardMatchesFiniteDifferences) {
  auto rng = test_rng();
  GatedDeltaArgs a = random_args(GetParam(), rng);
  expect_backward_matches_finite_differences(a, rng, GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GatedDeltaRef,
    ::testing::Values(
        // name, lengths, Hk, Hv, K, V, use_qk_l2norm, with_initial_state, output_final_state
        GatedDeltaCase{"one_token_k4_v3", {1}, 1, 1, 4, 3, true, true, true},
        GatedDeltaCase{"one_example_len7_k5_v3_no_l2norm", {7}, 1, 1, 5, 3, false, false, true},
        GatedDeltaCase{"gqa2_seqs_3_1_4_k5_v3", {3, 1, 4}, 2, 4, 5, 3, true, true, true},
        GatedDeltaCase{"gqa3_seqs_2_5_k4_v2_no_l2norm", {2, 5}, 1, 3, 4, 2, false, true, false},
        GatedDeltaCase{"gqa3_two_key_heads_k3_v7", {4, 2}, 2, 6, 3, 7, true, false, true},
        GatedDeltaCase{"many_tiny_seqs_1x7_gqa2", {1, 1, 1, 1, 1, 1, 1}, 1, 2, 3, 2, true, true, true},
        GatedDeltaCase{"zero_length_inside_seqs_3_0_2", {3, 0, 2}, 2, 2, 5, 3, true, true, true},
        GatedDeltaCase{"zero_length_first_and_last_no_l2norm", {0, 3, 0}, 1, 1, 2, 3, false, true, true},
        GatedDeltaCase{"empty_batch_t0", {0}, 1, 2, 3, 2, true, true, true},
        GatedDeltaCase{"scalar_state_k1_v1_no_l2norm", {4, 2}, 1, 1, 1, 1, false, true, true},
        GatedDeltaCase{"no_states_k6_v6", {4, 3}, 2, 2, 6, 6, true, false, false}),
    [](auto const& tc) { return tc.param.name; });

TEST(GatedDeltaRef, BackwardMatchesFiniteDifferencesOnRandomShapes) {
  auto rng = test_rng();
  for (int c = 0; c < cases(3, 30); ++c) {
    GatedDeltaCase tc;
    tc.use_qk_l2norm = uniform_int(rng, 0, 1) == 1;
    tc.Hk = uniform_int(rng, 1, 2);
    tc.Hv = tc.Hk * uniform_int(rng, 1, 3);
    tc.K = uniform_int(rng, 1, 6);
    tc.V = uniform_int(rng, 1, 5);
    tc.lengths = random_lengths(rng, uniform_int(rng, 1, 4), 0, 4);
    tc.with_initial_state = uniform_int(rng, 0, 1) == 1;
    tc.output_final_state = uniform_int(rng, 0, 1) == 1;
    GatedDeltaArgs a = random_args(tc, rng);
    expect_backward_matches_finite_differences(a, rng, describe(tc));
  }
}

TEST(GatedDeltaRef, MatchesClosedFormOneToken) {
  // One token from a zero state, no l2norm: S' = e^g·0 = 0, u = β v, S = β k vᵀ, so o = Sᵀ(scale q) = β (scale q·k) v
  // and final_state = β k vᵀ, whatever g. With w = dout and c = scale q·k: dv = β c w, dβ = c (v·w),
  // dq = scale β (v·w) k, dk = scale β (v·w) q, and dg = <S', dS'> = 0 because S' = 0.
  Tensor const q({1, 1, 3}, {1.0, -2.0, 0.5});
  Tensor const k({1, 1, 3}, {0.5, 1.0, 2.0});
  Tensor const v({1, 1, 2}, {3.0, -1.0});
  Tensor const g({1, 1}, {-0.7});
  Tensor const beta({1, 1}, {0.25});
  double const scale = 0.5;
  Tensor const dout({1, 1, 2}, {2.0, 1.0});
  double const qk = 1.0 * 0.5 - 2.0 * 1.0 + 0.5 * 2.0;  // −0.5
  double const c = scale * qk;                          // −0.25
  double const vw = 3.0 * 2.0 - 1.0 * 1.0;              // 5

  ref::GatedDeltaOut const out = ref::gated_delta_fwd(q, k, v, g, beta, {0, 1}, scale, false, {}, true);
  for (Index i = 0; i < 2; ++i) EXPECT_NEAR(out.o({0, 0, i}), 0.25 * c * v({0, 0, i}), 1e-15);
  for (Index a = 0; a < 3; ++a) {
    for (Index b = 0; b < 2; ++b) EXPECT_NEAR(out.final_state({0, 0, a, b}), 0.25 * k({0, 0, a}) * v({0, 0, b}), 1e-15);
  }

  ref::GatedDeltaGrads const grads = ref::gated_delta_bwd(dout, {}, q, k, v, g, beta, {0, 1}, scale, false);
  for (Index i = 0; i < 2; ++i) EXPECT_NEAR(grads.dv({0, 0, i}), 0.25 * c * dout({0, 0, i}), 1e-15);
  EXPECT_NEAR(grads.dbeta({0, 0}), c * vw, 1e-15);
  for (Index a = 0; a < 3; ++a) {
    EXPECT_NEAR(grads.dq({0, 0, a}), scale * 0.25 * vw * k({0, 0, a}), 1e-15);
    EXPECT_NEAR(grads.dk({0, 0, a}), scale * 0.25 * vw * q({0, 0, a}), 1e-15);
  }
  EXPECT_EQ(grads.dg({0, 0}), 0.0);
}

TEST(GatedDeltaRef, MatchesHandComputedScalarRecurrence) {
  // K = V = 1, no l2norm, scale 0.5, s0 = 2, two tokens (decay first, then the delta update, output from the new
  // state):
  //   t=1: g = ln 0.5, β = 0.5, k = 1, v = 3, q = 1: S' = 2·0.5 = 1, u = 0.5·(3 − 1·1) = 1, S = 1 + 1·1 = 2,
  //        o = 2 · 0.5·1 = 1.
  //   t=2: g = 0, β = 0.25, k = 1, v = 1, q = 3: S' = 2, u = 0.25·(1 − 2) = −0.25, S = 2 − 0.25 = 1.75,
  //        o = 1.75 · 0.5·3 = 2.625; final state 1.75.
  // Gradients of loss = o1 + o2 + 2·final: S_t = a_t S_{t−1} + β_t k_t v_t with a_t = e^{g_t}(1 − β_t k_t²), so
  // a1 = 0.25, a2 = 0.75, and ∂loss/∂S2 = 0.5·3 + 2 = 3.5;
  //   dinitial = 0.5·1·a1 + 3.5·a2·a1 = 0.125 + 0.65625 = 0.78125,
  //   dg2 = 3.5 · ∂S2/∂g2 = 3.5 · a2·S1 = 3.5·1.5 = 5.25,
  //   dβ2 = 3.5 · ∂S2/∂β2 = 3.5 · (k v − k² S2') = 3.5·(1 − 2) = −3.5.
  Tensor const q({2, 1, 1}, {1.0, 3.0});
  Tensor const k({2, 1, 1}, {1.0, 1.0});
  Tensor const v({2, 1, 1}, {3.0, 1.0});
  Tensor const g({2, 1}, {std::log(0.5), 0.0});
  Tensor const beta({2, 1}, {0.5, 0.25});
  Tensor const s0({1, 1, 1, 1}, {2.0});
  ref::GatedDeltaOut const out = ref::gated_delta_fwd(q, k, v, g, beta, {0, 2}, 0.5, false, s0, true);
  EXPECT_NEAR(out.o({0, 0, 0}), 1.0, 1e-15);
  EXPECT_NEAR(out.o({1, 0, 0}), 2.625, 1e-15);
  EXPECT_NEAR(out.final_state({0, 0, 0, 0}), 1.75, 1e-15);

  ref::GatedDeltaGrads const grads = ref::gated_delta_bwd(Tensor({2, 1, 1}, {1.0, 1.0}), Tensor({1, 1, 1, 1}, {2.0}), q,
                                                          k, v, g, beta, {0, 2}, 0.5, false, s0);
  EXPECT_NEAR(grads.dinitial_state({0, 0, 0, 0}), 0.78125, 1e-15);
  EXPECT_NEAR(grads.dg({1, 0}), 5.25, 1e-15);
  EXPECT_NEAR(grads.dbeta({1, 0}), -3.5, 1e-15);
}

TEST(GatedDeltaRef, L2NormIsAppliedToQAndKBeforeTheScale) {
  // One token from a zero state with l2norm: o = β (scale q̂·k̂) v with x̂ = x / sqrt(|x|² + 1e-6). q = (3, 4) and
  // k = (0, 2) give q̂·k̂ = 8 / (sqrt(25 + 1e-6) · sqrt(4 + 1e-6)); a scale applied before the norm would cancel.
  Tensor const q({1, 1, 2}, {3.0, 4.0});
  Tensor const k({1, 1, 2}, {0.0, 2.0});
  Tensor const v({1, 1, 1}, {2.0});
  Tensor const g({1, 1}, {0.0});
  Tensor const beta({1, 1}, {0.5});
  double const scale = 0.125;
  double const qk_hat = 8.0 / (std::sqrt(25.0 + ref::kL2NormEps) * std::sqrt(4.0 + ref::kL2NormEps));
  ref::GatedDeltaOut const out = ref::gated_delta_fwd(q, k, v, g, beta, {0, 1}, scale, true);
  EXPECT_NEAR(out.o({0, 0, 0}), 0.5 * scale * qk_hat * 2.0, 1e-15);
  EXPECT_FALSE(out.final_state.defined()) << "final_state is returned only when output_final_state";
}

TEST(GatedDeltaRef, ValueHeadsOfAGroupReadTheSameKeyHead) {
  // GQA: value head j reads key head j / (Hv / Hk), i.e. q and k repeated with repeat_interleave. The outputs equal
  // those of the same call with q and k explicitly repeated to Hv heads (same arithmetic: same bits), and dq, dk are
  // the sums of the repeated heads' gradients (a reassociated sum: 1e-13).
  auto rng = test_rng();
  Index const Hk = 2, group = 3, Hv = Hk * group, K = 4, V = 3;
  GatedDeltaArgs a = random_args({"gqa", {3, 2}, Hk, Hv, K, V, true, true, true}, rng);
  GatedDeltaArgs repeated = a;
  Index const T = a.cu_seqlens.back();
  repeated.q = Tensor({T, Hv, K});
  repeated.k = Tensor({T, Hv, K});
  for (Index t = 0; t < T; ++t) {
    for (Index j = 0; j < Hv; ++j) {
      repeated.q.vec({t, j}) = a.q.vec({t, j / group});
      repeated.k.vec({t, j}) = a.k.vec({t, j / group});
    }
  }
  ref::GatedDeltaOut const out = a.fwd(), out_repeated = repeated.fwd();
  FUSEPACK_EXPECT_PASS(compare_allclose("o (gqa vs repeated)", out.o, out_repeated.o, kExact));
  FUSEPACK_EXPECT_PASS(
      compare_allclose("final_state (gqa vs repeated)", out.final_state, out_repeated.final_state, kExact));

  Tensor const dout = randn(out.o.shape(), rng);
  Tensor const dfinal_state = randn(out.final_state.shape(), rng);
  ref::GatedDeltaGrads const grads = a.bwd(dout, dfinal_state), grads_repeated = repeated.bwd(dout, dfinal_state);
  Tensor dq_summed({T, Hk, K}), dk_summed({T, Hk, K});
  for (Index t = 0; t < T; ++t) {
    for (Index j = 0; j < Hv; ++j) {
      dq_summed.vec({t, j / group}) += grads_repeated.dq.vec({t, j});
      dk_summed.vec({t, j / group}) += grads_repeated.dk.vec({t, j});
    }
  }
  FUSEPACK_EXPECT_PASS(compare_allclose("dq (gqa vs repeated, summed)", grads.dq, dq_summed, {1e-13, 1e-13}));
  FUSEPACK_EXPECT_PASS(compare_allclose("dk (gqa vs repeated, summed)", grads.dk, dk_summed, {1e-13, 1e-13}));
  FUSEPACK_EXPECT_PASS(compare_allclose("dv (gqa vs repeated)", grads.dv, grads_repeated.dv, kExact));
  FUSEPACK_EXPECT_PASS(compare_allclose("dg (gqa vs repeated)", grads.dg, grads_repeated.dg, kExact));
  FUSEPACK_EXPECT_PASS(compare_allclose("dbeta (gqa vs repeated)", grads.dbeta, grads_repeated.dbeta, kExact));
}

TEST(GatedDeltaRef, PackedEqualsExamplesStitched) {
  // Each example computed alone (cu_seqlens {0, L}, its own initial state) and concatenated equals the packed call,
  // bit for bit, for outputs, final states and every gradient. Without an initial state, this is the state reset
  // at every example start.
  auto rng = test_rng();
  for (bool const use_qk_l2norm : {true, false}) {
    for (bool const with_initial_state : {true, false}) {
      GatedDeltaCase const tc{"stitched", {3, 0, 1, 5, 2}, 2, 4, 5, 3, use_qk_l2norm, with_initial_state, true};
      std::string const tag = describe(tc);
      GatedDeltaArgs const packed = random_args(tc, rng);
      ref::GatedDeltaOut const out = packed.fwd();
      Tensor const dout = randn(out.o.shape(), rng);
      Tensor const dfinal_state = randn(out.final_state.shape(), rng);
      ref::GatedDeltaGrads const grads = packed.bwd(dout, dfinal_state);

      ref::GatedDeltaOut stitched{Tensor(out.o.shape()), Tensor(out.final_state.shape())};
      ref::GatedDeltaGrads stitched_grads{
          Tensor(grads.dq.shape()),    Tensor(grads.dk.shape()),
          Tensor(grads.dv.shape()),    Tensor(grads.dg.shape()),
          Tensor(grads.dbeta.shape()), with_initial_state ? Tensor(grads.dinitial_state.shape()) : Tensor()};
      auto const& cu = packed.cu_seqlens;
      for (size_t n = 0; n + 1 < cu.size(); ++n) {
        Index const bos = cu[n], eos = cu[n + 1];
        GatedDeltaArgs alone = packed;
        alone.cu_seqlens = {0, static_cast<std::int32_t>(eos - bos)};
        for (Tensor* x : {&alone.q, &alone.k, &alone.v, &alone.g, &alone.beta}) *x = x->rows(bos, eos);
        if (with_initial_state) alone.initial_state = packed.initial_state.rows(n, n + 1);
        ref::GatedDeltaOut const y = alone.fwd();
        ref::GatedDeltaGrads const gy = alone.bwd(dout.rows(bos, eos), dfinal_state.rows(n, n + 1));
        stitched.o.set_rows(bos, y.o);
        stitched.final_state.set_rows(n, y.final_state);
        stitched_grads.dq.set_rows(bos, gy.dq);
        stitched_grads.dk.set_rows(bos, gy.dk);
        stitched_grads.dv.set_rows(bos, gy.dv);
        stitched_grads.dg.set_rows(bos, gy.dg);
        stitched_grads.dbeta.set_rows(bos, gy.dbeta);
        if (with_initial_state) stitched_grads.dinitial_state.set_rows(n, gy.dinitial_state);
      }
      auto check = [&](std::string const& name, Tensor const& got, Tensor const& want, bool packed_tokens) {
        FUSEPACK_EXPECT_PASS(compare_allclose(name + " stitched vs packed " + tag, got, want, kExact,
                                              packed_tokens ? packed_layout(want, cu) : plain_layout(want)));
      };
      check("o", stitched.o, out.o, true);
      check("final_state", stitched.final_state, out.final_state, false);
      check("dq", stitched_grads.dq, grads.dq, true);
      check("dk", stitched_grads.dk, grads.dk, true);
      check("dv", stitched_grads.dv, grads.dv, true);
      check("dg", stitched_grads.dg, grads.dg, true);
      check("dbeta", stitched_grads.dbeta, grads.dbeta, true);
      if (with_initial_state) check("dinitial_state", stitched_grads.dinitial_state, grads.dinitial_state, false);
    }
  }
}

TEST(GatedDeltaRef, ZeroLengthExamplePassesItsStateThrough) {
  // An example with no tokens returns its initial state as final state, and its dinitial_state is dfinal_state.
  auto rng = test_rng();
  GatedDeltaArgs const a = random_args({"zero", {2, 0, 1}, 1, 2, 3, 2, true, true, true}, rng);
  ref::GatedDeltaOut const out = a.fwd();
  Tensor const dfinal_state = randn(out.final_state.shape(), rng);
  ref::GatedDeltaGrads const grads = a.bwd(randn(out.o.shape(), rng), dfinal_state);
  FUSEPACK_EXPECT_PASS(compare_allclose("final_state of the empty example", out.final_state.rows(1, 2),
                                        a.initial_state.rows(1, 2), kExact));
  FUSEPACK_EXPECT_PASS(compare_allclose("dinitial_state of the empty example", grads.dinitial_state.rows(1, 2),
                                        dfinal_state.rows(1, 2), kExact));
}

TEST(GatedDeltaRef, RejectsBadArguments) {
  // A valid call: two examples of 2 and 1 tokens, Hk = 2, Hv = 4, K = 3, V = 2.
  std::vector<std::int32_t> const cu{0, 2, 3};
  Tensor const q({3, 2, 3}), k({3, 2, 3}), v({3, 4, 2}), g({3, 4}), beta({3, 4}), h0({2, 4, 3, 2});
  Tensor const dout({3, 4, 2}), dfinal({2, 4, 3, 2});
  auto fwd = [&](Tensor const& q_, Tensor const& k_, Tensor const& v_, Tensor const& g_, Tensor const& beta_,
                 std::vector<std::int32_t> const& cu_, double scale, Tensor const& h0_) {
    return ref::gated_delta_fwd(q_, k_, v_, g_, beta_, cu_, scale, true, h0_, true);
  };
  EXPECT_NO_THROW(fwd(q, k, v, g, beta, cu, 0.5, h0));
  EXPECT_NO_THROW(ref::gated_delta_bwd(dout, dfinal, q, k, v, g, beta, cu, 0.5, true, h0));

  FUSEPACK_EXPECT_INVALID_ARGUMENT(
      fwd(q, k, Tensor({3, 3, 2}), Tensor({3, 3}), Tensor({3, 3}), cu, 0.5, {}),
      "value heads Hv=3 (v dimension 1) must be a positive multiple of the key heads Hk=2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(
      fwd(Tensor({3, 4, 3}), Tensor({3, 4, 3}), Tensor({3, 2, 2}), Tensor({3, 2}), Tensor({3, 2}), cu, 0.5, {}),
      "value heads Hv=2 (v dimension 1) must be a positive multiple of the key heads Hk=4");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(Tensor({3, 0, 3}), Tensor({3, 0, 3}), v, g, beta, cu, 0.5, {}),
                                   "q must have at least one key head");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, Tensor({3, 2, 4}), v, g, beta, cu, 0.5, h0),
                                   "k has shape [3, 2, 4]; expected 3 in dimension 2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, Tensor({3, 1, 3}), v, g, beta, cu, 0.5, h0),
                                   "k has shape [3, 1, 3]; expected 2 in dimension 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(Tensor({3, 6}), k, v, g, beta, cu, 0.5, h0), "q must have 3 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(Tensor(), k, v, g, beta, cu, 0.5, h0), "q is required");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, Tensor({4, 4, 2}), g, beta, cu, 0.5, h0),
                                   "v has shape [4, 4, 2]; expected 3 in dimension 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, Tensor({3, 2}), beta, cu, 0.5, h0),
                                   "g has shape [3, 2]; expected 4 in dimension 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, Tensor({3}), cu, 0.5, h0), "beta must have 2 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, Tensor({2, 4}), cu, 0.5, h0),
                                   "beta has shape [2, 4]; expected 3 in dimension 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, beta, cu, 0.5, Tensor({3, 4, 3, 2})),
                                   "initial_state has shape [3, 4, 3, 2]; expected 2 in dimension 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, beta, cu, 0.5, Tensor({2, 4, 2, 3})),
                                   "initial_state has shape [2, 4, 2, 3]; expected 3 in dimension 2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, beta, {1, 2, 3}, 0.5, h0), "cu_seqlens must start at 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, beta, {0, 3, 2, 3}, 0.5, {}), "cu_seqlens must be non-decreasing");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, beta, {0, 2}, 0.5, {}),
                                   "cu_seqlens must end at the number of tokens T=3");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, beta, {0}, 0.5, {}), "cu_seqlens needs at least 2 entries");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, beta, cu, 0.0, h0), "scale must be > 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, beta, cu, -1.0, h0), "scale must be > 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(fwd(q, k, v, g, beta, cu, std::nan(""), h0), "scale must be > 0");

  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_delta_bwd(Tensor({3, 4, 3}), dfinal, q, k, v, g, beta, cu, 0.5, true, h0),
                                   "gated_delta_bwd: dout has shape [3, 4, 3]; expected 2 in dimension 2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(
      ref::gated_delta_bwd(dout, Tensor({1, 4, 3, 2}), q, k, v, g, beta, cu, 0.5, true, h0),
      "gated_delta_bwd: dfinal_state has shape [1, 4, 3, 2]; expected 2 in dimension 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_delta_bwd(dout, Tensor({2, 4, 3}), q, k, v, g, beta, cu, 0.5, true, h0),
                                   "dfinal_state must have 4 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_delta_bwd(dout, dfinal, q, k, v, g, beta, cu, 0.5, true, Tensor({2})),
                                   "gated_delta_bwd: initial_state must have 4 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_delta_bwd(dout, dfinal, q, k, v, g, beta, {0, 1, 2}, 0.5, true, {}),
                                   "gated_delta_bwd: cu_seqlens must end at the number of tokens T=3");
}

}  // namespace
}  // namespace fusepack::test
