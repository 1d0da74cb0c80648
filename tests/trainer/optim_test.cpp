// trainer/optim, on the CPU in fp64 unless said: AdamW against hand-derived values and an independent scalar loop of
// the torch formula (weight decay, bias correction, state, checkpoint resume), its kernels (fusepack's one-pass
// CUDA kernel with its compute copies, ATen's fused one, the foreach operations; fp32, fp64; CPU, and CUDA in
// *Cuda*) against that loop within a bound derived from counting roundings, the decay rule on
// Qwen3.5 names, the cosine schedule at its key steps, clipping by global norm (below, at and above max_norm, over
// ranks, mixed dtypes, non-finite), and step-level loss normalisation (sum / total, gradients equal to the full
// batch's, the per-micro-batch mean caught).
#include "trainer/optim/adamw.h"
#include "trainer/optim/grad_clip.h"
#include "trainer/optim/loss_normalization.h"
#include "trainer/optim/schedule.h"

#include "tests/support/env.h"
#include "tests/support/torch_bridge.h"

#include <c10/core/GradMode.h>

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using optim::AdamW;
using optim::AdamWOptions;
using optim::AdamWState;
using optim::CosineSchedule;
using optim::NamedParameter;
using optim::StepLossNormalizer;
using optim::TokenLossSum;

at::TensorOptions const kF64 = at::TensorOptions().dtype(at::kDouble);

at::Tensor randn(std::vector<int64_t> const& shape, std::mt19937_64& rng, double stddev = 1.0) {
  std::normal_distribution<double> normal(0.0, stddev);
  at::Tensor t = at::empty(shape, kF64);
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = normal(rng);
  return t;
}

std::vector<double> values(at::Tensor const& t) {  // any device and dtype: fp64 on the host
  at::Tensor const c = t.detach().to(at::kCPU, at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

double max_abs_diff(at::Tensor const& a, at::Tensor const& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

NamedParameter named(std::string name, at::Tensor value) { return {std::move(name), std::move(value)}; }

void set_grad(NamedParameter const& p, at::Tensor const& g) { p.param.mutable_grad() = g.clone(); }

// ------------------------------------------------------------------------------------------------------------------
// AdamW

TEST(AdamW, FirstStepMatchesHandDerivedValues) {
  // At t = 1: m = (1-β1)·g, v = (1-β2)·g², so m̂ = g, v̂ = g² and the update is lr·g / (|g| + eps), after the
  // decoupled decay p·(1 − lr·wd). With lr = 0.1, wd = 0.01, eps = 1e-8:
  //   p = 1,  g = 0.5:    0.999 − 0.1·0.5/(0.5 + 1e-8)   = 0.999 − 0.1/(1 + 2e-8)  = 0.89900000199999996000...
  //   p = −2, g = −0.25: −1.998 + 0.1·0.25/(0.25 + 1e-8) = −1.998 + 0.1/(1 + 4e-8) = −1.89800000399999984000...
  NamedParameter const w = named("model.layers.0.mlp.up_proj.weight", at::tensor({1.0, -2.0}, kF64));
  set_grad(w, at::tensor({0.5, -0.25}, kF64));
  AdamWOptions options;
  options.weight_decay = 0.01;
  AdamW opt({w}, options);
  opt.step(0.1);
  std::vector<double> const p = values(w.param);
  // fp64 rounds at 1.1e-16 relative; the handful of operations leaves the result within a few ulps of 1: 1e-15.
  EXPECT_NEAR(p[0], 0.89900000199999996, 1e-15);
  EXPECT_NEAR(p[1], -1.89800000399999984, 1e-15);
  AdamWState const& s = opt.state(w.name);
  EXPECT_EQ(s.step, 1);
  // (1 − 0.9)·0.5 and (1 − 0.999)·0.0625; 1 − β in double is off by up to 1e-16 relative: a few ulps of each.
  EXPECT_NEAR(values(s.exp_avg)[0], 0.05, 1e-16);
  EXPECT_NEAR(values(s.exp_avg_sq)[1], 6.25e-5, 1e-18);
}

// The textbook AdamW loop (torch's documented algorithm), one scalar at a time, written independently of the code
// under test: m̂ and v̂ are formed explicitly (the implementation folds the corrections into the step size and the
// denominator). `bias_correction` and `decoupled` switch off what the test must be able to see missing.
struct ScalarAdamW {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  bool bias_correction = true;
  bool decoupled = true;  // false: the L2 penalty folded into the gradient (Adam with weight_decay), a planted bug
  int step_offset = 0;    // the bias corrections use t + step_offset: 1 counts the increment twice, a planted bug

  void step(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v, std::vector<double> const& g,
            int t, double lr, bool decay) const {
    for (std::size_t i = 0; i < p.size(); ++i) {
      double grad = g[i];
      if (decay && !decoupled) grad += weight_decay * p[i];
      if (decay && decoupled) p[i] = p[i] - lr * weight_decay * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * grad;
      v[i] = beta2 * v[i] + (1 - beta2) * grad * grad;
      double const m_hat = bias_correction ? m[i] / (1 - std::pow(beta1, t + step_offset)) : m[i];
      double const v_hat = bias_correction ? v[i] / (1 - std::pow(beta2, t + step_offset)) : v[i];
      p[i] = p[i] - lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

struct ScalarParam {
  std::vector<double> p, m, v;
};

TEST(AdamW, MatchesScalarReferenceOverTenStepsWithDecayAndBiasCorrection) {
  auto rng = test_rng();
  // Decayed matrices and the four kinds of undecayed 1-D parameters of a Qwen3.5 layer.
  std::vector<NamedParameter> params = {
      named("model.language_model.layers.0.linear_attn.in_proj_qkv.weight", randn({6, 4}, rng)),
      named("model.language_model.layers.0.linear_attn.conv1d.weight", randn({6, 1, 4}, rng)),
      named("model.language_model.layers.0.linear_attn.A_log", randn({3}, rng)),
      named("model.language_model.layers.0.linear_attn.dt_bias", randn({3}, rng)),
      named("model.language_model.layers.0.input_layernorm.weight", randn({4}, rng)),
  };
  std::vector<bool> const decayed = {true, true, false, false, false};
  std::vector<ScalarParam> ref, no_bias_correction, coupled;
  for (NamedParameter const& p : params) ref.push_back({values(p.param), std::vector<double>(p.param.numel(), 0.0),
                                                        std::vector<double>(p.param.numel(), 0.0)});
  no_bias_correction = coupled = ref;
  ScalarAdamW const textbook;
  ScalarAdamW planted_no_bias = textbook, planted_coupled = textbook;
  planted_no_bias.bias_correction = false;
  planted_coupled.decoupled = false;

  AdamWOptions options;
  options.weight_decay = textbook.weight_decay;
  AdamW opt(params, options);
  for (std::size_t i = 0; i < params.size(); ++i) ASSERT_EQ(opt.decays(params[i].name), decayed[i]) << params[i].name;

  CosineSchedule const schedule{1e-2, 1e-3, 3, 10};
  for (int t = 1; t <= 10; ++t) {
    double const lr = schedule.lr(t - 1) + (t == 1 ? 1e-3 : 0);  // step 0 of a warmup has lr 0: give it a rate
    for (std::size_t i = 0; i < params.size(); ++i) {
      at::Tensor const g = randn(params[i].param.sizes().vec(), rng);
      set_grad(params[i], g);
      std::vector<double> const gv = values(g);
      textbook.step(ref[i].p, ref[i].m, ref[i].v, gv, t, lr, decayed[i]);
      planted_no_bias.step(no_bias_correction[i].p, no_bias_correction[i].m, no_bias_correction[i].v, gv, t, lr,
                           decayed[i]);
      planted_coupled.step(coupled[i].p, coupled[i].m, coupled[i].v, gv, t, lr, decayed[i]);
    }
    opt.step(lr);
  }
  // fp64 rounds at 1.1e-16; the two orders of the same operations differ by a few ulps per step, ten steps by a few
  // dozen on values of order 1: 1e-13. The planted variants below differ by 1e-4 or more.
  double constexpr kTol = 1e-13;
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor const expected = at::tensor(ref[i].p, kF64).view(params[i].param.sizes());
    EXPECT_LE(max_abs_diff(params[i].param, expected), kTol) << params[i].name;
    AdamWState const& s = opt.state(params[i].name);
    EXPECT_EQ(s.step, 10);
    EXPECT_LE(max_abs_diff(s.exp_avg.flatten(), at::tensor(ref[i].m, kF64)), kTol) << params[i].name;
    EXPECT_LE(max_abs_diff(s.exp_avg_sq.flatten(), at::tensor(ref[i].v, kF64)), kTol) << params[i].name;
  }
  // The comparison can fail: without bias correction every parameter lands elsewhere; coupled (L2) decay moves the
  // decayed ones.
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor const p = params[i].param.flatten();
    EXPECT_GT(max_abs_diff(p, at::tensor(no_bias_correction[i].p, kF64)), 1e3 * kTol) << params[i].name;
    if (decayed[i]) {
      EXPECT_GT(max_abs_diff(p, at::tensor(coupled[i].p, kF64)), 1e3 * kTol) << params[i].name;
    }
  }
}

TEST(AdamW, Fp32ParametersMatchTheFp64Reference) {
  auto rng = test_rng();
  at::Tensor const init = randn({64}, rng);
  NamedParameter const w = named("lm_head.weight", init.to(at::kFloat));
  ScalarParam ref{values(init.to(at::kFloat)), std::vector<double>(64, 0.0), std::vector<double>(64, 0.0)};
  ScalarAdamW const textbook;
  AdamWOptions options;
  options.weight_decay = textbook.weight_decay;
  AdamW opt({w}, options);
  for (int t = 1; t <= 10; ++t) {
    at::Tensor const g = randn({64}, rng).to(at::kFloat);  // the fp32 gradient both sides see
    set_grad(w, g);
    textbook.step(ref.p, ref.m, ref.v, values(g), t, 1e-2, true);
    opt.step(1e-2);
  }
  // fp32 rounds at 6e-8 relative; parameters of order 1 (|p| < 5) take ten roundings plus m, v and the division,
  // each contributing at most a few 1e-7: 2e-6. Steps of lr = 1e-2 are 5e3 times that.
  EXPECT_LE(max_abs_diff(w.param, at::tensor(ref.p, kF64)), 2e-6);
}

TEST(AdamW, DecayRuleFollowsHfTrainerAndExcludesALog) {
  struct Case {
    std::string name;
    std::vector<int64_t> shape;  // Qwen3.5-27B's
    bool hf_decays;
    bool qwen35_decays;
  };
  std::string const L = "model.language_model.layers.0.";
  std::vector<Case> const cases = {
      {"model.language_model.embed_tokens.weight", {248320, 5120}, true, true},
      {"model.language_model.norm.weight", {5120}, false, false},
      {"lm_head.weight", {248320, 5120}, true, true},
      {L + "linear_attn.in_proj_qkv.weight", {10240, 5120}, true, true},
      {L + "linear_attn.in_proj_z.weight", {6144, 5120}, true, true},
      {L + "linear_attn.in_proj_b.weight", {48, 5120}, true, true},
      {L + "linear_attn.in_proj_a.weight", {48, 5120}, true, true},
      {L + "linear_attn.conv1d.weight", {10240, 1, 4}, true, true},
      {L + "linear_attn.dt_bias", {48}, false, false},
      {L + "linear_attn.A_log", {48}, true, false},  // the one difference: HF Trainer decays A_log
      {L + "linear_attn.norm.weight", {128}, false, false},
      {L + "linear_attn.out_proj.weight", {5120, 6144}, true, true},
      {L + "input_layernorm.weight", {5120}, false, false},
      {L + "post_attention_layernorm.weight", {5120}, false, false},
      {L + "mlp.gate_proj.weight", {17408, 5120}, true, true},
      {L + "mlp.down_proj.weight", {5120, 17408}, true, true},
      {"model.language_model.layers.3.self_attn.q_proj.weight", {12288, 5120}, true, true},
      {"model.language_model.layers.3.self_attn.q_norm.weight", {256}, false, false},
      {"model.language_model.layers.3.self_attn.k_norm.weight", {256}, false, false},
      {"model.language_model.layers.3.self_attn.o_proj.weight", {5120, 6144}, true, true},
      {"encoder.layer.0.attention.output.dense.bias", {768}, false, false},  // a BERT bias: "bias"
      {"encoder.layer.0.attention.output.LayerNorm.weight", {768}, false, false},  // lower-cased "layernorm"
      {"model.normalizer.weight", {8, 8}, true, true},  // "norm" only as a whole path component
  };
  for (Case const& c : cases) {
    EXPECT_EQ(optim::hf_trainer_decays(c.name), c.hf_decays) << c.name;
    EXPECT_EQ(optim::qwen35_decays(c.name), c.qwen35_decays) << c.name;
    // The header's claim: for Qwen3.5 names, decay iff 2 or more dimensions.
    if (c.name.rfind("model.language_model.", 0) == 0 || c.name == "lm_head.weight") {
      EXPECT_EQ(optim::qwen35_decays(c.name), c.shape.size() >= 2) << c.name;
    }
  }
}

TEST(AdamW, ParametersExcludedFromDecayAreNotDecayed) {
  // A zero gradient makes m = v = 0 and the Adam update 0 / (0 + eps) = 0: only the decay p·(1 − lr·wd) remains.
  std::vector<NamedParameter> const params = {named("model.layers.0.mlp.up_proj.weight", at::full({2, 2}, 2.0, kF64)),
                                              named("model.layers.0.linear_attn.A_log", at::full({2}, 2.0, kF64)),
                                              named("model.layers.0.input_layernorm.weight", at::full({2}, 2.0, kF64))};
  for (NamedParameter const& p : params) set_grad(p, at::zeros_like(p.param));
  AdamWOptions options;
  options.weight_decay = 0.1;
  AdamW opt(params, options);
  opt.step(0.5);
  EXPECT_EQ(values(params[0].param)[0], 2.0 * (1 - 0.5 * 0.1));  // the same double operations: exact
  EXPECT_EQ(values(params[1].param)[0], 2.0);
  EXPECT_EQ(values(params[2].param)[0], 2.0);

  // The rule is the caller's to change: HF Trainer's decays A_log.
  NamedParameter const a_log = named("model.layers.0.linear_attn.A_log", at::full({2}, 2.0, kF64));
  set_grad(a_log, at::zeros_like(a_log.param));
  options.decays = optim::hf_trainer_decays;
  AdamW hf({a_log}, options);
  hf.step(0.5);
  EXPECT_EQ(values(a_log.param)[0], 2.0 * (1 - 0.5 * 0.1));
}

TEST(AdamW, StateRestoredFromACheckpointContinuesBitForBit) {
  auto rng = test_rng();
  NamedParameter const a = named("model.layers.0.mlp.up_proj.weight", randn({3, 5}, rng));
  NamedParameter const b = named("model.norm.weight", randn({5}, rng));
  AdamW first({a, b}, AdamWOptions{});
  std::vector<std::vector<at::Tensor>> grads;
  for (int t = 0; t < 5; ++t) grads.push_back({randn({3, 5}, rng), randn({5}, rng)});
  for (int t = 0; t < 3; ++t) {
    set_grad(a, grads[t][0]);
    set_grad(b, grads[t][1]);
    first.step(1e-2);
  }
  // A checkpoint: parameters and state copied out, loaded into a fresh optimizer over fresh tensors.
  NamedParameter const a2 = named(a.name, a.param.clone()), b2 = named(b.name, b.param.clone());
  AdamW resumed({a2, b2}, AdamWOptions{});
  for (std::string const& name : {a.name, b.name}) {
    AdamWState const& s = first.state(name);
    resumed.load_state(name, AdamWState{s.step, s.exp_avg.clone(), s.exp_avg_sq.clone()});
  }
  for (int t = 3; t < 5; ++t) {
    set_grad(a, grads[t][0]);
    set_grad(b, grads[t][1]);
    set_grad(a2, grads[t][0]);
    set_grad(b2, grads[t][1]);
    first.step(1e-2);
    resumed.step(1e-2);
  }
  EXPECT_TRUE(at::equal(a.param, a2.param));
  EXPECT_TRUE(at::equal(b.param, b2.param));
  EXPECT_EQ(resumed.state(a.name).step, 5);
  expect_torch_error([&] { resumed.load_state(a.name, AdamWState{1, at::zeros({5}, kF64), at::zeros({3, 5}, kF64)}); },
                     "exp_avg has shape [5]");
}

// ------------------------------------------------------------------------------------------------------------------
// AdamW's kernels (the fused kernel on CUDA, the foreach operations on the CPU) against the fp64 reference

// The inputs: mixed shapes (65,537 elements: one past a multi-tensor chunk of 65,536, so a tensor spans chunks; 1, 7
// and 3·5: not multiples of a vector width), decayed (the matrices) and not, four steps with lr changing per step,
// values of the run's dtype (drawn in fp64, rounded), torch's default betas and eps, weight decay 0.1.
struct KernelCase {
  std::vector<std::string> names;
  std::vector<bool> decayed;
  std::vector<at::Tensor> init;                // [param]: fp64 holding values of `dtype`
  std::vector<std::vector<at::Tensor>> grads;  // [step][param]: likewise
  std::vector<double> lrs;                     // [step]
  at::ScalarType dtype = at::kFloat;
  AdamWOptions options;
  bool offset_params = false;  // each parameter one element into a buffer: not 16-byte aligned (element-wise path)
};

KernelCase kernel_case(std::mt19937_64& rng, at::ScalarType dtype,
                       std::vector<std::vector<int64_t>> const& shapes = {{65537}, {3, 5}, {7}, {128, 129}, {1}}) {
  KernelCase c;
  c.dtype = dtype;
  c.lrs = {2e-3, 1e-2, 5e-3, 1e-3};
  c.options.weight_decay = 0.1;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    bool const decayed = shapes[i].size() == 2;
    c.names.push_back("model.layers." + std::to_string(i) +
                      (decayed ? ".mlp.up_proj.weight" : ".input_layernorm.weight"));
    c.decayed.push_back(decayed);
    c.init.push_back(randn(shapes[i], rng).to(dtype).to(at::kDouble));
  }
  for (std::size_t t = 0; t < c.lrs.size(); ++t) {
    c.grads.emplace_back();
    for (auto const& shape : shapes) c.grads.back().push_back(randn(shape, rng).to(dtype).to(at::kDouble));
  }
  return c;
}

// The reference loop (ScalarAdamW, fp64) and, per element, a first-order bound on how far a kernel computing in unit
// roundoff u (2^-24 for fp32, 2^-53 for fp64) can land from it, by counting roundings: each one errs by at most u
// times the magnitude rounded, and an fp64 constant taken into the kernel's dtype (β, lr, eps, ...) by u relative;
// 1 − β computed in the kernel's dtype from the rounded β errs by e = u·(β/(1 − β) + 1) relative (CUDA's fused kernel
// does; 19u at β = 0.95, the dominant term for v). Per step and element, counted for the operation orders of torch's
// fused kernels (CUDA, CPU) and of the foreach operations (those that compute a part in fp64 round fewer times):
//   m ← β1·m + (1 − β1)·g, or m + (1 − β1)·(g − m): at most 4 roundings of magnitudes ≤ M = |m| + (1 − β1)·|g|,
//       and (1 − β1)'s error e1 on |g| + |m|: δm ← δm + 4u·M + e1·(1 − β1)·(|g| + |m|) (the earlier error is carried
//       with weight β1 < 1, bounded by 1);
//   v ← β2·v + (1 − β2)·g·g: 6 roundings (2 constants, 3 products, the sum) of non-negative terms and (1 − β2)'s
//       error: relative error ρ ← ρ + 6u + e2;
//   lr·r = (lr/bc1)·m / (√v/√bc2 + eps): 8 roundings (3 constants, sqrt, 2 divisions, the product, eps's sum), half
//       of ρ through the sqrt, the bias corrections' own error e_bc (1 − β^t in the kernel's dtype, with pow within
//       2 ulps: u·(4β^t/bc + 1) each, bc2's halved by the sqrt), and m's error scaled:
//       δ(lr·r) = lr·|r|·(8u + ρ/2 + e_bc) + lr·δm / (bc1·(√v̂ + eps));
//   p ← p·(1 − lr·wd) − lr·r: the decay constant and product and the difference:
//       δp ← δp + 3u·|p| + u·lr·|r| + δ(lr·r).
// The bound B is δp (δm, ρ·v) after the last step. An fp32 kernel must land within B: the reference's own fp64
// roundings are 2^-29 times smaller. An fp64 kernel within 2B: the reference rounds (no more often than the kernel)
// in the same precision. Here, where |p| > 0.5, B is 12 to 13 u of |p| for fp32 (8e-7 relative) and 13 to 50 u for
// fp64 (2B: up to 1.1e-14 relative, bc2's cancellation at t = 2 included); the planted errors are 1.7e-3 of |p|
// (decay on the undecayed list), NaN (t − 1: 1 − β^0 = 0) and 25% of the first update (t + 1).
struct BoundedReference {
  std::vector<ScalarParam> ref;             // [param]
  std::vector<std::vector<double>> dp, dm;  // [param][element]: B for p and for m
  double rho = 0;                           // relative bound for v
};

BoundedReference bounded_reference(KernelCase const& c, ScalarAdamW const& adam, bool decay_all = false) {
  double const u = c.dtype == at::kDouble ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  BoundedReference r;
  for (at::Tensor const& p : c.init) {
    std::size_t const n = static_cast<std::size_t>(p.numel());
    r.ref.push_back({values(p), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)});
    r.dp.emplace_back(n, 0.0);
    r.dm.emplace_back(n, 0.0);
  }
  for (std::size_t s = 0; s < c.lrs.size(); ++s) {
    int const t = static_cast<int>(s) + 1;
    double const lr = c.lrs[s];
    // 1 − β taken from β rounded into the kernel's dtype: β's rounding (u·β) relative to 1 − β (19u at β = 0.95).
    double const e1 = u * (adam.beta1 / (1 - adam.beta1) + 1), e2 = u * (adam.beta2 / (1 - adam.beta2) + 1);
    r.rho += 6 * u + e2;
    double const b1t = std::pow(adam.beta1, t), b2t = std::pow(adam.beta2, t);
    double const bc1 = 1 - b1t, bc2 = 1 - b2t;
    // The bias corrections 1 − β^t, in the kernel's dtype on the fused paths (pow within 2 ulps, then the cancellation).
    double const e_bc = u * (4 * b1t / bc1 + 1) + u * (4 * b2t / bc2 + 1) / 2;
    for (std::size_t i = 0; i < c.init.size(); ++i) {
      ScalarParam& x = r.ref[i];
      std::vector<double> const p_prev = x.p, m_prev = x.m;
      std::vector<double> const g = values(c.grads[s][i]);
      adam.step(x.p, x.m, x.v, g, t, lr, decay_all || c.decayed[i]);
      for (std::size_t k = 0; k < g.size(); ++k) {
        r.dm[i][k] += 4 * u * (std::fabs(m_prev[k]) + (1 - adam.beta1) * std::fabs(g[k])) +
                      e1 * (1 - adam.beta1) * (std::fabs(g[k]) + std::fabs(m_prev[k]));
        double const denom = std::sqrt(x.v[k] / bc2) + adam.eps;
        double const lr_r = lr * std::fabs(x.m[k] / bc1 / denom);
        double const d_lr_r = lr_r * (8 * u + r.rho / 2 + e_bc) + lr * r.dm[i][k] / (bc1 * denom);
        r.dp[i][k] += 3 * u * std::fabs(p_prev[k]) + u * lr_r + d_lr_r;
      }
    }
  }
  return r;
}

// The reference and two planted variants a kernel must be told apart from: the bias corrections one step ahead (the
// increment counted twice) and decay on every parameter (the weight decay passed to the undecayed list).
struct References {
  BoundedReference exact, step_ahead, decay_everywhere;
};

References references(KernelCase const& c) {
  ScalarAdamW textbook;
  textbook.beta1 = c.options.beta1;
  textbook.beta2 = c.options.beta2;
  textbook.eps = c.options.eps;
  textbook.weight_decay = c.options.weight_decay;
  ScalarAdamW step_ahead = textbook;
  step_ahead.step_offset = 1;
  return {bounded_reference(c, textbook), bounded_reference(c, step_ahead),
          bounded_reference(c, textbook, /*decay_all=*/true)};
}

struct KernelRun {
  std::vector<at::Tensor> p, m, v;  // [param] after the last step, fp64 on the CPU
};

KernelRun run_adamw(KernelCase const& c, at::Device device, optim::AdamWKernel kernel) {
  std::vector<NamedParameter> params;
  // Copies (to() returns the tensor itself when it already has the device and dtype: fp64 on the CPU).
  for (std::size_t i = 0; i < c.init.size(); ++i) {
    at::Tensor p = c.init[i].to(device, c.dtype).clone();
    if (c.offset_params) {
      at::Tensor const buffer = at::empty({p.numel() + 1}, p.options());
      at::Tensor const view = buffer.narrow(0, 1, p.numel()).view(p.sizes());
      view.copy_(p);
      p = view;
    }
    params.push_back(named(c.names[i], p));
  }
  AdamWOptions options = c.options;
  options.kernel = kernel;
  AdamW adamw(params, options);
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_EQ(adamw.decays(c.names[i]), c.decayed[i]) << c.names[i];
  for (std::size_t s = 0; s < c.lrs.size(); ++s) {
    for (std::size_t i = 0; i < params.size(); ++i) set_grad(params[i], c.grads[s][i].to(device, c.dtype));
    adamw.step(c.lrs[s]);
  }
  KernelRun run;
  for (NamedParameter const& p : params) {
    AdamWState const& s = adamw.state(p.name);
    EXPECT_EQ(s.step, static_cast<int64_t>(c.lrs.size())) << p.name;
    run.p.push_back(p.param.detach().to(at::kCPU, at::kDouble).clone());
    run.m.push_back(s.exp_avg.to(at::kCPU, at::kDouble).clone());
    run.v.push_back(s.exp_avg_sq.to(at::kCPU, at::kDouble).clone());
  }
  return run;
}

// Elements of x outside |x − ref| <= bound (NaN is outside), how many are NaN, and the largest finite
// |x − ref| / bound.
struct Excess {
  int64_t outside = 0;
  int64_t nan = 0;
  double worst = 0;
};

Excess excess(at::Tensor const& x, std::vector<double> const& ref, std::vector<double> const& bound) {
  std::vector<double> const xs = values(x);
  Excess e;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    double const d = std::fabs(xs[k] - ref[k]);
    if (!(d <= bound[k])) ++e.outside;
    if (std::isnan(d)) ++e.nan;
    if (bound[k] > 0 && d / bound[k] > e.worst) e.worst = d / bound[k];
  }
  return e;
}

std::vector<double> scaled(std::vector<double> bound, double scale) {
  for (double& b : bound) b *= scale;
  return bound;
}

// p, m and v of `run` within the bound of the reference (2B for fp64); p outside it for the planted variants: the
// step-ahead one somewhere (the four steps' changes to a value can cancel, so not on every one), the decay one
// somewhere on the undecayed parameters (the only ones it changes: by lr·wd·|p|, so not on a value near 0).
void expect_matches_reference(std::string const& label, KernelCase const& c, References const& r,
                              KernelRun const& run) {
  double const scale = c.dtype == at::kDouble ? 2.0 : 1.0;
  double worst = 0, step_ahead_most = 0, decay_most = 0;
  int64_t step_ahead_outside = 0, decay_outside = 0;
  for (std::size_t i = 0; i < c.init.size(); ++i) {
    ScalarParam const& ref = r.exact.ref[i];
    std::vector<double> const dp = scaled(r.exact.dp[i], scale);
    std::vector<double> v_bound(ref.v.size());
    for (std::size_t k = 0; k < v_bound.size(); ++k) v_bound[k] = scale * r.exact.rho * ref.v[k];
    Excess const p = excess(run.p[i], ref.p, dp), m = excess(run.m[i], ref.m, scaled(r.exact.dm[i], scale)),
                 v = excess(run.v[i], ref.v, v_bound);
    EXPECT_EQ(p.outside, 0) << label << ": " << c.names[i] << " p; worst |p − ref| / bound " << p.worst
              << ", NaN: " << p.nan;
    EXPECT_EQ(m.outside, 0) << label << ": " << c.names[i] << " m; worst |m − ref| / bound " << m.worst
              << ", NaN: " << m.nan;
    EXPECT_EQ(v.outside, 0) << label << ": " << c.names[i] << " v; worst |v − ref| / bound " << v.worst
              << ", NaN: " << v.nan;
    worst = std::max({worst, p.worst, m.worst, v.worst});
    Excess const ahead = excess(run.p[i], r.step_ahead.ref[i].p, dp);
    step_ahead_outside += ahead.outside;
    step_ahead_most = std::max(step_ahead_most, ahead.worst);
    if (!c.decayed[i]) {
      Excess const decay = excess(run.p[i], r.decay_everywhere.ref[i].p, dp);
      decay_outside += decay.outside;
      decay_most = std::max(decay_most, decay.worst);
    }
  }
  EXPECT_GT(step_ahead_outside, 0) << label << ": every value is within the bound of the step-ahead variant";
  EXPECT_GT(decay_outside, 0) << label << ": the undecayed parameters are within the bound of the decayed variant";
  std::printf("[ measured ] %s: worst |x − ref| / bound %.3f; the planted variants' up to %.3g (step ahead), %.3g "
              "(decay)\n", label.c_str(), worst, step_ahead_most, decay_most);
}

// Two runs on the same inputs, each within B of the reference (the test above and the *Cuda* ones), so within 2B of
// each other: p, m and v of `a` against `b`'s.
void expect_runs_agree(std::string const& label, KernelCase const& c, BoundedReference const& r, KernelRun const& a,
                       KernelRun const& b) {
  double worst = 0;
  for (std::size_t i = 0; i < c.init.size(); ++i) {
    std::vector<double> v_bound = values(b.v[i]);
    for (double& x : v_bound) x *= 2 * r.rho * (1 + r.rho);  // 2ρ·v_ref, and v_ref <= v_b·(1 + ρ)
    Excess const p = excess(a.p[i], values(b.p[i]), scaled(r.dp[i], 2)),
                 m = excess(a.m[i], values(b.m[i]), scaled(r.dm[i], 2)), v = excess(a.v[i], values(b.v[i]), v_bound);
    EXPECT_EQ(p.outside, 0) << label << ": " << c.names[i] << " p; worst |a − b| / 2B " << p.worst
              << ", NaN: " << p.nan;
    EXPECT_EQ(m.outside, 0) << label << ": " << c.names[i] << " m; worst |a − b| / 2B " << m.worst
              << ", NaN: " << m.nan;
    EXPECT_EQ(v.outside, 0) << label << ": " << c.names[i] << " v; worst |a − b| / 2B " << v.worst
              << ", NaN: " << v.nan;
    worst = std::max({worst, p.worst, m.worst, v.worst});
  }
  std::printf("[ measured ] %s: worst |a − b| / 2B %.3f\n", label.c_str(), worst);
}

char const* dtype_name(at::ScalarType dtype) { return dtype == at::kDouble ? "fp64" : "fp32"; }

// On the CPU both kernels run: the fused one (forced: the CUDA code path, with torch's CPU fused kernel) and the
// foreach one (the CPU default, which must stay torch's default AdamW to the bit, NOTES.md). Planted in the code,
// the step count before the increment (t − 1: 1 − β^0 = 0, NaN at step 1) or the weight decay passed to the undecayed
// list fails this test through the fused run; on a GPU, the *Cuda* tests below.
TEST(AdamW, FusedAndForeachUpdatesStayWithinTheRoundingBoundOfTheFp64Reference) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    auto rng = test_rng();
    KernelCase const c = kernel_case(rng, dtype);
    References const refs = references(c);
    KernelRun const fused = run_adamw(c, at::kCPU, optim::AdamWKernel::kFused);
    KernelRun const foreach_ops = run_adamw(c, at::kCPU, optim::AdamWKernel::kForeach);
    expect_matches_reference(std::string("CPU fused ") + dtype_name(dtype), c, refs, fused);
    expect_matches_reference(std::string("CPU foreach ") + dtype_name(dtype), c, refs, foreach_ops);
    expect_runs_agree(std::string("CPU fused vs foreach ") + dtype_name(dtype), c, refs.exact, fused, foreach_ops);
    KernelRun const automatic = run_adamw(c, at::kCPU, optim::AdamWKernel::kAuto);
    for (std::size_t i = 0; i < c.init.size(); ++i) {
      EXPECT_TRUE(at::equal(automatic.p[i], foreach_ops.p[i])) << c.names[i] << ": the CPU default is not foreach";
    }
  }
}

// fusepack's kernel, the CUDA default, fp32 master weights (training's case). The planted variants of the reference
// (bias corrections a step ahead, decay on the undecayed list) must land outside the bound, and do by 1,400× and
// 2,200× on the H200, so a kernel with either bug fails. Also caught, planted on the H200: a block routed to the
// neighbouring parameter (the binary search off by one).
TEST(AdamW, CudaFusepackFp32UpdateStaysWithinTheRoundingBoundOfTheFp64Reference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  KernelCase const c = kernel_case(rng, at::kFloat);
  References const refs = references(c);
  KernelRun const automatic = run_adamw(c, at::kCUDA, optim::AdamWKernel::kAuto);
  expect_matches_reference("CUDA fp32 (fusepack)", c, refs, automatic);
  // The default on CUDA is fusepack's kernel: the same bits as a run forced onto it (the kernel is deterministic).
  KernelRun const forced = run_adamw(c, at::kCUDA, optim::AdamWKernel::kFusepack);
  for (std::size_t i = 0; i < c.init.size(); ++i) {
    EXPECT_TRUE(at::equal(automatic.p[i], forced.p[i])) << c.names[i] << ": the CUDA default is not fusepack's kernel";
  }
}

// ATen's fused kernel on the GPU, on request: within the same bound. Catches the same planted bugs in
// AdamW::fused_update.
TEST(AdamW, CudaAtenFusedFp32UpdateStaysWithinTheRoundingBoundOfTheFp64Reference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  KernelCase const c = kernel_case(rng, at::kFloat);
  expect_matches_reference("CUDA fp32 (ATen fused)", c, references(c),
                           run_adamw(c, at::kCUDA, optim::AdamWKernel::kFused));
}

// fp64 parameters on the GPU take both one-pass kernels too: within 2B of the reference (up to ~1e-14 relative).
TEST(AdamW, CudaFp64UpdatesStayWithinTheRoundingBoundOfTheFp64Reference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  KernelCase const c = kernel_case(rng, at::kDouble);
  References const refs = references(c);
  expect_matches_reference("CUDA fp64 (fusepack)", c, refs, run_adamw(c, at::kCUDA, optim::AdamWKernel::kFusepack));
  expect_matches_reference("CUDA fp64 (ATen fused)", c, refs, run_adamw(c, at::kCUDA, optim::AdamWKernel::kFused));
}

// fusepack's kernel over what its launches must cut and route: 90 parameters (64 of them undecayed, one list: more
// than one launch's table of 40),
// sizes one short of, at and one past a block's 4,096 elements and across several blocks, 1-element ones, in fp32
// and fp64; then the same with every parameter one element into its buffer (not 16-byte aligned: the element-wise
// path). Every value within the bound. Catches, planted in the kernel and run on the H200: a block routed to its
// neighbour tensor (the binary search off by one), the second launch of a list skipped; each leaves values at their
// start or another tensor's update (far outside the bound).
TEST(AdamW, CudaFusepackKernelCoversManyTensorsOfEverySizeAndAlignment) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  std::vector<std::vector<int64_t>> shapes;
  for (int i = 0; i < 90; ++i) {
    static std::vector<std::vector<int64_t>> const kinds = {{4095}, {4096}, {4097}, {3, 5}, {1}, {64, 129}, {12289}};
    shapes.push_back(kinds[static_cast<std::size_t>(i) % kinds.size()]);
  }
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (bool offset : {false, true}) {
      auto rng = test_rng();
      KernelCase c = kernel_case(rng, dtype, shapes);
      c.offset_params = offset;
      std::string const label = std::string("CUDA fusepack, 90 tensors, ") + dtype_name(dtype) +
                                (offset ? ", unaligned" : ", aligned");
      expect_matches_reference(label, c, references(c), run_adamw(c, at::kCUDA, optim::AdamWKernel::kFusepack));
    }
  }
}

// The CPU (foreach) and CUDA (fused) defaults on the same fp32 inputs: each within B of the reference, so within 2B
// of each other. Catches the planted bugs as a disagreement with the CPU path (NaN, or ~1e-3 of |p|).
TEST(AdamW, CudaAndCpuUpdatesAgreeWithinTwiceTheRoundingBound) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  KernelCase const c = kernel_case(rng, at::kFloat);
  expect_runs_agree("CUDA vs CPU fp32", c, references(c).exact, run_adamw(c, at::kCUDA, optim::AdamWKernel::kAuto),
                    run_adamw(c, at::kCPU, optim::AdamWKernel::kAuto));
}

// The fused kernel takes only members whose p, g, m and v share one dense layout (on CUDA ATen refuses the list
// otherwise). A parameter that is a strided view and a gradient in another layout than its parameter's take the list
// operations: their values equal a foreach run's bit for bit, next to a dense member that the fused kernel updates.
// Catches, planted in AdamW::step: every member sent to the fused kernel (on the CPU, wrong values for both; on CUDA,
// ATen's fast-path check throws).
void expect_other_layouts_take_the_list_operations(at::Device device, optim::AdamWKernel one_pass) {
  auto rng = test_rng();
  at::Tensor const base = randn({4, 12}, rng);
  std::vector<at::Tensor> const grads = {randn({4, 6}, rng), randn({4, 6}, rng), randn({4, 6}, rng)};
  auto run = [&](optim::AdamWKernel kernel) {
    at::Tensor const storage = base.to(device).clone();  // to() would return `base` itself on the CPU
    std::vector<NamedParameter> const params = {
        named("model.layers.0.mlp.up_proj.weight", storage.slice(1, 0, 12, 2)),     // a strided view
        named("model.layers.0.mlp.down_proj.weight", randn({4, 6}, rng).to(device)),  // its gradient column-major
        named("model.layers.0.mlp.gate_proj.weight", randn({4, 6}, rng).to(device))};
    AdamWOptions options;
    options.kernel = kernel;
    AdamW adamw(params, options);
    for (int t = 0; t < 2; ++t) {
      params[0].param.mutable_grad() = grads[0].to(device) * (t + 1);
      params[1].param.mutable_grad() = (grads[1].to(device) * (t + 1)).t().contiguous().t();
      params[2].param.mutable_grad() = grads[2].to(device) * (t + 1);
      adamw.step(1e-2);
    }
    std::vector<at::Tensor> out;
    for (NamedParameter const& p : params) out.push_back(p.param.to(at::kCPU).clone());
    return out;
  };
  auto rng_state = rng;
  std::vector<at::Tensor> const fused = run(one_pass);
  rng = rng_state;  // the same random parameters for the second run
  std::vector<at::Tensor> const foreach_ops = run(optim::AdamWKernel::kForeach);
  EXPECT_TRUE(at::equal(fused[0], foreach_ops[0])) << "the strided view";
  EXPECT_TRUE(at::equal(fused[1], foreach_ops[1])) << "the column-major gradient";
  // The dense member, which the fused kernel updated: both runs within 2B of the reference (fp64, |p| < 5: 2B < 5e-14).
  EXPECT_LE(max_abs_diff(fused[2], foreach_ops[2]), 1e-13);
}

TEST(AdamW, FusedKernelLeavesMembersOfAnotherLayoutToTheListOperations) {
  expect_other_layouts_take_the_list_operations(at::kCPU, optim::AdamWKernel::kFused);
}

TEST(AdamW, CudaOnePassKernelsLeaveMembersOfAnotherLayoutToTheListOperations) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_other_layouts_take_the_list_operations(at::kCUDA, optim::AdamWKernel::kFused);
  expect_other_layouts_take_the_list_operations(at::kCUDA, optim::AdamWKernel::kFusepack);
}

// step(lr, grad_scale) reads every gradient as g·grad_scale, which is clipping's in-place scaling followed by a plain
// step: p, m and v equal to the bit on every path (fusepack's kernel rounds g·grad_scale on its own with __fmul_rn,
// so no compiler may fuse it into the next operation). grad_scale 0.37 (no power of two). Catches, planted: the
// list paths' in-place scaling left out of AdamW::step (every value of the CPU runs differs); a kernel that ignored
// the scale would differ the same way.
void expect_grad_scale_is_scaling_first(at::Device device, optim::AdamWKernel kernel, char const* label) {
  double const scale = 0.37;
  auto rng = test_rng();
  KernelCase const c = kernel_case(rng, at::kFloat);
  auto run = [&](bool scale_in_step) {
    std::vector<NamedParameter> params;
    for (std::size_t i = 0; i < c.init.size(); ++i) {
      params.push_back(named(c.names[i], c.init[i].to(device, c.dtype).clone()));
    }
    AdamWOptions options = c.options;
    options.kernel = kernel;
    AdamW adamw(params, options);
    for (std::size_t s = 0; s < c.lrs.size(); ++s) {
      std::vector<at::Tensor> grads;
      for (std::size_t i = 0; i < params.size(); ++i) {
        set_grad(params[i], c.grads[s][i].to(device, c.dtype));
        grads.push_back(params[i].param.grad());
      }
      if (scale_in_step) {
        adamw.step(c.lrs[s], scale);
      } else {
        at::_foreach_mul_(grads, scale);  // what clip_grad_norm does
        adamw.step(c.lrs[s]);
      }
    }
    std::vector<at::Tensor> out;
    for (NamedParameter const& p : params) {
      AdamWState const& st = adamw.state(p.name);
      out.push_back(at::cat({p.param.detach().flatten(), st.exp_avg.flatten(), st.exp_avg_sq.flatten()}).cpu());
    }
    return out;
  };
  std::vector<at::Tensor> const in_step = run(true), first = run(false);
  for (std::size_t i = 0; i < c.init.size(); ++i) {
    EXPECT_TRUE(at::equal(in_step[i], first[i])) << label << ": " << c.names[i] << ": step(lr, s) is not scaling by s "
                                                 << "first; max |diff| " << max_abs_diff(in_step[i], first[i]);
  }
}

TEST(AdamW, GradScaleEqualsScalingTheGradientsFirst) {
  expect_grad_scale_is_scaling_first(at::kCPU, optim::AdamWKernel::kForeach, "CPU foreach");
  expect_grad_scale_is_scaling_first(at::kCPU, optim::AdamWKernel::kFused, "CPU ATen fused");
}

TEST(AdamW, CudaGradScaleEqualsScalingTheGradientsFirst) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_grad_scale_is_scaling_first(at::kCUDA, optim::AdamWKernel::kFusepack, "CUDA fusepack");
  expect_grad_scale_is_scaling_first(at::kCUDA, optim::AdamWKernel::kFused, "CUDA ATen fused");
  expect_grad_scale_is_scaling_first(at::kCUDA, optim::AdamWKernel::kForeach, "CUDA foreach");
}

// fusepack's kernel writes each compute copy in the same pass as its master: after every step the copy equals
// master.to(copy dtype) to the bit (bf16 and fp16 from fp32; fp32 and bf16 from fp64, which ATen rounds through fp32)
// and is recorded valid for the master's new version. A copy of another layout (here transposed) is not written: it
// keeps its old values and turns stale. Catches, planted in the kernel: the copy rounded from the master before its
// update, or copies routed to the wrong tensor; in AdamW::fusepack_update: the new version not recorded (every copy
// stale, so never used; run on the H200) or the master's version not bumped (a stale copy of another layout taken
// for valid).
void expect_compute_copies_written(at::ScalarType master_dtype, std::vector<at::ScalarType> const& copy_dtypes) {
  auto rng = test_rng();
  KernelCase const c = kernel_case(rng, master_dtype, {{4097}, {3, 5}, {7}, {128, 129}, {6, 4}});
  at::Device const cuda(at::kCUDA, 0);
  std::vector<NamedParameter> params;
  optim::ComputeCopies copies;
  for (std::size_t i = 0; i < c.init.size(); ++i) {
    params.push_back(named(c.names[i], c.init[i].to(cuda, c.dtype).clone()));
    if (i == 2) continue;  // one parameter without a copy
    auto copy = std::make_shared<optim::ComputeCopy>();
    at::ScalarType const dtype = copy_dtypes[i % copy_dtypes.size()];
    copy->value = i == 4 ? at::zeros({4, 6}, params[i].param.options().dtype(dtype)).t()  // another layout
                         : at::zeros_like(params[i].param, params[i].param.options().dtype(dtype));
    copies.emplace(c.names[i], copy);
  }
  AdamWOptions options = c.options;
  options.kernel = optim::AdamWKernel::kFusepack;
  AdamW adamw(params, options);
  adamw.set_compute_copies(copies);
  for (std::size_t s = 0; s < c.lrs.size(); ++s) {
    for (std::size_t i = 0; i < params.size(); ++i) set_grad(params[i], c.grads[s][i].to(cuda, c.dtype));
    adamw.step(c.lrs[s]);
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto const it = copies.find(c.names[i]);
      if (it == copies.end()) continue;
      optim::ComputeCopy const& copy = *it->second;
      std::string const label = std::string(dtype_name(master_dtype)) + " master, " +
                                c10::toString(copy.value.scalar_type()) + " copy of " + c.names[i] + ", step " +
                                std::to_string(s);
      if (i == 4) {
        EXPECT_FALSE(copy.valid_for(params[i].param)) << label << ": a copy of another layout was taken for valid";
        EXPECT_EQ(copy.value.abs().sum().item<double>(), 0.0) << label << ": a copy of another layout was written";
        continue;
      }
      EXPECT_TRUE(copy.valid_for(params[i].param)) << label << ": not recorded valid";
      at::Tensor const want = params[i].param.detach().to(copy.value.scalar_type());
      EXPECT_TRUE(at::equal(copy.value, want)) << label << ": not the master's cast; max |diff| "
                                               << max_abs_diff(copy.value, want);
    }
  }
}

TEST(AdamW, CudaFusepackKernelWritesTheComputeCopiesAsTheMastersCast) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_compute_copies_written(at::kFloat, {at::kBFloat16, at::kHalf});
  expect_compute_copies_written(at::kDouble, {at::kFloat, at::kBFloat16});
}

// The list paths do not write compute copies: after their step every copy is stale (the master's version moved), so
// the forward casts it again rather than reading the old values. Catches, planted: validity that ignores the version;
// and ATen's fused kernel, which does not bump the counters of what it writes, fails it unless AdamW bumps them.
TEST(AdamW, ListPathsLeaveComputeCopiesStale) {
  NamedParameter const w = named("model.layers.0.mlp.up_proj.weight", at::ones({3, 4}, at::kFloat));
  auto copy = std::make_shared<optim::ComputeCopy>();
  copy->value = w.param.to(at::kBFloat16);
  copy->master_version = static_cast<int64_t>(w.param._version());
  ASSERT_TRUE(copy->valid_for(w.param));
  for (optim::AdamWKernel kernel : {optim::AdamWKernel::kForeach, optim::AdamWKernel::kFused}) {
    AdamWOptions options;
    options.kernel = kernel;
    AdamW adamw({w}, options);
    adamw.set_compute_copies({{w.name, copy}});
    set_grad(w, at::full({3, 4}, 0.5, at::kFloat));
    copy->master_version = static_cast<int64_t>(w.param._version());
    adamw.step(1e-2);
    EXPECT_FALSE(copy->valid_for(w.param)) << "a copy the list path did not write is still taken for valid";
  }
}

// fusepack's kernel runs on CUDA only: asked for on the CPU it is an error before anything changes, never a quiet
// switch to another path.
TEST(AdamW, FusepackKernelOnTheCpuIsAnErrorBeforeAnyUpdate) {
  NamedParameter const w = named("w", at::ones({2}, kF64));
  AdamWOptions options;
  options.kernel = optim::AdamWKernel::kFusepack;
  AdamW adamw({w}, options);
  set_grad(w, at::ones({2}, kF64));
  expect_torch_error([&] { adamw.step(1e-3); }, "fusepack's AdamW kernel");
  EXPECT_TRUE(at::equal(w.param, at::ones({2}, kF64)));
  EXPECT_FALSE(adamw.has_state("w"));
  AdamW plain({w}, AdamWOptions{});
  expect_torch_error([&] { plain.step(1e-3, 0.0); }, "grad_scale must be finite and > 0");
}

TEST(AdamW, RejectsBadParametersGradientsAndOptions) {
  NamedParameter const w = named("w", at::ones({2}, kF64));
  NamedParameter const v = named("v", at::ones({2}, kF64));
  expect_torch_error([&] { AdamW({w, named("w", at::ones({2}, kF64))}, AdamWOptions{}); }, "registered twice");
  expect_torch_error([&] { AdamW({w, named("lm_head.weight", w.param)}, AdamWOptions{}); }, "same tensor");
  expect_torch_error([&] { AdamW({named("b", at::ones({2}, at::kBFloat16))}, AdamWOptions{}); }, "fp32 master");
  AdamWOptions bad;
  bad.beta2 = 1.0;
  expect_torch_error([&] { AdamW({w}, bad); }, "beta2 must be in [0, 1)");

  AdamW opt({w, v}, AdamWOptions{});
  set_grad(w, at::ones({2}, kF64));
  expect_torch_error([&] { opt.step(1e-3); }, "parameter 'v' has no gradient");
  EXPECT_TRUE(at::equal(w.param, at::ones({2}, kF64))) << "a rejected step must leave every parameter alone";
  EXPECT_FALSE(opt.has_state("w"));
  set_grad(v, at::ones({2}, at::kFloat));
  expect_torch_error([&] { opt.step(1e-3); }, "gradient of 'v' has dtype Float");
  set_grad(v, at::ones({3}, kF64));
  expect_torch_error([&] { opt.step(1e-3); }, "gradient of 'v' has shape [3]");
  set_grad(v, at::ones({2}, kF64));
  expect_torch_error([&] { opt.step(-1e-3); }, "lr must be finite and >= 0");
  expect_torch_error([&] { opt.state("w"); }, "no state yet");
  expect_torch_error([&] { opt.decays("nope"); }, "no parameter named 'nope'");
}

// ------------------------------------------------------------------------------------------------------------------
// CosineSchedule

TEST(CosineSchedule, KeyStepsMatchHandDerivedValues) {
  // peak 1e-3, min 1e-4 (r = 0.1), W = 10 warmup steps, N = 110 steps:
  //   lr(0)   = 1e-3 · 0/10 = 0                    (HF: the first update has rate 0)
  //   lr(5)   = 1e-3 · 5/10 = 5e-4
  //   lr(10)  = p = 0:    c = 1,            1e-3 · (1·0.9 + 0.1)                = 1e-3
  //   lr(35)  = p = 0.25: c = (1 + √2/2)/2 = 0.85355339059327373, 1e-3 · (0.9c + 0.1) = 8.6819805153394636e-4
  //   lr(60)  = p = 0.5:  c = 0.5 (cos(π/2) = 6e-17), 1e-3 · (0.45 + 0.1)       = 5.5e-4
  //   lr(110) = p = 1:    c = 0 (cos(π) = −1 exactly), 1e-3 · 0.1               = 1e-4 = min_lr
  CosineSchedule const s{1e-3, 1e-4, 10, 110};
  // A few ulps of 1e-3 (2.2e-19 each): 1e-18.
  double constexpr kTol = 1e-18;
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_NEAR(s.lr(5), 5e-4, kTol);
  EXPECT_NEAR(s.lr(10), 1e-3, kTol);
  EXPECT_NEAR(s.lr(35), 8.6819805153394636e-4, kTol);
  EXPECT_NEAR(s.lr(60), 5.5e-4, kTol);
  EXPECT_NEAR(s.lr(110), 1e-4, kTol);
}

TEST(CosineSchedule, WithoutWarmupStartsAtPeakAndDecaysToZeroByDefault) {
  CosineSchedule const s{2e-5, 0.0, 0, 4};
  // p = s/4: c = 1, (1 + √2/2)/2, 1/2, (1 − √2/2)/2, 0.
  EXPECT_NEAR(s.lr(0), 2e-5, 1e-20);
  EXPECT_NEAR(s.lr(1), 2e-5 * 0.85355339059327373, 1e-20);
  EXPECT_NEAR(s.lr(2), 1e-5, 1e-20);
  EXPECT_NEAR(s.lr(3), 2e-5 * 0.14644660940672624, 1e-20);
  EXPECT_EQ(s.lr(4), 0.0);
}

TEST(CosineSchedule, RisesThroughWarmupThenNeverRises) {
  CosineSchedule const s{3e-4, 3e-5, 7, 50};
  for (int64_t step = 1; step <= s.total_steps; ++step) {
    if (step <= s.warmup_steps) {
      EXPECT_GT(s.lr(step), s.lr(step - 1)) << "step " << step;
    } else {
      EXPECT_LE(s.lr(step), s.lr(step - 1)) << "step " << step;
    }
    // After warmup the rate stays within [min_lr, peak_lr] (to the rounding of r = min_lr / peak_lr: 1e-15).
    if (step >= s.warmup_steps) {
      EXPECT_GE(s.lr(step), s.min_lr * (1 - 1e-15)) << "step " << step;
    }
    EXPECT_LE(s.lr(step), s.peak_lr) << "step " << step;
  }
}

TEST(CosineSchedule, StepsOutsideTheRunAndBadSettingsAreErrors) {
  CosineSchedule const s{1e-3, 0.0, 2, 10};
  EXPECT_THROW(s.lr(-1), std::out_of_range);
  EXPECT_THROW(s.lr(11), std::out_of_range);
  auto expect_invalid = [](CosineSchedule const& bad, std::string const& field) {
    try {
      bad.validate();
      ADD_FAILURE() << "expected std::invalid_argument naming " << field;
    } catch (std::invalid_argument const& e) {
      std::printf("[  error   ] %s\n", e.what());
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_invalid({0.0, 0.0, 0, 10}, "peak_lr");
  expect_invalid({1e-3, 2e-3, 0, 10}, "min_lr");
  expect_invalid({1e-3, 0.0, 11, 10}, "warmup_steps");
  expect_invalid({1e-3, 0.0, 0, 0}, "total_steps");
}

// ------------------------------------------------------------------------------------------------------------------
// Gradient clipping

// Gradients [3, 4] and [12]: norms 5 and 12, global norm sqrt(25 + 144) = 13, every value exact in fp64.
std::vector<NamedParameter> three_four_twelve() {
  std::vector<NamedParameter> params = {named("a", at::zeros({2}, kF64)), named("b", at::zeros({1}, kF64))};
  set_grad(params[0], at::tensor({3.0, 4.0}, kF64));
  set_grad(params[1], at::tensor({12.0}, kF64));
  return params;
}

TEST(ClipGradNorm, BelowMaxNormLeavesGradientsUntouched) {
  std::vector<NamedParameter> const params = three_four_twelve();
  EXPECT_EQ(optim::clip_grad_norm(params, 26.0), 13.0);
  EXPECT_EQ(values(params[0].param.grad()), (std::vector<double>{3.0, 4.0}));
  EXPECT_EQ(values(params[1].param.grad()), (std::vector<double>{12.0}));
}

TEST(ClipGradNorm, AboveMaxNormScalesByMaxNormOverNormPlusEps) {
  std::vector<NamedParameter> const params = three_four_twelve();
  EXPECT_EQ(optim::clip_grad_norm(params, 6.5), 13.0);  // the norm before clipping
  double const factor = 6.5 / (13.0 + 1e-6);            // torch's; the same double operations: exact
  EXPECT_EQ(values(params[0].param.grad()), (std::vector<double>{3.0 * factor, 4.0 * factor}));
  EXPECT_EQ(values(params[1].param.grad()), (std::vector<double>{12.0 * factor}));
  EXPECT_NEAR(optim::grad_norm(params), 6.5, 1e-6);  // = 13·factor = 6.5·(1 − 7.7e-8)
}

TEST(ClipGradNorm, AtExactlyMaxNormScalesLikeTorch) {
  // torch clamps max_norm / (norm + 1e-6) at 1, so a norm equal to max_norm is still scaled, by 13 / 13.000001.
  std::vector<NamedParameter> const params = three_four_twelve();
  EXPECT_EQ(optim::clip_grad_norm(params, 13.0), 13.0);
  EXPECT_EQ(values(params[1].param.grad())[0], 12.0 * (13.0 / (13.0 + 1e-6)));
}

TEST(ClipGradNorm, NormIsTheL2NormOverEveryGradient) {
  auto rng = test_rng();
  std::vector<NamedParameter> params;
  double sum_sq = 0;
  for (int i = 0; i < 5; ++i) {
    params.push_back(named("p" + std::to_string(i), at::zeros({7, i + 1}, kF64)));
    at::Tensor const g = randn({7, i + 1}, rng);
    set_grad(params.back(), g);
    for (double x : values(g)) sum_sq += x * x;
  }
  // The same sum in another order (per-tensor norms, squared): a few ulps of a value of order 10: 1e-13.
  EXPECT_NEAR(optim::grad_norm(params), std::sqrt(sum_sq), 1e-13);
}

TEST(ClipGradNorm, SumsSquaresOverRanksThroughTheCallback) {
  // This rank holds [3, 4] (sum of squares 25); the other rank's [12] contributes 144.
  std::vector<NamedParameter> params = three_four_twelve();
  params.pop_back();
  int calls = 0;
  optim::AllReduceSum const other_rank = [&](at::Tensor& t) {
    ++calls;
    EXPECT_EQ(t.scalar_type(), at::kDouble);
    EXPECT_EQ(t.dim(), 0);
    t.add_(144.0);
  };
  EXPECT_EQ(optim::clip_grad_norm(params, 6.5, other_rank), 13.0);
  EXPECT_EQ(calls, 1);
  double const factor = 6.5 / (13.0 + 1e-6);
  EXPECT_EQ(values(params[0].param.grad()), (std::vector<double>{3.0 * factor, 4.0 * factor}));
}

TEST(ClipGradNorm, NonFiniteNormNamesTheParameterAndTouchesNothing) {
  std::vector<NamedParameter> const params = three_four_twelve();
  params[1].param.grad().fill_(std::nan(""));
  try {
    optim::clip_grad_norm(params, 1.0);
    ADD_FAILURE() << "expected NonFiniteGradNorm";
  } catch (optim::NonFiniteGradNorm const& e) {
    std::printf("[  error   ] %s\n", e.what());
    EXPECT_EQ(e.parameter(), "b");
    EXPECT_TRUE(std::isnan(e.norm()));
  }
  EXPECT_EQ(values(params[0].param.grad()), (std::vector<double>{3.0, 4.0}));
  // Finite here, infinite on another rank: the error says so.
  std::vector<NamedParameter> const finite = three_four_twelve();
  try {
    optim::grad_norm(finite, [](at::Tensor& t) { t.fill_(INFINITY); });
    ADD_FAILURE() << "expected NonFiniteGradNorm";
  } catch (optim::NonFiniteGradNorm const& e) {
    std::printf("[  error   ] %s\n", e.what());
    EXPECT_EQ(e.parameter(), "");
    EXPECT_NE(std::string(e.what()).find("another rank"), std::string::npos);
  }
  expect_torch_error([&] { optim::clip_grad_norm(finite, 0.0); }, "max_norm must be finite and > 0");
  std::vector<NamedParameter> const no_grad = {named("c", at::zeros({2}, kF64))};
  expect_torch_error([&] { optim::grad_norm(no_grad); }, "parameter 'c' has no gradient");
}

// Gradients of fp32 and bf16 interleaved in registration order (a bf16 gradient stands for a low-precision one): the
// foreach norms group them by dtype, so the sum and the culprit's name must undo the grouping. The norm against the
// fp64 norm over the gradients' values: each per-tensor norm is rounded once to its dtype (bf16: 2^-8 relative) after
// an fp32 accumulation of at most 52 terms (52·2^-24 < 2^-16), and |‖a‖ − ‖b‖| <= ‖a − b‖, so the total is within
// (2^-8 + 2^-16) of the reference, relative. A dropped group (the bf16 norms are ~8 and ~25 of ~47) is off by 15% or
// more. On the CPU the list norms are the single-tensor ones, so the norm also equals those, squared and summed in
// fp64, to a few fp64 ulps (1e-15 relative). Then non-finite gradients in both groups: the first in registration
// order is named (the bf16 'p1', though the fp32 group, holding the NaN 'p2', is reduced first). Catches, planted in
// grad_norm: the culprit searched group by group ('p2'), one group's norms left out of the sum.
void expect_mixed_dtype_norm(at::Device device) {
  auto rng = test_rng();
  std::vector<at::ScalarType> const dtypes = {at::kFloat, at::kBFloat16, at::kFloat, at::kBFloat16, at::kFloat};
  std::vector<NamedParameter> params;
  double sum_sq_values = 0, sum_sq_norms = 0;
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    std::vector<int64_t> const shape = {4, static_cast<int64_t>(3 * i + 1)};
    params.push_back(named("p" + std::to_string(i), at::zeros(shape, at::TensorOptions().device(device))));
    at::Tensor const g = randn(shape, rng, 1.0 + i).to(device, dtypes[i]);
    params.back().param.mutable_grad() = g;
    for (double x : values(g)) sum_sq_values += x * x;
    double const n = at::linalg_vector_norm(g, 2).item<double>();  // one tensor's reduction, in its dtype
    sum_sq_norms += n * n;
  }
  double const norm = optim::grad_norm(params);
  double const reference = std::sqrt(sum_sq_values);
  std::printf("[ measured ] %s: norm %.17g, fp64 over the values %.17g, relative %.3e\n", device.str().c_str(), norm,
              reference, std::fabs(norm - reference) / reference);
  EXPECT_LE(std::fabs(norm - reference), (std::ldexp(1.0, -8) + std::ldexp(1.0, -16)) * reference);
  if (device.is_cpu()) {
    EXPECT_NEAR(norm, std::sqrt(sum_sq_norms), 1e-15 * norm);
  }

  params[1].param.grad().fill_(INFINITY);
  params[2].param.grad()[0][0] = std::nan("");
  try {
    optim::grad_norm(params);
    ADD_FAILURE() << "expected NonFiniteGradNorm";
  } catch (optim::NonFiniteGradNorm const& e) {
    std::printf("[  error   ] %s\n", e.what());
    EXPECT_EQ(e.parameter(), "p1");
    EXPECT_TRUE(std::isnan(e.norm()));
  }
}

TEST(ClipGradNorm, NormOverMixedDtypesMatchesTheFp64ReferenceAndNamesTheFirstCulprit) {
  expect_mixed_dtype_norm(at::kCPU);
}

TEST(ClipGradNorm, CudaNormOverMixedDtypesMatchesTheFp64ReferenceAndNamesTheFirstCulprit) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_mixed_dtype_norm(at::kCUDA);
}

// ------------------------------------------------------------------------------------------------------------------
// Loss normalisation

TEST(StepLossNormalizer, TwoMicroBatchesGiveTheirSumOverTheTotal) {
  // Micro-batch 0: 3 targets whose losses sum to 6; micro-batch 1: 5 targets summing to 4. The step's loss is
  // (6 + 4) / 8 = 1.25, each micro-batch contributing its sum / 8. The per-micro-batch mean would give
  // (6/3 + 4/5) / 2 = 1.4 instead: the two differ whenever micro-batches hold different target counts.
  StepLossNormalizer norm({3, 5});
  EXPECT_EQ(norm.global_targets(), 8);
  at::Tensor const l0 = norm.normalize(TokenLossSum::from_sum(at::scalar_tensor(6.0, kF64), 3));
  at::Tensor const l1 = norm.normalize(TokenLossSum::from_sum(at::scalar_tensor(4.0, kF64), 5));
  EXPECT_EQ(l0.item<double>(), 6.0 / 8);
  EXPECT_EQ(l1.item<double>(), 4.0 / 8);
  EXPECT_EQ(norm.step_loss(), 1.25);
  double const mean_of_means = (6.0 / 3 + 4.0 / 5) / 2;
  EXPECT_GT(std::fabs(mean_of_means - norm.step_loss()), 0.1);
}

// A linear model W [V, D] (logits = x·Wᵀ) and micro-batches of 3 and 7 targets (plus ignored positions).
struct TinyLm {
  at::Tensor weight;               // [V, D], requires grad
  std::vector<at::Tensor> inputs;  // [n_i, D] per micro-batch
  std::vector<at::Tensor> labels;  // [n_i] int64, -100 on ignored positions
};

TinyLm tiny_lm(std::mt19937_64& rng) {
  int64_t const V = 11, D = 6;
  TinyLm lm;
  lm.weight = randn({V, D}, rng).requires_grad_();
  std::uniform_int_distribution<int64_t> token(0, V - 1);
  // (positions, targets): 5 positions of which 3 supervised, 9 of which 7.
  std::vector<std::pair<int64_t, int64_t>> const shapes = {{5, 3}, {9, 7}};
  for (auto const& [n, targets] : shapes) {
    lm.inputs.push_back(randn({n, D}, rng));
    std::vector<int64_t> lab(n, packing::kIgnoreIndex);
    for (int64_t i = 0; i < targets; ++i) lab[i] = token(rng);
    lm.labels.push_back(at::tensor(lab, at::TensorOptions().dtype(at::kLong)));
  }
  return lm;
}

at::Tensor grad_of(at::Tensor const& weight) {
  at::Tensor g = weight.grad().clone();
  weight.mutable_grad().reset();
  return g;
}

TEST(StepLossNormalizer, GradientEqualsTheFullBatchGradientAndCatchesTheMeanOfMeans) {
  auto rng = test_rng();
  TinyLm lm = tiny_lm(rng);
  // The target: one batch holding every micro-batch, Σ CE / all targets.
  at::Tensor const all_x = at::cat(lm.inputs), all_labels = at::cat(lm.labels);
  at::Tensor const full_loss = at::cross_entropy_loss(at::matmul(all_x, lm.weight.t()), all_labels, {},
                                                      at::Reduction::Mean, packing::kIgnoreIndex);
  full_loss.backward();
  at::Tensor const full_grad = grad_of(lm.weight);

  // The helper: count first, then sum / global count per micro-batch.
  StepLossNormalizer norm({optim::count_targets(lm.labels[0]), optim::count_targets(lm.labels[1])});
  EXPECT_EQ(norm.global_targets(), 10);
  for (std::size_t i = 0; i < lm.inputs.size(); ++i) {
    norm.normalize(optim::cross_entropy_sum(at::matmul(lm.inputs[i], lm.weight.t()), lm.labels[i])).backward();
  }
  at::Tensor const helper_grad = grad_of(lm.weight);

  // Planted: each micro-batch's mean, averaged over micro-batches (gradient accumulation without num_items).
  for (std::size_t i = 0; i < lm.inputs.size(); ++i) {
    at::Tensor const mean = at::cross_entropy_loss(at::matmul(lm.inputs[i], lm.weight.t()), lm.labels[i], {},
                                                   at::Reduction::Mean, packing::kIgnoreIndex);
    (mean / static_cast<double>(lm.inputs.size())).backward();
  }
  at::Tensor const planted_grad = grad_of(lm.weight);

  // fp64, the same terms summed in two groupings: a few ulps of gradients of order 1: 1e-14.
  double constexpr kTol = 1e-14;
  EXPECT_NEAR(norm.step_loss(), full_loss.item<double>(), kTol);
  EXPECT_LE(max_abs_diff(helper_grad, full_grad), kTol);
  // The check fails for the per-micro-batch mean: with 3 and 7 targets its weights are 1/6 and 1/14, not 1/10.
  double const planted_error = max_abs_diff(planted_grad, full_grad);
  std::printf("[  info    ] per-micro-batch mean: gradient off by %.3e (tolerance %.0e)\n", planted_error, kTol);
  EXPECT_GT(planted_error, 1e6 * kTol);
}

TEST(StepLossNormalizer, CountsTargetsOverRanksThroughTheCallback) {
  // This rank: micro-batches of 2 and 6 targets (sums 1 and 3); the other rank: 12 targets summing to 16.
  // Global: 20 targets, loss (1 + 3 + 16) / 20 = 1.
  std::vector<std::string> calls;
  optim::AllReduceSum const other_rank = [&](at::Tensor& t) {
    calls.push_back(std::string(c10::toString(t.scalar_type())));
    if (t.scalar_type() == at::kLong) {
      t.add_(12);
    } else {
      t.add_(16.0);
    }
  };
  StepLossNormalizer norm({2, 6}, other_rank);
  EXPECT_EQ(norm.local_targets(), 8);
  EXPECT_EQ(norm.global_targets(), 20);
  EXPECT_EQ(norm.normalize(TokenLossSum::from_sum(at::scalar_tensor(1.0, kF64), 2)).item<double>(), 1.0 / 20);
  EXPECT_EQ(norm.normalize(TokenLossSum::from_sum(at::scalar_tensor(3.0, kF64), 6)).item<double>(), 3.0 / 20);
  EXPECT_EQ(norm.step_loss(), 1.0);
  EXPECT_EQ(calls, (std::vector<std::string>{"Long", "Double"}));
}

TEST(StepLossNormalizer, RejectsWhatWouldBreakTheNormalisation) {
  expect_torch_error([] { StepLossNormalizer({0, 0}); }, "no target token on any rank");
  expect_torch_error([] { StepLossNormalizer({3, -1}); }, "micro-batch 1 has -1 targets");
  StepLossNormalizer norm({3, 5});
  at::Tensor const sum = at::scalar_tensor(1.0, kF64);
  // The forward supervised other targets than were counted.
  expect_torch_error([&] { norm.normalize(TokenLossSum::from_sum(sum, 4)); }, "micro-batch 0 sums over 4 targets but 3");
  norm.normalize(TokenLossSum::from_sum(sum, 3));
  expect_torch_error([&] { norm.step_loss(); }, "1 of 2 counted micro-batches");
  norm.normalize(TokenLossSum::from_sum(sum, 5));
  expect_torch_error([&] { norm.normalize(TokenLossSum::from_sum(sum, 5)); }, "already normalised");
  expect_torch_error([&] { TokenLossSum::from_sum(at::ones({2}, kF64), 2); }, "must be a 0-dim tensor");
  expect_torch_error([] { StepLossNormalizer({3}, [](at::Tensor& t) { t.fill_(1); }); }, "must SUM");
}

TEST(CrossEntropySum, MatchesHandComputedValues) {
  // Row 0: logits 0, 0, 0 and target 2: CE = log 3. Row 1: ignored. Row 2: logits log 1, log 2, log 5 (softmax
  // 1/8, 2/8, 5/8) and target 1: CE = log 4. Sum log 12 over 2 targets.
  at::Tensor const logits = at::tensor({0.0, 0.0, 0.0, 7.0, 8.0, 9.0, 0.0, std::log(2.0), std::log(5.0)}, kF64)
                                .view({3, 3});
  at::Tensor const labels = at::tensor({2, -100, 1}, at::TensorOptions().dtype(at::kInt));
  TokenLossSum const l = optim::cross_entropy_sum(logits, labels);
  EXPECT_EQ(l.targets, 2);
  EXPECT_EQ(l.sum.scalar_type(), at::kDouble);  // fp64 stays fp64
  EXPECT_NEAR(l.sum.item<double>(), std::log(12.0), 1e-15);  // log-sum-exp in fp64: a few ulps of 2.5
  // Leading dimensions are flattened: [1, 3, 3] logits with [1, 3] labels give the same.
  EXPECT_EQ(optim::cross_entropy_sum(logits.unsqueeze(0), labels.unsqueeze(0)).sum.item<double>(), l.sum.item<double>());
  // bf16 logits are upcast to fp32 as HF does.
  EXPECT_EQ(optim::cross_entropy_sum(logits.to(at::kBFloat16), labels).sum.scalar_type(), at::kFloat);
  expect_torch_error([&] { optim::cross_entropy_sum(logits, labels.slice(0, 0, 2)); }, "leading dimensions");
}

}  // namespace
}  // namespace fusepack::test
