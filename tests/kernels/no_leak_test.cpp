// The no-leak properties of docs/contracts.md, no leakage (properties/leak.h: isolation, perturbation invariance,
// zero cross-gradient) on the fused GPU kernels of conv1d, gated_delta and attention, each with the planted leak it
// must catch (the op run over the whole pack as one sequence, props::PackWideOp), as properties/*_props.cpp run them
// on the fp64 references and with the same seeds and levels (properties/check.h). One adapter per op implements
// props::PackedOp over the public ops API (Backend::kFused, input gradients by autograd): the inputs, drawn in fp64 as
// bf16-exact values by the properties' generators, go to the GPU in the run's dtype (g and the states of gated_delta
// in fp32) and the results come back through to_ref. Every property compares GPU runs with GPU runs.
//
// All three properties are checked bitwise, isolation included: each kernel computes an example from its own tokens
// in an order fixed relative to the example's first token. Why, and the launch choices that would break it (kept out
// of reach by each op's shapes and limits), are in each op's section below.
#include "kernels/conv1d/conv1d_widths.h"
#include "kernels/gated_delta/gated_delta_head_dims.h"
#include "kernels/gated_delta/gated_delta_schedule.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/conv1d.h"
#include "kernels/ops/gated_delta.h"
#include "properties/check.h"
#include "properties/gen/packings.h"
#include "properties/leak.h"

#include "tests/support/torch_bridge.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace fusepack::test {
namespace {

using ops::Backend;
using props::PackedOp;
using props::PackingLimits;
using props::PackTensors;
using ref::Index;
using ref::Tensor;

// The values of a kernel's compile-time list (Conv1dWidths, GatedDeltaHeadDims), for drawing one of them.
template <int... kValues>
std::vector<Index> values_of(IntList<kValues...>) {
  return {kValues...};
}

at::Tensor on_gpu(Tensor const& t, at::ScalarType dtype) { return to_torch(t, dtype, at::Device(at::kCUDA)); }

// A leaf the gradients are taken for; an undefined (absent) input stays undefined.
at::Tensor leaf(Tensor const& t, at::ScalarType dtype) {
  return t.defined() ? on_gpu(t, dtype).requires_grad_() : at::Tensor();
}

at::Tensor cu_tensor(std::vector<std::int32_t> const& cu) {
  return at::tensor(cu, at::TensorOptions().dtype(at::kInt)).to(at::Device(at::kCUDA));
}

Tensor to_ref_or_undefined(at::Tensor const& t) { return t.defined() ? to_ref(t) : Tensor(); }

// d Σ douts·outputs / d inputs (all defined), by autograd. An input the outputs do not depend on (an example of no
// tokens) gets zeros, and so does every input when no output depends on any.
std::vector<Tensor> input_grads(std::vector<at::Tensor> const& outputs, std::vector<at::Tensor> const& douts,
                                std::vector<at::Tensor> const& inputs) {
  std::vector<at::Tensor> used, used_douts;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].requires_grad()) continue;
    used.push_back(outputs[i]);
    used_douts.push_back(douts[i]);
  }
  std::vector<at::Tensor> grads(inputs.size());
  if (!used.empty()) {
    grads = torch::autograd::grad(used, inputs, used_douts, /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  }
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    out.push_back(to_ref(grads[i].defined() ? grads[i] : at::zeros_like(inputs[i])));
  }
  return out;
}

// Every test skips without a CUDA device that can run the fused kernels.
class FusedNoLeakTest : public ::testing::TestWithParam<Dtype> {
 protected:
  void SetUp() override { FUSEPACK_SKIP_WITHOUT_CUDA(); }
};

std::string dtype_param_name(::testing::TestParamInfo<Dtype> const& info) { return dtype_name(info.param); }

// Cases per property: 25 at smoke level, 250 at full. A case runs the fused op on the pack and on every example
// alone (forward and backward) with host round trips; on the H200 under the GPU suite's parallel ctest, 100 cases
// took 40-90 s per property for gated_delta and attention, a third of the suite. Each planted leak was caught within
// its first cases.
constexpr props::CaseCounts kGpuCases{25, 250};

// The three no-leak properties (properties/leak.h).
enum class NoLeak { kIsolation, kPerturbationInvariance, kZeroCrossGradient };

void check_no_leak(NoLeak property, PackedOp const& op, PackingLimits const& limits) {
  switch (property) {
    case NoLeak::kIsolation: props::check_isolation(op, limits); return;
    case NoLeak::kPerturbationInvariance: props::check_perturbation_invariance(op, limits); return;
    case NoLeak::kZeroCrossGradient: props::check_zero_cross_gradient(op, limits); return;
  }
}

// An op of the run's dtype with its shape drawn inside the RapidCheck case.
using DrawOp = std::shared_ptr<PackedOp const> (*)(Dtype);

// `property` holds for the fused op on random packings.
void expect_no_leak(NoLeak property, DrawOp draw, Dtype dtype, PackingLimits const& limits) {
  props::check_property([=] { check_no_leak(property, *draw(dtype), limits); }, kGpuCases);
}

// `property` catches the op run over the whole pack as one sequence (the planted leak `leak`).
void expect_pack_wide_leak_caught(NoLeak property, DrawOp draw, Dtype dtype, PackingLimits const& limits,
                                  char const* leak) {
  props::check_planted(leak, [=] { check_no_leak(property, props::PackWideOp(draw(dtype)), limits); }, kGpuCases);
}

// ---------------------------------------------------------------------------------------------------------------
// conv1d (kernels/conv1d/NOTES.md). Every y and dx element is written by one thread from its own example's taps in
// one fixed order (oldest tap first), whichever forward run (32 tokens) or backward run (64 tokens) of the pack it
// falls in: the fast and the checked bodies run the same tap function, and a tap before the example's first token reads
// +0 whether it comes from the history reset inside a pack or from the start of the tensor. So an example alone is
// bitwise that example in a pack. dweight is a shared parameter (summed over the pack) and is not compared. The fused
// kernel takes no initial_state (composite only), so the op has no example tensors; widths are Conv1dWidths; C covers
// the 4-channel packs (C % 4 == 0), the one-channel path (3, 13) and more than one block of lanes (132 > 128).
// Examples of up to 80 tokens cross the forward's and the backward's run boundaries; up to 6 of them (at most 480
// tokens); empty examples allowed, as the op accepts them.

// inputs: token {x [T, C]}; outputs: token {y [T, C]}.
class FusedConv1dOp : public PackedOp {
 public:
  FusedConv1dOp(props::Conv1dShape shape, std::uint64_t seed, Dtype dtype)
      : s_(shape),
        dtype_(dtype),
        weight_(on_gpu(props::normal_tensor({shape.C, shape.W}, props::mix({seed, 1}), 0.7), scalar_type(dtype))) {}
  std::string name() const override { return std::string("fused conv1d in ") + dtype_name(dtype_); }
  std::vector<std::string> input_names() const override { return {"x"}; }
  std::vector<std::string> output_names() const override { return {"y"}; }
  PackTensors example_inputs(Index length, std::uint64_t seed) const override {
    return {{props::normal_tensor({length, s_.C}, props::mix({seed, 1}))}, {}};
  }
  PackTensors forward(PackTensors const& in, std::vector<std::int32_t> const& cu) const override {
    return {{to_ref(run(leaf(in.token[0], scalar_type(dtype_)), cu))}, {}};
  }
  PackTensors backward(PackTensors const& dout, PackTensors const& in,
                       std::vector<std::int32_t> const& cu) const override {
    at::Tensor const x = leaf(in.token[0], scalar_type(dtype_));
    return {input_grads({run(x, cu)}, {on_gpu(dout.token[0], scalar_type(dtype_))}, {x}), {}};
  }

 private:
  at::Tensor run(at::Tensor const& x, std::vector<std::int32_t> const& cu) const {
    return ops::conv1d(x, weight_, cu_tensor(cu), s_.silu, Backend::kFused);
  }

  props::Conv1dShape s_;
  Dtype dtype_;
  at::Tensor weight_;  // [C, W] in the run's dtype; no gradient taken (not compared)
};

rc::Gen<props::Conv1dShape> fused_conv1d_shape() {
  return rc::gen::map(rc::gen::tuple(rc::gen::elementOf(std::vector<Index>{4, 3, 8, 13, 64, 132}),
                                     rc::gen::elementOf(values_of(Conv1dWidths{})), rc::gen::arbitrary<bool>()),
                      [](std::tuple<Index, Index, bool> const& t) {
                        return props::Conv1dShape{std::get<0>(t), std::get<1>(t), std::get<2>(t),
                                                  /*with_state=*/false};
                      });
}

PackingLimits const kConv1dLimits{/*max_examples=*/6, /*max_length=*/80, /*allow_empty=*/true};
char const kConv1dPackWide[] = "fused conv1d with taps across the example boundary (cu_seqlens {0, T})";

std::shared_ptr<PackedOp const> draw_conv1d(Dtype dtype) {
  props::Conv1dShape const shape = *fused_conv1d_shape();
  return std::make_shared<FusedConv1dOp>(shape, (*props::gen::seed()).value, dtype);
}

class Conv1dFusedNoLeak : public FusedNoLeakTest {};

TEST_P(Conv1dFusedNoLeak, Isolation) { expect_no_leak(NoLeak::kIsolation, draw_conv1d, GetParam(), kConv1dLimits); }

TEST_P(Conv1dFusedNoLeak, PerturbationInvariance) {
  expect_no_leak(NoLeak::kPerturbationInvariance, draw_conv1d, GetParam(), kConv1dLimits);
}

TEST_P(Conv1dFusedNoLeak, ZeroCrossGradient) {
  expect_no_leak(NoLeak::kZeroCrossGradient, draw_conv1d, GetParam(), kConv1dLimits);
}

TEST_P(Conv1dFusedNoLeak, PlantedPackWideFailsIsolation) {
  expect_pack_wide_leak_caught(NoLeak::kIsolation, draw_conv1d, GetParam(), kConv1dLimits, kConv1dPackWide);
}

TEST_P(Conv1dFusedNoLeak, PlantedPackWideFailsPerturbationInvariance) {
  expect_pack_wide_leak_caught(NoLeak::kPerturbationInvariance, draw_conv1d, GetParam(), kConv1dLimits,
                               kConv1dPackWide);
}

TEST_P(Conv1dFusedNoLeak, PlantedPackWideFailsZeroCrossGradient) {
  expect_pack_wide_leak_caught(NoLeak::kZeroCrossGradient, draw_conv1d, GetParam(), kConv1dLimits, kConv1dPackWide);
}

INSTANTIATE_TEST_SUITE_P(Sm90, Conv1dFusedNoLeak, ::testing::Values(Dtype::kBF16, Dtype::kF16, Dtype::kF32),
                         dtype_param_name);

// ---------------------------------------------------------------------------------------------------------------
// gated_delta (kernels/gated_delta/NOTES.md). Chunks of 64 tokens start at each example's first token and never span
// two examples; the state is reset at every example start; every kernel works per (chunk, head) or per (example,
// head) in a fixed order, with no atomics. So an example's results depend neither on its neighbours nor on its
// position in the pack: perturbation invariance and zero cross-gradients are exact. Isolation is exact too, one
// launch choice kept out of reach: the forward recurrence picks its block shape from the number of blocks
// N·Hv·V/columns (gated_delta_fwd.cu, launch_recurrence), and its shape of one warp per 16 value columns
// (kKSplit = 1, V = 128 only) sums the state products (k h)ᵀ and (q h)ᵀ over K in one chain where the others
// (kKSplit = 2) add two half-K sums. Their cost model can pick kKSplit = 1 only when the [8 warps, split 2] shape
// needs more than one wave, N·Hv·V/64 > #SMs (N·Hv > 66 at V = 128 on a 132-SM H200). Here N <= 4 and Hv <= 6
// (N·Hv·2 <= 48 blocks): split 2 in every full-chain run. The backward's full-chain state kernel also picks its width
// from N·Hv (64 or 128 value columns per block), which leaves each warp's arithmetic as it is. The two schedules
// (kernels/gated_delta/gated_delta_schedule.h: full chain, lean chain) order some sums differently, and by shape each
// pass picks one from N·Hv and the examples' lengths as well (at 8 × 1024 tokens with Hv = 32 the pack runs the full chain at split 1, an
// example alone the lean chain, so there isolation holds to rounding only). So each case forces one schedule, drawn
// with the shape, for the pack and every example alone: both schedules are covered, and isolation stays bitwise.
// Shapes: K = V from GatedDeltaHeadDims, GQA (Hv = 2 or 3 × Hk), with and without the l2 norm, an initial state and
// the final state (with their gradients) in 3 of 4 cases each. As in the kernel tests, g in [−0.05, 0] keeps the
// state carried across chunks (and into the next example, for the planted leak) visible, and without the l2 norm q
// and k have stddev K^−1/2 so that the state does not blow up. Examples of up to 140 tokens span up to three chunks;
// up to 4 of them (at most 560 tokens); empty examples allowed (no chunk; the final state is the initial state).

// inputs: token {q, k [T, Hk, K], v [T, Hv, V], g, beta [T, Hv]}, example {initial_state [N, Hv, K, V] or absent};
// outputs: token {o [T, Hv, V]}, example {final_state [N, Hv, K, V] or absent}.
class FusedGatedDeltaOp : public PackedOp {
 public:
  FusedGatedDeltaOp(props::GatedDeltaShape shape, GatedDeltaSchedule schedule, Dtype dtype)
      : s_(shape), schedule_(schedule), dtype_(dtype), scale_(1.0 / std::sqrt(static_cast<double>(shape.K))) {}
  std::string name() const override {
    return std::string("fused gated_delta (") + gated_delta_schedule_name(schedule_) + ") in " + dtype_name(dtype_);
  }
  std::vector<std::string> input_names() const override { return {"q", "k", "v", "g", "beta", "initial_state"}; }
  std::vector<std::string> output_names() const override { return {"o", "final_state"}; }
  PackTensors example_inputs(Index length, std::uint64_t seed) const override {
    double const qk_std = s_.use_qk_l2norm ? 1.0 : 1.0 / std::sqrt(static_cast<double>(s_.K));
    return {{props::normal_tensor({length, s_.Hk, s_.K}, props::mix({seed, 1}), qk_std),
             props::normal_tensor({length, s_.Hk, s_.K}, props::mix({seed, 2}), qk_std),
             props::normal_tensor({length, s_.Hv, s_.V}, props::mix({seed, 3})),
             props::uniform_tensor({length, s_.Hv}, props::mix({seed, 4}), -0.05, 0),
             props::uniform_tensor({length, s_.Hv}, props::mix({seed, 5}), 0, 1)},
            {s_.with_state ? props::normal_tensor({1, s_.Hv, s_.K, s_.V}, props::mix({seed, 6}), 0.5) : Tensor()}};
  }
  PackTensors forward(PackTensors const& in, std::vector<std::int32_t> const& cu) const override {
    Run const r = run(in, cu);
    return {{to_ref(r.out.o)}, {to_ref_or_undefined(r.out.final_state)}};
  }
  PackTensors backward(PackTensors const& dout, PackTensors const& in,
                       std::vector<std::int32_t> const& cu) const override {
    Run const r = run(in, cu);
    std::vector<at::Tensor> outputs{r.out.o}, douts{on_gpu(dout.token[0], scalar_type(dtype_))};
    if (s_.output_final_state) {
      outputs.push_back(r.out.final_state);
      douts.push_back(on_gpu(dout.example[0], at::kFloat));
    }
    std::vector<at::Tensor> inputs(r.leaves.begin(), r.leaves.begin() + 5);
    if (r.leaves[5].defined()) inputs.push_back(r.leaves[5]);
    std::vector<Tensor> g = input_grads(outputs, douts, inputs);
    return {{g[0], g[1], g[2], g[3], g[4]}, {r.leaves[5].defined() ? g[5] : Tensor()}};
  }

 private:
  struct Run {
    std::vector<at::Tensor> leaves;  // q, k, v, g, beta, initial_state (undefined when absent)
    ops::GatedDeltaResult out;
  };
  // q, k, v, beta in the run's dtype; g and the initial state in fp32, as the op takes them.
  Run run(PackTensors const& in, std::vector<std::int32_t> const& cu) const {
    at::ScalarType const st = scalar_type(dtype_);
    Run r;
    r.leaves = {leaf(in.token[0], st),         leaf(in.token[1], st), leaf(in.token[2], st),
                leaf(in.token[3], at::kFloat), leaf(in.token[4], st), leaf(in.example[0], at::kFloat)};
    auto const& l = r.leaves;
    r.out = ops::gated_delta(l[0], l[1], l[2], l[3], l[4], cu_tensor(cu), scale_, s_.use_qk_l2norm, Backend::kFused,
                             l[5], s_.output_final_state, schedule_);
    return r;
  }

  props::GatedDeltaShape s_;
  GatedDeltaSchedule schedule_;
  Dtype dtype_;
  double scale_;
};

rc::Gen<props::GatedDeltaShape> fused_gated_delta_shape() {
  auto const mostly = [] { return rc::gen::weightedElement<bool>({{3, true}, {1, false}}); };
  return rc::gen::map(
      rc::gen::tuple(rc::gen::elementOf(std::vector<Index>{1, 2}), rc::gen::elementOf(std::vector<Index>{2, 3}),
                     rc::gen::elementOf(values_of(GatedDeltaHeadDims{})), rc::gen::element(true, false), mostly(),
                     mostly()),
      [](std::tuple<Index, Index, Index, bool, bool, bool> const& t) {
        Index const hk = std::get<0>(t), group = std::get<1>(t), dim = std::get<2>(t);
        return props::GatedDeltaShape{hk, hk * group, dim, dim, std::get<3>(t), std::get<4>(t), std::get<5>(t)};
      });
}

PackingLimits const kGatedDeltaLimits{/*max_examples=*/4, /*max_length=*/140, /*allow_empty=*/true};
char const kGatedDeltaPackWide[] =
    "fused gated_delta with the state carried across examples (cu_seqlens {0, T}: never reset)";

std::shared_ptr<PackedOp const> draw_gated_delta(Dtype dtype) {
  GatedDeltaSchedule const schedule =
      *rc::gen::element(GatedDeltaSchedule::kFullChain, GatedDeltaSchedule::kLeanChain);
  return std::make_shared<FusedGatedDeltaOp>(*fused_gated_delta_shape(), schedule, dtype);
}

class GatedDeltaFusedNoLeak : public FusedNoLeakTest {};

TEST_P(GatedDeltaFusedNoLeak, Isolation) {
  expect_no_leak(NoLeak::kIsolation, draw_gated_delta, GetParam(), kGatedDeltaLimits);
}

TEST_P(GatedDeltaFusedNoLeak, PerturbationInvariance) {
  expect_no_leak(NoLeak::kPerturbationInvariance, draw_gated_delta, GetParam(), kGatedDeltaLimits);
}

TEST_P(GatedDeltaFusedNoLeak, ZeroCrossGradient) {
  expect_no_leak(NoLeak::kZeroCrossGradient, draw_gated_delta, GetParam(), kGatedDeltaLimits);
}

TEST_P(GatedDeltaFusedNoLeak, PlantedPackWideFailsIsolation) {
  expect_pack_wide_leak_caught(NoLeak::kIsolation, draw_gated_delta, GetParam(), kGatedDeltaLimits,
                               kGatedDeltaPackWide);
}

TEST_P(GatedDeltaFusedNoLeak, PlantedPackWideFailsPerturbationInvariance) {
  expect_pack_wide_leak_caught(NoLeak::kPerturbationInvariance, draw_gated_delta, GetParam(), kGatedDeltaLimits,
                               kGatedDeltaPackWide);
}

TEST_P(GatedDeltaFusedNoLeak, PlantedPackWideFailsZeroCrossGradient) {
  expect_pack_wide_leak_caught(NoLeak::kZeroCrossGradient, draw_gated_delta, GetParam(), kGatedDeltaLimits,
                               kGatedDeltaPackWide);
}

INSTANTIATE_TEST_SUITE_P(Sm90, GatedDeltaFusedNoLeak, ::testing::Values(Dtype::kBF16, Dtype::kF16, Dtype::kF32),
                         dtype_param_name);

// ---------------------------------------------------------------------------------------------------------------
// attention (kernels/attention/NOTES.md): FlashAttention-2 varlen (inside LibTorch) and fusepack's elementwise gate
// kernels; bf16 and fp16 only (FA2 has no fp32 path). FA2 tiles each example on its own, its query and key blocks
// counted from the example's first token, so the forward of an example is the same alone and in a pack. (A pack whose
// examples all hold at most one token takes FA2's decode path, q regrouped by kv head; a one-token row's softmax has a
// single term either way, so its o and lse come out the same.) The backward is reproducible only in deterministic mode,
// which the adapter's backward switches on: FA2 then adds each key block's dq into one of nsplits = ⌈#SMs / (b·Hq)⌉
// zero-initialised fp32 buffers (b: the non-empty examples; key block n into buffer n mod nsplits) and sums the buffers
// in order. An example of at most two backward key blocks gets dq = (0 + c₀) + c₁ for any nsplits; with three or more
// the grouping follows nsplits, which the other examples set (and a perturbation that empties or fills an example
// changes). Examples here have at most 140 tokens: two key blocks of the backward (kBlockN = 128 at D = 64 and 128);
// and with b <= 4, Hq <= 4 there are nsplits >= 9 buffers on a 132-SM H200, so even 64-key blocks would each get a
// buffer of their own. With GQA FA2 computes dk, dv per query head and sums each group of Hq/Hkv heads with at::sum:
// groups of 2 make that one addition, exact in any order, where a group of 3 or more could be reduced in an order that
// depends on the tensor's size. Shapes: Hkv in {1, 2}, Hq = 2·Hkv, D in {64, 128} (FA2's forward tiles are 128 × 128
// and 128 × 64 there, the backward's 128 × 128 and 64 × 128, so 140-token examples cross a query or key tile in both
// passes), with and without the output gate. Up to 4 examples (at most 560 tokens); empty examples allowed (the op
// drops them from what FA2 sees).

// inputs: token {q [T, Hq, D], k, v [T, Hkv, D], gate [T, Hq, D] or absent}; outputs: token {o [T, Hq, D]}.
class FusedAttentionOp : public PackedOp {
 public:
  FusedAttentionOp(props::AttentionShape shape, Dtype dtype)
      : s_(shape), dtype_(dtype), scale_(1.0 / std::sqrt(static_cast<double>(shape.D))) {}
  std::string name() const override { return std::string("fused attention in ") + dtype_name(dtype_); }
  std::vector<std::string> input_names() const override { return {"q", "k", "v", "gate"}; }
  std::vector<std::string> output_names() const override { return {"o"}; }
  PackTensors example_inputs(Index length, std::uint64_t seed) const override {
    return {{props::normal_tensor({length, s_.Hq, s_.D}, props::mix({seed, 1})),
             props::normal_tensor({length, s_.Hkv, s_.D}, props::mix({seed, 2})),
             props::normal_tensor({length, s_.Hkv, s_.D}, props::mix({seed, 3})),
             s_.gated ? props::normal_tensor({length, s_.Hq, s_.D}, props::mix({seed, 4})) : Tensor()},
            {}};
  }
  PackTensors forward(PackTensors const& in, std::vector<std::int32_t> const& cu) const override {
    std::vector<at::Tensor> const l = leaves(in);
    return {{to_ref(run(l, cu))}, {}};
  }
  PackTensors backward(PackTensors const& dout, PackTensors const& in,
                       std::vector<std::int32_t> const& cu) const override {
    DeterministicAlgorithms const deterministic;
    std::vector<at::Tensor> const l = leaves(in);
    std::vector<at::Tensor> inputs(l.begin(), l.begin() + 3);
    if (l[3].defined()) inputs.push_back(l[3]);
    std::vector<Tensor> g = input_grads({run(l, cu)}, {on_gpu(dout.token[0], scalar_type(dtype_))}, inputs);
    return {{g[0], g[1], g[2], l[3].defined() ? g[3] : Tensor()}, {}};
  }

 private:
  std::vector<at::Tensor> leaves(PackTensors const& in) const {
    at::ScalarType const st = scalar_type(dtype_);
    return {leaf(in.token[0], st), leaf(in.token[1], st), leaf(in.token[2], st), leaf(in.token[3], st)};
  }
  at::Tensor run(std::vector<at::Tensor> const& l, std::vector<std::int32_t> const& cu) const {
    std::int64_t longest = 0;
    for (std::size_t n = 0; n + 1 < cu.size(); ++n) longest = std::max<std::int64_t>(longest, cu[n + 1] - cu[n]);
    return ops::attention(l[0], l[1], l[2], cu_tensor(cu), longest, scale_, l[3], Backend::kFused);
  }

  props::AttentionShape s_;
  Dtype dtype_;
  double scale_;
};

rc::Gen<props::AttentionShape> fused_attention_shape() {
  return rc::gen::map(rc::gen::tuple(rc::gen::elementOf(std::vector<Index>{1, 2}),
                                     rc::gen::elementOf(std::vector<Index>{64, 128}), rc::gen::element(true, false)),
                      [](std::tuple<Index, Index, bool> const& t) {
                        Index const hkv = std::get<0>(t), dim = std::get<1>(t);
                        return props::AttentionShape{2 * hkv, hkv, dim, dim, std::get<2>(t)};
                      });
}

PackingLimits const kAttentionLimits{/*max_examples=*/4, /*max_length=*/140, /*allow_empty=*/true};
char const kAttentionPackWide[] =
    "fused attention without the block-diagonal mask (causal over the pack, cu_seqlens {0, T})";

std::shared_ptr<PackedOp const> draw_attention(Dtype dtype) {
  return std::make_shared<FusedAttentionOp>(*fused_attention_shape(), dtype);
}

class AttentionFusedNoLeak : public FusedNoLeakTest {};

TEST_P(AttentionFusedNoLeak, Isolation) {
  expect_no_leak(NoLeak::kIsolation, draw_attention, GetParam(), kAttentionLimits);
}

TEST_P(AttentionFusedNoLeak, PerturbationInvariance) {
  expect_no_leak(NoLeak::kPerturbationInvariance, draw_attention, GetParam(), kAttentionLimits);
}

TEST_P(AttentionFusedNoLeak, ZeroCrossGradient) {
  expect_no_leak(NoLeak::kZeroCrossGradient, draw_attention, GetParam(), kAttentionLimits);
}

TEST_P(AttentionFusedNoLeak, PlantedPackWideFailsIsolation) {
  expect_pack_wide_leak_caught(NoLeak::kIsolation, draw_attention, GetParam(), kAttentionLimits, kAttentionPackWide);
}

TEST_P(AttentionFusedNoLeak, PlantedPackWideFailsPerturbationInvariance) {
  expect_pack_wide_leak_caught(NoLeak::kPerturbationInvariance, draw_attention, GetParam(), kAttentionLimits,
                               kAttentionPackWide);
}

TEST_P(AttentionFusedNoLeak, PlantedPackWideFailsZeroCrossGradient) {
  expect_pack_wide_leak_caught(NoLeak::kZeroCrossGradient, draw_attention, GetParam(), kAttentionLimits,
                               kAttentionPackWide);
}

INSTANTIATE_TEST_SUITE_P(Sm90, AttentionFusedNoLeak, ::testing::Values(Dtype::kBF16, Dtype::kF16), dtype_param_name);

}  // namespace
}  // namespace fusepack::test
