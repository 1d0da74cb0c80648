#include "kernels/attention/attention.h"
#include "kernels/bench/bench.h"
#include "kernels/ops/attention.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <vector>

namespace fusepack::bench {

namespace {

// Qwen3.5-27B full attention: 24 query heads, 4 key/value heads, head dim 256, 8 packed examples of 1024 tokens,
// bf16, with the output gate.
constexpr int64_t kT = 8192, kHq = 24, kHkv = 4, kD = 256, kExamples = 8, kLen = 1024;

// The whole op: FlashAttention-2 varlen + fusepack's gate kernels (fused) against the per-example ATen math of
// HF's eager attention (composite; timeable at this size, so no SDPA stand-in is needed).
void bench_attention_op(Report& report) {
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor q = at::randn({kT, kHq, kD}, opts).requires_grad_(), k = at::randn({kT, kHkv, kD}, opts).requires_grad_(),
             v = at::randn({kT, kHkv, kD}, opts).requires_grad_(),
             gate = at::randn({kT, kHq, kD}, opts).requires_grad_();
  at::Tensor const dout = at::randn({kT, kHq, kD}, opts);
  at::Tensor const cu = at::arange(0, kT + 1, kLen, opts.dtype(at::kInt));
  double const scale = 1.0 / 16.0;
  auto fwd = [&](ops::Backend b) { return ops::attention(q, k, v, cu, kLen, scale, gate, b); };
  auto fwd_bwd = [&](ops::Backend b) { return torch::autograd::grad({fwd(b)}, {q, k, v, gate}, {dout}); };

  expect_close("attention", "out", fwd(ops::Backend::kFused), fwd(ops::Backend::kComposite), 1e-2);
  {
    // Two bf16 algorithms (FA2's fp32 tiles vs the composite's bf16 scores) agree to ~1e-2 in relative RMS on the
    // gradients; a wrong kernel errs by O(1).
    auto const gf = fwd_bwd(ops::Backend::kFused), gc = fwd_bwd(ops::Backend::kComposite);
    char const* names[] = {"dq", "dk", "dv", "dgate"};
    for (int i = 0; i < 4; ++i) expect_close("attention", names[i], gf[i], gc[i], 3e-2);
  }

  // Fewest bytes: forward reads q, k, v, gate and writes the output (24 + 4 + 4 + 24 + 24 head-rows of D per token);
  // the backward reads dout, q, k, v, gate and the saved FA2 output, and writes dq, dk, dv, dgate (160 more).
  double const row = 2.0 * kT * kD;  // bytes of one head's [T, D] in bf16
  std::string const shape = "8x1024 Hq=24 Hkv=4 D=256 gate";
  double fwd_fused = 0, fwd_bwd_fused = 0;
  {
    c10::InferenceMode inference;
    double const composite = time_cuda([&] { fwd(ops::Backend::kComposite); }, 10, 2).ms;
    fwd_fused = time_cuda([&] { fwd(ops::Backend::kFused); }).ms;
    report.add({"attention", shape, "fwd", composite, fwd_fused, 80 * row});
  }
  double const composite = time_cuda([&] { fwd_bwd(ops::Backend::kComposite); }, 10, 2).ms;
  fwd_bwd_fused = time_cuda([&] { fwd_bwd(ops::Backend::kFused); }).ms;
  report.add({"attention", shape, "fwd+bwd", composite, fwd_bwd_fused, 240 * row});
  // Attention is matrix-bound: FLOPs in FlashAttention's convention (causal halves the square; bwd = 2.5 × fwd).
  double const flops = 4.0 * kExamples * (double(kLen) * kLen / 2) * kHq * kD;
  std::printf(
      "attention %s: fused fwd %.0f TFLOP/s, fwd+bwd %.0f TFLOP/s (anchor, FA2 alone with expanded kv: "
      "0.40 ms fwd, 1.83 ms fwd+bwd)\n",
      shape.c_str(), flops / (fwd_fused * 1e-3) / 1e12, 3.5 * flops / (fwd_bwd_fused * 1e-3) / 1e12);
}

// The gate alone, where fusepack's kernels run: y = o·σ(g) and its backward, against ATen's o * sigmoid(g).
void bench_attention_gate(Report& report) {
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor o = at::randn({kT, kHq, kD}, opts).requires_grad_(), g = at::randn({kT, kHq, kD}, opts).requires_grad_();
  at::Tensor const dy = at::randn({kT, kHq, kD}, opts);
  at::Tensor y = at::empty_like(o), d_o = at::empty_like(o), dgate = at::empty_like(g);
  cudaStream_t const stream = at::cuda::getCurrentCUDAStream();
  AttentionGateBwdParams p;
  p.o = o.data_ptr();
  p.gate = g.data_ptr();
  p.y = y.data_ptr();
  p.dy = dy.data_ptr();
  p.d_o = d_o.data_ptr();
  p.dgate = dgate.data_ptr();
  p.n = o.numel();
  p.dtype = DType::kBF16;
  auto fused_fwd = [&] { run_attention_gate_fwd(p, stream); };
  auto fused_fwd_bwd = [&] {
    run_attention_gate_fwd(p, stream);
    run_attention_gate_bwd(p, stream);
  };
  auto composite_fwd = [&] { return o * at::sigmoid(g); };
  auto composite_fwd_bwd = [&] { return torch::autograd::grad({composite_fwd()}, {o, g}, {dy}); };

  fused_fwd_bwd();
  auto const gc = composite_fwd_bwd();
  expect_close("attention gate", "y", y, composite_fwd(), 1e-2);
  expect_close("attention gate", "d_o", d_o, gc[0], 1e-2);
  expect_close("attention gate", "dgate", dgate, gc[1], 1e-2);

  double const elem = 2.0 * kT * kHq * kD;  // bytes of one [T, Hq, D] bf16 tensor
  std::string const shape = "T=8192 Hq=24 D=256 bf16";
  {
    c10::InferenceMode inference;
    // read o, g; write y
    report.add({"attention_gate", shape, "fwd", time_cuda(composite_fwd).ms, time_cuda(fused_fwd).ms, 3 * elem});
  }
  // forward (read 2, write 1) + backward (read dy, o, g; write d_o, dgate)
  report.add(
      {"attention_gate", shape, "fwd+bwd", time_cuda(composite_fwd_bwd).ms, time_cuda(fused_fwd_bwd).ms, 8 * elem});
}

}  // namespace

void bench_attention(Report& report) {
  bench_attention_gate(report);
  bench_attention_op(report);
}

}  // namespace fusepack::bench
