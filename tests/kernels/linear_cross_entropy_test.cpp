// linear_cross_entropy (the LM head and its loss as one op) on both backends against the fp64 reference: logits
// h·Wᵀ computed here with Eigen, ref::cross_entropy_fwd/bwd for the loss and d logits, and d h = d logits · W,
// d W = d logitsᵀ · h. The chunked algorithm of the fused path runs on the CPU too (chunked_linear_cross_entropy), so
// its fp64 and fp32 behaviour is checked here on every chunk size: one token, chunks that do not divide the tokens, one
// chunk, larger than the tokens, automatic. The backward is checked under an incoming gradient of 0.37, not 1 (a
// backward that ignores it, a bug class of such ops, fails). On the GPU (*Fused*): bf16, fp16 and fp32 within twice
// the composite's error (docs/contracts.md, numerics) for vocabularies of whole and partial 16-byte rows, a bad label
// past the check giving NaN, and a peak memory far below the composite's. The fused per-token kernel overwrites the
// logits with their gradient: reading the target's logit after the row is overwritten (another bug class of such
// kernels) changes the loss by about the logit itself, far outside the bound.
#include "kernels/ops/linear_cross_entropy.h"
#include "kernels/ops/op_scope.h"
#include "reference/cross_entropy.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/torch_bridge.h"
#include "verify/random.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>

#ifdef FUSEPACK_TEST_CUDA_MEMORY
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#ifdef FUSEPACK_TEST_CUDA_KERNELS
#include "kernels/linear_cross_entropy/cross_entropy_rows.h"

#include <ATen/cuda/CUDAContext.h>
#endif

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace fusepack::test {
namespace {

using ops::Backend;
using ref::Tensor;

constexpr double kScale = 0.37;  // the incoming gradient of the loss sum

struct Case {
  Tensor hidden, weight;  // [T, H], [V, H]
  std::vector<std::int64_t> labels;
};

// T tokens, every `ignore_every`-th label -100 (0: none), the others uniform in [0, V).
Case make_case(std::int64_t T, std::int64_t H, std::int64_t V, int ignore_every, std::mt19937_64& rng) {
  Case c{randn({T, H}, rng), randn({V, H}, rng, 0.5), {}};
  std::uniform_int_distribution<std::int64_t> token(0, V - 1);
  for (std::int64_t t = 0; t < T; ++t) {
    c.labels.push_back(ignore_every > 0 && t % ignore_every == 0 ? ref::kIgnoreIndex : token(rng));
  }
  return c;
}

struct Expected {
  double loss = 0;
  Tensor dhidden, dweight;  // for an incoming gradient of kScale
};

Expected reference(Case const& c) {
  std::int64_t const T = c.hidden.size(0), V = c.weight.size(0), H = c.hidden.size(1);
  Tensor logits({T, V});
  if (T > 0) logits.mat({}) = c.hidden.mat({}) * c.weight.mat({}).transpose();
  Expected e{ref::cross_entropy_fwd(logits, c.labels).loss_sum, Tensor({T, H}), Tensor({V, H})};
  Tensor const dlogits = ref::cross_entropy_bwd(kScale, logits, c.labels);
  if (T > 0) {
    e.dhidden.mat({}) = dlogits.mat({}) * c.weight.mat({});
    e.dweight.mat({}) = dlogits.mat({}).transpose() * c.hidden.mat({});
  }
  return e;
}

struct LceRun {
  at::Tensor loss, dhidden, dweight;
};

using Op = std::function<at::Tensor(at::Tensor const&, at::Tensor const&, at::Tensor const&)>;

// The op's loss and its gradients for `scale` times the loss sum.
LceRun run(Op const& op, Case const& c, at::ScalarType dtype, at::Device device, double scale = kScale) {
  at::Tensor h = to_torch(c.hidden, dtype, device).requires_grad_();
  at::Tensor w = to_torch(c.weight, dtype, device).requires_grad_();
  at::Tensor const labels = at::tensor(c.labels, at::kLong).to(device);
  at::Tensor const loss = op(h, w, labels);
  auto const grads = torch::autograd::grad({loss * scale}, {h, w});
  return {loss.detach(), grads[0], grads[1]};
}

Op composite() {
  return [](at::Tensor const& h, at::Tensor const& w, at::Tensor const& l) {
    return ops::linear_cross_entropy(h, w, l, Backend::kComposite);
  };
}

Op chunked(std::int64_t chunk) {
  return [chunk](at::Tensor const& h, at::Tensor const& w, at::Tensor const& l) {
    return ops::chunked_linear_cross_entropy(h, w, l, chunk);
  };
}

Tensor scalar(double v) { return Tensor({1}, {v}); }

// fp64 on both sides, differing in summation order over at most a few hundred terms (and the chunked sum of the
// weight gradient over chunks): errors ~1e-15 relative; 1e-12 of the largest value leaves room for that while a lost
// or doubled term errs by ~1e-2.
void expect_fp64_match(std::string const& what, LceRun const& r, Expected const& e) {
  double const loss_tol = 1e-12 * std::max(1.0, std::abs(e.loss));
  EXPECT_NEAR(r.loss.item<double>(), e.loss, loss_tol) << what;
  auto tol = [](Tensor const& t) { return Tolerance{1e-12 * std::max(1e-300, t.flat().cwiseAbs().maxCoeff()), 0}; };
  if (e.dhidden.numel() > 0) {
    FUSEPACK_EXPECT_PASS(compare_allclose(what + " dhidden", to_ref(r.dhidden), e.dhidden, tol(e.dhidden)));
  }
  FUSEPACK_EXPECT_PASS(compare_allclose(what + " dweight", to_ref(r.dweight), e.dweight, tol(e.dweight)));
}

TEST(LinearCrossEntropyComposite, MatchesTheReferenceInFp64) {
  auto rng = test_rng();
  Case const c = make_case(13, 8, 37, 4, rng);
  expect_fp64_match("composite", run(composite(), c, at::kDouble, at::kCPU), reference(c));
}

// The chunked path: every chunk size gives the reference's loss and gradients.
TEST(LinearCrossEntropyChunked, MatchesTheReferenceInFp64ForEveryChunkSize) {
  auto rng = test_rng();
  for (int k = 0; k < cases(2, 10); ++k) {
    std::int64_t const T = uniform_int(rng, 1, 40), H = uniform_int(rng, 1, 12), V = uniform_int(rng, 2, 60);
    std::printf("[  case    ] T %lld, H %lld, V %lld\n", static_cast<long long>(T), static_cast<long long>(H),
                static_cast<long long>(V));
    Case const c = make_case(T, H, V, uniform_int(rng, 0, 4), rng);
    Expected const e = reference(c);
    for (std::int64_t chunk : {std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, T - 1, T, T + 5}) {
      if (chunk < 0) continue;
      expect_fp64_match("T " + std::to_string(T) + ", V " + std::to_string(V) + ", chunk " + std::to_string(chunk),
                        run(chunked(chunk), c, at::kDouble, at::kCPU), e);
    }
  }
}

// A backward that ignores its incoming gradient returns the gradients of the loss sum itself: what the check above
// would then see, 1/0.37 times the expected gradients, fails it.
TEST(LinearCrossEntropyChunked, PlantedIncomingGradientIgnoredFailsTheCheck) {
  auto rng = test_rng();
  Case const c = make_case(11, 6, 29, 3, rng);
  Expected const e = reference(c);
  LceRun const ignored = run(chunked(4), c, at::kDouble, at::kCPU, 1.0);
  ErrorReport const r = compare_allclose("dweight, incoming gradient ignored", to_ref(ignored.dweight), e.dweight,
                                         Tolerance{1e-12 * e.dweight.flat().cwiseAbs().maxCoeff(), 0});
  EXPECT_FALSE(r.passed()) << "a backward that ignores the incoming gradient passed the check";
}

// fp32: within twice the composite fp32 error plus a rounding step (the rule the kernels meet), and rel-RMS 1e-5.
TEST(LinearCrossEntropyChunked, Fp32StaysWithinTwiceTheCompositeError) {
  auto rng = test_rng();
  Case const c = make_case(300, 64, 1000, 5, rng);
  Expected const e = reference(c);
  LceRun const a = run(chunked(37), c, at::kFloat, at::kCPU), b = run(composite(), c, at::kFloat, at::kCPU);
  FUSEPACK_EXPECT_PASS(check_fused("loss", a.loss.reshape({1}), b.loss.reshape({1}), scalar(e.loss)));
  FUSEPACK_EXPECT_PASS(check_fused("dhidden", a.dhidden, b.dhidden, e.dhidden));
  FUSEPACK_EXPECT_PASS(check_fused("dweight", a.dweight, b.dweight, e.dweight));
}

// The ATen ops run on this thread while a RecordFunction callback is installed (a plain function: the callback API
// takes a function pointer).
std::vector<std::string> g_ops_run;
std::unique_ptr<at::ObserverContext> record_op(at::RecordFunction const& fn) {
  g_ops_run.emplace_back(fn.name());
  return nullptr;
}

std::vector<std::string> ops_run_by(std::function<void()> const& body) {
  g_ops_run.clear();
  at::CallbackHandle const handle =
      at::addThreadLocalCallback(at::RecordFunctionCallback(record_op).scopes({at::RecordScope::FUNCTION}));
  body();
  at::removeCallback(handle);
  return g_ops_run;
}

bool ran(std::vector<std::string> const& ops, std::string const& op) {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

// Evaluation runs under at::NoGradGuard with parameters that still require grad: the forward then computes the
// reference's loss and none of the gradient work, whose one-hot scatter (aten::scatter_add_) and weight-gradient
// accumulation (aten::addmm_) it runs in grad mode.
TEST(LinearCrossEntropyChunked, WithoutGradModeTheForwardComputesTheLossAndNoGradient) {
  auto rng = test_rng();
  Case const c = make_case(23, 5, 31, 3, rng);
  at::Tensor const h = to_torch(c.hidden, at::kDouble, at::kCPU).requires_grad_();
  at::Tensor const w = to_torch(c.weight, at::kDouble, at::kCPU).requires_grad_();
  at::Tensor const labels = at::tensor(c.labels, at::kLong);
  at::Tensor loss;
  std::vector<std::string> const no_grad = ops_run_by([&] {
    at::NoGradGuard guard;
    loss = ops::chunked_linear_cross_entropy(h, w, labels, 4);
  });
  double const want = reference(c).loss;
  EXPECT_NEAR(loss.item<double>(), want, 1e-12 * std::abs(want));
  std::vector<std::string> const with_grad = ops_run_by([&] { ops::chunked_linear_cross_entropy(h, w, labels, 4); });
  for (char const* op : {"aten::scatter_add_", "aten::addmm_"}) {
    EXPECT_TRUE(ran(with_grad, op)) << op << ": the witness must see the gradient work in grad mode";
    EXPECT_FALSE(ran(no_grad, op)) << op << " ran without grad mode";
  }
}

TEST(LinearCrossEntropyChunked, NoTargetsGiveAZeroLossAndZeroGradients) {
  auto rng = test_rng();
  Case c = make_case(9, 4, 11, 1, rng);  // every label -100
  LceRun const r = run(chunked(2), c, at::kDouble, at::kCPU);
  EXPECT_EQ(r.loss.item<double>(), 0.0);
  EXPECT_TRUE(at::equal(r.dhidden, at::zeros_like(r.dhidden)));
  EXPECT_TRUE(at::equal(r.dweight, at::zeros_like(r.dweight)));
  c = make_case(0, 4, 11, 0, rng);  // no tokens
  LceRun const empty = run(chunked(0), c, at::kDouble, at::kCPU);
  EXPECT_EQ(empty.loss.item<double>(), 0.0);
  EXPECT_EQ(empty.dhidden.sizes(), at::IntArrayRef({0, 4}));
  EXPECT_TRUE(at::equal(empty.dweight, at::zeros({11, 4}, at::kDouble)));
}

// A tied head: the weight is also used elsewhere (the embedding), and its gradient is the sum of both uses.
TEST(LinearCrossEntropyChunked, ATiedHeadsGradientAddsToTheWeightsOtherUses) {
  auto rng = test_rng();
  Case const c = make_case(17, 6, 23, 3, rng);
  auto tied = [&](Op const& op) {
    at::Tensor w = to_torch(c.weight, at::kDouble, at::kCPU).requires_grad_();
    at::Tensor const ids = at::tensor(std::vector<std::int64_t>{3, 0, 22, 3}, at::kLong);
    at::Tensor const h = to_torch(c.hidden, at::kDouble, at::kCPU) + w.index_select(0, ids).sum();  // "embedding"
    at::Tensor const loss = op(h, w, at::tensor(c.labels, at::kLong));
    return torch::autograd::grad({loss}, {w})[0];
  };
  at::Tensor const want = tied(composite()), got = tied(chunked(5));
  double const scale = want.abs().max().item<double>();
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-12 * scale) << "the tied head's gradients differ";
}

TEST(LinearCrossEntropy, RefusesWhatItCannotCompute) {
  auto rng = test_rng();
  Case const c = make_case(4, 3, 5, 0, rng);
  at::Tensor const h = to_torch(c.hidden, at::kDouble, at::kCPU), w = to_torch(c.weight, at::kDouble, at::kCPU);
  at::Tensor const labels = at::tensor(c.labels, at::kLong);
  expect_torch_error([&] { ops::chunked_linear_cross_entropy(h, w, at::tensor({0, 1, 5, 2}, at::kLong)); },
                     "a label is outside [0, 5) and not -100 (e.g. 5)");
  expect_torch_error([&] { ops::chunked_linear_cross_entropy(h, w, at::tensor({0, 1, -1, 2}, at::kLong)); },
                     "(e.g. -1)");
  expect_torch_error([&] { ops::chunked_linear_cross_entropy(h, w, labels.to(at::kInt)); }, "labels must be int64");
  expect_torch_error([&] { ops::chunked_linear_cross_entropy(h, w.narrow(1, 0, 2), labels); }, "weight");
  expect_torch_error([&] { ops::chunked_linear_cross_entropy(h, w, labels.narrow(0, 0, 3)); }, "labels");
  expect_torch_error([&] { ops::chunked_linear_cross_entropy(h, w.to(at::kFloat), labels); }, "dtype");
  expect_torch_error([&] { ops::chunked_linear_cross_entropy(h, w, labels, -1); }, "chunk_tokens must be >= 0");
  if (!ops::fused_kernels_built()) return;
  expect_torch_error([&] { ops::linear_cross_entropy(h.to(at::kFloat), w.to(at::kFloat), labels, Backend::kFused); },
                     "linear_cross_entropy");
}

TEST(LinearCrossEntropy, AChunkHoldsAbout1GiBOfLogits) {
  EXPECT_EQ(ops::linear_cross_entropy_chunk(248320, 8192, 2), 2162);  // Qwen3.5 in bf16: 2^30 / (2 · 248320) = 2162.1
  EXPECT_EQ(ops::linear_cross_entropy_chunk(248320, 8192, 4), 1081);  // in fp32
  EXPECT_EQ(ops::linear_cross_entropy_chunk(256, 8192, 4), 8192);     // a small vocabulary: the whole batch
  EXPECT_EQ(ops::linear_cross_entropy_chunk(1 << 30, 10, 2), 1);      // at least one token
  EXPECT_EQ(ops::linear_cross_entropy_chunk(256, 0, 2), 1);
}

// ---- The fused path on the GPU

// Vocabularies of 1000 (rows of 16-byte vectors in every dtype) and 997 (element by element: rows start unaligned).
class LinearCrossEntropyFused : public ::testing::TestWithParam<std::tuple<Dtype, std::int64_t, std::int64_t>> {};

TEST_P(LinearCrossEntropyFused, MatchesTheReferenceWithinTwiceTheCompositeError) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto const [dtype, chunk, vocab] = GetParam();
  auto rng = test_rng();
  Case c = make_case(300, 64, vocab, 5, rng);
  round_to(dtype, c.hidden);  // the reference sees exactly the op's inputs
  round_to(dtype, c.weight);
  Expected const e = reference(c);
  at::ScalarType const st = scalar_type(dtype);
  at::Device const cuda(at::kCUDA);
  ops::reset_op_run_counts();
  LceRun const fused = run([chunk = chunk](at::Tensor const& h, at::Tensor const& w, at::Tensor const& l) {
    return ops::linear_cross_entropy(h, w, l, Backend::kFused, chunk);
  }, c, st, cuda);
  EXPECT_TRUE(ops::op_runs_not_on(Backend::kFused).empty()) << ops::describe_op_runs(ops::op_run_counts());
  EXPECT_EQ(ops::op_run_counts().size(), 2u) << ops::describe_op_runs(ops::op_run_counts());  // forward, backward
  LceRun const base = run(composite(), c, st, cuda);
  // the loss is fp32 in every run: in bf16/fp16 runs it carries the logits' rounding (no fp32 rel-RMS bound)
  FUSEPACK_EXPECT_PASS(check_fused("loss", fused.loss.reshape({1}), base.loss.reshape({1}), scalar(e.loss), {}, dtype));
  FUSEPACK_EXPECT_PASS(check_fused("dhidden", fused.dhidden, base.dhidden, e.dhidden));
  FUSEPACK_EXPECT_PASS(check_fused("dweight", fused.dweight, base.dweight, e.dweight));
}

INSTANTIATE_TEST_SUITE_P(Sm90, LinearCrossEntropyFused,
                         ::testing::Combine(::testing::Values(Dtype::kBF16, Dtype::kF16, Dtype::kF32),
                                            ::testing::Values(std::int64_t{0}, std::int64_t{37}),
                                            ::testing::Values(std::int64_t{1000}, std::int64_t{997})),
                         [](auto const& tc) {
                           return std::string(dtype_name(std::get<0>(tc.param))) + "_chunk_" +
                                  std::to_string(std::get<1>(tc.param)) + "_vocab_" +
                                  std::to_string(std::get<2>(tc.param));
                         });

// A caller that vouches for its labels skips the op's check (a device-to-host sync); a bad label that gets through
// anyway makes the loss and its row's gradient NaN instead of reading outside the row.
TEST(LinearCrossEntropyFused, ABadLabelPastTheCheckGivesNaNNotAnOutOfBoundsRead) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  for (std::int64_t bad : {std::int64_t{1000}, std::int64_t{-5}}) {
    at::Tensor h = at::randn({6, 32}, opts).requires_grad_(), w = at::randn({1000, 32}, opts).requires_grad_();
    at::Tensor const labels = at::tensor(std::vector<std::int64_t>{3, -100, bad, 7, 0, 999}, at::kLong).to(at::kCUDA);
    at::Tensor const loss =
        ops::linear_cross_entropy(h, w, labels, Backend::kFused, /*chunk_tokens=*/0, /*labels_checked=*/true);
    EXPECT_TRUE(std::isnan(loss.item<double>())) << "label " << bad;
    loss.backward();
    at::Tensor const row_nan = h.grad().isnan().any(1).cpu();
    EXPECT_TRUE(row_nan[2].item<bool>()) << "label " << bad;
    EXPECT_FALSE(row_nan[0].item<bool>() || row_nan[1].item<bool>() || row_nan[3].item<bool>()) << "label " << bad;
    expect_torch_error([&] { ops::linear_cross_entropy(h, w, labels, Backend::kFused); }, "not -100");
  }
}

#ifdef FUSEPACK_TEST_CUDA_KERNELS
// The per-token kernel on its own, over logits written by ATen's kernels (no GEMM, so compute-sanitizer's initcheck,
// which does not see the stores of cuBLAS's kernels, can check this kernel's reads: ci/gpu_sanitize.sh), against fp64
// log-softmax: rows with a target, rows of -100, 16-byte rows (V 1000) and unaligned ones (997), bf16 and fp32, the
// gradient in place and the loss alone. Bounds: the loss is an fp32 log-sum-exp of at most 1000 terms, a few units
// of 2^-24 of |lse| (1e-5·(|lse| + 1) leaves room); the gradient is exp(z − lse) in fp32 (the lse's error, ~1e-6 of
// p = exp(z − lse): 1e-5·p) rounded once to the dtype (2^-8 of |g| for bf16, 2^-23 for fp32, twice the half ulp).
// Reading the target's logit after the row was overwritten errs by about the logit itself; NaN fails every bound.
TEST(LinearCrossEntropyFused, RowKernelMatchesFp64LogSoftmaxOnItsOwn) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    for (std::int64_t V : {std::int64_t{1000}, std::int64_t{997}}) {
      std::int64_t const R = 37;
      at::Tensor const z0 = (at::randn({R, V}, at::TensorOptions().device(at::kCUDA)) * 3).to(dtype);
      std::vector<std::int64_t> labels(R);
      std::uniform_int_distribution<std::int64_t> token(0, V - 1);
      for (std::int64_t r = 0; r < R; ++r) labels[r] = r % 5 == 0 ? ops::kLinearCrossEntropyIgnoreIndex : token(rng);
      at::Tensor const label_t = at::tensor(labels, at::kLong).to(at::kCUDA);
      at::Tensor const z64 = z0.to(at::kDouble).cpu();
      at::Tensor const lse = at::logsumexp(z64, {1});
      at::Tensor const p = (z64 - lse.unsqueeze(1)).exp();
      at::Tensor const valid = (label_t != ops::kLinearCrossEntropyIgnoreIndex).cpu();
      at::Tensor const index = at::where(valid, label_t.cpu(), at::zeros_like(label_t.cpu())).unsqueeze(1);
      at::Tensor const loss_ref = at::where(valid, lse - z64.gather(1, index).squeeze(1), at::zeros_like(lse));
      at::Tensor const g_ref =
          (p - at::zeros_like(p).scatter_(1, index, 1.0)) * valid.unsqueeze(1).to(at::kDouble);
      double const rounding = dtype == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -23);
      for (bool gradient : {true, false}) {
        at::Tensor z = z0.clone();
        at::Tensor const loss = at::empty({R}, z.options().dtype(at::kFloat));
        CrossEntropyRowsParams params;
        params.logits = z.data_ptr();
        params.labels = label_t.data_ptr<std::int64_t>();
        params.loss = loss.data_ptr<float>();
        params.rows = R;
        params.vocab = V;
        params.gradient = gradient;
        params.dtype = dtype == at::kBFloat16 ? DType::kBF16 : DType::kF32;
        run_cross_entropy_rows(params, at::cuda::getCurrentCUDAStream());
        std::string const what = std::string(c10::toString(dtype)) + " V " + std::to_string(V) +
                                 (gradient ? " with the gradient" : " loss only");
        at::Tensor const loss_err = (loss.to(at::kDouble).cpu() - loss_ref).abs();
        EXPECT_TRUE((loss_err <= 1e-5 * (lse.abs() + 1)).all().item<bool>()) << what << ": loss error up to "
                                                                           << loss_err.max().item<double>();
        if (gradient) {
          at::Tensor const g_err = (z.to(at::kDouble).cpu() - g_ref).abs();
          at::Tensor const bound = rounding * g_ref.abs() + 1e-5 * p + 1e-30;
          EXPECT_TRUE((g_err <= bound).all().item<bool>())
              << what << ": gradient error up to " << (g_err / bound).max().item<double>() << " of its bound";
        } else {
          EXPECT_TRUE(at::equal(z, z0)) << what << ": the logits were changed";
        }
      }
    }
  }
}
#endif

#ifdef FUSEPACK_TEST_CUDA_MEMORY
// The point of the op: the composite keeps [T, V] bf16 logits and their fp32 copy for the backward, the fused path
// one chunk. T = 4096, V = 65536, H = 256, bf16: the composite's logits alone are 1.5 GiB.
TEST(LinearCrossEntropyFused, PeakMemoryStaysFarBelowTheComposites) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const h0 = at::randn({4096, 256}, opts), w0 = at::randn({65536, 256}, opts) * 0.05;
  at::Tensor const labels = at::randint(65536, {4096}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
  auto peak = [&](Backend backend) {
    at::Tensor h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    c10::cuda::CUDACachingAllocator::emptyCache();
    auto const before = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    ops::linear_cross_entropy(h, w, labels, backend).backward();
    auto const stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    return static_cast<double>(stats.allocated_bytes[0].peak - before) / (1 << 20);
  };
  double const fused = peak(Backend::kFused), comp = peak(Backend::kComposite);
  std::printf("[ measured ] peak memory above the inputs, T 4096, V 65536, H 256, bf16: fused %.0f MiB, composite "
              "%.0f MiB\n", fused, comp);
  EXPECT_LT(fused, comp / 4);
}
#endif

}  // namespace
}  // namespace fusepack::test
