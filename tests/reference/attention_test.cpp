// attention reference: backward vs finite differences (q, k, v, gate), closed-form and hand-computed cases, causality,
// the GQA head mapping, packed == examples stitched, bad arguments.
#include "reference/attention.h"

#include "reference/math.h"
#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "verify/compare.h"
#include "verify/gradcheck.h"
#include "verify/random.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using ref::Index;
using ref::Shape;
using ref::Tensor;

constexpr Tolerance kExact{0, 0};  // the same arithmetic on the same inputs must give the same bits

struct AttentionCase {
  std::string name;
  std::vector<int> lengths;  // example lengths; 0 = a zero-length example
  Index Hq, Hkv, D, Dv;
  bool with_gate;
};

// The arguments of one call, drawn as the model feeds the op: standard normal q, k, v, gate and scale = D^−1/2, so
// the scores are O(1) and the softmax is neither uniform nor one-hot.
struct AttentionArgs {
  Tensor q, k, v, gate;
  std::vector<std::int32_t> cu_seqlens;
  double scale = 1;

  Tensor fwd() const { return ref::attention_fwd(q, k, v, cu_seqlens, scale, gate); }
  ref::AttentionGrads bwd(Tensor const& dout) const {
    return ref::attention_bwd(dout, q, k, v, cu_seqlens, scale, gate);
  }
};

AttentionArgs random_args(AttentionCase const& c, std::mt19937_64& rng) {
  AttentionArgs a;
  a.cu_seqlens = cu_seqlens_from_lengths(c.lengths);
  Index const T = a.cu_seqlens.back();
  a.q = randn({T, c.Hq, c.D}, rng);
  a.k = randn({T, c.Hkv, c.D}, rng);
  a.v = randn({T, c.Hkv, c.Dv}, rng);
  if (c.with_gate) a.gate = randn({T, c.Hq, c.Dv}, rng);
  a.scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  return a;
}

// Every gradient of loss = <dout, attention(q, k, v, gate)> against central finite differences.
void expect_backward_matches_finite_differences(AttentionArgs& a, std::mt19937_64& rng, std::string const& tag) {
  Tensor const dout = randn(a.fwd().shape(), rng);
  auto loss = [&] { return dot(dout, a.fwd()); };
  ref::AttentionGrads const grads = a.bwd(dout);
  auto const& cu = a.cu_seqlens;
  FUSEPACK_EXPECT_PASS(check_gradient("dq " + tag, loss, a.q, grads.dq, packed_layout(a.q, cu)));
  FUSEPACK_EXPECT_PASS(check_gradient("dk " + tag, loss, a.k, grads.dk, packed_layout(a.k, cu)));
  FUSEPACK_EXPECT_PASS(check_gradient("dv " + tag, loss, a.v, grads.dv, packed_layout(a.v, cu)));
  if (a.gate.defined()) {
    FUSEPACK_EXPECT_PASS(check_gradient("dgate " + tag, loss, a.gate, grads.dgate, packed_layout(a.gate, cu)));
  } else {
    EXPECT_FALSE(grads.dgate.defined()) << "dgate without a gate " << tag;
  }
}

std::string describe(AttentionCase const& c) {
  std::string s = "seqs";
  for (int len : c.lengths) s += "_" + std::to_string(len);
  return s + " Hq" + std::to_string(c.Hq) + " Hkv" + std::to_string(c.Hkv) + " D" + std::to_string(c.D) + " Dv" +
         std::to_string(c.Dv) + (c.with_gate ? " gated" : "");
}

// How GoogleTest prints a case when a test fails (instead of the struct's bytes).
void PrintTo(AttentionCase const& c, std::ostream* os) { *os << c.name << " (" << describe(c) << ")"; }

class AttentionRef : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionRef, BackwardMatchesFiniteDifferences) {
  auto rng = test_rng();
  AttentionArgs a = random_args(GetParam(), rng);
  expect_backward_matches_finite_differences(a, rng, GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionRef,
    ::testing::Values(
        // name, lengths, Hq, Hkv, D, Dv, with_gate
        AttentionCase{"one_token_d4_dv3_gated", {1}, 1, 1, 4, 3, true},
        AttentionCase{"one_example_len7_d5_dv3", {7}, 1, 1, 5, 3, false},
        AttentionCase{"one_example_len6_d5_dv3_gated", {6}, 2, 2, 5, 3, true},
        AttentionCase{"gqa2_seqs_3_1_4_d5_dv3_gated", {3, 1, 4}, 4, 2, 5, 3, true},
        AttentionCase{"gqa3_hq6_hkv2_seqs_2_5_d5_dv3", {2, 5}, 6, 2, 5, 3, false},
        AttentionCase{"gqa3_hq3_hkv1_seqs_4_2_d3_dv7_gated", {4, 2}, 3, 1, 3, 7, true},
        AttentionCase{"many_tiny_seqs_1x7_gqa2_gated", {1, 1, 1, 1, 1, 1, 1}, 2, 1, 3, 2, true},
        AttentionCase{"many_tiny_seqs_1_2_1_2_1", {1, 2, 1, 2, 1}, 2, 2, 2, 3, false},
        AttentionCase{"zero_length_inside_seqs_3_0_2_gated", {3, 0, 2}, 4, 2, 5, 3, true},
        AttentionCase{"zero_length_first_and_last", {0, 3, 0}, 2, 1, 2, 3, false},
        AttentionCase{"empty_batch_t0_gated", {0}, 2, 1, 3, 2, true},
        AttentionCase{"scalar_heads_d1_dv1", {4, 2}, 1, 1, 1, 1, false},
        AttentionCase{"mha3_d6_dv6_gated", {4, 3}, 3, 3, 6, 6, true}),
    [](auto const& tc) { return tc.param.name; });

TEST(AttentionRef, BackwardMatchesFiniteDifferencesOnRandomShapes) {
  auto rng = test_rng();
  for (int c = 0; c < cases(3, 30); ++c) {
    AttentionCase tc;
    tc.with_gate = uniform_int(rng, 0, 1) == 1;
    tc.Hkv = uniform_int(rng, 1, 2);
    tc.Hq = tc.Hkv * uniform_int(rng, 1, 3);
    tc.D = uniform_int(rng, 1, 6);
    tc.Dv = uniform_int(rng, 1, 5);
    tc.lengths = random_lengths(rng, uniform_int(rng, 1, 4), 0, 5);
    AttentionArgs a = random_args(tc, rng);
    expect_backward_matches_finite_differences(a, rng, describe(tc));
  }
}

TEST(AttentionRef, LengthOneExampleOutputsItsValue) {
  // A token alone sees only itself: its one softmax weight is exp(0)/exp(0) = 1, so o = v of its kv head, times
  // σ(gate) with a gate. Then dv = dout ⊙ σ(gate), dgate = dout ⊙ v ⊙ σ(1 − σ), and dq = dk = 0 because
  // dS = P (dP − P dP) = 0 for P = 1 (the score does not move the output).
  auto rng = test_rng();
  for (bool const with_gate : {false, true}) {
    AttentionArgs const a = random_args({"len1", {1, 1, 1, 1}, 6, 2, 5, 3, with_gate}, rng);
    Tensor const out = a.fwd();
    Tensor const dout = randn(out.shape(), rng);
    ref::AttentionGrads const grads = a.bwd(dout);
    Tensor want_out(out.shape()), want_dv(a.v.shape()), want_dgate(out.shape());
    for (Index t = 0; t < 4; ++t) {
      for (Index h = 0; h < 6; ++h) {
        for (Index i = 0; i < 3; ++i) {
          double const s = with_gate ? ref::sigmoid(a.gate({t, h, i})) : 1.0;
          want_out({t, h, i}) = a.v({t, h / 3, i}) * s;
          want_dv({t, h / 3, i}) += dout({t, h, i}) * s;
          want_dgate({t, h, i}) = dout({t, h, i}) * a.v({t, h / 3, i}) * s * (1 - s);
        }
      }
    }
    std::string const tag = with_gate ? " (gated)" : "";
    FUSEPACK_EXPECT_PASS(compare_allclose("o = v" + tag, out, want_out, {1e-15, 1e-15}));
    FUSEPACK_EXPECT_PASS(compare_allclose("dv = dout σ" + tag, grads.dv, want_dv, {1e-15, 1e-15}));
    FUSEPACK_EXPECT_PASS(compare_allclose("dq = 0" + tag, grads.dq, Tensor(a.q.shape()), kExact));
    FUSEPACK_EXPECT_PASS(compare_allclose("dk = 0" + tag, grads.dk, Tensor(a.k.shape()), kExact));
    if (with_gate) FUSEPACK_EXPECT_PASS(compare_allclose("dgate" + tag, grads.dgate, want_dgate, {1e-15, 1e-15}));
  }
}

TEST(AttentionRef, IdenticalKeysGiveTheSecondTokenTheMeanOfTheValues) {
  // Two tokens whose keys are equal have equal scores whatever the query: the second token weighs both values 1/2
  // and gets (v0 + v1) / 2; the first sees only itself and gets v0. Since Σ_j dS_j = 0 for any softmax, dq of the
  // second token is scale·k·Σ dS_j = 0.
  Tensor const q({2, 1, 3}, {0.3, -1.0, 2.0, 1.5, 0.5, -0.25});
  Tensor const k({2, 1, 3}, {1.0, 2.0, -1.0, 1.0, 2.0, -1.0});
  Tensor const v({2, 1, 2}, {4.0, -2.0, 1.0, 6.0});
  Tensor const out = ref::attention_fwd(q, k, v, {0, 2}, 0.7);
  EXPECT_NEAR(out({0, 0, 0}), 4.0, 1e-15);
  EXPECT_NEAR(out({0, 0, 1}), -2.0, 1e-15);
  EXPECT_NEAR(out({1, 0, 0}), 2.5, 1e-15);
  EXPECT_NEAR(out({1, 0, 1}), 2.0, 1e-15);
  Tensor const dout({2, 1, 2}, {1.0, 2.0, -3.0, 0.5});
  ref::AttentionGrads const grads = ref::attention_bwd(dout, q, k, v, {0, 2}, 0.7);
  for (Index a = 0; a < 3; ++a) EXPECT_NEAR(grads.dq({1, 0, a}), 0.0, 1e-15);
}

TEST(AttentionRef, MatchesHandComputedTwoTokenSoftmax) {
  // D = Dv = 1, scale 0.5, second token's query 1 against keys 0 and 2 ln 3: scores 0 and ln 3, so the weights are
  // 1/(1+3) and 3/(1+3) and o1 = v0/4 + 3 v1/4 = 2/4 + 3·10/4 = 8. With dout = (0, 1): dv = (1/4, 3/4) at the
  // second query plus (dout_0 = 0) at the first; dP = (v0, v1) = (2, 10), P·dP = 8, dS = (1/4·(2−8), 3/4·(10−8)) =
  // (−1.5, 1.5), dq1 = 0.5·(−1.5·0 + 1.5·2 ln 3) = 1.5 ln 3, dk0 = 0.5·(−1.5)·1 = −0.75, dk1 = 0.75.
  Tensor const q({2, 1, 1}, {5.0, 1.0});
  Tensor const k({2, 1, 1}, {0.0, 2.0 * std::log(3.0)});
  Tensor const v({2, 1, 1}, {2.0, 10.0});
  Tensor const out = ref::attention_fwd(q, k, v, {0, 2}, 0.5);
  EXPECT_NEAR(out({0, 0, 0}), 2.0, 1e-15);
  EXPECT_NEAR(out({1, 0, 0}), 8.0, 1e-14);
  ref::AttentionGrads const grads = ref::attention_bwd(Tensor({2, 1, 1}, {0.0, 1.0}), q, k, v, {0, 2}, 0.5);
  EXPECT_NEAR(grads.dv({0, 0, 0}), 0.25, 1e-15);
  EXPECT_NEAR(grads.dv({1, 0, 0}), 0.75, 1e-15);
  EXPECT_NEAR(grads.dq({0, 0, 0}), 0.0, 1e-15);
  EXPECT_NEAR(grads.dq({1, 0, 0}), 1.5 * std::log(3.0), 1e-14);
  EXPECT_NEAR(grads.dk({0, 0, 0}), -0.75, 1e-14);
  EXPECT_NEAR(grads.dk({1, 0, 0}), 0.75, 1e-14);
}

TEST(AttentionRef, ZeroGateHalvesTheOutput) {
  // σ(0) = 1/2: the gated output is exactly half the ungated one (a multiplication by 1/2 is exact), and
  // dgate = dout ⊙ o_ungated · σ(1 − σ) = dout ⊙ o_ungated / 4.
  auto rng = test_rng();
  AttentionArgs a = random_args({"gate0", {3, 2}, 4, 2, 5, 3, false}, rng);
  Tensor const ungated = a.fwd();
  a.gate = Tensor(ungated.shape());
  Tensor const gated = a.fwd();
  Tensor half = ungated;
  half.flat() *= 0.5;
  FUSEPACK_EXPECT_PASS(compare_allclose("o with gate 0 = o / 2", gated, half, kExact));
  Tensor const dout = randn(gated.shape(), rng);
  Tensor want_dgate(gated.shape());
  want_dgate.flat() = dout.flat().cwiseProduct(ungated.flat()) / 4;
  FUSEPACK_EXPECT_PASS(compare_allclose("dgate with gate 0", a.bwd(dout).dgate, want_dgate, {1e-15, 1e-15}));
}

TEST(AttentionRef, FutureTokensDoNotChangeEarlierOutputs) {
  // Causality: changing q, k, v, gate of the last token of an example leaves every earlier output bitwise unchanged.
  auto rng = test_rng();
  AttentionArgs const a = random_args({"causal", {5}, 4, 2, 3, 3, true}, rng);
  AttentionArgs changed = a;
  for (Tensor* x : {&changed.q, &changed.k, &changed.v, &changed.gate}) {
    Index const row = x->numel() / 5;
    x->flat().tail(row) = randn({row}, rng, 3.0).flat();
  }
  Tensor const out = a.fwd(), out_changed = changed.fwd();
  Index const first4 = out.numel() / 5 * 4;
  FUSEPACK_EXPECT_PASS(compare_allclose("o of tokens 0..3", out_changed.flat().data(), out.flat().data(), first4,
                                        kExact, packed_layout(out, a.cu_seqlens)));
}

TEST(AttentionRef, QueryHeadsOfAGroupReadTheSameKvHead) {
  // GQA: query head h reads kv head h / (Hq / Hkv), i.e. k and v repeated with repeat_interleave. The outputs, dq and
  // dgate equal those of the same call with k and v explicitly repeated to Hq heads (same arithmetic: same bits), and
  // dk, dv are the sums of the repeated heads' gradients (a reassociated sum: 1e-13).
  auto rng = test_rng();
  Index const Hkv = 2, group = 3, Hq = Hkv * group, D = 4, Dv = 3;
  AttentionArgs const a = random_args({"gqa", {3, 2}, Hq, Hkv, D, Dv, true}, rng);
  AttentionArgs repeated = a;
  Index const T = a.cu_seqlens.back();
  repeated.k = Tensor({T, Hq, D});
  repeated.v = Tensor({T, Hq, Dv});
  for (Index t = 0; t < T; ++t) {
    for (Index h = 0; h < Hq; ++h) {
      repeated.k.vec({t, h}) = a.k.vec({t, h / group});
      repeated.v.vec({t, h}) = a.v.vec({t, h / group});
    }
  }
  Tensor const out = a.fwd();
  FUSEPACK_EXPECT_PASS(compare_allclose("o (gqa vs repeated)", out, repeated.fwd(), kExact));

  Tensor const dout = randn(out.shape(), rng);
  ref::AttentionGrads const grads = a.bwd(dout), grads_repeated = repeated.bwd(dout);
  Tensor dk_summed({T, Hkv, D}), dv_summed({T, Hkv, Dv});
  for (Index t = 0; t < T; ++t) {
    for (Index h = 0; h < Hq; ++h) {
      dk_summed.vec({t, h / group}) += grads_repeated.dk.vec({t, h});
      dv_summed.vec({t, h / group}) += grads_repeated.dv.vec({t, h});
    }
  }
  FUSEPACK_EXPECT_PASS(compare_allclose("dq (gqa vs repeated)", grads.dq, grads_repeated.dq, kExact));
  FUSEPACK_EXPECT_PASS(compare_allclose("dgate (gqa vs repeated)", grads.dgate, grads_repeated.dgate, kExact));
  FUSEPACK_EXPECT_PASS(compare_allclose("dk (gqa vs repeated, summed)", grads.dk, dk_summed, {1e-13, 1e-13}));
  FUSEPACK_EXPECT_PASS(compare_allclose("dv (gqa vs repeated, summed)", grads.dv, dv_summed, {1e-13, 1e-13}));
}

TEST(AttentionRef, PackedEqualsExamplesStitched) {
  // Each example computed alone (cu_seqlens {0, L}) and concatenated equals the packed call, bit for bit, for the
  // output and every gradient: no token sees another example, and dk, dv of an example collect only its own queries.
  auto rng = test_rng();
  for (bool const with_gate : {false, true}) {
    AttentionCase const tc{"stitched", {3, 0, 1, 5, 2}, 6, 2, 5, 3, with_gate};
    std::string const tag = describe(tc);
    AttentionArgs const packed = random_args(tc, rng);
    Tensor const out = packed.fwd();
    Tensor const dout = randn(out.shape(), rng);
    ref::AttentionGrads const grads = packed.bwd(dout);

    Tensor stitched(out.shape());
    ref::AttentionGrads stitched_grads{Tensor(grads.dq.shape()), Tensor(grads.dk.shape()), Tensor(grads.dv.shape()),
                                       with_gate ? Tensor(grads.dgate.shape()) : Tensor()};
    auto const& cu = packed.cu_seqlens;
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      Index const bos = cu[n], eos = cu[n + 1];
      AttentionArgs alone = packed;
      alone.cu_seqlens = {0, static_cast<std::int32_t>(eos - bos)};
      for (Tensor* x : {&alone.q, &alone.k, &alone.v}) *x = x->rows(bos, eos);
      if (with_gate) alone.gate = packed.gate.rows(bos, eos);
      ref::AttentionGrads const g = alone.bwd(dout.rows(bos, eos));
      stitched.set_rows(bos, alone.fwd());
      stitched_grads.dq.set_rows(bos, g.dq);
      stitched_grads.dk.set_rows(bos, g.dk);
      stitched_grads.dv.set_rows(bos, g.dv);
      if (with_gate) stitched_grads.dgate.set_rows(bos, g.dgate);
    }
    auto check = [&](std::string const& name, Tensor const& got, Tensor const& want) {
      FUSEPACK_EXPECT_PASS(
          compare_allclose(name + " stitched vs packed " + tag, got, want, kExact, packed_layout(want, cu)));
    };
    check("o", stitched, out);
    check("dq", stitched_grads.dq, grads.dq);
    check("dk", stitched_grads.dk, grads.dk);
    check("dv", stitched_grads.dv, grads.dv);
    if (with_gate) check("dgate", stitched_grads.dgate, grads.dgate);
  }
}

TEST(AttentionRef, EmptyBatchGivesEmptyOutputsOfTheRightShape) {
  // T = 0 (cu_seqlens {0, 0}) is legal: every result has 0 tokens and the heads and widths of its input.
  Tensor const q({0, 4, 5}), k({0, 2, 5}), v({0, 2, 3}), gate({0, 4, 3});
  EXPECT_EQ(ref::attention_fwd(q, k, v, {0, 0}, 0.5, gate).shape(), (Shape{0, 4, 3}));
  ref::AttentionGrads const grads = ref::attention_bwd(Tensor({0, 4, 3}), q, k, v, {0, 0}, 0.5, gate);
  EXPECT_EQ(grads.dq.shape(), q.shape());
  EXPECT_EQ(grads.dk.shape(), k.shape());
  EXPECT_EQ(grads.dv.shape(), v.shape());
  EXPECT_EQ(grads.dgate.shape(), gate.shape());
}

TEST(AttentionRef, RejectsBadArguments) {
  // A valid call: two examples of 2 and 1 tokens, Hq = 4, Hkv = 2, D = 4, Dv = 3.
  std::vector<std::int32_t> const cu{0, 2, 3};
  Tensor const q({3, 4, 4}), k({3, 2, 4}), v({3, 2, 3}), gate({3, 4, 3}), dout({3, 4, 3});
  EXPECT_NO_THROW(ref::attention_fwd(q, k, v, cu, 0.5, gate));
  EXPECT_NO_THROW(ref::attention_bwd(dout, q, k, v, cu, 0.5, gate));

  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(Tensor({3, 3, 4}), k, v, cu, 0.5),
                                   "query heads Hq=3 (q dimension 1) must be a positive multiple of the key/value "
                                   "heads Hkv=2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(Tensor({3, 1, 4}), k, v, cu, 0.5),
                                   "query heads Hq=1 (q dimension 1) must be a positive multiple");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(Tensor({3, 0, 4}), Tensor({3, 0, 4}), Tensor({3, 0, 3}), cu, 0.5),
                                   "key/value heads Hkv=0 (k dimension 1), which must be >= 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, Tensor({4, 2, 4}), v, cu, 0.5),
                                   "k has shape [4, 2, 4]; expected 3 in dimension 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, Tensor({2, 2, 3}), cu, 0.5),
                                   "v has shape [2, 2, 3]; expected 3 in dimension 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, Tensor({3, 2, 5}), v, cu, 0.5),
                                   "k has shape [3, 2, 5]; expected 4 in dimension 2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, Tensor({3, 1, 3}), cu, 0.5),
                                   "v has shape [3, 1, 3]; expected 2 in dimension 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(Tensor({3, 16}), k, v, cu, 0.5), "q must have 3 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(Tensor(), k, v, cu, 0.5), "q is required");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, Tensor(), v, cu, 0.5), "k is required");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, Tensor({3, 2}), cu, 0.5), "v must have 3 dimensions");

  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, cu, 0.5, Tensor({3, 4, 4})),
                                   "gate has shape [3, 4, 4]; expected 3 in dimension 2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, cu, 0.5, Tensor({3, 2, 3})),
                                   "gate has shape [3, 2, 3]; expected 4 in dimension 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, cu, 0.5, Tensor({2, 4, 3})),
                                   "gate has shape [2, 4, 3]; expected 3 in dimension 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, cu, 0.5, Tensor({3, 12})),
                                   "gate must have 3 dimensions");

  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, {0}, 0.5), "cu_seqlens needs at least 2 entries");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, {1, 3}, 0.5), "cu_seqlens must start at 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, {0, 2, 1, 3}, 0.5),
                                   "cu_seqlens must be non-decreasing; got cu_seqlens[1]=2 > cu_seqlens[2]=1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, {0, 2}, 0.5),
                                   "cu_seqlens must end at the number of tokens T=3; got cu_seqlens[1]=2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, {0, 2, 4}, 0.5),
                                   "cu_seqlens must end at the number of tokens T=3; got cu_seqlens[2]=4");

  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, cu, 0.0), "scale must be > 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, cu, -0.5), "scale must be > 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_fwd(q, k, v, cu, std::numeric_limits<double>::quiet_NaN()),
                                   "scale must be > 0");

  // The backward checks the same arguments, under its own name, and dout.
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_bwd(Tensor({3, 4, 4}), q, k, v, cu, 0.5, gate),
                                   "attention_bwd: dout has shape [3, 4, 4]; expected 3 in dimension 2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_bwd(Tensor(), q, k, v, cu, 0.5), "dout is required");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_bwd(dout, q, k, v, cu, 0.5, Tensor({3, 4, 2})),
                                   "attention_bwd: gate has shape [3, 4, 2]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_bwd(dout, Tensor({3, 3, 4}), k, v, cu, 0.5),
                                   "attention_bwd: the query heads Hq=3");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_bwd(dout, q, k, v, {0, 3, 2}, 0.5),
                                   "attention_bwd: cu_seqlens must be non-decreasing");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::attention_bwd(dout, q, k, v, cu, -1.0), "attention_bwd: scale must be > 0");
}

}  // namespace
}  // namespace fusepack::test
