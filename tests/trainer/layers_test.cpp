// The three Qwen3.5 blocks of trainer/model/layers.h (gated_attention, gated_deltanet, mlp), run in fp64 on the CPU
// with the composite backend, against this file's own composition of the fp64 reference ops (reference/: rmsnorm,
// rope, attention, conv1d, gated_delta, gated_rmsnorm, swiglu; the projections are Eigen products here). Every weight
// is random, q_norm != k_norm and A_log, dt_bias and the gated norm too, so a wiring mix-up that init's symmetric
// values hide (both q/k norms zero, i.e. gain 1) changes the output. Checked: a fixed pack of 3 examples per block,
// random packs (1..5 examples of 0..12 tokens, empty ones included) with random weights, and the planted bugs this
// comparison must catch: q_norm/k_norm swapped, q_proj's per-head [query | gate] halves swapped, A_log/dt_bias
// swapped, the z and v rows of the DeltaNet input projections swapped, the MLP's gate/up swapped.
#include "trainer/model/config.h"
#include "trainer/model/layers.h"

#include "reference/attention.h"
#include "reference/conv1d.h"
#include "reference/gated_delta.h"
#include "reference/gated_rmsnorm.h"
#include "reference/math.h"
#include "reference/rmsnorm.h"
#include "reference/rope.h"
#include "reference/swiglu.h"
#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/torch_bridge.h"
#include "verify/random.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using model::AttentionWeights;
using model::GatedDeltaNetWeights;
using model::MlpWeights;
using model::Qwen35Config;
using ops::Backend;
using ref::Index;

// One intra-op thread: the tiny blocks gain nothing from threads (as in model_test.cpp).
class OneIntraOpThread : public ::testing::Environment {
 public:
  void SetUp() override { at::set_num_threads(1); }
};
::testing::Environment* const kOneIntraOpThread = ::testing::AddGlobalTestEnvironment(new OneIntraOpThread);

// Both sides are fp64 and compute the same formulas in different orders (ATen's GEMMs vs Eigen's, the composite's
// chunked delta rule vs the reference's per-token recurrence, softmax by ATen vs by hand), over at most a few hundred
// terms per sum: their differences are ~1e-15 of the output's magnitude (measured: at most 7e-15 of max|ref|, 0.7% of
// this budget, over 12 seeds at the full level). 1e-12 of max|ref| leaves over a hundredfold margin; a wiring mistake
// errs by a sizeable fraction of the output (the planted bugs below: about 1e-2 of max|ref| and more).
constexpr double kRelTol = 1e-12;

at::Tensor torch64(ref::Tensor const& t) { return to_torch(t, at::kDouble, at::Device(at::kCPU)); }

// The same row-major values under another shape.
ref::Tensor reshaped(ref::Tensor const& t, ref::Shape shape) {
  return ref::Tensor(std::move(shape), std::vector<double>(t.data(), t.data() + t.numel()));
}

// nn.Linear without bias: y[t, o] = Σ_i w[o, i] · x[t, i]; x: [T, in], w: [out, in].
ref::Tensor linear(ref::Tensor const& x, ref::Tensor const& w) {
  Index const T = x.size(0), in = x.size(1), out = w.size(0);
  ref::Tensor y({T, out});
  Eigen::Map<ref::RowMatrix const> const xm(x.data(), T, in), wm(w.data(), out, in);
  Eigen::Map<ref::RowMatrix>(y.data(), T, out).noalias() = xm * wm.transpose();
  return y;
}

// A pack of examples: cu_seqlens and position_ids for both sides, and the input x [T, H].
struct Pack {
  std::vector<int> lengths;
  std::vector<std::int32_t> cu;
  std::vector<std::int64_t> pos;  // restarting at 0 per example
  model::SequenceLayout seq;
  ref::Tensor x;
};

Pack make_pack(std::vector<int> const& lengths, Index H, std::mt19937_64& rng) {
  Pack p;
  p.lengths = lengths;
  p.cu = cu_seqlens_from_lengths(lengths);
  for (int len : lengths) {
    for (int i = 0; i < len; ++i) p.pos.push_back(i);
  }
  p.seq.cu_seqlens = at::tensor(p.cu, at::TensorOptions().dtype(at::kInt));
  p.seq.position_ids = at::tensor(p.pos, at::TensorOptions().dtype(at::kLong));
  p.seq.max_seqlen = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  p.x = randn({p.cu.back(), H}, rng);
  return p;
}

std::string lengths_str(std::vector<int> const& lengths) {
  std::string s = "{";
  for (size_t i = 0; i < lengths.size(); ++i) s += (i ? ", " : "") + std::to_string(lengths[i]);
  return s + "}";
}

at::Tensor draw(ref::Shape shape, std::mt19937_64& rng, double lo, double hi) {
  return torch64(uniform(std::move(shape), rng, lo, hi));
}
// [out, in] with variance 1/in, so unit-variance inputs give outputs of order 1.
at::Tensor draw_matrix(Index out, Index in, std::mt19937_64& rng) {
  double const r = std::sqrt(3.0 / static_cast<double>(in));
  return draw({out, in}, rng, -r, r);
}

AttentionWeights draw_attention(Qwen35Config const& c, std::mt19937_64& rng) {
  Index const H = c.hidden_size, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  AttentionWeights w;
  w.q_proj = draw_matrix(Hq * 2 * D, H, rng);
  w.k_proj = draw_matrix(Hkv * D, H, rng);
  w.v_proj = draw_matrix(Hkv * D, H, rng);
  w.o_proj = draw_matrix(H, Hq * D, rng);
  w.q_norm = draw({D}, rng, -0.5, 0.5);  // gains 1 + w in [0.5, 1.5], different per channel and between q and k
  w.k_norm = draw({D}, rng, -0.5, 0.5);
  return w;
}

GatedDeltaNetWeights draw_deltanet(Qwen35Config const& c, std::mt19937_64& rng) {
  Index const H = c.hidden_size, Hv = c.linear_num_value_heads, Kd = c.linear_num_key_heads * c.linear_key_head_dim;
  Index const Vd = Hv * c.linear_value_head_dim;
  GatedDeltaNetWeights w;
  w.in_proj_qkv = draw_matrix(2 * Kd + Vd, H, rng);
  w.in_proj_z = draw_matrix(Vd, H, rng);
  w.in_proj_b = draw_matrix(Hv, H, rng);
  w.in_proj_a = draw_matrix(Hv, H, rng);
  w.conv1d = draw({2 * Kd + Vd, 1, c.linear_conv_kernel_dim}, rng, -0.7, 0.7);
  w.dt_bias = draw({Hv}, rng, -1.0, 1.0);
  w.A_log = draw({Hv}, rng, -1.0, 1.0);
  w.norm = draw({c.linear_value_head_dim}, rng, 0.5, 1.5);
  w.out_proj = draw_matrix(H, Vd, rng);
  return w;
}

MlpWeights draw_mlp(Qwen35Config const& c, std::mt19937_64& rng) {
  Index const H = c.hidden_size, I = c.intermediate_size;
  return {draw_matrix(I, H, rng), draw_matrix(I, H, rng), draw_matrix(H, I, rng)};
}

// ---------------------------------------------------------------------------------------------------------------
// The reference compositions: each block as transformers' Qwen3.5 modeling code computes it, from reference ops.

ref::Tensor attention_ref(Pack const& p, AttentionWeights const& w, Qwen35Config const& c) {
  Index const T = p.x.size(0), Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  ref::Tensor const qg = linear(p.x, to_ref(w.q_proj));  // [T, Hq·2D], per head [query (D) | gate (D)]
  ref::Tensor q({T, Hq, D}), gate({T, Hq, D});
  for (Index t = 0; t < T; ++t) {
    for (Index h = 0; h < Hq; ++h) {
      for (Index d = 0; d < D; ++d) {
        q({t, h, d}) = qg({t, h * 2 * D + d});
        gate({t, h, d}) = qg({t, h * 2 * D + D + d});
      }
    }
  }
  ref::Tensor k = reshaped(linear(p.x, to_ref(w.k_proj)), {T, Hkv, D});
  ref::Tensor const v = reshaped(linear(p.x, to_ref(w.v_proj)), {T, Hkv, D});
  Index const rotary_dim = static_cast<Index>(static_cast<double>(D) * c.partial_rotary_factor);  // HF: int()
  q = ref::rope_fwd(ref::rmsnorm_fwd(q, to_ref(w.q_norm), c.rms_norm_eps), p.pos, rotary_dim, c.rope_theta);
  k = ref::rope_fwd(ref::rmsnorm_fwd(k, to_ref(w.k_norm), c.rms_norm_eps), p.pos, rotary_dim, c.rope_theta);
  ref::Tensor const o = ref::attention_fwd(q, k, v, p.cu, 1.0 / std::sqrt(static_cast<double>(D)), gate);
  return linear(reshaped(o, {T, Hq * D}), to_ref(w.o_proj));
}

ref::Tensor deltanet_ref(Pack const& p, GatedDeltaNetWeights const& w, Qwen35Config const& c) {
  Index const T = p.x.size(0), Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  Index const dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, Kd = Hk * dk, Vd = Hv * dv;
  Index const C = 2 * Kd + Vd;
  ref::Tensor const conv = ref::conv1d_fwd(linear(p.x, to_ref(w.in_proj_qkv)),
                                           reshaped(to_ref(w.conv1d), {C, c.linear_conv_kernel_dim}), p.cu, true);
  ref::Tensor q({T, Hk, dk}), k({T, Hk, dk}), v({T, Hv, dv});  // channels [q | k | v], head-major within each
  for (Index t = 0; t < T; ++t) {
    for (Index i = 0; i < Kd; ++i) q.data()[t * Kd + i] = conv({t, i});
    for (Index i = 0; i < Kd; ++i) k.data()[t * Kd + i] = conv({t, Kd + i});
    for (Index i = 0; i < Vd; ++i) v.data()[t * Vd + i] = conv({t, 2 * Kd + i});
  }
  ref::Tensor const a = linear(p.x, to_ref(w.in_proj_a)), b = linear(p.x, to_ref(w.in_proj_b));
  ref::Tensor const A_log = to_ref(w.A_log), dt_bias = to_ref(w.dt_bias);
  ref::Tensor g({T, Hv}), beta({T, Hv});
  for (Index t = 0; t < T; ++t) {
    for (Index j = 0; j < Hv; ++j) {
      g({t, j}) = -std::exp(A_log({j})) * ref::softplus(a({t, j}) + dt_bias({j}));
      beta({t, j}) = ref::sigmoid(b({t, j}));
    }
  }
  double const scale = 1.0 / std::sqrt(static_cast<double>(dk));
  ref::Tensor const o = ref::gated_delta_fwd(q, k, v, g, beta, p.cu, scale, /*use_qk_l2norm=*/true).o;
  ref::Tensor const z = reshaped(linear(p.x, to_ref(w.in_proj_z)), {T, Hv, dv});
  ref::Tensor const y = ref::gated_rmsnorm_fwd(o, z, to_ref(w.norm), c.rms_norm_eps);
  return linear(reshaped(y, {T, Vd}), to_ref(w.out_proj));
}

ref::Tensor mlp_ref(Pack const& p, MlpWeights const& w) {
  return linear(ref::swiglu_fwd(linear(p.x, to_ref(w.gate_proj)), linear(p.x, to_ref(w.up_proj))),
                to_ref(w.down_proj));
}

// ---------------------------------------------------------------------------------------------------------------
// The comparisons: the block (composite, fp64) against the reference composition, to kRelTol of max|ref|.

ErrorReport compare(std::string const& name, at::Tensor const& got, ref::Tensor const& want, Pack const& p) {
  double const m = want.numel() ? want.flat().cwiseAbs().maxCoeff() : 0.0;
  return compare_allclose(name + " " + lengths_str(p.lengths), to_ref(got), want, Tolerance{kRelTol * m, 0},
                          packed_layout(want, p.cu));
}

ErrorReport check_attention(Pack const& p, AttentionWeights const& given, AttentionWeights const& w,
                            Qwen35Config const& c) {
  at::Tensor const got = model::gated_attention(torch64(p.x), given, c, p.seq, Backend::kComposite);
  return compare("gated_attention", got, attention_ref(p, w, c), p);
}
ErrorReport check_deltanet(Pack const& p, GatedDeltaNetWeights const& given, GatedDeltaNetWeights const& w,
                           Qwen35Config const& c) {
  at::Tensor const got = model::gated_deltanet(torch64(p.x), given, c, p.seq, Backend::kComposite);
  return compare("gated_deltanet", got, deltanet_ref(p, w, c), p);
}
ErrorReport check_mlp(Pack const& p, MlpWeights const& given, MlpWeights const& w) {
  return compare("mlp", model::mlp(torch64(p.x), given, Backend::kComposite), mlp_ref(p, w), p);
}

Qwen35Config tiny() { return model::preset("qwen35-tiny"); }
std::vector<int> const kFixedLengths{5, 1, 9};

// A planted bug must fail the comparison, and by far: more than 1e6 times the tolerance (error > 1e-6 of max|ref|).
void expect_caught(std::string const& bug, ErrorReport const& r) {
  std::printf("[ planted  ] %s: max error %.3e (%.3g x the tolerance) | %s\n", bug.c_str(), r.max_abs,
              r.budget_used, r.str().c_str());
  EXPECT_FALSE(r.passed()) << "the reference composition missed the planted bug: " << bug;
  EXPECT_GT(r.budget_used, 1e6) << bug << ": caught, but not far above the tolerance";
}

// Each block (attention, Gated DeltaNet, MLP) with fresh random weights on pack `p`, against the composition.
void expect_every_block_matches(Pack const& p, Qwen35Config const& c, std::mt19937_64& rng) {
  AttentionWeights const wa = draw_attention(c, rng);
  GatedDeltaNetWeights const wd = draw_deltanet(c, rng);
  MlpWeights const wm = draw_mlp(c, rng);
  FUSEPACK_EXPECT_PASS(check_attention(p, wa, wa, c));
  FUSEPACK_EXPECT_PASS(check_deltanet(p, wd, wd, c));
  FUSEPACK_EXPECT_PASS(check_mlp(p, wm, wm));
}

TEST(Qwen35Layers, FixedPackMatchesTheReferenceComposition) {
  auto rng = test_rng();
  Qwen35Config const c = tiny();
  expect_every_block_matches(make_pack(kFixedLengths, c.hidden_size, rng), c, rng);
}

// Random packs: 1..5 examples of 0..12 tokens, fresh weights and input every case. Empty examples (and an empty pack)
// are valid input to the layers and to every reference op (cu_seqlens need only be non-decreasing); a length drawn
// from 0..12 is rarely 0, so every third case empties one example on purpose, and the first case is all empty.
TEST(Qwen35Layers, RandomPacksMatchTheReferenceComposition) {
  auto rng = test_rng();
  Qwen35Config const c = tiny();
  int const n = cases(8, 100);
  int empty_examples = 0;
  for (int i = 0; i < n; ++i) {
    int const count = uniform_int(rng, 1, 5);
    std::vector<int> lengths = random_lengths(rng, count, 0, i == 0 ? 0 : 12);
    if (i % 3 == 1) lengths[uniform_int(rng, 0, count - 1)] = 0;
    empty_examples += static_cast<int>(std::count(lengths.begin(), lengths.end(), 0));
    SCOPED_TRACE("case " + std::to_string(i) + ", lengths " + lengths_str(lengths));
    expect_every_block_matches(make_pack(lengths, c.hidden_size, rng), c, rng);
  }
  std::printf("[ measured ] %d random packs, %d empty examples among them\n", n, empty_examples);
}

// ---------------------------------------------------------------------------------------------------------------
// Planted bugs: the block gets mixed-up weights, the reference the right ones; the comparison must fail.

// The fixed pack through block `check` given the weights drawn by `draw` after `plant` mixed them up, against the
// reference with the right ones: must fail.
template <typename Weights, typename Draw, typename Check, typename Plant>
void expect_planted_caught(std::string const& bug, Draw draw, Check check, Plant plant) {
  auto rng = test_rng();
  Qwen35Config const c = tiny();
  Pack const p = make_pack(kFixedLengths, c.hidden_size, rng);
  Weights const w = draw(c, rng);
  Weights planted = w;
  plant(planted, c);
  expect_caught(bug, check(p, planted, w, c));
}

TEST(Qwen35Layers, PlantedQNormKNormSwapIsCaught) {
  expect_planted_caught<AttentionWeights>(
      "q_norm and k_norm swapped", draw_attention, check_attention,
      [](AttentionWeights& w, Qwen35Config const&) { std::swap(w.q_norm, w.k_norm); });
}

TEST(Qwen35Layers, PlantedQueryGateHalvesSwapIsCaught) {
  // q_proj rows per head [gate | query] instead of [query | gate]
  expect_planted_caught<AttentionWeights>(
      "q_proj's query and gate halves swapped", draw_attention, check_attention,
      [](AttentionWeights& w, Qwen35Config const& c) {
        Index const Hq = c.num_attention_heads, D = c.head_dim;
        w.q_proj = w.q_proj.view({Hq, 2, D, c.hidden_size}).flip({1}).reshape({Hq * 2 * D, c.hidden_size});
      });
}

TEST(Qwen35Layers, PlantedALogDtBiasSwapIsCaught) {
  expect_planted_caught<GatedDeltaNetWeights>(
      "A_log and dt_bias swapped", draw_deltanet, check_deltanet,
      [](GatedDeltaNetWeights& w, Qwen35Config const&) { std::swap(w.A_log, w.dt_bias); });
}

TEST(Qwen35Layers, PlantedZAndVRowsSwapIsCaught) {
  // the gate z read from in_proj_qkv's v rows, and v from in_proj_z
  expect_planted_caught<GatedDeltaNetWeights>(
      "z and v rows swapped", draw_deltanet, check_deltanet, [](GatedDeltaNetWeights& w, Qwen35Config const& c) {
        Index const Kd2 = 2 * c.linear_num_key_heads * c.linear_key_head_dim;
        Index const Vd = c.linear_num_value_heads * c.linear_value_head_dim;
        at::Tensor const qkv = w.in_proj_qkv;
        w.in_proj_qkv = at::cat({qkv.narrow(0, 0, Kd2), w.in_proj_z}, 0);
        w.in_proj_z = qkv.narrow(0, Kd2, Vd).contiguous();
      });
}

TEST(Qwen35Layers, PlantedMlpGateUpSwapIsCaught) {
  expect_planted_caught<MlpWeights>(
      "gate_proj and up_proj swapped", draw_mlp,
      [](Pack const& p, MlpWeights const& given, MlpWeights const& w, Qwen35Config const&) {
        return check_mlp(p, given, w);
      },
      [](MlpWeights& w, Qwen35Config const&) { std::swap(w.gate_proj, w.up_proj); });
}

// Σ_i <parts[i], weights[i]> (fp64), leaving out part 1 unless `use_middle`: its gradient then never arrives.
at::Tensor weighted_sum(std::vector<at::Tensor> const& parts, std::vector<at::Tensor> const& weights, bool use_middle) {
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i != 1 || use_middle) loss = loss + (parts[i] * weights[i]).sum();
  }
  return loss;
}

// split_columns against narrow + contiguous under autograd: equal parts and equal input gradients (fp64), with every
// part used, and with the middle part unused (its gradient missing: zeros). A backward that put the parts' gradients
// in another order, or left a missing one out, differs from narrow's in its columns.
TEST(SplitColumns, GivesNarrowsPartsAndGradient) {
  auto rng = test_rng();
  at::Tensor const x0 = to_torch(randn({5, 9}, rng), at::kDouble, at::kCPU);
  std::vector<std::int64_t> const widths = {2, 4, 3};
  for (bool use_middle : {true, false}) {
    std::vector<at::Tensor> weights;
    for (std::int64_t w : widths) weights.push_back(to_torch(randn({5, w}, rng), at::kDouble, at::kCPU));
    auto loss_of = [&](std::vector<at::Tensor> const& parts) { return weighted_sum(parts, weights, use_middle); };
    at::Tensor x = x0.clone().requires_grad_(), y = x0.clone().requires_grad_();
    std::vector<at::Tensor> const split = model::split_columns(x, widths);
    std::vector<at::Tensor> narrowed;
    std::int64_t start = 0;
    for (std::int64_t w : widths) {
      narrowed.push_back(y.narrow(1, start, w).contiguous());
      start += w;
    }
    ASSERT_EQ(split.size(), narrowed.size());
    for (std::size_t i = 0; i < split.size(); ++i) {
      EXPECT_TRUE(split[i].is_contiguous());
      EXPECT_TRUE(at::equal(split[i], narrowed[i])) << "part " << i;
    }
    loss_of(split).backward();
    loss_of(narrowed).backward();
    EXPECT_TRUE(at::equal(x.grad(), y.grad())) << "middle part used: " << use_middle << "\n" << x.grad() << "\n"
                                               << y.grad();
  }
  expect_torch_error([&] { model::split_columns(x0, {2, 4}); }, "the widths sum to 6 but x has 9 columns");
  expect_torch_error([&] { model::split_columns(x0.view({45}), {45}); }, "must be 2-D");
}

// shared_input_linear against separate at::linear calls under autograd (fp64): the same outputs and weight gradients
// to the bit (the same products), and the same input gradient up to the order of the sum (its products accumulated by
// the GEMMs instead of added after: 1e-14 relative covers an fp64 reordering of three terms of O(10), a dropped or
// doubled product moves it by O(1)), with every output used and with one unused (its gradient missing: no term).
TEST(SharedInputLinear, GivesSeparateLinearsOutputsAndGradients) {
  auto rng = test_rng();
  at::Tensor const x0 = to_torch(randn({7, 6}, rng), at::kDouble, at::kCPU);
  std::vector<at::Tensor> w0;
  for (std::int64_t rows : {5, 3, 4}) w0.push_back(to_torch(randn({rows, 6}, rng), at::kDouble, at::kCPU));
  for (bool use_middle : {true, false}) {
    std::vector<at::Tensor> dy;
    for (at::Tensor const& w : w0) dy.push_back(to_torch(randn({7, w.size(0)}, rng), at::kDouble, at::kCPU));
    auto loss_of = [&](std::vector<at::Tensor> const& outs) { return weighted_sum(outs, dy, use_middle); };
    at::Tensor x = x0.clone().requires_grad_(), y = x0.clone().requires_grad_();
    std::vector<at::Tensor> wx, wy;
    for (at::Tensor const& w : w0) {
      wx.push_back(w.clone().requires_grad_());
      wy.push_back(w.clone().requires_grad_());
    }
    std::vector<at::Tensor> const shared = model::shared_input_linear(x, wx);
    std::vector<at::Tensor> separate;
    for (at::Tensor const& w : wy) separate.push_back(at::linear(y, w));
    ASSERT_EQ(shared.size(), separate.size());
    for (std::size_t i = 0; i < shared.size(); ++i) EXPECT_TRUE(at::equal(shared[i], separate[i])) << "output " << i;
    loss_of(shared).backward();
    loss_of(separate).backward();
    EXPECT_TRUE(at::allclose(x.grad(), y.grad(), 1e-14, 0)) << "middle used: " << use_middle << "\n"
                                                             << x.grad() - y.grad();
    for (std::size_t i = 0; i < wx.size(); ++i) {
      if (i == 1 && !use_middle) {
        EXPECT_FALSE(wx[i].grad().defined()) << "an unused output gives its weight no gradient";
        continue;
      }
      EXPECT_TRUE(at::equal(wx[i].grad(), wy[i].grad())) << "weight " << i << ", middle used: " << use_middle;
    }
  }
  expect_torch_error([&] { model::shared_input_linear(x0, {w0[0], at::ones({2, 5}, at::kDouble)}); },
                     "weight 1 must be [O, 6] in Double on cpu; got shape [2, 5]");
  expect_torch_error([&] { model::shared_input_linear(x0.view({42}), w0); }, "x must be 2-D");
}

}  // namespace
}  // namespace fusepack::test
