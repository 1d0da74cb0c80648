#include "kernels/ops/gated_delta.h"

#include "kernels/gated_delta/gated_delta_head_dims.h"
#include "kernels/ops/check.h"
#include "kernels/ops/host_to_device.h"
#include "kernels/ops/op_scope.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#ifdef FUSEPACK_WITH_CUDA_KERNELS
#include "kernels/gated_delta/gated_delta.h"
#include "kernels/ops/dtype.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fusepack::ops {

namespace {

constexpr double kL2NormEps = 1e-6;  // reference/gated_delta.h, fla's l2norm and HF's torch fallback
constexpr int64_t kChunk = 64;       // HF's torch fallback and kernels/gated_delta (kGatedDeltaChunk)

// x / sqrt(Σx² + eps) over the last dimension.
at::Tensor l2norm(at::Tensor const& x) { return x * at::rsqrt(x.square().sum(-1, /*keepdim=*/true) + kL2NormEps); }

// [L, ...] → [L + pad, ...] with zero rows appended.
at::Tensor pad_tokens(at::Tensor const& x, int64_t pad) {
  if (pad == 0) return x;
  std::vector<int64_t> p(2 * x.dim(), 0);
  p.back() = pad;  // the (before, after) pair of dimension 0 comes last
  return at::constant_pad_nd(x, p);
}

// One example of L tokens, value heads split as [Hk, G] (key head, its G = Hv/Hk value heads) so that q̂, k̂ and
// q̂k̂ᵀ, k̂k̂ᵀ stay per key head and broadcast over the group (no copy of q or k per value head).
//   qs, kh: [L, Hk, K] scale·q̂, k̂; v: [L, Hv, V]; g, beta: [L, Hv]; h0: [Hv, K, V] or undefined (zeros).
// Chunks of kChunk tokens, or one chunk of L < kChunk (the kernels' chunks: the last one of an example is short). A
// longer example is zero-padded to whole chunks: a padded token has k̂ = 0, β = 0 and g = 0, so it adds nothing to the
// state and leaves the decay of the last real token in place. Returns o [L, Hv, V] and the final state [Hv, K, V], all
// in the compute dtype.
std::pair<at::Tensor, at::Tensor> gated_delta_example(at::Tensor const& qs, at::Tensor const& kh, at::Tensor const& v,
                                                      at::Tensor const& g, at::Tensor const& beta,
                                                      at::Tensor const& h0, int64_t Hk, int64_t G) {
  int64_t const L = qs.size(0), K = qs.size(2), V = v.size(2), Hv = Hk * G;
  int64_t const C = std::min(L, kChunk), nc = (L + C - 1) / C, pad = nc * C - L;
  // Token tensors → [Hk, 1 or G, nc, C, ...] (key tensors broadcast over G).
  auto key_chunks = [&](at::Tensor const& x) {
    return pad_tokens(x, pad).reshape({nc, C, Hk, 1, K}).permute({2, 3, 0, 1, 4});
  };
  auto value_chunks = [&](at::Tensor const& x) {
    return pad_tokens(x, pad).reshape({nc, C, Hk, G, x.size(-1)}).permute({2, 3, 0, 1, 4});
  };
  auto scalar_chunks = [&](at::Tensor const& x) {
    return pad_tokens(x, pad).reshape({nc, C, Hk, G}).permute({2, 3, 0, 1});
  };
  at::Tensor const q_c = key_chunks(qs), k_c = key_chunks(kh);      // [Hk, 1, nc, C, K]
  at::Tensor const v_c = value_chunks(v);                            // [Hk, G, nc, C, V]
  at::Tensor const b_c = scalar_chunks(beta);                        // [Hk, G, nc, C]
  at::Tensor const G_c = scalar_chunks(g).cumsum(-1);                // [Hk, G, nc, C] in-chunk cumulative decay

  // exp(G_i − G_j) on (i, j) of the mask, 0 elsewhere: the exponent is masked before exp, so it never overflows
  // (G_i − G_j > 0 above the diagonal) and no 0·inf reaches the forward or the backward.
  at::Tensor const diff = G_c.unsqueeze(-1) - G_c.unsqueeze(-2);     // [Hk, G, nc, C, C]
  at::Tensor const ones = at::ones({C, C}, G_c.options().dtype(at::kBool));
  double const minus_inf = -std::numeric_limits<double>::infinity();
  at::Tensor const decay_strict = diff.masked_fill(ones.tril(-1).logical_not(), minus_inf).exp();  // i > j
  at::Tensor const decay_causal = diff.masked_fill(ones.tril(0).logical_not(), minus_inf).exp();   // i >= j

  // UT transform: (I + A) [w | u] = [β exp(G) k̂ | β v], A strictly lower: β_i (k̂_i·k̂_j) exp(G_i − G_j).
  at::Tensor const kT = k_c.transpose(-1, -2);
  at::Tensor const A = at::matmul(k_c, kT) * decay_strict * b_c.unsqueeze(-1);
  at::Tensor const rhs = at::cat({k_c * (b_c * G_c.exp()).unsqueeze(-1), v_c * b_c.unsqueeze(-1)}, -1);
  at::Tensor const wu = at::linalg_solve_triangular(A, rhs, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
  at::Tensor const w = wu.narrow(-1, 0, K), u = wu.narrow(-1, K, V);  // [Hk, G, nc, C, K], [Hk, G, nc, C, V]

  at::Tensor const P = at::matmul(q_c, kT) * decay_causal;                    // [Hk, G, nc, C, C]
  at::Tensor const q_decayed = q_c * G_c.exp().unsqueeze(-1);                 // [Hk, G, nc, C, K]
  at::Tensor const G_last = G_c.narrow(-1, C - 1, 1);                         // [Hk, G, nc, 1]
  at::Tensor const k_to_end = (k_c * (G_last - G_c).exp().unsqueeze(-1)).transpose(-1, -2);  // [Hk, G, nc, K, C]
  at::Tensor const chunk_decay = G_last.exp().unsqueeze(-1);                  // [Hk, G, nc, 1, 1]

  at::Tensor h = h0.defined() ? h0.reshape({Hk, G, K, V}) : at::zeros({Hk, G, K, V}, qs.options());
  std::vector<at::Tensor> outs;
  outs.reserve(nc);
  for (int64_t c = 0; c < nc; ++c) {
    at::Tensor const v_new = u.select(2, c) - at::matmul(w.select(2, c), h);  // [Hk, G, C, V]
    outs.push_back(at::matmul(q_decayed.select(2, c), h) + at::matmul(P.select(2, c), v_new));
    h = h * chunk_decay.select(2, c) + at::matmul(k_to_end.select(2, c), v_new);
  }
  at::Tensor const o = at::stack(outs, 2).permute({2, 3, 0, 1, 4}).reshape({nc * C, Hv, V}).narrow(0, 0, L);
  return {o, h.reshape({Hv, K, V})};
}

// Per example (one state each, reset at every example start: correct on packed input by construction), in fp32
// (fp64 for fp64 input) like HF's torch fallback; o cast back to q's dtype, the state kept in the compute dtype.
GatedDeltaResult gated_delta_composite(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v,
                                       at::Tensor const& g, at::Tensor const& beta, std::vector<int32_t> const& cu,
                                       double scale, bool use_qk_l2norm, at::Tensor const& initial_state,
                                       bool output_final_state) {
  FUSEPACK_OP_RUNS("gated_delta", Pass::kForward, Backend::kComposite);
  at::ScalarType const ct = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  int64_t const Hk = q.size(1), Hv = v.size(1), K = q.size(2), V = v.size(2), G = Hv / Hk;
  at::Tensor qs = q.to(ct), kh = k.to(ct);
  if (use_qk_l2norm) {
    qs = l2norm(qs);
    kh = l2norm(kh);
  }
  qs = qs * scale;
  at::Tensor const vc = v.to(ct), gc = g.to(ct), bc = beta.to(ct);
  at::Tensor const h0 = initial_state.defined() ? initial_state.to(ct) : at::Tensor();
  int64_t const N = static_cast<int64_t>(cu.size()) - 1;
  std::vector<at::Tensor> outs, finals;
  outs.reserve(N);
  finals.reserve(N);
  for (int64_t n = 0; n < N; ++n) {
    int64_t const bos = cu[n], len = cu[n + 1] - cu[n];
    at::Tensor const h0n = h0.defined() ? h0.select(0, n) : at::Tensor();
    if (len == 0) {  // no token: o gets no rows, the state passes through
      outs.push_back(vc.narrow(0, bos, 0));
      finals.push_back(h0n.defined() ? h0n : at::zeros({Hv, K, V}, qs.options()));
      continue;
    }
    auto [o, h] = gated_delta_example(qs.narrow(0, bos, len), kh.narrow(0, bos, len), vc.narrow(0, bos, len),
                                      gc.narrow(0, bos, len), bc.narrow(0, bos, len), h0n, Hk, G);
    outs.push_back(o);
    finals.push_back(h);
  }
  GatedDeltaResult r;
  r.o = at::cat(outs, 0).to(q.scalar_type());
  if (output_final_state) r.final_state = at::stack(finals, 0);
  return r;
}

#ifdef FUSEPACK_WITH_CUDA_KERNELS
// The chunk table of the last cu_seqlens, on its device, held with the tensor (so its memory cannot be reused) and
// its version counter: every layer of a step passes the same cu_seqlens and only the first pays the host-to-device
// copy; an in-place write to cu_seqlens builds it again. Inference tensors have no version counter: never cached.
struct DeviceChunkTable {
  at::Tensor cu_seqlens;
  int64_t version = -1;
  at::Tensor chunks;       // GatedDeltaChunkTable::data, int32 on the device
  at::Tensor chunks_host;  // and on the host, where the by-shape schedule reads each example's chunks
  int N = 0, NC = 0;
};
thread_local DeviceChunkTable last_chunk_table;

DeviceChunkTable device_chunk_table(at::Tensor const& cu_seqlens, std::vector<int32_t> const& cu) {
  bool const cacheable = !cu_seqlens.is_inference();
  if (cacheable && last_chunk_table.cu_seqlens.defined() && last_chunk_table.cu_seqlens.is_same(cu_seqlens) &&
      last_chunk_table.version == cu_seqlens._version()) {
    return last_chunk_table;
  }
  GatedDeltaChunkTable const table = gated_delta_chunk_table(cu);
  DeviceChunkTable fresh;
  fresh.chunks = host_to_device(table.data, at::kInt, cu_seqlens.device());
  fresh.chunks_host = at::tensor(table.data, at::kInt);
  fresh.N = table.N;
  fresh.NC = table.NC;
  if (cacheable) {
    fresh.cu_seqlens = cu_seqlens;
    fresh.version = cu_seqlens._version();
    last_chunk_table = fresh;
  }
  return fresh;
}

GatedDeltaFwdParams fwd_params(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor const& g,
                               at::Tensor const& beta, at::Tensor const& initial_state, at::Tensor const& cu_seqlens,
                               at::Tensor const& chunks, at::Tensor const& chunks_host, int64_t N, int64_t NC,
                               double scale, bool use_qk_l2norm) {
  GatedDeltaFwdParams p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.g = g.data_ptr<float>();
  p.beta = beta.data_ptr();
  p.cu_seqlens = cu_seqlens.data_ptr<int32_t>();
  p.chunks = chunks.data_ptr<int32_t>();
  p.chunks_host = chunks_host.data_ptr<int32_t>();
  p.initial_state = initial_state.defined() ? initial_state.data_ptr<float>() : nullptr;
  p.T = q.size(0);
  p.Hk = static_cast<int>(q.size(1));
  p.Hv = static_cast<int>(v.size(1));
  p.K = static_cast<int>(q.size(2));
  p.V = static_cast<int>(v.size(2));
  p.N = static_cast<int>(N);
  p.NC = static_cast<int>(NC);
  p.scale = static_cast<float>(scale);
  p.use_qk_l2norm = use_qk_l2norm;
  p.dtype = kernel_dtype(q);
  return p;
}

at::Tensor workspace(std::size_t bytes, at::Tensor const& like) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

// Forward inputs: q, k, v, g, beta, initial_state (optional), cu_seqlens, the chunk table on the device and on the
// host; outputs: o, and
// final_state when output_final_state. The tensors the backward reads (q_rstd, k_rstd, Ainv, h, v_new; for 16-bit
// runs also P and the backward's row records, gated_delta_saves_intra) are allocated and written only when `save`
// (grad mode on and some input requires grad).
struct GatedDeltaFunction : torch::autograd::Function<GatedDeltaFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor const& q,
                                                at::Tensor const& k, at::Tensor const& v, at::Tensor const& g,
                                                at::Tensor const& beta, std::optional<at::Tensor> const& state_opt,
                                                at::Tensor const& cu_seqlens, at::Tensor const& chunks,
                                                at::Tensor const& chunks_host, int64_t N, int64_t NC, double scale,
                                                bool use_qk_l2norm, bool output_final_state, bool save,
                                                int64_t schedule) {
    FUSEPACK_OP_RUNS("gated_delta", Pass::kForward, Backend::kFused);
    c10::cuda::CUDAGuard guard(q.device());
    at::Tensor const initial_state = state_opt.value_or(at::Tensor());
    int64_t const T = q.size(0), Hk = q.size(1), Hv = v.size(1), K = q.size(2), V = v.size(2);
    auto const f32 = q.options().dtype(at::kFloat);
    GatedDeltaFwdParams p =
        fwd_params(q, k, v, g, beta, initial_state, cu_seqlens, chunks, chunks_host, N, NC, scale, use_qk_l2norm);
    p.schedule = static_cast<GatedDeltaSchedule>(schedule);
    at::Tensor o = at::empty({T, Hv, V}, q.options());
    at::Tensor final_state = output_final_state ? at::empty({N, Hv, K, V}, f32) : at::Tensor();
    p.o = o.data_ptr();
    p.final_state = output_final_state ? final_state.data_ptr<float>() : nullptr;
    at::Tensor q_rstd, k_rstd, Ainv, h, v_new, P, brec;
    if (save) {
      int64_t const parts = gated_delta_ainv_parts(p.dtype);
      auto const bf16 = q.options().dtype(at::kBFloat16);
      q_rstd = at::empty({T, Hk}, f32);
      k_rstd = at::empty({T, Hk}, f32);
      Ainv = at::empty({T, Hv, parts, kGatedDeltaChunk}, bf16);  // bf16 parts of the inverse
      h = at::empty({NC, Hv, V, K}, f32);  // the state entering every chunk, transposed (gated_delta.h)
      v_new = at::empty({T, Hv, V}, f32);
      p.save = true;
      p.q_rstd = q_rstd.data_ptr<float>();
      p.k_rstd = k_rstd.data_ptr<float>();
      p.Ainv = static_cast<std::uint16_t*>(Ainv.data_ptr());
      p.h = h.data_ptr<float>();
      p.v_new = v_new.data_ptr<float>();
      if (gated_delta_saves_intra(p.dtype)) {
        P = at::empty({NC, Hv, parts, kGatedDeltaChunk, kGatedDeltaChunk}, bf16);
        brec = at::empty({T, Hv, kBwdRecord}, f32);
        p.P = static_cast<std::uint16_t*>(P.data_ptr());
        p.brec = brec.data_ptr<float>();
      }
    }
    at::Tensor const ws = workspace(gated_delta_fwd_workspace_bytes(p), q);
    run_gated_delta_fwd(p, ws.data_ptr(), at::cuda::getCurrentCUDAStream());

    ctx->set_materialize_grads(false);  // an unused final state passes no dfinal_state (nullptr), not zeros
    ctx->saved_data["N"] = N;
    ctx->saved_data["chunks_host"] = chunks_host;
    ctx->saved_data["NC"] = NC;
    ctx->saved_data["schedule"] = schedule;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["use_qk_l2norm"] = use_qk_l2norm;
    ctx->saved_data["save"] = save;
    if (save) {
      ctx->save_for_backward(
          {q, k, v, g, beta, initial_state, cu_seqlens, chunks, q_rstd, k_rstd, Ainv, h, v_new, P, brec});
    }
    if (output_final_state) return {o, final_state};
    return {o};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    FUSEPACK_OP_RUNS("gated_delta", Pass::kBackward, Backend::kFused);
    TORCH_CHECK(ctx->saved_data["save"].toBool(), "gated_delta: backward called on a forward that ran without "
                "saving its tensors (grad mode was off, or no input required grad)");
    auto const saved = ctx->get_saved_variables();
    at::Tensor const &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &beta = saved[4],
                     &initial_state = saved[5], &cu_seqlens = saved[6], &chunks = saved[7];
    c10::cuda::CUDAGuard guard(q.device());
    at::Tensor dout = grads[0].defined() ? grads[0].to(q.scalar_type()).contiguous()
                                         : at::zeros({q.size(0), v.size(1), v.size(2)}, q.options());
    // The kernels read dout in 16-byte vectors; a gradient that is a view at an odd offset is copied.
    if (!gated_delta_misaligned(dout.data_ptr(), "dout").empty()) dout = dout.clone();
    at::Tensor const dfinal_state =
        grads.size() > 1 && grads[1].defined() ? grads[1].to(at::kFloat).contiguous() : at::Tensor();
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v), dg = at::empty_like(g),
               dbeta = at::empty_like(beta);
    at::Tensor dinitial_state = initial_state.defined() ? at::empty_like(initial_state) : at::Tensor();

    GatedDeltaBwdParams p;
    static_cast<GatedDeltaFwdParams&>(p) =
        fwd_params(q, k, v, g, beta, initial_state, cu_seqlens, chunks, ctx->saved_data["chunks_host"].toTensor(),
                   ctx->saved_data["N"].toInt(), ctx->saved_data["NC"].toInt(), ctx->saved_data["scale"].toDouble(),
                   ctx->saved_data["use_qk_l2norm"].toBool());
    p.schedule = static_cast<GatedDeltaSchedule>(ctx->saved_data["schedule"].toInt());
    p.save = true;
    p.q_rstd = saved[8].data_ptr<float>();
    p.k_rstd = saved[9].data_ptr<float>();
    p.Ainv = static_cast<std::uint16_t*>(saved[10].data_ptr());
    p.h = saved[11].data_ptr<float>();
    p.v_new = saved[12].data_ptr<float>();
    if (saved[13].defined()) {  // gated_delta_saves_intra
      p.P = static_cast<std::uint16_t*>(saved[13].data_ptr());
      p.brec = saved[14].data_ptr<float>();
    }
    p.dout = dout.data_ptr();
    p.dfinal_state = dfinal_state.defined() ? dfinal_state.data_ptr<float>() : nullptr;
    p.dq = dq.data_ptr();
    p.dk = dk.data_ptr();
    p.dv = dv.data_ptr();
    p.dg = dg.data_ptr<float>();
    p.dbeta = dbeta.data_ptr();
    p.dinitial_state = dinitial_state.defined() ? dinitial_state.data_ptr<float>() : nullptr;
    at::Tensor const ws = workspace(gated_delta_bwd_workspace_bytes(p), q);
    p.workspace = ws.data_ptr();
    run_gated_delta_bwd(p, at::cuda::getCurrentCUDAStream());
    // One gradient per forward argument: q, k, v, g, beta, initial_state, then none for the rest.
    return {dq, dk, dv, dg, dbeta, dinitial_state, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};
#endif

}  // namespace

GatedDeltaResult gated_delta(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor const& g,
                             at::Tensor const& beta, at::Tensor const& cu_seqlens, double scale, bool use_qk_l2norm,
                             Backend backend, at::Tensor const& initial_state, bool output_final_state,
                             GatedDeltaSchedule schedule) {
  char const* const op = "gated_delta";
  check_sizes(op, "q", q, {-1, -1, -1});
  TORCH_CHECK(q.is_floating_point(), op, ": q must be a floating-point tensor; got ", q.scalar_type());
  int64_t const T = q.size(0), Hk = q.size(1), K = q.size(2);
  TORCH_CHECK(Hk >= 1 && K >= 1, op, ": q must have at least one key head (dimension 1) and one channel "
              "(dimension 2); got shape ", q.sizes());
  check_sizes(op, "k", k, {T, Hk, K});
  check_same_dtype_device(op, "k", k, "q", q);
  check_sizes(op, "v", v, {T, -1, -1});
  check_same_dtype_device(op, "v", v, "q", q);
  int64_t const Hv = v.size(1), V = v.size(2);
  TORCH_CHECK(Hv >= Hk && Hv % Hk == 0, op, ": the value heads Hv=", Hv, " (v dimension 1) must be a positive "
              "multiple of the key heads Hk=", Hk, " (q and k dimension 1); v has shape ", v.sizes(), ", q has shape ",
              q.sizes());
  TORCH_CHECK(V >= 1, op, ": v must have at least one channel (dimension 2); got shape ", v.sizes());
  // The decay and the state are fp32; an fp64 q (composite only) may bring them in fp64 to stay in fp64 throughout.
  bool const fp64 = q.scalar_type() == at::kDouble;
  auto state_dtype_ok = [&](at::Tensor const& t) {
    return t.scalar_type() == at::kFloat || (fp64 && t.scalar_type() == at::kDouble);
  };
  char const* const state_dtypes = fp64 ? "Float or Double (q is Double)" : "Float";
  check_sizes(op, "g", g, {T, Hv});
  TORCH_CHECK(state_dtype_ok(g), op, ": g must be ", state_dtypes, "; got ", g.scalar_type());
  TORCH_CHECK(g.device() == q.device(), op, ": g is on ", g.device(), " but q is on ", q.device(),
              "; they must be on the same device");
  check_sizes(op, "beta", beta, {T, Hv});
  check_same_dtype_device(op, "beta", beta, "q", q);
  TORCH_CHECK(scale > 0 && std::isfinite(scale), op, ": scale must be positive and finite; got scale=", scale);
  std::vector<int32_t> const cu = check_cu_seqlens(op, cu_seqlens, T);
  int64_t const N = static_cast<int64_t>(cu.size()) - 1;
  if (initial_state.defined()) {
    check_sizes(op, "initial_state", initial_state, {N, Hv, K, V});
    TORCH_CHECK(state_dtype_ok(initial_state), op, ": initial_state must be ", state_dtypes, "; got ",
                initial_state.scalar_type());
    TORCH_CHECK(initial_state.device() == q.device(), op, ": initial_state is on ", initial_state.device(),
                " but q is on ", q.device(), "; they must be on the same device");
  }
  if (backend == Backend::kComposite) {
    TORCH_CHECK(schedule == GatedDeltaSchedule::kByShape, op, ": the schedule '", gated_delta_schedule_name(schedule),
                "' is a choice of the fused kernels; the composite backend takes only the default (by shape)");
    return gated_delta_composite(q, k, v, g, beta, cu, scale, use_qk_l2norm, initial_state, output_final_state);
  }

  TORCH_CHECK(gated_delta_head_dims_supported(K, V), op, ": ", gated_delta_head_dims_refusal(K, V));
  check_fused_input(op, "q", q);
  check_fused_input(op, "k", k);
  check_fused_input(op, "v", v);
  check_fused_input(op, "g", g);
  check_fused_input(op, "beta", beta);
  if (initial_state.defined()) check_fused_input(op, "initial_state", initial_state);
  TORCH_CHECK(cu_seqlens.device() == q.device(), op, ": the fused kernel needs cu_seqlens on q's device ", q.device(),
              "; got ", cu_seqlens.device());
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  bool const save = at::GradMode::is_enabled() &&
                    (q.requires_grad() || k.requires_grad() || v.requires_grad() || g.requires_grad() ||
                     beta.requires_grad() || (initial_state.defined() && initial_state.requires_grad()));
  DeviceChunkTable const table = device_chunk_table(cu_seqlens, cu);
  auto const outs = GatedDeltaFunction::apply(
      q, k, v, g, beta, initial_state.defined() ? std::optional<at::Tensor>(initial_state) : std::nullopt,
      cu_seqlens.contiguous(), table.chunks, table.chunks_host, int64_t{table.N}, int64_t{table.NC}, scale,
      use_qk_l2norm, output_final_state, save, static_cast<int64_t>(schedule));
  GatedDeltaResult r;
  r.o = outs[0];
  if (output_final_state) r.final_state = outs[1];
  return r;
#else
  TORCH_CHECK(false, "gated_delta: unreachable without CUDA kernels");
#endif
}

}  // namespace fusepack::ops
