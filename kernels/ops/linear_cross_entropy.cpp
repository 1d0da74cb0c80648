#include "kernels/ops/linear_cross_entropy.h"

#include "kernels/ops/check.h"
#include "kernels/ops/op_scope.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef FUSEPACK_WITH_CUDA_KERNELS
#include "kernels/linear_cross_entropy/cross_entropy_rows.h"
#include "kernels/ops/dtype.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <algorithm>

namespace fusepack::ops {

namespace {

constexpr char kOp[] = "linear_cross_entropy";

at::ScalarType loss_type(at::Tensor const& hidden) {
  return hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

void check_inputs(at::Tensor const& hidden, at::Tensor const& weight, at::Tensor const& labels, bool labels_checked) {
  TORCH_CHECK(hidden.defined() && weight.defined() && labels.defined(),
              "linear_cross_entropy: hidden, weight and labels are required");
  check_sizes(kOp, "hidden", hidden, {-1, -1});
  check_sizes(kOp, "weight", weight, {-1, hidden.size(1)});
  check_sizes(kOp, "labels", labels, {hidden.size(0)});
  check_same_dtype_device(kOp, "weight", weight, "hidden", hidden);
  TORCH_CHECK(labels.scalar_type() == at::kLong, "linear_cross_entropy: labels must be int64; got ",
              labels.scalar_type());
  TORCH_CHECK(labels.device() == hidden.device(), "linear_cross_entropy: labels are on ", labels.device(),
              " but hidden is on ", hidden.device());
  TORCH_CHECK(weight.size(0) >= 1, "linear_cross_entropy: the vocabulary (weight dimension 0) is empty");
  if (labels.numel() > 0 && !labels_checked) {  // one device-to-host sync
    at::Tensor const bad = (labels >= weight.size(0)) | ((labels < 0) & (labels != kLinearCrossEntropyIgnoreIndex));
    TORCH_CHECK(!bad.any().item<bool>(), "linear_cross_entropy: a label is outside [0, ", weight.size(0),
                ") and not -100 (e.g. ", labels.masked_select(bad)[0].item<std::int64_t>(), ")");
  }
}

// Whether the forward computes the gradients: only when a backward can follow. Inside Function::forward grad mode is
// always off, so this is decided by the caller; under at::NoGradGuard (evaluation) a parameter still requires grad,
// and the [vocab, hidden] fp32 weight gradient would be computed for nothing.
bool wants_gradients(at::Tensor const& hidden, at::Tensor const& weight) {
  return at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
}

// One chunk's per-token step over its logits z [len, V] (the inputs' dtype): adds the chunk's loss to `loss` and,
// when `grads`, returns d loss / d z in the inputs' dtype (possibly in z's memory).
at::Tensor rows_aten(at::Tensor z, at::Tensor const& target, at::Tensor& loss, bool grads) {
  at::ScalarType const acc = loss.scalar_type(), dtype = z.scalar_type();
  at::Tensor const valid = target != kLinearCrossEntropyIgnoreIndex;
  at::Tensor const index = at::where(valid, target, at::zeros_like(target)).unsqueeze(1);  // [len, 1]
  z = z.to(acc);  // the loss in fp32 (fp64): as the composite computes it
  at::Tensor const lse = at::logsumexp(z, {1});
  at::Tensor const picked = z.gather(1, index).squeeze(1);
  loss.add_(at::where(valid, lse - picked, at::zeros_like(lse)).sum());
  if (!grads) return at::Tensor();
  // d loss / d z = softmax(z) − onehot(label) on target rows, 0 elsewhere; into z's buffer, now that the loss has read
  // it.
  at::Tensor& g = z.sub_(lse.unsqueeze(1)).exp_();
  g.scatter_add_(1, index, at::full({z.size(0), 1}, -1.0, g.options()));
  g.mul_(valid.unsqueeze(1).to(acc));
  return g.to(dtype);  // the composite's gradient of the head GEMM has this dtype
}

#ifdef FUSEPACK_WITH_CUDA_KERNELS
// The same step as one kernel (kernels/linear_cross_entropy/cross_entropy_rows.h), the gradient in z's memory.
at::Tensor rows_kernel(at::Tensor z, at::Tensor const& target, at::Tensor& loss, bool grads) {
  at::Tensor const row_loss = at::empty({z.size(0)}, z.options().dtype(at::kFloat));
  CrossEntropyRowsParams p;
  p.logits = z.data_ptr();
  p.labels = target.data_ptr<std::int64_t>();
  p.loss = row_loss.data_ptr<float>();
  p.rows = z.size(0);
  p.vocab = z.size(1);
  p.gradient = grads;
  p.dtype = kernel_dtype(z);
  run_cross_entropy_rows(p, at::cuda::getCurrentCUDAStream());
  loss.add_(row_loss.sum());
  return grads ? z : at::Tensor();
}
#endif

// The chunked forward and, when `grads`, both gradients for a loss gradient of 1; the backward scales them. `kernel`:
// the per-token step runs as the CUDA kernel (the fused op); otherwise as ATen operations (any device).
struct ChunkedLinearCrossEntropyFunction : torch::autograd::Function<ChunkedLinearCrossEntropyFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor const& hidden, at::Tensor const& weight,
                            at::Tensor const& labels, std::int64_t chunk_tokens, bool grads, bool kernel) {
    // The fused op's record and profiler range span the whole pass (FUSEPACK_OP_RUNS declares the range in this
    // scope), so they cannot sit behind a bare `if`.
    ctx->saved_data["record"] = kernel;
    if (kernel) {
      FUSEPACK_OP_RUNS("linear_cross_entropy", Pass::kForward, Backend::kFused);
      return chunks_forward(ctx, hidden, weight, labels, chunk_tokens, grads, kernel);
    }
    return chunks_forward(ctx, hidden, weight, labels, chunk_tokens, grads, kernel);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    if (ctx->saved_data["record"].toBool()) {
      FUSEPACK_OP_RUNS("linear_cross_entropy", Pass::kBackward, Backend::kFused);
      return scaled_gradients(ctx, grads[0]);
    }
    return scaled_gradients(ctx, grads[0]);
  }

 private:
  static at::Tensor chunks_forward(torch::autograd::AutogradContext* ctx, at::Tensor const& hidden,
                                   at::Tensor const& weight, at::Tensor const& labels, std::int64_t chunk_tokens,
                                   bool grads, bool kernel) {
    std::int64_t const T = hidden.size(0), V = weight.size(0);
    std::int64_t const chunk =
        chunk_tokens > 0 ? chunk_tokens : linear_cross_entropy_chunk(V, T, hidden.element_size());
    at::ScalarType const acc = loss_type(hidden);
    at::Tensor loss = at::zeros({}, hidden.options().dtype(acc));
    at::Tensor dhidden = grads ? at::empty_like(hidden, at::MemoryFormat::Contiguous) : at::Tensor();
    at::Tensor dweight = grads ? at::zeros(weight.sizes(), weight.options().dtype(acc)) : at::Tensor();
    for (std::int64_t start = 0; start < T; start += chunk) {
      std::int64_t const len = std::min(chunk, T - start);
      at::Tensor const h = hidden.narrow(0, start, len);
      at::Tensor const target = labels.narrow(0, start, len);
      at::Tensor const z = at::linear(h, weight);  // [len, V], the logits in the inputs' dtype (the head GEMM)
#ifdef FUSEPACK_WITH_CUDA_KERNELS
      at::Tensor const gz = kernel ? rows_kernel(z, target, loss, grads) : rows_aten(z, target, loss, grads);
#else
      (void)kernel;  // no kernel in this build: the op refuses the fused backend before it gets here
      at::Tensor const gz = rows_aten(z, target, loss, grads);
#endif
      if (!grads) continue;
      at::Tensor dh = dhidden.narrow(0, start, len);  // rows of a contiguous tensor: contiguous
      at::mm_out(dh, gz, weight);
      if (weight.scalar_type() == acc) {
        dweight.addmm_(gz.t(), h);
      } else {
        at::addmm_out(dweight, dweight, gz.t(), h, acc);  // bf16/fp16 products summed in fp32 over every chunk
      }
    }
    if (grads) ctx->save_for_backward({dhidden, dweight});
    ctx->saved_data["weight_dtype"] = static_cast<std::int64_t>(weight.scalar_type());
    return loss;
  }

  // dloss: 0-dim, the loss's dtype; it scales every stored gradient.
  static torch::autograd::tensor_list scaled_gradients(torch::autograd::AutogradContext* ctx, at::Tensor const& dloss) {
    auto const saved = ctx->get_saved_variables();
    auto const weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    at::Tensor const dhidden = saved[0] * dloss.to(saved[0].scalar_type());
    at::Tensor const dweight = (saved[1] * dloss).to(weight_dtype);
    return {dhidden, dweight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::int64_t linear_cross_entropy_chunk(std::int64_t vocab, std::int64_t tokens, std::int64_t element_bytes) {
  TORCH_CHECK(vocab >= 1, "linear_cross_entropy_chunk: vocab must be >= 1; got ", vocab);
  TORCH_CHECK(element_bytes >= 1, "linear_cross_entropy_chunk: element_bytes must be >= 1; got ", element_bytes);
  std::int64_t const fit = (std::int64_t{1} << 30) / (element_bytes * vocab);
  return std::max<std::int64_t>(1, std::min(fit, std::max<std::int64_t>(tokens, 1)));
}

at::Tensor chunked_linear_cross_entropy(at::Tensor const& hidden, at::Tensor const& weight, at::Tensor const& labels,
                                        std::int64_t chunk_tokens) {
  check_inputs(hidden, weight, labels, /*labels_checked=*/false);
  TORCH_CHECK(chunk_tokens >= 0, "linear_cross_entropy: chunk_tokens must be >= 0 (0: automatic); got ", chunk_tokens);
  return ChunkedLinearCrossEntropyFunction::apply(hidden.contiguous(), weight.contiguous(), labels, chunk_tokens,
                                                  wants_gradients(hidden, weight), /*kernel=*/false);
}

at::Tensor linear_cross_entropy(at::Tensor const& hidden, at::Tensor const& weight, at::Tensor const& labels,
                                Backend backend, std::int64_t chunk_tokens, bool labels_checked) {
  check_inputs(hidden, weight, labels, labels_checked);
  TORCH_CHECK(chunk_tokens >= 0, "linear_cross_entropy: chunk_tokens must be >= 0 (0: automatic); got ", chunk_tokens);
  if (backend == Backend::kComposite) {
    FUSEPACK_OP_RUNS("linear_cross_entropy", Pass::kForward, Backend::kComposite);
    return at::cross_entropy_loss(at::linear(hidden, weight).to(loss_type(hidden)), labels, {}, at::Reduction::Sum,
                                  kLinearCrossEntropyIgnoreIndex);
  }
  check_fused_input(kOp, "hidden", hidden);
  check_fused_input(kOp, "weight", weight);
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  c10::cuda::CUDAGuard const guard(hidden.device());
  return ChunkedLinearCrossEntropyFunction::apply(hidden, weight, labels.contiguous(), chunk_tokens,
                                                  wants_gradients(hidden, weight), /*kernel=*/true);
#else
  TORCH_CHECK(false, "linear_cross_entropy: unreachable without CUDA kernels");
#endif
}

}  // namespace fusepack::ops
