// The lean forward's state chain in warpgroup products (wgmma, kernels/common/wgmma.cuh): bf16 runs at K = V = 128.
// The same chunk step and the same bf16 parts as gated_delta_fwd_state_chain (gated_delta_fwd_chain.cuh), one
// warpgroup per 64 value columns instead of two warps per 16: warp w holds hᵀ of the block's value columns 16w ..
// 16w + 15 over all 128 state columns (64 fp32 registers a thread, the accumulators of the update's products), so
// neither X nor v_new is exchanged between warps. Per chunk, with h the state entering it:
//   Xᵀ [64 columns × 64 tokens] = hᵀ kᵀ: A = hᵀ's two bf16 parts from registers, B = the k tile (K-major);
//   Yᵀ = β (vᵀ − e^{G} rstd_k ⊙ Xᵀ) in place (y_from_x, the same as the in-chain recurrences');
//   v_newᵀ [64 columns × 64 tokens] = Yᵀ Ainvᵀ: A = Yᵀ's two parts from registers, B = Ainv's two planes (K-major),
//   three products per K step (hi·lo, lo·hi, hi·hi, the order of mma_split);
//   hᵀ ← e^{G_last} hᵀ + (rstd_k e^{G_last − G} ⊙ v_new)ᵀ k: A = the scaled v_newᵀ's two parts from registers, B = the
//   same k tile read transposed (MN-major), N = 128.
// Out: h entering every chunk and v_new in the tile orders the output kernel reads (state_tile, vn_tile_offset), the
// final state, and the count of chunks written in `done` [N, Hv, V / 64] every kChainPublishEvery chunks and after the
// last, as gated_delta_fwd_state_chain publishes it. Its sums run in another order than mma.sync's (X over all of K
// at once rather than two halves added), so its results are not those of gated_delta_fwd_state_chain bit for bit.
#pragma once

#include "kernels/common/wgmma.cuh"
#include "kernels/gated_delta/gated_delta_fwd_chain.cuh"
#include "kernels/gated_delta/gated_delta_wg.cuh"

namespace fusepack::gated_delta_fwd_detail {

constexpr int kWgChainColumns = 64;  // value columns of a block: one warpgroup, 16 per warp

// One stage (a chunk's inputs), every operand tile 1024-byte aligned for its 128-byte swizzle:
//   k [64 tokens][128] bf16 as two K-major tiles of 64 state columns (8 KB each);
//   Ainv's two planes [64 i][64 j] bf16, K-major (8 KB each);
//   v's 64 value columns [64 tokens][64 + pad] bf16, plain rows (read by ldmatrix.trans in y_from_x);
//   the records [64][kRecord] fp32.
struct WgChainSmem {
  static constexpr int kLdV = kWgChainColumns + kLdPad;
  static constexpr std::size_t kK = 0;
  static constexpr std::size_t kPlanes = kK + 2 * 8192;
  static constexpr std::size_t kV = kPlanes + 2 * 8192;
  static constexpr std::size_t kRec = kV + 2 * kChunk * kLdV;
  static constexpr std::size_t kStage = (kRec + 4 * kChunk * kRecord + 1023) / 1024 * 1024;
  static constexpr std::size_t kBytes = 2 * kStage + 1024;  // + 1024: the dynamic buffer aligned up by the kernel
};

template <bool kHParts>
__global__ void __launch_bounds__(128, 1)
    gated_delta_fwd_state_chain_wg(GatedDeltaFwdParams p, float const* rec, __nv_bfloat16 const* ainv_planes,
                                   float* h_out, float* vn_tiles, int* done) {
  static_assert(!kHParts, "the state goes to the output kernel in fp32 from this chain");
  using Sm = WgChainSmem;
  using T = __nv_bfloat16;
  constexpr int kK = 128, kThreads = 128, kPF = 2;
  extern __shared__ unsigned char gd_smem_raw[];
  // The swizzled tiles need 1024-byte alignment in the shared window (the dynamic buffer guarantees 16).
  auto const raw_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(gd_smem_raw));
  unsigned char* const gd_smem = gd_smem_raw + ((1024 - (raw_address & 1023)) & 1023);

  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  int const Hk = p.Hk, Hv = p.Hv, V = p.V, tiles = V / kWgChainColumns;
  GatedDeltaChunks::ChainBlock const block = gated_delta_chunks(p).chain_block(blockIdx.x, Hv, tiles);
  int const hv = block.head, n = block.example;  // longest example first
  int const hk = hv / (Hv / Hk);
  int const v0 = block.tile * kWgChainColumns;  // first value column of the block
  int const vb = v0 / 16 + warp;                // the warp's 16-column block of V
  std::int64_t const bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];
  int const chunks = static_cast<int>((eos - bos + kChunk - 1) / kChunk);
  int const chunk0 = gated_delta_chunks(p).first_chunk(n);
  int* const my_done = done != nullptr ? done + (std::int64_t(n) * Hv + hv) * tiles + block.tile : nullptr;
  grid_launch_dependents();  // every block of the chain has started once the output kernel's blocks may start
  if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kChainStart);

  // hᵀ[v0 + 16·warp + g + 8·(e>>1)][8·nt + 2t + (e&1)] in h[4·nt + e]: the update's accumulators (m64n128).
  float h[64];
  std::int64_t const state_off = (std::int64_t(n) * Hv + hv) * kK * V + v0 + 16 * warp + g;
  load_state_slab(reinterpret_cast<float(&)[16][4]>(h), p.initial_state, state_off, 0, V, t);

  // Chunk `it` of the example into stage s (zeros past L). Each thread copies one 16-byte column of the k tile (rows
  // tid / 16 + 8u) and of Ainv's planes (rows tid / 8 + 16u): rows 8 apart share a swizzle, so each copy is the last
  // one's addresses plus constants.
  int const kc = tid % 16, kr = tid / 16, pc = tid % 8, pr = tid / 8;
  int const k_dst = Sm::kK + (kc >> 3) * 8192 + wgmma::sw128_offset(kr, kc & 7);
  int const p_dst = Sm::kPlanes + wgmma::sw128_offset(pr, pc);
  auto issue = [&](int it, int s) {
    unsigned char* const base = gd_smem + s * Sm::kStage;
    std::int64_t const t0 = bos + std::int64_t(it) * kChunk;
    int const L = static_cast<int>(eos - t0 < kChunk ? eos - t0 : kChunk);
    T const* const k0 = static_cast<T const*>(p.k) + (t0 * Hk + hk) * kK;
    T const* const k_src = k0 + std::int64_t(kr) * Hk * kK + 8 * kc;
    __nv_bfloat16 const* const p0 = ainv_planes + (t0 * Hv + hv) * kPF * kChunk;
    __nv_bfloat16 const* const p_src = p0 + std::int64_t(pr) * Hv * kPF * kChunk + 8 * pc;
    std::int64_t const k_step8 = std::int64_t(8) * Hk * kK, p_step16 = std::int64_t(16) * Hv * kPF * kChunk;
    auto const copy = [&](auto guarded) {  // a whole chunk without the guards (every chunk but an example's last)
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        bool const in = !decltype(guarded)::value || kr + 8 * u < L;
        cp_async16(base + k_dst + u * 1024, in ? k_src + u * k_step8 : k0, in ? 16 : 0);
      }
#pragma unroll
      for (int part = 0; part < kPF; ++part) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          bool const in = !decltype(guarded)::value || pr + 16 * u < L;
          cp_async16(base + p_dst + part * 8192 + u * 2048, in ? p_src + u * p_step16 + part * kChunk : p0,
                     in ? 16 : 0);
        }
      }
    };
    if (L == kChunk) {
      copy(std::false_type{});
    } else {
      copy(std::true_type{});
    }
    copy_rows_async<kChunk, int(sizeof(T)) * kWgChainColumns, kThreads, true>(
        base + Sm::kV, int(sizeof(T)) * Sm::kLdV, static_cast<T const*>(p.v) + (t0 * Hv + hv) * V + v0,
        sizeof(T) * std::int64_t(Hv) * V, L);
    copy_rows_async<kChunk, 4 * kRecord, kThreads, true>(base + Sm::kRec, 4 * kRecord, rec + (t0 * Hv + hv) * kRecord,
                                                         4 * std::int64_t(Hv) * kRecord, L);
  };

  if (chunks > 0) issue(0, 0);
  cp_async_commit();
  float x[32] = {}, vn[32] = {};  // Xᵀ (then Yᵀ) and v_newᵀ: each chunk's first product overwrites them
  for (int it = 0; it < chunks; ++it) {
    int const s = it & 1;
    cp_async_wait_all();
    wgmma::fence_shared_to_async();  // this thread's cp.async writes, for the products' reads
    __syncthreads();  // stage s has landed for every thread; every read of stage s^1 (the previous chunk) is done
    if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kChainStep, it);

    unsigned char* const base = gd_smem + s * Sm::kStage;
    T const* const v_tile = reinterpret_cast<T const*>(base + Sm::kV);
    float const* const rec_tile = reinterpret_cast<float const*>(base + Sm::kRec);
    std::uint64_t const desc_k = wgmma::sw128_desc(base + Sm::kK);
    std::uint64_t const desc_k_mn = wgmma::sw128_mn_desc(base + Sm::kK, 8192);
    std::uint64_t const desc_ainv[2] = {wgmma::sw128_desc(base + Sm::kPlanes),
                                        wgmma::sw128_desc(base + Sm::kPlanes + 8192)};
    std::int64_t const chunk_head = std::int64_t(chunk0 + it) * Hv + hv;

    // Xᵀ = hᵀ kᵀ from the state's parts; while it runs, the count published, the next chunk's copies issued and the
    // state entering this chunk stored.
    std::uint32_t ah[kK / 16][kPF][4];
    a_from_acc_steps<kPF>(h, ah);
    issue_state_times_kt(x, ah, desc_k);
    if (tid == 0 && it > 0 && it % kChainPublishEvery == 0) publish_count(my_done, it);
    if (it + 1 < chunks) issue(it + 1, s ^ 1);
    cp_async_commit();
    store_state(h, h_out + chunk_head * V * kK + state_tile(kK, vb, 0) + 4 * lane);
    wgmma::wait<0>();
    hold_registers(ah);
    hold_registers(x);

    // Yᵀ in place of Xᵀ, then its parts.
    y_from_x(reinterpret_cast<float(&)[8][4]>(x), v_tile, Sm::kLdV, 16 * warp, rec_tile, lane);
    std::uint32_t ay[4][kPF][4];
    a_from_acc_steps<kPF>(x, ay);

    // v_newᵀ = Yᵀ Ainvᵀ (Ainv's planes [i][j]: B K-major over j).
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma::mma_m64n64k16_bf16_rs(vn, ay[ks][0], wgmma::k_step(desc_ainv[1], ks), ks > 0);
      wgmma::mma_m64n64k16_bf16_rs(vn, ay[ks][1], wgmma::k_step(desc_ainv[0], ks), true);
      wgmma::mma_m64n64k16_bf16_rs(vn, ay[ks][0], wgmma::k_step(desc_ainv[0], ks), true);
    }
    wgmma::commit();
    wgmma::wait<0>();
    hold_registers(ay);
    hold_registers(vn);

    // hᵀ ← e^{G_last} hᵀ + (rstd_k e^{G_last − G} ⊙ v_new)ᵀ k (k read transposed: N = the 128 state columns), from the
    // scaled v_newᵀ's parts; while it runs, v_new out (the output kernel's tiles: this warp's 16 columns × 64 tokens
    // in register order).
    float const decay = rec_tile[kRecDecay];
#pragma unroll
    for (int e = 0; e < 64; ++e) h[e] *= decay;
    std::uint32_t av[4][kPF][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      float f[8];  // the accumulator tiles 2ks and 2ks + 1, each column scaled
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        int const nt = 2 * ks + (e >> 2);
        f[e] = vn[4 * nt + (e & 3)] * rec_tile[(8 * nt + 2 * t + (e & 1)) * kRecord + kRecD];
      }
      a_from_floats<kPF>(f, av[ks]);
    }
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma::mma_m64n128k16_bf16_rs<true>(h, av[ks][1], wgmma::k_step_mn(desc_k_mn, ks), true);
      wgmma::mma_m64n128k16_bf16_rs<true>(h, av[ks][0], wgmma::k_step_mn(desc_k_mn, ks), true);
    }
    wgmma::commit();
    float* const vt = vn_tiles + vn_tile_offset(chunk_head, V, vb) + 4 * lane;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      *reinterpret_cast<float4*>(vt + nt * 128) =
          make_float4(vn[4 * nt], vn[4 * nt + 1], vn[4 * nt + 2], vn[4 * nt + 3]);
    }
    wgmma::wait<0>();
    hold_registers(av);
    hold_registers(h);
  }
  __syncthreads();  // the last chunk's stores
  if (tid == 0 && chunks > 0) publish_count(my_done, chunks);
  if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kChainEnd);

  if (p.final_state != nullptr) {
    store_state_slab(reinterpret_cast<float const(&)[16][4]>(h), p.final_state, state_off, 0, V, t);
  }
}

}  // namespace fusepack::gated_delta_fwd_detail
