#include "kernels/ops/attention.h"

#include "kernels/ops/check.h"
#include "kernels/ops/op_scope.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#ifdef FUSEPACK_WITH_CUDA_KERNELS
#include "kernels/attention/attention.h"
#include "kernels/ops/dtype.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fusepack::ops {

namespace {

// [L, Hkv, D] → [L, Hq, D] with query head h reading key/value head h / group: repeat_interleave over the heads,
// written as expand + reshape so that its backward is a plain sum (repeat_interleave's index_add backward is
// non-deterministic on CUDA).
at::Tensor repeat_kv_heads(at::Tensor const& x, int64_t group) {
  if (group == 1) return x;
  int64_t const L = x.size(0), Hkv = x.size(1), D = x.size(2);
  return x.unsqueeze(2).expand({L, Hkv, group, D}).reshape({L, Hkv * group, D});
}

// HF transformers' eager attention per example (scores in the input dtype, softmax in fp32 then cast back), as users
// run it without fused kernels; packed examples are computed one by one, so no token can see another example.
at::Tensor attention_composite(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v,
                               std::vector<int32_t> const& cu, double scale, at::Tensor const& gate) {
  FUSEPACK_OP_RUNS("attention", Pass::kForward, Backend::kComposite);
  int64_t const group = q.size(1) / k.size(1);
  at::ScalarType const softmax_type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;  // HF: fp32
  std::vector<at::Tensor> outs;
  outs.reserve(cu.size() - 1);
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    int64_t const bos = cu[n], len = cu[n + 1] - cu[n];
    at::Tensor const qn = q.narrow(0, bos, len).transpose(0, 1);                          // [Hq, L, D]
    at::Tensor const kn = repeat_kv_heads(k.narrow(0, bos, len), group).transpose(0, 1);  // [Hq, L, D]
    at::Tensor const vn = repeat_kv_heads(v.narrow(0, bos, len), group).transpose(0, 1);  // [Hq, L, D]
    at::Tensor const scores = at::matmul(qn, kn.transpose(1, 2)) * scale;                 // [Hq, L, L]
    at::Tensor const future = at::ones({len, len}, q.options().dtype(at::kBool)).triu(1);
    at::Tensor const p =
        at::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1, softmax_type)
            .to(q.scalar_type());
    outs.push_back(at::matmul(p, vn).transpose(0, 1));  // [L, Hq, D]
  }
  at::Tensor const o = at::cat(outs, 0);
  return gate.defined() ? o * at::sigmoid(gate) : o;
}

#ifdef FUSEPACK_WITH_CUDA_KERNELS
// FlashAttention-2 varlen forward and backward (inside LibTorch) around fusepack's gate kernels. FA2 reads k and v
// with their Hkv heads (GQA natively) and the causal mask is per example (cu_seqlens for both q and k).
struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor const& q, at::Tensor const& k,
                            at::Tensor const& v, std::optional<at::Tensor> const& gate_opt,
                            at::Tensor const& cu_seqlens, int64_t max_seqlen, double scale) {
    FUSEPACK_OP_RUNS("attention", Pass::kForward, Backend::kFused);
    c10::cuda::CUDAGuard guard(q.device());
    at::Tensor const gate = gate_opt.value_or(at::Tensor());
    ctx->saved_data["max_seqlen"] = max_seqlen;
    ctx->saved_data["scale"] = scale;
    if (q.size(0) == 0) {  // no tokens: nothing to run (FlashAttention-2 needs at least one)
      ctx->save_for_backward({q, k, v, gate});
      return at::empty_like(q);
    }
    auto const [fa_out, lse, rng_state, unused, debug_mask] = at::_flash_attention_forward(
        q, k, v, std::optional<at::Tensor>(cu_seqlens), std::optional<at::Tensor>(cu_seqlens), max_seqlen, max_seqlen,
        /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false, std::optional<double>(scale));
    at::Tensor const o = fa_out.contiguous();  // [T, Hq, D]: FA2 returns it contiguous; the gate kernel relies on it
    at::Tensor y = o;
    if (gate.defined()) {
      y = at::empty_like(o);
      AttentionGateFwdParams p;
      p.o = o.data_ptr();
      p.gate = gate.data_ptr();
      p.y = y.data_ptr();
      p.n = o.numel();
      p.dtype = kernel_dtype(o);
      run_attention_gate_fwd(p, at::cuda::getCurrentCUDAStream());
    }
    ctx->save_for_backward({q, k, v, gate, o, lse, rng_state, unused, cu_seqlens});
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    FUSEPACK_OP_RUNS("attention", Pass::kBackward, Backend::kFused);
    auto const saved = ctx->get_saved_variables();
    at::Tensor const &q = saved[0], &k = saved[1], &v = saved[2], &gate = saved[3];
    c10::cuda::CUDAGuard guard(q.device());
    if (q.size(0) == 0) {
      at::Tensor const dgate = gate.defined() ? at::zeros_like(gate) : at::Tensor();
      return {at::zeros_like(q), at::zeros_like(k), at::zeros_like(v), dgate, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    at::Tensor const &o = saved[4], &lse = saved[5], &rng_state = saved[6], &unused = saved[7], &cu = saved[8];
    int64_t const max_seqlen = ctx->saved_data["max_seqlen"].toInt();
    double const scale = ctx->saved_data["scale"].toDouble();
    at::Tensor const dy = grads[0].contiguous();
    at::Tensor d_o = dy, dgate;
    if (gate.defined()) {
      d_o = at::empty_like(o);
      dgate = at::empty_like(gate);
      AttentionGateBwdParams p;
      p.o = o.data_ptr();
      p.gate = gate.data_ptr();
      p.dy = dy.data_ptr();
      p.d_o = d_o.data_ptr();
      p.dgate = dgate.data_ptr();
      p.n = o.numel();
      p.dtype = kernel_dtype(o);
      run_attention_gate_bwd(p, at::cuda::getCurrentCUDAStream());
    }
    // FA2 accumulates dq with fp32 atomics unless at::globalContext().deterministicAlgorithms() is on, when it
    // switches to per-split buffers summed in a fixed order (see NOTES.md).
    auto const [dq, dk, dv] =
        at::_flash_attention_backward(d_o, q, k, v, o, lse, cu, cu, max_seqlen, max_seqlen, /*dropout_p=*/0.0,
                                      /*is_causal=*/true, rng_state, unused, std::optional<double>(scale));
    return {dq, dk, dv, dgate, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
#endif

}  // namespace

at::Tensor attention(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor const& cu_seqlens,
                     int64_t max_seqlen, double scale, at::Tensor const& gate, Backend backend) {
  check_sizes("attention", "q", q, {-1, -1, -1});
  TORCH_CHECK(at::isFloatingType(q.scalar_type()), "attention: q must be floating point; got ", q.scalar_type());
  int64_t const T = q.size(0), Hq = q.size(1), D = q.size(2);
  check_sizes("attention", "k", k, {T, -1, D});
  int64_t const Hkv = k.size(1);
  TORCH_CHECK(Hkv >= 1 && Hq >= Hkv && Hq % Hkv == 0, "attention: the query heads Hq=", Hq,
              " (q dimension 1) must be a positive multiple of the key/value heads Hkv=", Hkv,
              " (k dimension 1), which must be >= 1; q has shape ", q.sizes(), ", k has shape ", k.sizes());
  check_sizes("attention", "v", v, {T, Hkv, D});
  check_same_dtype_device("attention", "k", k, "q", q);
  check_same_dtype_device("attention", "v", v, "q", q);
  if (gate.defined()) {
    check_sizes("attention", "gate", gate, {T, Hq, D});
    check_same_dtype_device("attention", "gate", gate, "q", q);
  }
  TORCH_CHECK(scale > 0 && std::isfinite(scale), "attention: scale must be positive and finite; got scale=", scale);
  std::vector<int32_t> const cu = check_cu_seqlens("attention", cu_seqlens, T);
  int64_t longest = 0, longest_at = 0;
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    if (cu[n + 1] - cu[n] > longest) {
      longest = cu[n + 1] - cu[n];
      longest_at = static_cast<int64_t>(n);
    }
  }
  TORCH_CHECK(max_seqlen >= longest, "attention: max_seqlen=", max_seqlen, " is smaller than the longest example (",
              longest, " tokens, example ", longest_at, " of cu_seqlens); it must be at least that");
  if (backend == Backend::kComposite) return attention_composite(q, k, v, cu, scale, gate);

  check_fused_input("attention", "q", q);
  check_fused_input("attention", "k", k);
  check_fused_input("attention", "v", v);
  if (gate.defined()) check_fused_input("attention", "gate", gate);
  TORCH_CHECK(q.scalar_type() != at::kFloat,
              "attention: the fused path runs FlashAttention-2, which has fp16 and bf16 kernels only; q has dtype ",
              q.scalar_type(), " and shape ", q.sizes(), " (cast to bf16, or use the composite backend)");
  TORCH_CHECK(D % 8 == 0 && D <= 256,
              "attention: FlashAttention-2 needs the head dim D (q dimension 2) to be a multiple of 8 and at most 256;",
              " got D=", D, " (q shape ", q.sizes(), ")");
  TORCH_CHECK(cu_seqlens.device() == q.device(), "attention: the fused path needs cu_seqlens on q's device ",
              q.device(), "; got ", cu_seqlens.device());
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  // Empty examples are dropped from what FlashAttention-2 sees: its all-length-1 (decode) path reshapes q by the
  // number of examples, which is only right when every example holds exactly one token.
  std::vector<int32_t> nonempty{0};
  for (size_t n = 1; n < cu.size(); ++n) {
    if (cu[n] != nonempty.back()) nonempty.push_back(cu[n]);
  }
  at::Tensor const cu_fa = nonempty.size() == cu.size()
                               ? cu_seqlens.contiguous()
                               : at::tensor(nonempty, at::TensorOptions().dtype(at::kInt)).to(q.device());
  // FA2 sizes its grid by the max length it is given: the longest example (max_seqlen was checked to be >= it).
  return AttentionFunction::apply(q, k, v, gate.defined() ? std::optional<at::Tensor>(gate) : std::nullopt, cu_fa,
                                  std::max<int64_t>(longest, 1), scale);
#else
  TORCH_CHECK(false, "attention: unreachable without CUDA kernels");
#endif
}

}  // namespace fusepack::ops
