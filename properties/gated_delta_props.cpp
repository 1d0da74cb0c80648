// gated_delta no-leak properties on random packings (docs/contracts.md, no leakage, channel 2: the recurrent state is
// zero, or the example's own initial state, at each example start), and the planted leak each must catch: a recurrence
// that never resets its state, so every example starts from the previous example's final state.
#include "properties/check.h"
#include "properties/leak.h"
#include "reference/gated_delta.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

namespace fusepack::props {
namespace {

using ref::Index;
using ref::Tensor;

// inputs: token {q, k [T, Hk, K], v [T, Hv, V], g, beta [T, Hv]}, example {initial_state [N, Hv, K, V] or absent};
// outputs: token {o [T, Hv, V]}, example {final_state [N, Hv, K, V] or absent}.
class GatedDeltaOp : public PackedOp {
 public:
  explicit GatedDeltaOp(GatedDeltaShape shape) : s_(shape), scale_(1.0 / std::sqrt(static_cast<double>(shape.K))) {}
  std::string name() const override { return "gated_delta"; }
  std::vector<std::string> input_names() const override { return {"q", "k", "v", "g", "beta", "initial_state"}; }
  std::vector<std::string> output_names() const override { return {"o", "final_state"}; }
  PackTensors example_inputs(Index length, std::uint64_t seed) const override {
    // g: log decay in [-1, 0] as in the model (g = -exp(A_log)·softplus(...) <= 0); beta = sigmoid(b) in (0, 1).
    return {{normal_tensor({length, s_.Hk, s_.K}, mix({seed, 1})), normal_tensor({length, s_.Hk, s_.K}, mix({seed, 2})),
             normal_tensor({length, s_.Hv, s_.V}, mix({seed, 3})), uniform_tensor({length, s_.Hv}, mix({seed, 4}), -1, 0),
             uniform_tensor({length, s_.Hv}, mix({seed, 5}), 0, 1)},
            {s_.with_state ? normal_tensor({1, s_.Hv, s_.K, s_.V}, mix({seed, 6}), 0.5) : Tensor()}};
  }
  PackTensors forward(PackTensors const& in, std::vector<std::int32_t> const& cu) const override {
    auto const& t = in.token;
    ref::GatedDeltaOut r = ref::gated_delta_fwd(t[0], t[1], t[2], t[3], t[4], cu, scale_, s_.use_qk_l2norm,
                                                in.example[0], s_.output_final_state);
    return {{r.o}, {r.final_state}};
  }
  PackTensors backward(PackTensors const& dout, PackTensors const& in,
                       std::vector<std::int32_t> const& cu) const override {
    auto const& t = in.token;
    ref::GatedDeltaGrads g = ref::gated_delta_bwd(dout.token[0], dout.example[0], t[0], t[1], t[2], t[3], t[4], cu,
                                                  scale_, s_.use_qk_l2norm, in.example[0]);
    return {{g.dq, g.dk, g.dv, g.dg, g.dbeta}, {g.dinitial_state}};
  }

 protected:
  GatedDeltaShape s_;
  double scale_;
};

// Planted: example n starts from example n-1's final state (example 0 from its own initial state, or zeros), as a
// kernel that walks the pack without resetting its state at the example starts would; final states are still reported
// per example, and the examples' own initial states after the first are ignored.
class StateNotResetOp : public GatedDeltaOp {
 public:
  using GatedDeltaOp::GatedDeltaOp;
  std::string name() const override { return "gated_delta with the state carried across examples"; }
  PackTensors forward(PackTensors const& in, std::vector<std::int32_t> const& cu) const override {
    std::vector<Tensor> o, final_state;
    Tensor state = start_state(in);
    for (std::size_t n = 0; n + 1 < cu.size(); ++n) {
      std::vector<Tensor> const t = example_tokens(in, cu, n);
      ref::GatedDeltaOut r = ref::gated_delta_fwd(t[0], t[1], t[2], t[3], t[4], {0, cu[n + 1] - cu[n]}, scale_,
                                                  s_.use_qk_l2norm, state, /*output_final_state=*/true);
      o.push_back(r.o);
      final_state.push_back(r.final_state);
      state = r.final_state;
    }
    return {{cat_rows(o)}, {s_.output_final_state ? cat_rows(final_state) : Tensor()}};
  }
  PackTensors backward(PackTensors const& dout, PackTensors const& in,
                       std::vector<std::int32_t> const& cu) const override {
    std::size_t const N = cu.size() - 1;
    std::vector<Tensor> initial{start_state(in)};  // the state each example starts from
    for (std::size_t n = 0; n + 1 < N; ++n) {
      std::vector<Tensor> const t = example_tokens(in, cu, n);
      initial.push_back(ref::gated_delta_fwd(t[0], t[1], t[2], t[3], t[4], {0, cu[n + 1] - cu[n]}, scale_,
                                             s_.use_qk_l2norm, initial[n], true)
                            .final_state);
    }
    std::vector<std::vector<Tensor>> parts(5, std::vector<Tensor>(N));
    Tensor dcarry(initial[0].shape());  // d loss / d (the state example n+1 starts from)
    for (std::size_t n = N; n-- > 0;) {
      std::vector<Tensor> const t = example_tokens(in, cu, n);
      Tensor dfinal = dcarry;
      if (dout.example[0].defined()) dfinal.flat() += rows(dout.example[0], static_cast<Index>(n), 1).flat();
      ref::GatedDeltaGrads g =
          ref::gated_delta_bwd(rows(dout.token[0], cu[n], cu[n + 1] - cu[n]), dfinal, t[0], t[1], t[2], t[3], t[4],
                               {0, cu[n + 1] - cu[n]}, scale_, s_.use_qk_l2norm, initial[n]);
      parts[0][n] = g.dq, parts[1][n] = g.dk, parts[2][n] = g.dv, parts[3][n] = g.dg, parts[4][n] = g.dbeta;
      dcarry = g.dinitial_state;
    }
    Tensor dinitial;
    if (s_.with_state) {
      std::vector<Tensor> rows_n(N, Tensor(dcarry.shape()));
      rows_n[0] = dcarry;
      dinitial = cat_rows(rows_n);
    }
    return {{cat_rows(parts[0]), cat_rows(parts[1]), cat_rows(parts[2]), cat_rows(parts[3]), cat_rows(parts[4])},
            {dinitial}};
  }

 private:
  Tensor start_state(PackTensors const& in) const {
    return s_.with_state ? rows(in.example[0], 0, 1) : Tensor({1, s_.Hv, s_.K, s_.V});
  }
  static std::vector<Tensor> example_tokens(PackTensors const& in, std::vector<std::int32_t> const& cu, std::size_t n) {
    std::vector<Tensor> t;
    for (Tensor const& x : in.token) t.push_back(rows(x, cu[n], cu[n + 1] - cu[n]));
    return t;
  }
};

PackingLimits const kLimits{/*max_examples=*/8, /*max_length=*/16, /*allow_empty=*/true};
char const kStateNotReset[] = "delta-rule state not reset between examples (carried from the previous example)";

template <class Op = GatedDeltaOp>
std::shared_ptr<PackedOp const> draw_gated_delta() {
  return std::make_shared<Op>(*gen::gated_delta_shape());
}

TEST(GatedDeltaNoLeak, Isolation) {
  check_property([] { check_isolation(*draw_gated_delta(), kLimits); });
}

TEST(GatedDeltaNoLeak, PerturbationInvariance) {
  check_property([] { check_perturbation_invariance(*draw_gated_delta(), kLimits); });
}

TEST(GatedDeltaNoLeak, ZeroCrossGradient) {
  check_property([] { check_zero_cross_gradient(*draw_gated_delta(), kLimits); });
}

TEST(GatedDeltaNoLeak, PlantedStateNotResetFailsIsolation) {
  check_planted(kStateNotReset, [] { check_isolation(*draw_gated_delta<StateNotResetOp>(), kLimits); });
}

TEST(GatedDeltaNoLeak, PlantedStateNotResetFailsPerturbationInvariance) {
  check_planted(kStateNotReset, [] { check_perturbation_invariance(*draw_gated_delta<StateNotResetOp>(), kLimits); });
}

TEST(GatedDeltaNoLeak, PlantedStateNotResetFailsZeroCrossGradient) {
  check_planted(kStateNotReset, [] { check_zero_cross_gradient(*draw_gated_delta<StateNotResetOp>(), kLimits); });
}

}  // namespace
}  // namespace fusepack::props
