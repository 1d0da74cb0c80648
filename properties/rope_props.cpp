// rope no-leak properties on random packings (docs/contracts.md, no leakage, channel 4: positions restart at 0 in every
// example), and the planted leaks they must catch:
//   - positions not restarting (0..T-1 over the pack; the bug class reported publicly in LLaMA-Factory's
//     neat_packing and Megatron's RoPE) for isolation and perturbation invariance (replacing an example by one of
//     another length shifts every later example's positions);
//   - for the zero cross-gradient: rope acts on each token alone, so no position bug can move a gradient between
//     tokens; the planted leak is an out-of-example read (docs/contracts.md, no leakage, channel 7): a backward that
//     adds the previous token's gradient at every example start, as a tiled kernel with a one-token halo would.
#include "properties/check.h"
#include "properties/leak.h"
#include "reference/rope.h"

#include <gtest/gtest.h>

#include <memory>

namespace fusepack::props {
namespace {

using ref::Index;
using ref::Tensor;

// inputs: token {x [T, H, D]}; outputs: token {y [T, H, D]}; positions come from cu_seqlens.
class RopeOp : public PackedOp {
 public:
  explicit RopeOp(RopeShape shape) : s_(shape) {}
  std::string name() const override { return "rope"; }
  std::vector<std::string> input_names() const override { return {"x"}; }
  std::vector<std::string> output_names() const override { return {"y"}; }
  PackTensors example_inputs(Index length, std::uint64_t seed) const override {
    return {{normal_tensor({length, s_.H, s_.D}, mix({seed, 1}))}, {}};
  }
  PackTensors forward(PackTensors const& in, std::vector<std::int32_t> const& cu) const override {
    return {{ref::rope_fwd(in.token[0], positions(cu), s_.rotary_dim, s_.theta)}, {}};
  }
  PackTensors backward(PackTensors const& dout, PackTensors const& in,
                       std::vector<std::int32_t> const& cu) const override {
    (void)in;
    return {{ref::rope_bwd(dout.token[0], positions(cu), s_.rotary_dim, s_.theta)}, {}};
  }

 protected:
  // position_ids of a packed batch: restarting at 0 in every example.
  virtual std::vector<std::int64_t> positions(std::vector<std::int32_t> const& cu) const {
    std::vector<std::int64_t> pos;
    for (std::size_t n = 0; n + 1 < cu.size(); ++n) {
      for (std::int32_t t = cu[n]; t < cu[n + 1]; ++t) pos.push_back(t - cu[n]);
    }
    return pos;
  }

  RopeShape s_;
};

// Planted: positions 0..T-1 over the whole pack.
class RopePositionsNotRestarting : public RopeOp {
 public:
  using RopeOp::RopeOp;
  std::string name() const override { return "rope with positions 0..T-1 over the pack"; }

 protected:
  std::vector<std::int64_t> positions(std::vector<std::int32_t> const& cu) const override {
    std::vector<std::int64_t> pos(static_cast<std::size_t>(cu.back()));
    for (std::size_t t = 0; t < pos.size(); ++t) pos[t] = static_cast<std::int64_t>(t);
    return pos;
  }
};

// Planted: dx at each example start also gets the previous token's (unrotated) gradient.
class RopeHaloBackward : public RopeOp {
 public:
  using RopeOp::RopeOp;
  std::string name() const override { return "rope with a one-token halo read in its backward"; }
  PackTensors backward(PackTensors const& dout, PackTensors const& in,
                       std::vector<std::int32_t> const& cu) const override {
    PackTensors grad = RopeOp::backward(dout, in, cu);
    Tensor const& dy = dout.token[0];
    Index const row = s_.H * s_.D;
    for (std::size_t n = 1; n + 1 < cu.size(); ++n) {
      Index const t = cu[n];
      if (t == 0 || t == cu[n + 1]) continue;  // no token before it, or an empty example without a first token
      grad.token[0].flat().segment(t * row, row) += dy.flat().segment((t - 1) * row, row);
    }
    return grad;
  }
};

// Rope has no zero-length restriction; positions of an empty example are simply absent.
PackingLimits const kLimits{/*max_examples=*/8, /*max_length=*/16, /*allow_empty=*/true};
char const kNoRestart[] = "positions not restarting per example (0..T-1 over the pack)";
char const kHalo[] = "backward reads the previous example's last token (one-token halo)";

template <class Op>
std::shared_ptr<PackedOp const> draw_rope() {
  return std::make_shared<Op>(*gen::rope_shape());
}

TEST(RopeNoLeak, Isolation) {
  check_property([] { check_isolation(*draw_rope<RopeOp>(), kLimits); });
}

TEST(RopeNoLeak, PerturbationInvariance) {
  check_property([] { check_perturbation_invariance(*draw_rope<RopeOp>(), kLimits); });
}

TEST(RopeNoLeak, ZeroCrossGradient) {
  check_property([] { check_zero_cross_gradient(*draw_rope<RopeOp>(), kLimits); });
}

TEST(RopeNoLeak, PlantedPositionsNotRestartingFailIsolation) {
  check_planted(kNoRestart, [] { check_isolation(*draw_rope<RopePositionsNotRestarting>(), kLimits); });
}

TEST(RopeNoLeak, PlantedPositionsNotRestartingFailPerturbationInvariance) {
  check_planted(kNoRestart, [] { check_perturbation_invariance(*draw_rope<RopePositionsNotRestarting>(), kLimits); });
}

TEST(RopeNoLeak, PlantedHaloReadFailsZeroCrossGradient) {
  check_planted(kHalo, [] { check_zero_cross_gradient(*draw_rope<RopeHaloBackward>(), kLimits); });
}

}  // namespace
}  // namespace fusepack::props
