// gated_delta on both backends: the composite (chunked ATen) on the CPU against the fp64 naive-recurrence reference
// in fp64 and fp32, o, final_state and every gradient; the fused kernels against the reference under docs/contracts.md,
// numerics with the composite in the same dtype as baseline (suites *Fused*: labels kernels + gpu), the no-leak
// perturbation property and bitwise determinism of the fused backward on the GPU; T = 0; bad input.
#ifdef FUSEPACK_TEST_CUDA_KERNELS
#include "kernels/gated_delta/gated_delta.h"
#include "kernels/gated_delta/gated_delta_trace.h"
#endif
#include "kernels/gated_delta/gated_delta_schedule.h"
#include "kernels/ops/gated_delta.h"
#include "reference/gated_delta.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/torch_bridge.h"
#include "verify/random.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace fusepack {
// GoogleTest prints a schedule by its name (found by argument-dependent lookup in the enum's namespace).
void PrintTo(GatedDeltaSchedule s, std::ostream* os) { *os << gated_delta_schedule_name(s); }
}  // namespace fusepack

namespace fusepack::test {
namespace {

using ops::Backend;
using ref::Tensor;

struct GatedDeltaCase {
  std::string name;
  std::vector<int> lengths;  // packed examples, zeros allowed; empty = 200 random examples of 1..3 tokens
  int64_t Hk, Hv, K, V;
  bool use_qk_l2norm = true;
  bool initial_state = false;
  bool final_state = false;  // output_final_state; the loss then also reads it, with a random dfinal_state
  double g_min = -0.05;      // g uniform in [g_min, 0]
  bool full_only = false;    // the fp64 reference is too slow for the smoke level
};
void PrintTo(GatedDeltaCase const& c, std::ostream* os) { *os << c.name; }

std::vector<int> repeated_lengths(int count, int max_len) {  // 1, 2, ..., max_len, 1, 2, ...
  std::vector<int> lengths(count);
  for (int i = 0; i < count; ++i) lengths[i] = 1 + i % max_len;
  return lengths;
}

// Inputs drawn in fp64 and rounded to what the op receives (q, k, v, beta, dout in the run's dtype; g, the states and
// dfinal_state in fp32, or fp64 for fp64 runs), so the reference sees exactly the kernel's inputs. As the model feeds
// the op: β = sigmoid(b) in (0, 1), g <= 0. The default g >= −0.05 keeps exp(ΣG) over a 64-token chunk near 0.2, so
// the state carried from chunk to chunk and from the initial state stays visible in o; without l2 norm q and k have
// stddev K^−1/2 (unit expected norm), so I − β k kᵀ does not blow the state up.
struct GatedDeltaInputs {
  std::vector<int32_t> cu;
  Tensor q, k, v, g, beta, initial_state, dout, dfinal_state;  // initial_state, dfinal_state undefined when unused
  double scale = 1;
};

GatedDeltaInputs draw(GatedDeltaCase const& c, Dtype dtype, std::mt19937_64& rng) {
  GatedDeltaInputs in;
  std::vector<int> const lengths = c.lengths.empty() ? random_lengths(rng, 200, 1, 3) : c.lengths;
  in.cu = cu_seqlens_from_lengths(lengths);
  int64_t const T = in.cu.back(), N = static_cast<int64_t>(lengths.size());
  double const qk_std = c.use_qk_l2norm ? 1.0 : 1.0 / std::sqrt(static_cast<double>(c.K));
  in.q = randn({T, c.Hk, c.K}, rng, qk_std);
  in.k = randn({T, c.Hk, c.K}, rng, qk_std);
  in.v = randn({T, c.Hv, c.V}, rng);
  in.g = uniform({T, c.Hv}, rng, c.g_min, 0.0);
  in.beta = uniform({T, c.Hv}, rng, 0.0, 1.0);
  in.dout = randn({T, c.Hv, c.V}, rng);
  if (c.initial_state) in.initial_state = randn({N, c.Hv, c.K, c.V}, rng, 0.5);
  if (c.final_state) in.dfinal_state = randn({N, c.Hv, c.K, c.V}, rng);
  in.scale = 1.0 / std::sqrt(static_cast<double>(c.K));
  Dtype const state = dtype == Dtype::kF64 ? Dtype::kF64 : Dtype::kF32;
  for (Tensor* t : {&in.q, &in.k, &in.v, &in.beta, &in.dout}) round_to(dtype, *t);
  for (Tensor* t : {&in.g, &in.initial_state, &in.dfinal_state}) {
    if (t->defined()) round_to(state, *t);
  }
  return in;
}

struct DeviceInputs {
  at::Tensor q, k, v, g, beta, initial_state, dout, dfinal_state, cu;
  double scale = 1;
};

DeviceInputs to_device(GatedDeltaInputs const& in, Dtype dtype, at::Device device) {
  at::ScalarType const st = scalar_type(dtype), state = dtype == Dtype::kF64 ? at::kDouble : at::kFloat;
  DeviceInputs d;
  d.q = to_torch(in.q, st, device);
  d.k = to_torch(in.k, st, device);
  d.v = to_torch(in.v, st, device);
  d.g = to_torch(in.g, state, device);
  d.beta = to_torch(in.beta, st, device);
  d.dout = to_torch(in.dout, st, device);
  if (in.initial_state.defined()) d.initial_state = to_torch(in.initial_state, state, device);
  if (in.dfinal_state.defined()) d.dfinal_state = to_torch(in.dfinal_state, state, device);
  d.cu = at::tensor(in.cu, at::TensorOptions().dtype(at::kInt)).to(device);
  d.scale = in.scale;
  return d;
}

// Outputs and every gradient of one backend, for loss = <dout, o> + <dfinal_state, final_state>. final_state is
// defined only when the case asks for it, dinitial_state only when an initial state is given.
struct GatedDeltaRun {
  at::Tensor o, final_state, dq, dk, dv, dg, dbeta, dinitial_state;
};

// `schedule` forces the fused kernels' schedule in both passes (the composite takes only the default, kByShape).
GatedDeltaRun run(Backend backend, DeviceInputs const& in, bool use_qk_l2norm,
                  GatedDeltaSchedule schedule = GatedDeltaSchedule::kByShape) {
  auto leaf = [](at::Tensor const& t) { return t.defined() ? t.detach().clone().requires_grad_() : at::Tensor(); };
  at::Tensor q = leaf(in.q), k = leaf(in.k), v = leaf(in.v), g = leaf(in.g), beta = leaf(in.beta),
             state = leaf(in.initial_state);
  bool const with_final = in.dfinal_state.defined();
  ops::GatedDeltaResult r =
      ops::gated_delta(q, k, v, g, beta, in.cu, in.scale, use_qk_l2norm, backend, state, with_final, schedule);
  std::vector<at::Tensor> outputs{r.o}, douts{in.dout}, inputs{q, k, v, g, beta};
  if (with_final) {
    outputs.push_back(r.final_state);
    douts.push_back(in.dfinal_state);
  }
  if (state.defined()) inputs.push_back(state);
  // allow_unused: with T = 0 the output depends on none of q, k, g, beta.
  auto grads = torch::autograd::grad(outputs, inputs, douts, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true);
  auto or_zeros = [](at::Tensor const& grad, at::Tensor const& like) {
    return grad.defined() ? grad : at::zeros_like(like);
  };
  GatedDeltaRun out;
  out.o = r.o.detach();
  if (with_final) out.final_state = r.final_state.detach();
  out.dq = or_zeros(grads[0], q);
  out.dk = or_zeros(grads[1], k);
  out.dv = or_zeros(grads[2], v);
  out.dg = or_zeros(grads[3], g);
  out.dbeta = or_zeros(grads[4], beta);
  if (state.defined()) out.dinitial_state = or_zeros(grads[5], state);
  return out;
}

struct Reference {
  ref::GatedDeltaOut out;
  ref::GatedDeltaGrads grads;
};

Reference reference(GatedDeltaInputs const& in, bool use_qk_l2norm) {
  bool const with_final = in.dfinal_state.defined();
  return {ref::gated_delta_fwd(in.q, in.k, in.v, in.g, in.beta, in.cu, in.scale, use_qk_l2norm, in.initial_state,
                               with_final),
          ref::gated_delta_bwd(in.dout, in.dfinal_state, in.q, in.k, in.v, in.g, in.beta, in.cu, in.scale,
                               use_qk_l2norm, in.initial_state)};
}

// One named tensor of a run, its reference and how to decode its indices.
struct Compared {
  std::string name;
  at::Tensor got, baseline;
  Tensor want;
  IndexLayout layout;
};

std::vector<Compared> compared(GatedDeltaRun const& r, GatedDeltaRun const& base, Reference const& want,
                               std::vector<int32_t> const& cu) {
  std::vector<Compared> c{
      {"o", r.o, base.o, want.out.o, packed_layout(want.out.o, cu)},
      {"dq", r.dq, base.dq, want.grads.dq, packed_layout(want.grads.dq, cu)},
      {"dk", r.dk, base.dk, want.grads.dk, packed_layout(want.grads.dk, cu)},
      {"dv", r.dv, base.dv, want.grads.dv, packed_layout(want.grads.dv, cu)},
      {"dg", r.dg, base.dg, want.grads.dg, packed_layout(want.grads.dg, cu)},
      {"dbeta", r.dbeta, base.dbeta, want.grads.dbeta, packed_layout(want.grads.dbeta, cu)},
  };
  if (r.final_state.defined()) {
    c.push_back({"final_state", r.final_state, base.final_state, want.out.final_state,
                 plain_layout(want.out.final_state)});
  }
  if (r.dinitial_state.defined()) {
    c.push_back({"dinitial_state", r.dinitial_state, base.dinitial_state, want.grads.dinitial_state,
                 plain_layout(want.grads.dinitial_state)});
  }
  return c;
}

double max_abs(Tensor const& t) { return t.numel() ? t.flat().cwiseAbs().maxCoeff() : 0.0; }

// ---------------------------------------------------------------------------------------------------------------
// Composite on the CPU vs the reference: the chunked algorithm (UT transform, triangular solve, chunk-to-chunk state)
// against the naive per-token recurrence.

// The composite's tensors in these CPU tests are tiny: ATen's intra-op threads cost more than they give (200 tiny
// examples took 22 s of CPU with 2 threads on a busy 2-core machine, 0.6 s with one).
void use_one_cpu_thread() { at::set_num_threads(1); }

class GatedDeltaComposite : public ::testing::TestWithParam<GatedDeltaCase> {
 protected:
  void SetUp() override { use_one_cpu_thread(); }
};

TEST_P(GatedDeltaComposite, MatchesReferenceOnCpuInFp64) {
  GatedDeltaCase const& c = GetParam();
  auto rng = test_rng();
  GatedDeltaInputs const in = draw(c, Dtype::kF64, rng);
  GatedDeltaRun const r = run(Backend::kComposite, to_device(in, Dtype::kF64, at::Device(at::kCPU)), c.use_qk_l2norm);
  Reference const want = reference(in, c.use_qk_l2norm);
  // Both sides are fp64 and differ in algorithm (chunked solve vs token by token), so in operation order only: at most
  // 2.1e-15 of the tensor's largest magnitude was measured (0.21% of this budget); 1e-12 of the largest magnitude
  // leaves ~500x headroom while a dropped term or a wrong decay errs by 1e-3 or more.
  for (Compared const& x : compared(r, r, want, in.cu)) {
    Tolerance const tol{1e-12 * std::max(1.0, max_abs(x.want)), 0};
    FUSEPACK_EXPECT_PASS(compare_allclose(x.name, to_ref(x.got), x.want, tol, x.layout));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, GatedDeltaComposite,
    ::testing::Values(
        GatedDeltaCase{"one_example_1_hk2_hv4_k8_v16_state_dfinal", {1}, 2, 4, 8, 16, true, true, true},
        GatedDeltaCase{"one_example_63_hk1_hv1_k16_v8", {63}, 1, 1, 16, 8},
        GatedDeltaCase{"one_example_64_gqa1_hk2_hv2_k8_v8_state", {64}, 2, 2, 8, 8, true, true, false},
        GatedDeltaCase{"one_example_65_gqa3_hk1_hv3_k8_v16_no_l2norm_state_dfinal", {65}, 1, 3, 8, 16, false, true,
                       true},
        GatedDeltaCase{"one_example_130_gqa2_hk2_hv4_k16_v16_state_dfinal", {130}, 2, 4, 16, 16, true, true, true},
        GatedDeltaCase{"seqs_5_0_70_0_3_gqa3_hk2_hv6_k8_v8_state_dfinal", {5, 0, 70, 0, 3}, 2, 6, 8, 8, true, true,
                       true},
        GatedDeltaCase{"seqs_17_64_1_no_l2norm_hk2_hv2_k8_v8", {17, 64, 1}, 2, 2, 8, 8, false},
        GatedDeltaCase{"dfinal_without_initial_state_seqs_64_65", {64, 65}, 1, 2, 8, 8, true, false, true},
        GatedDeltaCase{"200_tiny_examples_hk1_hv2_k8_v8_state_dfinal", {}, 1, 2, 8, 8, true, true, true},
        // g down to −24: G reaches ~−770 within a chunk, where exp(−G) overflows fp64 and exp(G) underflows; only the
        // masked exp(G_i − G_j) is safe (computed as exp(G_i)·exp(−G_j) it turns o and the gradients into NaN)
        GatedDeltaCase{"strong_decay_seqs_130_20_hk1_hv2_k8_v8_state", {130, 20}, 1, 2, 8, 8, true, true, true,
                       -24.0}),
    [](auto const& tc) { return tc.param.name; });

// fp32 inputs, computed in fp32: every output within kFp32RelRms of the fp64 reference in relative RMS (fp32 rounds at
// 6e-8; the chunk's triangular solve and the state recurrence add up at most a few hundred terms per element: measured
// 1.6e-6 at worst, dg under strong decay; a wrong formula errs by 1e-3 or more) and elementwise within 1e-5 of the
// tensor's largest magnitude (20% of it used at worst). The strong-decay case (g down to −4: G reaches ~−130 within a
// chunk, where exp(−G) overflows fp32) catches exp(G_i − G_j) computed as exp(G_i)·exp(−G_j) (checked: NaN).
TEST(GatedDeltaComposite, MatchesReferenceOnCpuInFp32) {
  use_one_cpu_thread();
  auto rng = test_rng();
  for (GatedDeltaCase const& c :
       {GatedDeltaCase{"seqs_1_63_64_65_130_gqa2", {1, 63, 64, 65, 130}, 2, 4, 16, 16, true, true, true},
        GatedDeltaCase{"strong_decay_seqs_130_20", {130, 20}, 1, 2, 16, 16, true, true, true, -4.0}}) {
    SCOPED_TRACE(c.name);
    GatedDeltaInputs const in = draw(c, Dtype::kF32, rng);
    GatedDeltaRun const r =
        run(Backend::kComposite, to_device(in, Dtype::kF32, at::Device(at::kCPU)), c.use_qk_l2norm);
    Reference const want = reference(in, c.use_qk_l2norm);
    for (Compared const& x : compared(r, r, want, in.cu)) {
      EXPECT_EQ(x.got.scalar_type(), at::kFloat) << x.name;
      ErrorReport rep = compare_allclose(x.name + " fp32", to_ref(x.got), x.want,
                                         Tolerance{kFp32RelRms * max_abs(x.want), 0}, x.layout);
      if (rep.rel_rms > kFp32RelRms) rep.failed_bound = "rel_rms over the fp32 bound 1e-5";
      FUSEPACK_EXPECT_PASS(rep);
    }
  }
}

// No tokens: o is empty, the final state is the initial state and its gradient passes straight back.
TEST(GatedDeltaComposite, ZeroTokensPassTheStateThrough) {
  use_one_cpu_thread();
  GatedDeltaCase const c{"no_tokens", {0, 0}, 2, 4, 8, 8, true, true, true};
  auto rng = test_rng();
  GatedDeltaInputs const in = draw(c, Dtype::kF64, rng);
  DeviceInputs const d = to_device(in, Dtype::kF64, at::Device(at::kCPU));
  GatedDeltaRun const r = run(Backend::kComposite, d, true);
  EXPECT_EQ(r.o.sizes(), (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(r.dq.sizes(), (std::vector<int64_t>{0, 2, 8}));
  EXPECT_TRUE(at::equal(r.final_state, d.initial_state));
  EXPECT_TRUE(at::equal(r.dinitial_state, d.dfinal_state));
}

// Without output_final_state no final state comes back; o is the same either way.
TEST(GatedDeltaComposite, FinalStateOnlyWhenAsked) {
  use_one_cpu_thread();
  at::Tensor const q = at::randn({5, 1, 4}), v = at::randn({5, 2, 4}), g = -at::rand({5, 2}), beta = at::rand({5, 2});
  at::Tensor const cu = at::tensor(std::vector<int32_t>{0, 2, 5}, at::kInt);
  auto const without = ops::gated_delta(q, q, v, g, beta, cu, 0.5, true, Backend::kComposite);
  auto const with = ops::gated_delta(q, q, v, g, beta, cu, 0.5, true, Backend::kComposite, {}, true);
  EXPECT_FALSE(without.final_state.defined());
  ASSERT_TRUE(with.final_state.defined());
  EXPECT_EQ(with.final_state.sizes(), (std::vector<int64_t>{2, 2, 4, 4}));
  EXPECT_EQ(with.final_state.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(without.o, with.o));
}

// ---------------------------------------------------------------------------------------------------------------
// Fused on the GPU vs the reference, the composite in the same dtype as baseline.

// bf16 runs: every tensor's relative RMS error is also bounded. One bf16 rounding of every element gives
// 2^−9/√3 ≈ 1.1e-3; the section 5 budget lets the worst element reach ~3 rounding steps; 1e-2 is ~9 roundings' RMS,
// above what a kernel accumulating in fp32 produces and far below a wrong or missing term (1e-1 and up). fp32 runs
// meet kFp32RelRms through check_fused.
constexpr double kBf16RelRms = 1e-2;

// docs/contracts.md, numerics for one tensor of a fused run in `dtype`. Outputs in the run's dtype (o, dq, dk, dv,
// dbeta; all of them in an fp32 run) go through check_fused. The fp32 outputs of a bf16/fp16 run (final_state,
// dinitial_state, dg) carry the precision of the run's dtype, not of their storage: their floor is one rounding step of
// the run's dtype at the reference's magnitude, as for o (the composite, computing in fp32, errs by ~1e-6 there, so a
// floor of one fp32 step would ask a bf16 tensor-core kernel for fp32 accuracy).
ErrorReport check_output(Compared const& x, Dtype dtype) {
  ErrorReport r;
  if (x.got.scalar_type() == scalar_type(dtype)) {
    r = check_fused(x.name, x.got, x.baseline, x.want, x.layout);
  } else {
    Tensor const got = to_ref(x.got), base = to_ref(x.baseline);
    r = compare_with_baseline(x.name + " fp32 of a " + dtype_name(dtype) + " run", got.data(), base.data(),
                              x.want.data(), x.want.numel(), rounding_step(dtype, max_abs(x.want)), x.layout);
  }
  if (dtype != Dtype::kF32 && r.rel_rms > kBf16RelRms) {
    r.failed_bound = "rel_rms " + std::to_string(r.rel_rms) + " > " + std::to_string(kBf16RelRms) + " (bf16 bound)";
  }
  return r;
}

// A schedule in a test name: its name with '_' for ' ' (GoogleTest names take only [A-Za-z0-9_]).
std::string schedule_label(GatedDeltaSchedule s) {
  std::string label = gated_delta_schedule_name(s);
  std::replace(label.begin(), label.end(), ' ', '_');
  return label;
}

// Every case under both forced schedules: they are two kernel pipelines (the forward's o computed on the chunk chain
// or after it from the saved states; the backward's state recurrence on one or two warps per 16 value columns) that
// the launchers pick between by shape, so under the default a case would test only the one its shape picks and the
// edge packs below would miss the other. Both schedules see the same inputs (seeded by dtype and case, not schedule),
// so their error-budget lines compare kernels, not draws. The composite baseline takes only the default.
class GatedDeltaFused
    : public ::testing::TestWithParam<std::tuple<Dtype, GatedDeltaSchedule, GatedDeltaCase>> {};

TEST_P(GatedDeltaFused, MatchesReference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto const& [dtype, schedule, c] = GetParam();
  if (c.full_only && test_level() != TestLevel::kFull) {
    GTEST_SKIP() << "full level only: the fp64 reference of this case takes minutes (FUSEPACK_TEST_LEVEL=full)";
  }
  std::mt19937_64 rng(  // keyed by the test's name without its schedule
      seed_for("Sm90/GatedDeltaFused.MatchesReference/" + std::string(dtype_name(dtype)) + "_" + c.name));
  GatedDeltaInputs const in = draw(c, dtype, rng);
  DeviceInputs const d = to_device(in, dtype, at::Device(at::kCUDA));
  GatedDeltaRun const fused = run(Backend::kFused, d, c.use_qk_l2norm, schedule);
  GatedDeltaRun const composite = run(Backend::kComposite, d, c.use_qk_l2norm);
  Reference const want = reference(in, c.use_qk_l2norm);
  for (Compared const& x : compared(fused, composite, want, in.cu)) FUSEPACK_EXPECT_PASS(check_output(x, dtype));
}

INSTANTIATE_TEST_SUITE_P(
    Sm90, GatedDeltaFused,
    ::testing::Combine(
        ::testing::Values(Dtype::kBF16, Dtype::kF32, Dtype::kF16),
        ::testing::Values(GatedDeltaSchedule::kFullChain, GatedDeltaSchedule::kLeanChain),
        ::testing::Values(
            // Qwen3.5-9B/35B heads at the benchmark's 8192 tokens, packed and as one example
            GatedDeltaCase{"hk16_hv32_8x1024_state_dfinal", std::vector<int>(8, 1024), 16, 32, 128, 128, true, true,
                           true, -0.05, /*full_only=*/true},
            GatedDeltaCase{"hk16_hv32_1x8192_state_dfinal", {8192}, 16, 32, 128, 128, true, true, true, -0.05, true},
            GatedDeltaCase{"hk16_hv32_seqs_70_1_130", {70, 1, 130}, 16, 32, 128, 128},
            GatedDeltaCase{"qwen35_27b_hk16_hv48_seqs_129_3_state_dfinal", {129, 3}, 16, 48, 128, 128, true, true,
                           true},
            GatedDeltaCase{"hk2_hv4_seqs_1_63_64_65_130_state_dfinal", {1, 63, 64, 65, 130}, 2, 4, 128, 128, true,
                           true, true},
            GatedDeltaCase{"gqa1_hk4_hv4_seqs_100_64", {100, 64}, 4, 4, 128, 128},
            GatedDeltaCase{"gqa3_hk2_hv6_seqs_100_64_state", {100, 64}, 2, 6, 128, 128, true, true, false},
            GatedDeltaCase{"length_1_hk2_hv4", {1}, 2, 4, 128, 128},
            GatedDeltaCase{"300_examples_1_to_6_hk2_hv4_state_dfinal", repeated_lengths(300, 6), 2, 4, 128, 128, true,
                           true, true},
            GatedDeltaCase{"empty_examples_seqs_0_5_0_70_0_state_dfinal", {0, 5, 0, 70, 0}, 2, 4, 128, 128, true,
                           true, true},
            GatedDeltaCase{"one_example_1000_hk1_hv2", {1000}, 1, 2, 128, 128},
            GatedDeltaCase{"no_l2norm_seqs_17_64_1", {17, 64, 1}, 2, 4, 128, 128, false},
            GatedDeltaCase{"strong_decay_seqs_130_65_state_dfinal", {130, 65}, 2, 4, 128, 128, true, true, true,
                           -4.0},
            // K = V = 64, the other head size the kernels are compiled for (the qwen35-tiny64 preset's)
            GatedDeltaCase{"k64_hk2_hv4_seqs_1_63_64_65_130_state_dfinal", {1, 63, 64, 65, 130}, 2, 4, 64, 64, true,
                           true, true},
            GatedDeltaCase{"k64_gqa3_hk2_hv6_seqs_100_64_300", {100, 64, 300}, 2, 6, 64, 64},
            // Edge packs (the FlashAttention-varlen class of bugs around empty and one-token examples).
            // Every example of length 1 (max_seqlen 1): every chunk is one token, and each example's state takes one
            // step from its own initial state.
            GatedDeltaCase{"37_examples_of_1_hk2_hv4_state_dfinal", std::vector<int>(37, 1), 2, 4, 128, 128, true, true,
                           true},
            // One token in all, with a state in and out ("length_1_hk2_hv4" above has neither).
            GatedDeltaCase{"length_1_hk2_hv4_state_dfinal", {1}, 2, 4, 128, 128, true, true, true},
            // Chunk edges (kGatedDeltaChunk = 64, kernels/gated_delta/gated_delta.h; kChunk in
            // gated_delta_{fwd,bwd}_kernels.cuh): one example of exactly one chunk, two examples of one chunk each
            // (the second starting on a chunk boundary), examples one short of, at and one past a chunk.
            GatedDeltaCase{"one_example_64_hk2_hv4_state_dfinal", {64}, 2, 4, 128, 128, true, true, true},
            GatedDeltaCase{"seqs_64_64_hk2_hv4_state_dfinal", {64, 64}, 2, 4, 128, 128, true, true, true},
            GatedDeltaCase{"seqs_63_1_64_65_hk2_hv4_state_dfinal", {63, 1, 64, 65}, 2, 4, 128, 128, true, true, true},
            // Empty examples at the start, middle and end next to a one-chunk and a one-token example: no chunks, so
            // their final state is their initial state and dinitial_state their dfinal_state; the chunk table's
            // per-example offsets must skip them.
            GatedDeltaCase{"empty_examples_seqs_0_64_0_1_0_state_dfinal", {0, 64, 0, 1, 0}, 2, 4, 128, 128, true, true,
                           true},
            // The same edges at K = V = 64.
            GatedDeltaCase{"k64_37_examples_of_1_state_dfinal", std::vector<int>(37, 1), 2, 4, 64, 64, true, true,
                           true},
            GatedDeltaCase{"k64_seqs_0_1_0_64_64_65_0_state_dfinal", {0, 1, 0, 64, 64, 65, 0}, 2, 4, 64, 64, true,
                           true, true})),
    [](auto const& tc) {
      return std::string(dtype_name(std::get<0>(tc.param))) + "_" + schedule_label(std::get<1>(tc.param)) + "_" +
             std::get<2>(tc.param).name;
    });

TEST(GatedDeltaFused, ZeroTokensPassTheStateThrough) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  GatedDeltaCase const c{"no_tokens", {0, 0}, 2, 4, 128, 128, true, true, true};
  auto rng = test_rng();
  DeviceInputs const d = to_device(draw(c, Dtype::kBF16, rng), Dtype::kBF16, at::Device(at::kCUDA));
  GatedDeltaRun const r = run(Backend::kFused, d, true);
  EXPECT_EQ(r.o.sizes(), (std::vector<int64_t>{0, 4, 128}));
  EXPECT_EQ(r.dk.sizes(), (std::vector<int64_t>{0, 2, 128}));
  EXPECT_TRUE(at::equal(r.final_state, d.initial_state));
  EXPECT_TRUE(at::equal(r.dinitial_state, d.dfinal_state));
}

// Every output and gradient of two runs, bit for bit.
void expect_bitwise_equal(GatedDeltaRun const& a, GatedDeltaRun const& b) {
  EXPECT_TRUE(at::equal(a.o, b.o));
  EXPECT_TRUE(at::equal(a.final_state, b.final_state));
  EXPECT_TRUE(at::equal(a.dq, b.dq));
  EXPECT_TRUE(at::equal(a.dk, b.dk));
  EXPECT_TRUE(at::equal(a.dv, b.dv));
  EXPECT_TRUE(at::equal(a.dg, b.dg));
  EXPECT_TRUE(at::equal(a.dbeta, b.dbeta));
  EXPECT_TRUE(at::equal(a.dinitial_state, b.dinitial_state));
}

TEST(GatedDeltaFused, BackwardIsBitwiseDeterministic) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  GatedDeltaCase const c{"determinism", {1, 17, 300, 1024, 64}, 16, 32, 128, 128, true, true, true};
  auto rng = test_rng();
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF32}) {
    DeviceInputs const d = to_device(draw(c, dtype, rng), dtype, at::Device(at::kCUDA));
    // Under each forced schedule: two different forward pipelines, and the backward runs on what each one saved.
    for (GatedDeltaSchedule schedule : {GatedDeltaSchedule::kFullChain, GatedDeltaSchedule::kLeanChain}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", " + gated_delta_schedule_name(schedule));
      expect_bitwise_equal(run(Backend::kFused, d, true, schedule), run(Backend::kFused, d, true, schedule));
    }
  }
}

// The forward without gradients (inference: nothing saved for a backward) runs kernels of its own, which write none of
// the saved tensors (and the lean chain hands the state to the output kernel as its bf16 parts in 16-bit runs, not in
// fp32). Its o and final state equal the training forward's bit for bit (the same products over the same parts), under
// both schedules, in every dtype, at both head sizes, across empty, one-token and chunk-edge examples. Planted: the
// chain storing the two parts in each other's tile fails it (o differs).
TEST(GatedDeltaFused, ForwardWithoutGradientsEqualsTheTrainingForward) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  for (GatedDeltaCase const& c :
       {GatedDeltaCase{"seqs_0_1_63_64_65_130_state_final", {0, 1, 63, 64, 65, 130}, 2, 4, 128, 128, true, true, true},
        GatedDeltaCase{"k64_gqa3_seqs_100_64_300", {100, 64, 300}, 2, 6, 64, 64},
        GatedDeltaCase{"hk16_hv32_seqs_1000_70_no_l2norm", {1000, 70}, 16, 32, 128, 128, false}}) {
    for (Dtype dtype : {Dtype::kBF16, Dtype::kF16, Dtype::kF32}) {
      DeviceInputs const d = to_device(draw(c, dtype, rng), dtype, at::Device(at::kCUDA));
      for (GatedDeltaSchedule schedule : {GatedDeltaSchedule::kFullChain, GatedDeltaSchedule::kLeanChain}) {
        SCOPED_TRACE(c.name + ", " + dtype_name(dtype) + ", " + gated_delta_schedule_name(schedule));
        GatedDeltaRun const trained = run(Backend::kFused, d, c.use_qk_l2norm, schedule);
        at::NoGradGuard no_grad;
        ops::GatedDeltaResult const inferred = ops::gated_delta(d.q, d.k, d.v, d.g, d.beta, d.cu, d.scale,
                                                                c.use_qk_l2norm, Backend::kFused, d.initial_state,
                                                                c.final_state, schedule);
        EXPECT_TRUE(at::equal(inferred.o, trained.o));
        if (c.final_state) {
          EXPECT_TRUE(at::equal(inferred.final_state, trained.final_state));
        }
      }
    }
  }
}

// A gradient of o that arrives at an odd offset (a view 2 bytes past a 16-byte boundary, as a narrow of a larger
// buffer gives) is copied before the kernels read it in 16-byte vectors: the gradients equal those from the same values
// aligned. Planted: without the copy the backward refuses it ("dout must be 16-byte aligned") and this fails.
TEST(GatedDeltaFused, TakesAGradientAtAnOddOffset) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  GatedDeltaCase const c{"odd_dout", {70, 1, 130}, 2, 4, 128, 128, true, true, true};
  auto rng = test_rng();
  DeviceInputs d = to_device(draw(c, Dtype::kBF16, rng), Dtype::kBF16, at::Device(at::kCUDA));
  GatedDeltaRun const aligned = run(Backend::kFused, d, true);
  at::Tensor const buffer = at::empty({d.dout.numel() + 1}, d.dout.options());
  at::Tensor const odd = buffer.narrow(0, 1, d.dout.numel()).view(d.dout.sizes());
  odd.copy_(d.dout);
  ASSERT_NE(reinterpret_cast<std::uintptr_t>(odd.data_ptr()) % 16, 0u);
  d.dout = odd;
  expect_bitwise_equal(aligned, run(Backend::kFused, d, true));
}

// The device chunk table is remembered per cu_seqlens tensor to spare a copy per layer; an in-place write to
// cu_seqlens must rebuild it: the result then equals that of a fresh tensor holding the new values.
TEST(GatedDeltaFused, RebuildsTheChunkTableWhenCuSeqlensIsWrittenInPlace) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  GatedDeltaCase const c{"chunk_table", {100, 60}, 2, 4, 128, 128};
  auto rng = test_rng();
  DeviceInputs d = to_device(draw(c, Dtype::kBF16, rng), Dtype::kBF16, at::Device(at::kCUDA));
  at::NoGradGuard no_grad;
  auto fused = [&](at::Tensor const& cu) {
    return ops::gated_delta(d.q, d.k, d.v, d.g, d.beta, cu, d.scale, true, Backend::kFused).o;
  };
  at::Tensor const before = fused(d.cu);
  d.cu[1].fill_(30);  // examples of 30 and 130 tokens now
  at::Tensor const after = fused(d.cu);
  at::Tensor const fresh = fused(at::tensor(std::vector<int32_t>{0, 30, 160}, at::kInt).to(at::kCUDA));
  EXPECT_TRUE(at::equal(after, fresh)) << "the chunk table of the old cu_seqlens values was used";
  EXPECT_FALSE(at::equal(after, before));
}

// ---------------------------------------------------------------------------------------------------------------
// Long examples on the GPU (full level): one example of 32768 and one of 65536 tokens at the Qwen3.5-9B/35B heads,
// 512 and 1024 chunks in a row on the state chain, bf16, under both forced schedules.
//
// The fused kernels and the composite run on all 32 value heads (so the kernels see the model's grid), but the fp64
// reference covers only key head 0 and the 2 value heads that read it: its per-token recurrence over all heads would
// take 16 times as long, and each [65536, 32, 128] fp64 tensor of its inputs, outputs and gradients takes 2 GB (its
// backward also keeps the state entering every token of the head it walks, 8.6 GB at 65536 tokens, whatever the
// number of heads). The subset is exact: value head j reads only key head j / (Hv/Hk), so key head 0 with value heads
// 0 .. Hv/Hk − 1 is a gated delta problem of its own (Hk = 1, Hv = Hv/Hk) whose o, final state and gradients of v, g,
// β and the initial state are those heads' slices of the full problem's, and dq, dk of key head 0 sum over exactly
// those value heads. The fused and composite results are sliced the same way and checked as in MatchesReference.

// Heads [begin, end) (dimension 1) of a packed [T, H, ...] tensor or of a state [N, H, K, V], as a new tensor; an
// undefined tensor stays undefined.
Tensor heads(Tensor const& t, ref::Index begin, ref::Index end) {
  if (!t.defined()) return t;
  ref::Shape shape = t.shape();
  ref::Index const outer = shape[0], H = shape[1], n = end - begin;
  ref::Index inner = 1;
  for (size_t i = 2; i < shape.size(); ++i) inner *= shape[i];
  shape[1] = n;
  Tensor out(shape);
  for (ref::Index i = 0; i < outer; ++i) {
    std::copy_n(t.data() + (i * H + begin) * inner, n * inner, out.data() + i * n * inner);
  }
  return out;
}

// The inputs of key head 0 and of the `group` = Hv/Hk value heads that read it.
GatedDeltaInputs key_head_0(GatedDeltaInputs const& in, ref::Index group) {
  GatedDeltaInputs s;
  s.cu = in.cu;
  s.scale = in.scale;
  s.q = heads(in.q, 0, 1);
  s.k = heads(in.k, 0, 1);
  s.v = heads(in.v, 0, group);
  s.g = heads(in.g, 0, group);
  s.beta = heads(in.beta, 0, group);
  s.dout = heads(in.dout, 0, group);
  s.initial_state = heads(in.initial_state, 0, group);
  s.dfinal_state = heads(in.dfinal_state, 0, group);
  return s;
}

// The same heads of a run, copied: a view would keep the memory of all heads alive.
GatedDeltaRun key_head_0(GatedDeltaRun const& r, int64_t group) {
  auto cut = [](at::Tensor const& t, int64_t n) {
    return t.defined() ? t.slice(1, 0, n).clone(at::MemoryFormat::Contiguous) : at::Tensor();
  };
  GatedDeltaRun s;
  s.o = cut(r.o, group);
  s.final_state = cut(r.final_state, group);
  s.dq = cut(r.dq, 1);
  s.dk = cut(r.dk, 1);
  s.dv = cut(r.dv, group);
  s.dg = cut(r.dg, group);
  s.dbeta = cut(r.dbeta, group);
  s.dinitial_state = cut(r.dinitial_state, group);
  return s;
}

class GatedDeltaFusedLong : public ::testing::TestWithParam<std::tuple<GatedDeltaSchedule, GatedDeltaCase>> {};

TEST_P(GatedDeltaFusedLong, MatchesReferenceOnKeyHead0) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto const& [schedule, c] = GetParam();
  if (c.full_only && test_level() != TestLevel::kFull) {
    GTEST_SKIP() << "full level only: the fp64 reference of this case takes minutes (FUSEPACK_TEST_LEVEL=full)";
  }
  Dtype const dtype = Dtype::kBF16;
  int64_t const group = c.Hv / c.Hk;
  // the same draw for both schedules
  std::mt19937_64 rng(seed_for("Sm90/GatedDeltaFusedLong.MatchesReferenceOnKeyHead0/bf16_" + c.name));
  DeviceInputs d;
  GatedDeltaInputs sub;
  {  // the fp64 inputs of all heads (6.4 GB at 65536 tokens) live only for this scope
    GatedDeltaInputs const in = draw(c, dtype, rng);
    d = to_device(in, dtype, at::Device(at::kCUDA));
    sub = key_head_0(in, group);
  }
  GatedDeltaRun const fused = key_head_0(run(Backend::kFused, d, c.use_qk_l2norm, schedule), group);
  GatedDeltaRun const composite = key_head_0(run(Backend::kComposite, d, c.use_qk_l2norm), group);
  Reference const want = reference(sub, c.use_qk_l2norm);
  for (Compared const& x : compared(fused, composite, want, sub.cu)) FUSEPACK_EXPECT_PASS(check_output(x, dtype));
}

INSTANTIATE_TEST_SUITE_P(
    Sm90, GatedDeltaFusedLong,
    ::testing::Combine(
        ::testing::Values(GatedDeltaSchedule::kFullChain, GatedDeltaSchedule::kLeanChain),
        ::testing::Values(// Heads without decay (g = 0, a quarter of the heads in FlashQLA's benchmark): dh_next keeps
                          // dfinal_state's scale in every chunk, where the bf16 backward's dg has the least margin
                          // (kernels/gated_delta/NOTES.md, the split policy's CPU emulation: up to 82% at 4096 tokens).
                          GatedDeltaCase{"hk16_hv32_1x4096_state_dfinal_no_decay", {4096}, 16, 32, 128, 128, true,
                                         true, true, 0.0},
                          GatedDeltaCase{"hk16_hv32_1x32768_state_dfinal_no_decay", {32768}, 16, 32, 128, 128, true,
                                         true, true, 0.0, /*full_only=*/true},
                          GatedDeltaCase{"hk16_hv32_1x32768_state_dfinal", {32768}, 16, 32, 128, 128, true, true, true,
                                         -0.05, /*full_only=*/true},
                          GatedDeltaCase{"hk16_hv32_1x65536_state_dfinal", {65536}, 16, 32, 128, 128, true, true, true,
                                         -0.05, true})),
    [](auto const& tc) {
      return std::string(dtype_name(Dtype::kBF16)) + "_" + schedule_label(std::get<0>(tc.param)) + "_" +
             std::get<1>(tc.param).name;
    });

// ---------------------------------------------------------------------------------------------------------------
// Bad input, refused before anything runs, with the reason.

struct BadInputs {
  at::Tensor q, k, v, g, beta, cu, initial_state;
  double scale = 0.5;
  Backend backend = Backend::kComposite;
  GatedDeltaSchedule schedule = GatedDeltaSchedule::kByShape;
  std::function<void()> call() const {
    BadInputs const b = *this;
    return [b] {
      ops::gated_delta(b.q, b.k, b.v, b.g, b.beta, b.cu, b.scale, true, b.backend, b.initial_state, true,
                       b.schedule);
    };
  }
};

BadInputs good_inputs(at::TensorOptions opts, int64_t K = 8) {
  BadInputs b;
  b.q = at::randn({5, 2, K}, opts);
  b.k = at::randn({5, 2, K}, opts);
  b.v = at::randn({5, 4, K}, opts);
  b.g = -at::rand({5, 4}, opts.dtype(at::kFloat));
  b.beta = at::rand({5, 4}, opts);
  b.cu = at::tensor(std::vector<int32_t>{0, 2, 5}, opts.dtype(at::kInt));
  b.initial_state = at::randn({2, 4, K, K}, opts.dtype(at::kFloat));
  return b;
}

TEST(GatedDeltaOps, RejectsBadInput) {
  use_one_cpu_thread();
  BadInputs const good = good_inputs(at::TensorOptions().dtype(at::kFloat));
  good.call()();  // the baseline call is valid
  BadInputs b = good;
  b.v = at::randn({5, 6, 8});
  b.g = at::zeros({5, 6});
  b.beta = at::zeros({5, 6});
  b.initial_state = at::Tensor();
  b.q = at::randn({5, 4, 8});
  b.k = at::randn({5, 4, 8});
  expect_torch_error(b.call(),
                     "the value heads Hv=6 (v dimension 1) must be a positive multiple of the key heads Hk=4");
  b = good;
  b.k = at::randn({5, 2, 6});
  expect_torch_error(b.call(), "k has shape [5, 2, 6]; expected 8 in dimension 2");
  b = good;
  b.v = at::randn({4, 4, 8});
  expect_torch_error(b.call(), "v has shape [4, 4, 8]; expected 5 in dimension 0");
  b = good;
  b.g = at::zeros({5, 2});
  expect_torch_error(b.call(), "g has shape [5, 2]; expected 4 in dimension 1");
  b = good;
  b.v = good.v.to(at::kBFloat16);
  expect_torch_error(b.call(), "v has dtype BFloat16 but q has Float");
  b = good;
  b.g = good.g.to(at::kBFloat16);
  expect_torch_error(b.call(), "g must be Float; got BFloat16");
  b = good;
  b.beta = good.beta.to(at::kDouble);
  expect_torch_error(b.call(), "beta has dtype Double but q has Float");
  b = good;
  b.initial_state = good.initial_state.to(at::kDouble);
  expect_torch_error(b.call(), "initial_state must be Float; got Double");
  b = good;
  b.initial_state = at::zeros({3, 4, 8, 8});
  expect_torch_error(b.call(), "initial_state has shape [3, 4, 8, 8]; expected 2 in dimension 0");
  b = good;
  b.cu = good.cu.to(at::kLong);
  expect_torch_error(b.call(), "cu_seqlens must be int32");
  b = good;
  b.cu = at::tensor(std::vector<int32_t>{0, 3, 2, 5}, at::kInt);
  expect_torch_error(b.call(), "cu_seqlens must be non-decreasing; got cu_seqlens[1]=3 > cu_seqlens[2]=2");
  b = good;
  b.cu = at::tensor(std::vector<int32_t>{0, 2, 4}, at::kInt);
  expect_torch_error(b.call(), "cu_seqlens must end at the number of tokens T=5; got cu_seqlens[2]=4");
  b = good;
  b.cu = at::tensor(std::vector<int32_t>{1, 2, 5}, at::kInt);
  expect_torch_error(b.call(), "cu_seqlens must start at 0");
  for (double scale : {0.0, -1.0, std::nan("")}) {
    b = good;
    b.scale = scale;
    expect_torch_error(b.call(), "scale must be positive and finite");
  }
  // The fused backend never falls back: sizes it has no kernel for are refused with K and V named, CPU tensors with
  // the reason.
  b = good;
  b.backend = Backend::kFused;
  expect_torch_error(b.call(), "the fused kernel supports K = V in {64, 128}; got K=8 (q dimension 2) and V=8");
  BadInputs wide = good_inputs(at::TensorOptions().dtype(at::kFloat), 128);
  wide.backend = Backend::kFused;
  wide.v = at::randn({5, 4, 64});
  wide.initial_state = at::Tensor();
  expect_torch_error(wide.call(), "got K=128 (q dimension 2) and V=64 (v dimension 2)");
  wide = good_inputs(at::TensorOptions().dtype(at::kFloat), 128);
  wide.backend = Backend::kFused;
  expect_torch_error(wide.call(), "CUDA");
}

// The schedule is the fused kernels' choice: the composite has one way to compute o, so it refuses a forced one rather
// than ignore it (a test or benchmark forcing a schedule on it would check or time something other than it asked).
TEST(GatedDeltaComposite, RefusesAForcedSchedule) {
  use_one_cpu_thread();
  for (GatedDeltaSchedule schedule : {GatedDeltaSchedule::kFullChain, GatedDeltaSchedule::kLeanChain}) {
    BadInputs b = good_inputs(at::TensorOptions().dtype(at::kFloat));
    b.schedule = schedule;
    expect_torch_error(b.call(), std::string("the schedule '") + gated_delta_schedule_name(schedule) +
                                     "' is a choice of the fused kernels");
  }
}

// The chain steps the by-shape rule compares (gated_delta_chain_steps): blocks handed out longest first, each to the
// place that frees first. Expected values worked by hand. Planted: every block starting at step 0 (places without
// limit) gives 16 and 128 for the two multi-wave cases and 5 for the hand-worked one, and fails here.
TEST(GatedDeltaSchedules, ChainStepsHandBlocksToTheFirstFreePlace) {
  // equal lengths: waves × chunks; 8 × 1024 tokens at Hv = 32 is 8 · 128 lean blocks of 16 chunks, 264 places: 4 waves
  EXPECT_EQ(gated_delta_chain_steps(std::vector<std::int64_t>(8, 16), 128, 264), 64);
  EXPECT_EQ(gated_delta_chain_steps({128}, 128, 132), 128);  // one wave: the example's chunks
  EXPECT_EQ(gated_delta_chain_steps({128}, 192, 132), 256);  // 192 blocks on 132 places: two waves
  // chunks {5, 3, 2, 2}, one block each, two places: 5 | 3, then 2 on the place free at 3 (ends 5), then 2 at 5 → 7
  EXPECT_EQ(gated_delta_chain_steps({5, 3, 2, 2}, 1, 2), 7);
  // the longest bounds it when the rest fill in behind: {6, 1 × 4} on two places: 6 | 1, 1, 1, 1 → 6
  EXPECT_EQ(gated_delta_chain_steps({6, 1, 1, 1, 1}, 1, 2), 6);
  // empty examples take no place and no step
  EXPECT_EQ(gated_delta_chain_steps({3, 0, 0}, 4, 1), 12);
  EXPECT_EQ(gated_delta_chain_steps({0, 0}, 4, 1), 0);
  EXPECT_EQ(gated_delta_chain_steps({}, 4, 1), 0);
  FUSEPACK_EXPECT_INVALID_ARGUMENT(gated_delta_chain_steps({2, 3}, 1, 1),
                                   "chunk counts must be >= 0 and in non-increasing order; got 3 after 2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(gated_delta_chain_steps({-1}, 1, 1), "got -1 after -1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(gated_delta_chain_steps({1}, 0, 1),
                                   "expected blocks_per_example >= 1 and slots >= 1; got 0 and 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(gated_delta_chain_steps({1}, 1, 0), "got 1 and 0");
}

// The by-shape rule both passes apply (gated_delta_pick_schedule): the lean chain exactly when its steps are at most
// the given multiple of the full chain's. The edge cases catch a '<' planted for the '<=' (150 ≤ 1.5 · 100 would run
// the full chain).
TEST(GatedDeltaSchedules, ByShapeIsLeanWithinItsStepRatio) {
  using S = GatedDeltaSchedule;
  EXPECT_EQ(gated_delta_pick_schedule(S::kByShape, 150, 100, 1.5), S::kLeanChain);
  EXPECT_EQ(gated_delta_pick_schedule(S::kByShape, 151, 100, 1.5), S::kFullChain);
  EXPECT_EQ(gated_delta_pick_schedule(S::kByShape, 128, 128, 1.0), S::kLeanChain);
  EXPECT_EQ(gated_delta_pick_schedule(S::kByShape, 0, 0, 1.0), S::kLeanChain);  // no chunks: either; lean
  // a forced schedule whatever the shape
  EXPECT_EQ(gated_delta_pick_schedule(S::kFullChain, 1, 100, 2.0), S::kFullChain);
  EXPECT_EQ(gated_delta_pick_schedule(S::kLeanChain, std::int64_t(1) << 40, 1, 1.0), S::kLeanChain);
  // Hv·V/32 lean blocks per example
  EXPECT_EQ(gated_delta_lean_blocks_per_example(32, 128), 128);
  EXPECT_EQ(gated_delta_lean_blocks_per_example(48, 64), 96);
  // blocks per multiprocessor: 1 KB reserved per block, at least one
  EXPECT_EQ(gated_delta_blocks_per_sm(100 * 1024, 233472), 2);
  EXPECT_EQ(gated_delta_blocks_per_sm(114 * 1024, 233472), 1);
  EXPECT_EQ(gated_delta_blocks_per_sm(300 * 1024, 233472), 1);
}

// Arguments no GPU has are refused with the values, not turned into a schedule.
TEST(GatedDeltaSchedules, RefusesImpossibleFigures) {
  using S = GatedDeltaSchedule;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(
      gated_delta_pick_schedule(S::kByShape, -1, 10, 1.0),
      "expected lean_steps >= 0, full_steps >= 0 and lean_steps_per_full_step > 0; got -1, 10 and 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(gated_delta_pick_schedule(S::kLeanChain, 1, -2, 1.0), "got 1, -2 and 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(gated_delta_pick_schedule(S::kByShape, 1, 1, 0.0), "got 1, 1 and 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(gated_delta_blocks_per_sm(1024, 0),
                                   "shared memory per multiprocessor must be positive; got 0 bytes");
}

#ifdef FUSEPACK_TEST_CUDA_KERNELS
// Params of a bf16 shape at K = V = 128 over `t` (the host chunk table the by-shape rule reads).
GatedDeltaFwdParams schedule_params(GatedDeltaChunkTable const& t, int Hv) {
  GatedDeltaFwdParams p;
  p.chunks_host = t.data.data();
  p.N = t.N;
  p.NC = t.NC;
  p.Hk = 16;
  p.Hv = Hv;
  return p;
}

// What the op runs by default at the shapes kernels/gated_delta/NOTES.md reports, on the H200's figures (132 SMs of
// 233,472 bytes of shared memory; host arithmetic, no device needed), against the schedule each pass measured faster
// there (fusepack-bench gated_delta, both forced schedules). The places follow from the kernels' shared memory and
// registers (bf16, K = 128: lean two blocks per SM forward, one backward, the backward's of 64 value columns): a
// kernel change that moves them changes which schedule these shapes run, and the notes' by-shape timings with it, so
// it has to show up here.
TEST(GatedDeltaSchedules, ByShapeOnTheH200) {
  using S = GatedDeltaSchedule;
  constexpr int kSms = 132, kSmemPerSm = 233472;
  GatedDeltaChunkTable const one = gated_delta_chunk_table({0, 8192});
  GatedDeltaFwdParams const p = schedule_params(one, 32);
  EXPECT_EQ(gated_delta_fwd_chain_places(p, S::kLeanChain, kSms, kSmemPerSm).slots, 2 * kSms);
  EXPECT_EQ(gated_delta_bwd_chain_places(p, S::kLeanChain, kSms, kSmemPerSm).slots, kSms);
  EXPECT_EQ(gated_delta_bwd_chain_places(p, S::kLeanChain, kSms, kSmemPerSm).blocks_per_example, 64);
  EXPECT_EQ(gated_delta_fwd_chain_places(p, S::kLeanChain, kSms, kSmemPerSm).blocks_per_example, 128);
  struct Shape {
    char const* name;
    std::vector<int> lengths;
    int Hv;
    S fwd, bwd;
  };
  // Packs as the trainer makes them at Qwen3.5-0.8B's heads (log-normal lengths, median 900, 8,192 tokens): the
  // forward ran lean faster in all, the backward lean up to a step ratio of 2.0 (counted in 64-column blocks, at most
  // 1.45 in these packs), and the backward at 8 × 1024 (2.0) lean faster since its recurrence runs in warpgroups.
  std::vector<Shape> shapes{
      {"1x8192 Hv=32", {8192}, 32, S::kLeanChain, S::kLeanChain},
      {"1x32768 Hv=32", {32768}, 32, S::kLeanChain, S::kLeanChain},
      {"8x1024 Hv=32", std::vector<int>(8, 1024), 32, S::kFullChain, S::kLeanChain},
      {"1x8192 Hv=48 (Qwen3.5-27B)", {8192}, 48, S::kLeanChain, S::kLeanChain},
      {"8x1024 Hv=48", std::vector<int>(8, 1024), 48, S::kFullChain, S::kLeanChain},
      {"pack 2840 x9", {2840, 415, 1210, 655, 980, 301, 760, 532, 499}, 16, S::kLeanChain, S::kLeanChain},
      {"pack 6086 x3", {6086, 1059, 802}, 16, S::kLeanChain, S::kLeanChain},
      {"pack 317 x7", {317, 634, 2460, 2828, 317, 310, 869}, 16, S::kLeanChain, S::kLeanChain},
      {"pack 285 x9", {285, 1056, 1001, 1393, 433, 904, 855, 270, 1384}, 16, S::kLeanChain, S::kLeanChain},
      {"pack 1055 x5", {1055, 1862, 672, 1072, 2042}, 16, S::kLeanChain, S::kLeanChain},
      {"pack 997 x6", {997, 379, 1285, 957, 1602, 1070}, 16, S::kLeanChain, S::kLeanChain},
      {"pack 864 x6", {864, 1058, 1534, 377, 653, 603}, 16, S::kLeanChain, S::kLeanChain},
      {"pack 836 x7", {836, 1517, 1477, 719, 260, 1947, 650}, 16, S::kLeanChain, S::kLeanChain}};
  for (Shape const& s : shapes) {
    SCOPED_TRACE(s.name);
    GatedDeltaChunkTable const t = gated_delta_chunk_table(cu_seqlens_from_lengths(s.lengths));
    GatedDeltaFwdParams const q = schedule_params(t, s.Hv);
    EXPECT_EQ(gated_delta_pick_schedule_for(q, GatedDeltaPass::kForward, kSms, kSmemPerSm), s.fwd);
    EXPECT_EQ(gated_delta_pick_schedule_for(q, GatedDeltaPass::kBackward, kSms, kSmemPerSm), s.bwd);
  }
  // Each pass remembers its last choice (every layer of a step asks for the same pack); asked again for the same
  // examples at other heads it chooses again: in fp16 (32-column lean blocks) eight examples of 1024 tokens run the
  // backward lean at Hv = 8 (two waves of lean blocks, twice the full chain's steps) and full at Hv = 32 (four times).
  // Planted: the memory keyed on the examples' chunks alone answers the Hv = 32 backward with the Hv = 8 choice
  // (lean) and fails here.
  GatedDeltaChunkTable const eight = gated_delta_chunk_table(cu_seqlens_from_lengths(std::vector<int>(8, 1024)));
  GatedDeltaFwdParams hv8 = schedule_params(eight, 8);
  hv8.Hk = 8;
  hv8.dtype = DType::kF16;
  GatedDeltaFwdParams hv32 = schedule_params(eight, 32);
  hv32.dtype = DType::kF16;
  for (int again = 0; again < 2; ++again) {
    EXPECT_EQ(gated_delta_pick_schedule_for(hv8, GatedDeltaPass::kBackward, kSms, kSmemPerSm), S::kLeanChain);
    EXPECT_EQ(gated_delta_pick_schedule_for(hv32, GatedDeltaPass::kBackward, kSms, kSmemPerSm), S::kFullChain);
  }
  GatedDeltaFwdParams no_table = p;
  no_table.chunks_host = nullptr;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(gated_delta_pick_schedule_for(no_table, GatedDeltaPass::kForward, kSms, kSmemPerSm),
                                   "the by-shape schedule reads each example's chunks from the host chunk table");
  no_table.K = no_table.V = 96;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(gated_delta_fwd_chain_places(no_table, S::kLeanChain, kSms, kSmemPerSm),
                                   "the fused kernel supports K = V in {64, 128}; got K=96");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(gated_delta_bwd_chain_places(p, S::kByShape, kSms, kSmemPerSm),
                                   "needs a forced schedule");
}

// The chunk table's example order for the recurrences: most chunks first, ties in example order, empty examples last.
// (The kernels' results do not depend on it, only when each example's blocks start; an ascending sort fails here.)
TEST(GatedDeltaChunkTables, ListExamplesLongestFirst) {
  //                                                     chunks: 1  0  3    2    3    1
  GatedDeltaChunkTable const t = gated_delta_chunk_table(cu_seqlens_from_lengths({5, 0, 130, 128, 129, 64}));
  ASSERT_EQ(t.N, 6);
  ASSERT_EQ(t.NC, 10);
  GatedDeltaChunks const view{t.data.data(), t.NC, t.N};
  std::vector<int> order;
  for (int i = 0; i < t.N; ++i) order.push_back(view.example_by_length(i));
  EXPECT_EQ(order, (std::vector<int>{2, 4, 3, 0, 5, 1}));
  EXPECT_EQ(t.data.size(), std::size_t(3 * 10 + 2 * 6 + 1));
  EXPECT_EQ(view.first_chunk(6), 10);  // the layout before by_length unchanged
  EXPECT_EQ(view.example(9), 5);
  EXPECT_EQ(gated_delta_chunk_table({0}).data.size(), std::size_t(1));
}

// The recurrences' blocks: [example by length][value head][value tile], so the longest example's blocks are handed out
// first, and every (example, head, tile) runs once. Planted: the head and the tile decoded in the other order
// (head fastest) put block 1 on head 1, tile 0 and fail at once.
TEST(GatedDeltaChunkTables, ChainBlocksRunEveryExampleHeadAndTileOnceLongestFirst) {
  GatedDeltaChunkTable const t = gated_delta_chunk_table(cu_seqlens_from_lengths({5, 0, 130, 128, 129, 64}));
  GatedDeltaChunks const view{t.data.data(), t.NC, t.N};
  constexpr int kHv = 3, kTiles = 4;
  std::vector<std::array<int, 3>> expected;  // (example, head, tile) in grid order
  for (int example : {2, 4, 3, 0, 5, 1}) {   // longest first (ListExamplesLongestFirst)
    for (int head = 0; head < kHv; ++head) {
      for (int tile = 0; tile < kTiles; ++tile) expected.push_back({example, head, tile});
    }
  }
  for (std::size_t b = 0; b < expected.size(); ++b) {
    GatedDeltaChunks::ChainBlock const got = view.chain_block(static_cast<std::int64_t>(b), kHv, kTiles);
    EXPECT_EQ((std::array<int, 3>{got.example, got.head, got.tile}), expected[b]) << "block " << b;
  }
}

// The backward's kernels read q, k, v and dout and store dv in 16-byte vectors: a pointer off that grid is refused by
// name before anything runs (host check, no device). Planted: without the check these params reach the launch (and a
// misaligned vector access on a device), and the expected refusal never comes.
TEST(GatedDeltaBackwardParams, RefusesTensorsOffTheVectorGrid) {
  alignas(16) static unsigned char memory[64];
  void* const aligned = memory;
  GatedDeltaBwdParams p;
  p.K = p.V = 128;
  p.Hk = p.Hv = 1;
  p.T = p.N = p.NC = 1;
  p.chunks = reinterpret_cast<std::int32_t const*>(memory);
  p.q = p.k = p.v = p.dout = aligned;
  p.g = reinterpret_cast<float const*>(memory);
  p.beta = aligned;
  p.dq = p.dk = p.dv = p.dbeta = aligned;
  p.dg = reinterpret_cast<float*>(memory);
  GatedDeltaBwdParams off = p;
  off.dv = memory + 2;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(run_gated_delta_bwd(off, nullptr),
                                   "dv must be 16-byte aligned; got an address 2 bytes past a 16-byte boundary");
  off = p;
  off.dout = memory + 8;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(run_gated_delta_bwd(off, nullptr), "dout must be 16-byte aligned");
  // Aligned, the check moves on (to the saved tensors this params lacks).
  FUSEPACK_EXPECT_INVALID_ARGUMENT(run_gated_delta_bwd(p, nullptr), "q_rstd is null");
}

// The forward's timeline (gated_delta_trace.h): an event's packed word gives back every field at its extremes (the
// H200's 132 SMs, blocks and chunk steps up to 2^24 - 1), for every kind, under the names ci/gated_delta_trace.py
// reads. Planted: the block field one bit narrower (mask 0x7FFFFF) fails at the largest block; the SM field shifted by
// 47 overlaps the block and fails at block 2^24 - 1 with SM 4095.
TEST(GatedDeltaTrace, PackedEventsComeBackAsRecorded) {
  char const* const names[] = {"wy_start",     "wy_end",       "chain_start", "chain_step",  "chain_end",
                               "output_start", "output_ready", "output_end",  "output_built"};
  static_assert(sizeof names / sizeof names[0] == kGatedDeltaTraceKinds, "a name per kind");
  struct Fields {
    int sm, block, step;
  };
  for (int k = 0; k < kGatedDeltaTraceKinds; ++k) {
    auto const kind = static_cast<GatedDeltaTraceKind>(k);
    EXPECT_STREQ(gated_delta_trace_kind_name(kind), names[k]);
    for (Fields const f : {Fields{0, 0, 0}, Fields{131, 4095, 127}, Fields{4095, (1 << 24) - 1, (1 << 24) - 1},
                           Fields{1, 1 << 23, 1}}) {
      std::uint64_t const ns = 0xFEDCBA9876543210ull;
      GatedDeltaTraceEvent const e = gated_delta_trace_unpack(ns, gated_delta_trace_pack(kind, f.sm, f.block, f.step));
      EXPECT_EQ(e.ns, ns);
      EXPECT_EQ(e.kind, kind);
      EXPECT_EQ(e.sm, f.sm);
      EXPECT_EQ(e.block, f.block);
      EXPECT_EQ(e.step, f.step);
    }
  }
}

// A build configured without -DFUSEPACK_GATED_DELTA_TRACE=ON records nothing and says so when asked for a trace,
// naming the option, rather than returning an empty timeline.
TEST(GatedDeltaTrace, ABuildWithoutTheOptionRefusesToTrace) {
  if (gated_delta_trace_built()) GTEST_SKIP() << "this build records the timeline";
  for (int i = 0; i < 2; ++i) {
    try {
      if (i == 0) {
        gated_delta_trace_begin();
      } else {
        gated_delta_trace_end();
      }
      ADD_FAILURE() << "expected std::runtime_error from gated_delta_trace_" << (i == 0 ? "begin" : "end");
    } catch (std::runtime_error const& e) {
      std::printf("[  error   ] %s\n", e.what());
      EXPECT_NE(std::string(e.what()).find("configure with -DFUSEPACK_GATED_DELTA_TRACE=ON"), std::string::npos)
          << e.what();
    }
  }
}
#endif

// fp64 q may bring g and the state in fp64 (the state is then fp64 throughout) or in fp32.
TEST(GatedDeltaOps, Fp64InputTakesFp32OrFp64DecayAndState) {
  use_one_cpu_thread();
  BadInputs b = good_inputs(at::TensorOptions().dtype(at::kDouble));
  b.call()();
  b.g = b.g.to(at::kDouble);
  b.initial_state = b.initial_state.to(at::kDouble);
  auto const r = ops::gated_delta(b.q, b.k, b.v, b.g, b.beta, b.cu, 0.5, true, Backend::kComposite, b.initial_state,
                                  true);
  EXPECT_EQ(r.o.scalar_type(), at::kDouble);
  EXPECT_EQ(r.final_state.scalar_type(), at::kDouble);
  b.g = b.g.to(at::kHalf);
  expect_torch_error(b.call(), "g must be Float or Double (q is Double); got Half");
}

TEST(GatedDeltaFused, RejectsCuSeqlensOnAnotherDevice) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  BadInputs b = good_inputs(at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA), 128);
  b.backend = Backend::kFused;
  b.cu = b.cu.cpu();
  expect_torch_error(b.call(), "the fused kernel needs cu_seqlens on q's device");
  b = good_inputs(at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA), 128);
  b.backend = Backend::kFused;
  b.q = b.q.transpose(0, 1).contiguous().transpose(0, 1);
  expect_torch_error(b.call(), "the fused kernel needs q contiguous");
}

}  // namespace
}  // namespace fusepack::test
