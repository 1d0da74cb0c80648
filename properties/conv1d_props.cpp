// conv1d no-leak properties on random packings (docs/contracts.md, no leakage, channel 3: taps that fall in the
// previous example contribute exactly 0), and the planted leak each must catch: the conv run over the pack as one
// sequence, so its taps reach into the previous example.
#include "properties/check.h"
#include "properties/leak.h"
#include "reference/conv1d.h"

#include <gtest/gtest.h>

#include <memory>

namespace fusepack::props {
namespace {

using ref::Index;
using ref::Tensor;

// inputs: token {x [T, C]}, example {initial_state [N, C, W-1] or absent}; outputs: token {y [T, C]}.
class Conv1dOp : public PackedOp {
 public:
  Conv1dOp(Conv1dShape shape, std::uint64_t seed)
      : s_(shape), weight_(normal_tensor({shape.C, shape.W}, mix({seed, 1}), 0.7)) {}
  std::string name() const override { return "conv1d"; }
  std::vector<std::string> input_names() const override { return {"x", "initial_state"}; }
  std::vector<std::string> output_names() const override { return {"y"}; }
  PackTensors example_inputs(Index length, std::uint64_t seed) const override {
    return {{normal_tensor({length, s_.C}, mix({seed, 1}))},
            {s_.with_state ? normal_tensor({1, s_.C, s_.W - 1}, mix({seed, 2})) : Tensor()}};
  }
  PackTensors forward(PackTensors const& in, std::vector<std::int32_t> const& cu) const override {
    return {{ref::conv1d_fwd(in.token[0], weight_, cu, s_.silu, in.example[0])}, {}};
  }
  PackTensors backward(PackTensors const& dout, PackTensors const& in,
                       std::vector<std::int32_t> const& cu) const override {
    ref::Conv1dGrads g = ref::conv1d_bwd(dout.token[0], in.token[0], weight_, cu, s_.silu, in.example[0]);
    return {{g.dx}, {g.dinitial_state}};
  }

 private:
  Conv1dShape s_;
  Tensor weight_;
};

PackingLimits const kLimits{/*max_examples=*/8, /*max_length=*/16, /*allow_empty=*/true};
char const kTapsCross[] = "conv1d taps cross the example boundary (cu_seqlens {0, T})";

std::shared_ptr<PackedOp const> draw_conv1d() {
  Conv1dShape const shape = *gen::conv1d_shape();
  return std::make_shared<Conv1dOp>(shape, (*gen::seed()).value);
}

TEST(Conv1dNoLeak, Isolation) {
  check_property([] { check_isolation(*draw_conv1d(), kLimits); });
}

TEST(Conv1dNoLeak, PerturbationInvariance) {
  check_property([] { check_perturbation_invariance(*draw_conv1d(), kLimits); });
}

TEST(Conv1dNoLeak, ZeroCrossGradient) {
  check_property([] { check_zero_cross_gradient(*draw_conv1d(), kLimits); });
}

TEST(Conv1dNoLeak, PlantedTapsAcrossBoundaryFailIsolation) {
  check_planted(kTapsCross, [] { check_isolation(PackWideOp(draw_conv1d()), kLimits); });
}

TEST(Conv1dNoLeak, PlantedTapsAcrossBoundaryFailPerturbationInvariance) {
  check_planted(kTapsCross, [] { check_perturbation_invariance(PackWideOp(draw_conv1d()), kLimits); });
}

TEST(Conv1dNoLeak, PlantedTapsAcrossBoundaryFailZeroCrossGradient) {
  check_planted(kTapsCross, [] { check_zero_cross_gradient(PackWideOp(draw_conv1d()), kLimits); });
}

}  // namespace
}  // namespace fusepack::props
