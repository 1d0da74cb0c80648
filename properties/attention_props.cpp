// attention no-leak properties on random packings (docs/contracts.md, no leakage, channel 1: block-diagonal causal
// visibility), and the planted leak each must catch: plain causal attention over the pack, without the block-diagonal
// mask (the bug class reported publicly in HF transformers, TRL and Axolotl packing).
#include "properties/check.h"
#include "properties/leak.h"
#include "reference/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

namespace fusepack::props {
namespace {

using ref::Index;
using ref::Tensor;

// inputs: token {q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv], gate [T, Hq, Dv] or absent}; outputs: token {o}.
class AttentionOp : public PackedOp {
 public:
  explicit AttentionOp(AttentionShape shape) : s_(shape), scale_(1.0 / std::sqrt(static_cast<double>(shape.D))) {}
  std::string name() const override { return "attention"; }
  std::vector<std::string> input_names() const override { return {"q", "k", "v", "gate"}; }
  std::vector<std::string> output_names() const override { return {"o"}; }
  PackTensors example_inputs(Index length, std::uint64_t seed) const override {
    return {{normal_tensor({length, s_.Hq, s_.D}, mix({seed, 1})), normal_tensor({length, s_.Hkv, s_.D}, mix({seed, 2})),
             normal_tensor({length, s_.Hkv, s_.Dv}, mix({seed, 3})),
             s_.gated ? normal_tensor({length, s_.Hq, s_.Dv}, mix({seed, 4})) : Tensor()},
            {}};
  }
  PackTensors forward(PackTensors const& in, std::vector<std::int32_t> const& cu) const override {
    auto const& t = in.token;
    return {{ref::attention_fwd(t[0], t[1], t[2], cu, scale_, t[3])}, {}};
  }
  PackTensors backward(PackTensors const& dout, PackTensors const& in,
                       std::vector<std::int32_t> const& cu) const override {
    auto const& t = in.token;
    ref::AttentionGrads g = ref::attention_bwd(dout.token[0], t[0], t[1], t[2], cu, scale_, t[3]);
    return {{g.dq, g.dk, g.dv, g.dgate}, {}};
  }

 private:
  AttentionShape s_;
  double scale_;
};

PackingLimits const kLimits{/*max_examples=*/8, /*max_length=*/16, /*allow_empty=*/true};
char const kNoMask[] = "attention without the block-diagonal mask (causal over the pack, cu_seqlens {0, T})";

std::shared_ptr<PackedOp const> draw_attention() { return std::make_shared<AttentionOp>(*gen::attention_shape()); }

TEST(AttentionNoLeak, Isolation) {
  check_property([] { check_isolation(*draw_attention(), kLimits); });
}

TEST(AttentionNoLeak, PerturbationInvariance) {
  check_property([] { check_perturbation_invariance(*draw_attention(), kLimits); });
}

TEST(AttentionNoLeak, ZeroCrossGradient) {
  check_property([] { check_zero_cross_gradient(*draw_attention(), kLimits); });
}

TEST(AttentionNoLeak, PlantedNoBlockMaskFailsIsolation) {
  check_planted(kNoMask, [] { check_isolation(PackWideOp(draw_attention()), kLimits); });
}

TEST(AttentionNoLeak, PlantedNoBlockMaskFailsPerturbationInvariance) {
  check_planted(kNoMask, [] { check_perturbation_invariance(PackWideOp(draw_attention()), kLimits); });
}

TEST(AttentionNoLeak, PlantedNoBlockMaskFailsZeroCrossGradient) {
  check_planted(kNoMask, [] { check_zero_cross_gradient(PackWideOp(draw_attention()), kLimits); });
}

}  // namespace
}  // namespace fusepack::props
