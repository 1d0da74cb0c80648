#include "trainer/model/layers.h"

#include "kernels/ops/attention.h"
#include "kernels/ops/conv1d.h"
#include "kernels/ops/gated_delta.h"
#include "kernels/ops/op_scope.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

namespace fusepack::model {
namespace {

// The profile's GEMM groups (kernels/ops/op_scope.h): the token mixers' input and output projections, and the MLP's
// three projections. The head's GEMMs belong to the linear_cross_entropy op.
constexpr char const* kProjections = FUSEPACK_RANGE_PREFIX "gemm projections";
constexpr char const* kMlp = FUSEPACK_RANGE_PREFIX "gemm mlp";

struct SplitColumnsFunction : torch::autograd::Function<SplitColumnsFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext*, at::Tensor const& x,
                                                std::vector<std::int64_t> const& widths) {
    torch::autograd::variable_list parts;
    std::int64_t start = 0;
    for (std::int64_t w : widths) {
      parts.push_back(x.narrow(1, start, w).contiguous());
      start += w;
    }
    return parts;
  }

  // A part the graph did not reach arrives as zeros (autograd materializes the missing gradients).
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {at::cat(grads, 1), at::Tensor()};
  }
};

struct SharedInputLinearFunction : torch::autograd::Function<SharedInputLinearFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor const& x,
                                                at::TensorList weights) {
    torch::autograd::variable_list saved{x};
    torch::autograd::variable_list out;
    for (at::Tensor const& w : weights) {
      out.push_back(at::mm(x, w.t()));
      saved.push_back(w);
    }
    ctx->save_for_backward(saved);
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined: it adds nothing
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto const saved = ctx->get_saved_variables();
    at::Tensor const& x = saved[0];
    torch::autograd::variable_list out(grads.size() + 1);  // dx, then one per weight
    bool const want_dx = ctx->needs_input_grad(0);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      at::Tensor const& w = saved[i + 1];
      if (want_dx) {
        if (out[0].defined()) {
          out[0].addmm_(grads[i], w);
        } else {
          out[0] = at::mm(grads[i], w);
        }
      }
      if (ctx->needs_input_grad(i + 1)) out[i + 1] = at::mm(grads[i].t(), x);
    }
    if (want_dx && !out[0].defined()) out[0] = at::zeros_like(x);
    return out;
  }
};

}  // namespace

std::vector<at::Tensor> shared_input_linear(at::Tensor const& x, std::vector<at::Tensor> const& weights) {
  TORCH_CHECK(x.dim() == 2, "shared_input_linear: x must be 2-D [R, H]; got shape ", x.sizes());
  TORCH_CHECK(!weights.empty(), "shared_input_linear: no weights");
  for (std::size_t i = 0; i < weights.size(); ++i) {
    at::Tensor const& w = weights[i];
    TORCH_CHECK(w.dim() == 2 && w.size(1) == x.size(1) && w.scalar_type() == x.scalar_type() &&
                    w.device() == x.device(),
                "shared_input_linear: weight ", i, " must be [O, ", x.size(1), "] in ", x.scalar_type(), " on ",
                x.device(), "; got shape ", w.sizes(), " in ", w.scalar_type(), " on ", w.device());
  }
  return SharedInputLinearFunction::apply(x, at::TensorList(weights));  // a TensorList: each weight gets its edge
}

std::vector<at::Tensor> split_columns(at::Tensor const& x, std::vector<std::int64_t> const& widths) {
  TORCH_CHECK(x.dim() == 2, "split_columns: x must be 2-D [R, C]; got shape ", x.sizes());
  std::int64_t total = 0;
  for (std::int64_t w : widths) {
    TORCH_CHECK(w >= 0, "split_columns: widths must be >= 0; got ", w);
    total += w;
  }
  TORCH_CHECK(total == x.size(1), "split_columns: the widths sum to ", total, " but x has ", x.size(1), " columns");
  return SplitColumnsFunction::apply(x, widths);
}

at::Tensor gated_deltanet(at::Tensor const& x_TH, GatedDeltaNetWeights const& w, Qwen35Config const& c,
                          SequenceLayout const& seq, ops::Backend backend) {
  int64_t const T = x_TH.size(0), Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  int64_t const dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, Kd = c.linear_key_dim();
  int64_t const Vd = c.linear_value_dim();
  at::Tensor mixed_TC, z_THvdv, b_THv, a_THv;
  {
    FUSEPACK_PROFILE_RANGE(range, kProjections);
    std::vector<at::Tensor> const p = shared_input_linear(x_TH, {w.in_proj_qkv, w.in_proj_z, w.in_proj_b, w.in_proj_a});
    mixed_TC = p[0];
    z_THvdv = p[1].view({T, Hv, dv});
    b_THv = p[2];
    a_THv = p[3];
  }

  std::vector<at::Tensor> const qkv =
      ops::conv1d_parts(mixed_TC, w.conv1d.squeeze(1), seq.cu_seqlens, /*silu=*/true, {Kd, Kd, Vd}, backend);
  at::Tensor const q_THkdk = qkv[0].view({T, Hk, dk});
  at::Tensor const k_THkdk = qkv[1].view({T, Hk, dk});
  at::Tensor const v_THvdv = qkv[2].view({T, Hv, dv});

  // The decay is computed in fp32 whatever the model dtype (HF: A_log.float(), a.float()); fp64 models keep fp64.
  at::ScalarType const decay_type = x_TH.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor const g_THv =
      -at::exp(w.A_log.to(decay_type)) * at::softplus(a_THv.to(decay_type) + w.dt_bias.to(decay_type));
  at::Tensor const beta_THv = at::sigmoid(b_THv);  // in the model dtype, as HF

  double const scale = 1.0 / std::sqrt(static_cast<double>(dk));
  at::Tensor const o_THvdv = ops::gated_delta(q_THkdk, k_THkdk, v_THvdv, g_THv.contiguous(), beta_THv.contiguous(),
                                              seq.cu_seqlens, scale, /*use_qk_l2norm=*/true, backend)
                                 .o;
  at::Tensor const y_THvdv = ops::gated_rmsnorm(o_THvdv, z_THvdv.contiguous(), w.norm, c.rms_norm_eps, backend);
  FUSEPACK_PROFILE_RANGE(range, kProjections);
  return at::linear(y_THvdv.reshape({T, Vd}), w.out_proj);
}

at::Tensor gated_attention(at::Tensor const& x_TH, AttentionWeights const& w, Qwen35Config const& c,
                           SequenceLayout const& seq, ops::Backend backend) {
  int64_t const T = x_TH.size(0), Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  at::Tensor qg_THq2D, k_THkvD, v_THkvD;
  {
    FUSEPACK_PROFILE_RANGE(range, kProjections);
    std::vector<at::Tensor> const p = shared_input_linear(x_TH, {w.q_proj, w.k_proj, w.v_proj});
    qg_THq2D = p[0].view({T, Hq, 2 * D});  // per head [query | gate]
    k_THkvD = p[1].view({T, Hkv, D});
    v_THkvD = p[2].view({T, Hkv, D});
  }
  std::vector<at::Tensor> const query_gate = split_columns(qg_THq2D.view({T * Hq, 2 * D}), {D, D});
  at::Tensor const gate_THqD = query_gate[1].view({T, Hq, D});
  at::Tensor q_THqD = ops::rmsnorm(query_gate[0].view({T, Hq, D}), w.q_norm, c.rms_norm_eps, backend);
  k_THkvD = ops::rmsnorm(k_THkvD, w.k_norm, c.rms_norm_eps, backend);
  q_THqD = ops::rope(q_THqD, seq.position_ids, c.rotary_dim(), c.rope_theta, backend);
  k_THkvD = ops::rope(k_THkvD, seq.position_ids, c.rotary_dim(), c.rope_theta, backend);
  double const scale = 1.0 / std::sqrt(static_cast<double>(D));
  at::Tensor const o_THqD =
      ops::attention(q_THqD, k_THkvD, v_THkvD, seq.cu_seqlens, seq.max_seqlen, scale, gate_THqD, backend);
  FUSEPACK_PROFILE_RANGE(range, kProjections);
  return at::linear(o_THqD.reshape({T, Hq * D}), w.o_proj);
}

at::Tensor mlp(at::Tensor const& x_TH, MlpWeights const& w, ops::Backend backend) {
  at::Tensor gate_TI, up_TI;
  {
    FUSEPACK_PROFILE_RANGE(range, kMlp);
    std::vector<at::Tensor> const p = shared_input_linear(x_TH, {w.gate_proj, w.up_proj});
    gate_TI = p[0];
    up_TI = p[1];
  }
  at::Tensor const h_TI = ops::swiglu(gate_TI, up_TI, backend);
  FUSEPACK_PROFILE_RANGE(range, kMlp);
  return at::linear(h_TI, w.down_proj);
}

}  // namespace fusepack::model
