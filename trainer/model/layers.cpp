#include "trainer/model/layers.h"

#include "kernels/ops/attention.h"
#include "kernels/ops/conv1d.h"
#include "kernels/ops/gated_delta.h"
#include "kernels/ops/gated_rmsnorm.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fusepack::model {

at::Tensor gated_deltanet(at::Tensor const& x_TH, GatedDeltaNetWeights const& w, Qwen35Config const& c,
                          SequenceLayout const& seq, ops::Backend backend) {
  int64_t const T = x_TH.size(0), Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  int64_t const dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, Kd = c.linear_key_dim();
  int64_t const Vd = c.linear_value_dim();
  at::Tensor const mixed_TC = at::linear(x_TH, w.in_proj_qkv);
  at::Tensor const z_THvdv = at::linear(x_TH, w.in_proj_z).view({T, Hv, dv});
  at::Tensor const b_THv = at::linear(x_TH, w.in_proj_b);
  at::Tensor const a_THv = at::linear(x_TH, w.in_proj_a);

  at::Tensor const conv_TC = ops::conv1d(mixed_TC, w.conv1d.squeeze(1), seq.cu_seqlens, /*silu=*/true, backend);
  at::Tensor const q_THkdk = conv_TC.narrow(1, 0, Kd).reshape({T, Hk, dk}).contiguous();
  at::Tensor const k_THkdk = conv_TC.narrow(1, Kd, Kd).reshape({T, Hk, dk}).contiguous();
  at::Tensor const v_THvdv = conv_TC.narrow(1, 2 * Kd, Vd).reshape({T, Hv, dv}).contiguous();

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
  return at::linear(y_THvdv.reshape({T, Vd}), w.out_proj);
}

at::Tensor gated_attention(at::Tensor const& x_TH, AttentionWeights const& w, Qwen35Config const& c,
                           SequenceLayout const& seq, ops::Backend backend) {
  int64_t const T = x_TH.size(0), Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  at::Tensor const qg_THq2D = at::linear(x_TH, w.q_proj).view({T, Hq, 2 * D});  // per head [query | gate]
  at::Tensor const gate_THqD = qg_THq2D.narrow(2, D, D).contiguous();
  at::Tensor q_THqD = ops::rmsnorm(qg_THq2D.narrow(2, 0, D).contiguous(), w.q_norm, c.rms_norm_eps, backend);
  at::Tensor k_THkvD = ops::rmsnorm(at::linear(x_TH, w.k_proj).view({T, Hkv, D}), w.k_norm, c.rms_norm_eps, backend);
  at::Tensor const v_THkvD = at::linear(x_TH, w.v_proj).view({T, Hkv, D});
  q_THqD = ops::rope(q_THqD, seq.position_ids, c.rotary_dim(), c.rope_theta, backend);
  k_THkvD = ops::rope(k_THkvD, seq.position_ids, c.rotary_dim(), c.rope_theta, backend);
  double const scale = 1.0 / std::sqrt(static_cast<double>(D));
  at::Tensor const o_THqD =
      ops::attention(q_THqD, k_THkvD, v_THkvD, seq.cu_seqlens, seq.max_seqlen, scale, gate_THqD, backend);
  return at::linear(o_THqD.reshape({T, Hq * D}), w.o_proj);
}

at::Tensor mlp(at::Tensor const& x_TH, MlpWeights const& w, ops::Backend backend) {
  at::Tensor const h_TI = ops::swiglu(at::linear(x_TH, w.gate_proj), at::linear(x_TH, w.up_proj), backend);
  return at::linear(h_TI, w.down_proj);
}

}  // namespace fusepack::model
