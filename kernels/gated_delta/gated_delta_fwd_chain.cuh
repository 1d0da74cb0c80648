// Device code of the forward's kLeanChain schedule (gated_delta_schedule.h): the state chain, which carries
// only the state from chunk to chunk, and the per-chunk output kernel, which computes o and P for every chunk at once
// from the states the chain left. For few long examples, where the chain is the whole time: the output's products (q h,
// P, P v_new) leave the serial path, and the chain's two warps per 16 value columns share v_new's rows as well as the
// state's columns. Same numerics as the in-chain recurrence (gated_delta_fwd_kernels.cuh): the state and v_new in
// fp32, every product over the same bf16 parts. gated_delta_fwd.cu launches.
#pragma once

#include "kernels/gated_delta/gated_delta_fwd_kernels.cuh"

namespace fusepack::gated_delta_fwd_detail {

// v_new as the chain hands it to the output kernel: fp32 [NC, Hv, V/16, 8 token tiles, 128], each 16-column block's
// [16, 64] accumulator tiles in register order (lane l's four floats of token tile nt at nt·128 + 4·l), so both
// kernels move a tile with one coalesced 16-byte access per lane. Rows past a chunk's end hold zeros.
__host__ __device__ constexpr std::int64_t vn_tile_offset(std::int64_t chunk_head, int V, int vb) {
  return (chunk_head * (V / 16) + vb) * 8 * 128;
}

// The state entering each chunk as the chain hands it to the output kernel in a forward without saved tensors: in
// 16-bit runs, whose products take the fp32 state as two bf16 parts (SplitPolicy kOrder 1), the chain stores the
// parts it forms for its own products instead of the fp32 values, in the same bytes: of each pair of 8-column tiles
// (2s, 2s + 1) of state_tile order, tile 2s holds the lane's A fragment words of part 0 (a_from_acc of the pair),
// tile 2s + 1 those of part 1. The output kernel then loads its A fragments as they are: the same words it would form
// from the fp32 tiles, so o is the same to the bit, without the conversions (13% of its instructions). A saved h (the
// backward's input) stays fp32, as do fp32 runs, whose three parts would take 1.5 times the bytes.
template <typename T>
constexpr bool kHAsParts = SplitPolicy<T>::kOrder == 1;

__device__ __forceinline__ void store_h_parts(float* tile_pair, std::uint32_t const (&a)[2][4]) {
#pragma unroll
  for (int part = 0; part < 2; ++part) {
    *reinterpret_cast<uint4*>(tile_pair + part * 128) = make_uint4(a[part][0], a[part][1], a[part][2], a[part][3]);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Kernel 3, the state chain: one block per (example, value head, tile of 16·kSlabs value columns), sequential over the
// example's chunks. A slab of two warps owns 16 value columns and keeps hᵀ [16, K] in fp32 registers, each warp K/2
// of the state columns. Per chunk, with h the state entering it:
//   X = (k h)ᵀ (each warp over its K half; the halves added through shared memory, X_0 + X_1 in both warps);
//   Y_i = β_i (v_i − e^{G_i} rstd_k_i X_i); v_new = Ainv Y, the first warp the 16-token row blocks {0, 3}, the second
//   {1, 2} (5 of the 10 lower-triangular tile products each), exchanged through shared memory;
//   hᵀ ← e^{G_last} hᵀ + (rstd_k e^{G_last − G} ⊙ v_new)ᵀ k over the warp's K half.
// Out: h entering every chunk (`h_out`: p.h when saving, the workspace otherwise; tile order, state_tile) and v_new
// (vn_tile_offset), and the final state. The next chunk's k rows, v columns, Ainv planes and records stream into the
// other stage (cp.async) while this one computes. The warps of a block meet at block barriers.
// The output kernel runs beside the chain (gated_delta_fwd.cu launches it as a programmatic dependent): each block
// publishes in `done` [N, Hv, V/kBV] how many of its example's chunks it has written h and v_new for: at the barrier
// that starts chunk `it` (the first after those stores) when `it` is a multiple of kChainPublishEvery, and after the
// last chunk.

// How often a chain block publishes its count of chunks written. Publishing is a release store: a memory barrier
// that waits until the publishing thread's earlier stores are visible, while the block's other warps wait for its
// warp at the next barrier. Every fourth chunk (the count after the last chunk is always published) was faster in
// training than every chunk (kernels/gated_delta/NOTES.md); an output block waits at most kChainPublishEvery - 1
// chunk steps longer for its chunk.
constexpr int kChainPublishEvery = 4;

template <typename T, int kK, int kSlabs>
struct ChainSmem {
  static constexpr int kParts = SplitPolicy<T>::kOrder + 1;  // bf16 planes of Ainv
  static constexpr int kBV = 16 * kSlabs;
  static constexpr int kLdK = kK + kLdPad;
  static constexpr int kLdV = kBV + kLdPad;
  static constexpr int kTileFloats = 16 * kChunk;  // one warp's [16 columns, 64 tokens] accumulator tiles
  static constexpr std::size_t kKTile = 0;                                              // T [64][kLdK]
  static constexpr std::size_t kVTile = kKTile + sizeof(T) * kChunk * kLdK;            // T [64][kLdV]
  static constexpr std::size_t kPlanes = align16(kVTile + sizeof(T) * kChunk * kLdV);  // bf16 [parts][64][kLdSq]
  static constexpr std::size_t kRec = kPlanes + 2 * kParts * kPlane;                   // fp32 [64][kRecord]
  static constexpr std::size_t kStage = kRec + sizeof(float) * kChunk * kRecord;       // one chunk's inputs
  // fp32 [slabs][X of warp 0, X of warp 1, v_new's two row blocks of warp 0, of warp 1]: 3 · kTileFloats per slab
  static constexpr std::size_t kExchange = 2 * kStage;
  static_assert(kExchange % 16 == 0, "the exchange is read and written in 16-byte words");
  static constexpr std::size_t kBytes = kExchange + sizeof(float) * kSlabs * 3 * kTileFloats;
};

// kHParts: h_out takes the state entering each chunk as its bf16 parts (kHAsParts; when p.save is off), not fp32.
template <typename T, int kK, int kSlabs, bool kHParts>
__global__ void __launch_bounds__(kSlabs * 64, 1)
    gated_delta_fwd_state_chain(GatedDeltaFwdParams p, float const* rec, __nv_bfloat16 const* ainv_planes,
                                float* h_out, float* vn_tiles, int* done) {
  static_assert(!kHParts || kHAsParts<T>, "the state goes as parts only in the runs whose products take two");
  using Sm = ChainSmem<T, kK, kSlabs>;
  using Pol = SplitPolicy<T>;
  constexpr int kThreads = kSlabs * 64, kBV = Sm::kBV, kKW = kK / 2;  // state columns of a warp
  constexpr int kStateTiles = kKW / 8;
  constexpr int kPF = Pol::kOrder + 1, kPR = Pol::kRawParts;
  extern __shared__ __align__(16) unsigned char gd_smem[];

  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  int const slab = warp / 2, kh = warp % 2;
  int const Hk = p.Hk, Hv = p.Hv, V = p.V, tiles = V / kBV;
  GatedDeltaChunks::ChainBlock const block = gated_delta_chunks(p).chain_block(blockIdx.x, Hv, tiles);
  int const vtile = block.tile, hv = block.head, n = block.example;  // longest example first
  int const hk = hv / (Hv / Hk);
  int const v0 = vtile * kBV;          // first value column of the block
  int const wc = 16 * slab;            // the slab's columns within the block's tile
  int const vb = (v0 + wc) / 16;       // the slab's 16-column block of V
  int const d0 = kh * kKW;             // the warp's first state column (key dimension)
  std::int64_t const bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];
  int const chunks = static_cast<int>((eos - bos + kChunk - 1) / kChunk);
  int const chunk0 = gated_delta_chunks(p).first_chunk(n);
  int* const my_done = done != nullptr ? done + (std::int64_t(n) * Hv + hv) * tiles + vtile : nullptr;  // T = 0
  grid_launch_dependents();  // every block of the chain has started once the output kernel's blocks may start
  if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kChainStart);
  float* const exchange = reinterpret_cast<float*>(gd_smem + Sm::kExchange) + slab * 3 * Sm::kTileFloats;
  float* const x_mine = exchange + kh * Sm::kTileFloats;
  float const* const x_other = exchange + (kh ^ 1) * Sm::kTileFloats;
  // A warp's two row blocks of v_new, in register order: tile nt (row block np = nt / 2) at slot 2 (np / 2) + nt % 2,
  // so that both {0, 3} and {1, 2} fill slots 0..3.
  float* const vn_mine = exchange + 2 * Sm::kTileFloats + kh * (Sm::kTileFloats / 2);
  float const* const vn_other = exchange + 2 * Sm::kTileFloats + (kh ^ 1) * (Sm::kTileFloats / 2);
  auto const vn_slot = [](int nt) { return ((nt >> 2) << 1) | (nt & 1); };

  // hᵀ[v0 + wc + g + 8·(e>>1)][d0 + 8·nt + 2t + (e&1)] in h[nt][e]; state tensors are [.., K, V].
  float h[kStateTiles][4];
  std::int64_t const state_off = (std::int64_t(n) * Hv + hv) * kK * V + v0 + wc + g;
  load_state_slab(h, p.initial_state, state_off, d0, V, t);

  // Chunk `it` of the example into stage s: k rows, the block's v columns, Ainv planes and records (zeros past L).
  auto issue = [&](int it, int s) {
    unsigned char* base = gd_smem + s * Sm::kStage;
    std::int64_t const t0 = bos + std::int64_t(it) * kChunk;
    int const L = static_cast<int>(eos - t0 < kChunk ? eos - t0 : kChunk);
    copy_chunk_inputs<T, kK, kBV, kThreads, false, true>(p, rec, ainv_planes, t0, L, hk, hv, v0, base + Sm::kKTile,
                                                         nullptr, int(sizeof(T)) * Sm::kLdK, base + Sm::kVTile,
                                                         int(sizeof(T)) * Sm::kLdV, base + Sm::kPlanes, base + Sm::kRec);
  };

  if (chunks > 0) issue(0, 0);
  cp_async_commit();
  for (int it = 0; it < chunks; ++it) {
    int const s = it & 1;
    cp_async_wait_all();
    __syncthreads();  // stage s has landed for every thread; every read of stage s^1 (the previous chunk) is done
    if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kChainStep, it);
    // Every store of chunks < it came before the barrier (and it > 0 means chunks > 0, so my_done is set).
    if (tid == 0 && it > 0 && it % kChainPublishEvery == 0) publish_count(my_done, it);
    if (it + 1 < chunks) issue(it + 1, s ^ 1);
    cp_async_commit();

    unsigned char* base = gd_smem + s * Sm::kStage;
    T const* k_tile = reinterpret_cast<T const*>(base + Sm::kKTile);
    T const* v_tile = reinterpret_cast<T const*>(base + Sm::kVTile);
    __nv_bfloat16 const* planes = reinterpret_cast<__nv_bfloat16 const*>(base + Sm::kPlanes);
    float const* rec_tile = reinterpret_cast<float const*>(base + Sm::kRec);
    std::int64_t const chunk_head = std::int64_t(chunk0 + it) * Hv + hv;

    // X = (k h)ᵀ over the warp's state columns (A = the state slab, B = the raw k rows; the rows past L are zeros in
    // the stage, so the last chunk's products need no guard, which would make the compiler recompute every address).
    // The state entering the chunk goes out on the way, one 16-byte store per tile among the products: in fp32 when
    // saving (and in fp32 runs), as its bf16 parts otherwise (kHParts).
    float* const hc = h_out + chunk_head * V * kK + state_tile(kK, vb, d0 / 8) + 4 * lane;
    float x[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKW / 16; ++ks) {
      if constexpr (!kHParts) {
#pragma unroll
        for (int nt = 2 * ks; nt < 2 * ks + 2; ++nt) {
          *reinterpret_cast<float4*>(hc + state_tile(kK, 0, nt)) = make_float4(h[nt][0], h[nt][1], h[nt][2], h[nt][3]);
        }
      }
      std::uint32_t a[kPF][4];
      a_from_acc<kPF>(h[2 * ks], h[2 * ks + 1], a);
      if constexpr (kHParts) store_h_parts(hc + state_tile(kK, 0, 2 * ks), a);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        std::uint32_t b0[kPR][2], b1[kPR][2];
        load_b_cols_x2<T, kPR>(k_tile, Sm::kLdK, 16 * np, d0 + 16 * ks, lane, b0, b1);
        mma_split<Pol::kOrder>(x[2 * np], a, b0);
        mma_split<Pol::kOrder>(x[2 * np + 1], a, b1);
      }
    }
    tiles_to_exchange(x, x_mine, lane);
    __syncthreads();  // the slabs work in step
    tiles_add_from_exchange(x, x_other, lane);  // X_kh + X_other: the same sum in both warps (fp32 addition commutes)

    // Y_i = β_i (v_i − e^{G_i} rstd_k_i X_i) in place of X; then this warp's row blocks of v_new = Ainv Y.
    y_from_x(x, v_tile, Sm::kLdV, wc, rec_tile, lane);
    float vn[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (kh == 0 || ks < 3) {  // the second warp's blocks {1, 2} need Y's blocks 0..2 only
        std::uint32_t a[kPF][4];
        a_from_acc<kPF>(x[2 * ks], x[2 * ks + 1], a);
#pragma unroll
        for (int np = ks; np < 4; ++np) {  // Ainv is lower-triangular
          if (lean_owns_token_block(kh, np)) {
            std::uint32_t b0[kPF][2], b1[kPF][2];
            load_b_planes_x2<kPF>(planes, 16 * np, 16 * ks, lane, b0, b1);
            mma_split<Pol::kOrder>(vn[2 * np], a, b0);
            mma_split<Pol::kOrder>(vn[2 * np + 1], a, b1);
          }
        }
      }
    }
    // This warp's blocks out (the output kernel's v_new) and to the partner; the partner's blocks in.
    float* const vt = vn_tiles + vn_tile_offset(chunk_head, V, vb) + 4 * lane;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (lean_owns_token_block(kh, nt / 2)) {
        *reinterpret_cast<float4*>(vt + nt * 128) = make_float4(vn[nt][0], vn[nt][1], vn[nt][2], vn[nt][3]);
        tile_to_exchange(vn[nt], vn_mine, vn_slot(nt), lane);
      }
    }
    __syncthreads();  // the slabs work in step
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (!lean_owns_token_block(kh, nt / 2)) tile_from_exchange(vn[nt], vn_other, vn_slot(nt), lane);
    }

    // hᵀ ← e^{G_last} hᵀ + (rstd_k e^{G_last − G} ⊙ v_new)ᵀ k, each warp over its state columns.
    update_state(h, vn, k_tile, Sm::kLdK, rec_tile, d0, kChunk, lane);  // unguarded: zeros past L
  }
  __syncthreads();  // the last chunk's stores
  if (tid == 0 && chunks > 0) publish_count(my_done, chunks);
  if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kChainEnd);

  if (p.final_state != nullptr) store_state_slab(h, p.final_state, state_off, d0, V, t);
}

// ---------------------------------------------------------------------------------------------------------------
// Kernel 4, the output: one block per (chunk, value head), K/16 warps, warp w on value columns 16w..16w+15 (K = V).
// It runs beside the chain: P first, from the chunk's own inputs; then it waits until the chain's blocks of its
// example and head have published the chunk (`done`), and reads h and v_new from L2. The grid's last block waits for
// the whole chain before it ends, so that nothing after this kernel in the stream runs before the chain has finished
// (its final state). Blocks run in chunk order, the order in which the chain of one example publishes them.
// From the chunk's q and k rows, its records, the state entering it (h) and its v_new (both from the chain):
//   P as in the in-chain recurrence (build_p_planes), saved for the backward of 16-bit runs;
//   o = scale rstd_q e^{G} (q h) + P v_new, over the same parts and in the same order as the in-chain recurrence's
//   one-warp-per-16-columns shape; v_new out to p.v_new in its hand-over type when saving.
template <typename T, int kK>
struct OutputSmem {
  static constexpr int kParts = SplitPolicy<T>::kOrder + 1;  // bf16 planes of P
  static constexpr int kLdK = kK + kLdPad;
  static constexpr int kWarps = kK / 16;
  // 16-bit runs stage a warp's second half of h and its v_new through shared memory (one copy in flight for all of
  // them); fp32 runs, whose tiles are twice the size, only v_new, to stay at two blocks per multiprocessor.
  static constexpr bool kStageHalfH = sizeof(T) < 4;
  static constexpr std::size_t kWarpStage = sizeof(float) * ((kStageHalfH ? 16 * kK / 2 : 0) + 16 * kChunk);
  static constexpr std::size_t kQTile = 0;                                              // T [64][kLdK]
  static constexpr std::size_t kPlanes = align16(kQTile + sizeof(T) * kChunk * kLdK);  // bf16 [parts][64][kLdSq]
  static constexpr std::size_t kRec = kPlanes + 2 * kParts * kPlane;                   // fp32 [64][kRecord]
  static constexpr std::size_t kKTile = kRec + sizeof(float) * kChunk * kRecord;      // T [64][kLdK], until P is built
  static constexpr std::size_t kStage = kKTile;  // then fp32 [warps][the warp's h half, v_new], in register order
  static constexpr std::size_t kKTileBytes = sizeof(T) * kChunk * kLdK, kStageBytes = kWarps * kWarpStage;
  static constexpr std::size_t kBytes = kKTile + (kKTileBytes > kStageBytes ? kKTileBytes : kStageBytes);
};

// kHParts: h_in holds the state's bf16 parts (kHAsParts; the chain stores them when p.save is off), not fp32.
// kChainColumns: the value columns of one chain block (one `done` counter each).
template <typename T, int kK, bool kHParts, int kChainColumns = kGatedDeltaLeanColumns>
__global__ void __launch_bounds__(kK * 2, 2)
    gated_delta_fwd_chunk_output(GatedDeltaFwdParams p, float const* rec, float const* h_in, float const* vn_tiles,
                                 int const* done) {
  static_assert(!kHParts || kHAsParts<T>, "the state comes as parts only in the runs whose products take two");
  using Sm = OutputSmem<T, kK>;
  using Pol = SplitPolicy<T>;
  constexpr int kWarps = Sm::kWarps, kThreads = kWarps * 32, kStateTiles = kK / 8;
  constexpr int kPF = Pol::kOrder + 1, kPR = Pol::kRawParts;
  extern __shared__ __align__(16) unsigned char gd_smem[];

  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, t = lane & 3;
  if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kOutputStart);
  int const Hk = p.Hk, Hv = p.Hv, V = p.V;
  int const hv = static_cast<int>(blockIdx.x % Hv), c = static_cast<int>(blockIdx.x / Hv);
  int const hk = hv / (Hv / Hk);
  GatedDeltaChunks const table = gated_delta_chunks(p);
  std::int64_t const t0 = table.start(c);
  int const L = table.len(c);
  std::int64_t const chunk_head = std::int64_t(c) * Hv + hv;
  T* const q_tile = reinterpret_cast<T*>(gd_smem + Sm::kQTile);
  __nv_bfloat16* const planes = reinterpret_cast<__nv_bfloat16*>(gd_smem + Sm::kPlanes);
  float* const rec_tile = reinterpret_cast<float*>(gd_smem + Sm::kRec);
  T* const k_tile = reinterpret_cast<T*>(gd_smem + Sm::kKTile);

  std::int64_t const qk0 = (t0 * Hk + hk) * kK, qk_stride = sizeof(T) * std::int64_t(Hk) * kK;
  copy_rows_async<kChunk, int(sizeof(T)) * kK, kThreads>(q_tile, int(sizeof(T)) * Sm::kLdK,
                                                         static_cast<T const*>(p.q) + qk0, qk_stride, L);
  copy_rows_async<kChunk, int(sizeof(T)) * kK, kThreads>(k_tile, int(sizeof(T)) * Sm::kLdK,
                                                         static_cast<T const*>(p.k) + qk0, qk_stride, L);
  copy_rows_async<kChunk, 4 * kRecord, kThreads>(rec_tile, 4 * kRecord, rec + (t0 * Hv + hv) * kRecord,
                                                 4 * std::int64_t(Hv) * kRecord, L);
  cp_async_commit();

  cp_async_wait_all();
  __syncthreads();  // q, k and the records have landed

  build_p_planes<T, kK, kWarps>(q_tile, k_tile, Sm::kLdK, rec_tile, planes, L, warp, lane);
  if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kOutputBuilt);

  // Until the chain's blocks of this example and head (one per kChainColumns value columns) have written the chunk.
  int const chain_tiles = V / kChainColumns;  // the launcher runs the chain in blocks of these
  if (tid < chain_tiles) {
    int const n = table.example(c), step = c - table.first_chunk(n);
    int const* const count = done + (std::int64_t(n) * Hv + hv) * chain_tiles + tid;
    while (acquire_count(count) <= step) __nanosleep(200);
  }
  __syncthreads();  // the chunk is published; P is complete, and the k tile is dead (the stage overlays it)
  if (tid == 0) {
    gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kOutputReady, c - table.first_chunk(table.example(c)));
  }

  // This warp's state slab hᵀ [16, K] in two halves of K (to stay within the registers of two blocks per
  // multiprocessor) and its v_new [16 columns, 64 tokens], all requested at once: the first half into registers, the
  // rest into the warp's stage by cp.async, each lane copying the 16 bytes of each tile it later reads itself (so
  // its own wait is the only one it needs).
  float const* const hc = h_in + chunk_head * V * kK + state_tile(kK, warp, 0) + 4 * lane;
  float const* const vt = vn_tiles + vn_tile_offset(chunk_head, V, warp) + 4 * lane;
  float* const stage = reinterpret_cast<float*>(gd_smem + Sm::kStage) + warp * (Sm::kWarpStage / sizeof(float));
  float* const h_stage = stage + 4 * lane;                                       // tiles kStateTiles / 2 ..
  float* const vn_stage = stage + (Sm::kStageHalfH ? 16 * kK / 2 : 0) + 4 * lane;  // 8 token tiles
  if constexpr (Sm::kStageHalfH) {
#pragma unroll
    for (int nt = 0; nt < kStateTiles / 2; ++nt) {
      cp_async16(h_stage + nt * 128, hc + state_tile(kK, 0, kStateTiles / 2 + nt), 16);
    }
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) cp_async16(vn_stage + nt * 128, vt + nt * 128, 16);
  cp_async_commit();

  // Z = (q h)ᵀ over all K, scaled by scale rstd_q e^{G} per token (h's tiles as loaded: fp32, or its parts).
  float z[8][4] = {};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float h[kStateTiles / 2][4];
    if (half == 1 && Sm::kStageHalfH) cp_async_wait_all();
#pragma unroll
    for (int nt = 0; nt < kStateTiles / 2; ++nt) {
      float const* const tile = hc + state_tile(kK, 0, half * kStateTiles / 2 + nt);
      float4 const f = half == 1 && Sm::kStageHalfH ? *reinterpret_cast<float4 const*>(h_stage + nt * 128)
                                                    : __ldcg(reinterpret_cast<float4 const*>(tile));
      h[nt][0] = f.x, h[nt][1] = f.y, h[nt][2] = f.z, h[nt][3] = f.w;
    }
#pragma unroll
    for (int ks = 0; ks < kK / 32; ++ks) {
      std::uint32_t a[kPF][4];
      if constexpr (kHParts) {  // the tile pair's words are the A fragment's two parts (store_h_parts)
#pragma unroll
        for (int part = 0; part < kPF; ++part) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[part][e] = __float_as_uint(h[2 * ks + part][e]);
        }
      } else {
        a_from_acc<kPF>(h[2 * ks], h[2 * ks + 1], a);
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {  // unguarded: the q tile holds zeros past L, whose products add zeros
        std::uint32_t b0[kPR][2], b1[kPR][2];
        load_b_cols_x2<T, kPR>(q_tile, Sm::kLdK, 16 * np, half * kK / 2 + 16 * ks, lane, b0, b1);
        mma_split<Pol::kOrder>(z[2 * np], a, b0);
        mma_split<Pol::kOrder>(z[2 * np + 1], a, b1);
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) z[nt][e] *= rec_tile[(8 * nt + 2 * t + (e & 1)) * kRecord + kRecC];
  }
  cp_async_wait_all();
  float vn[8][4];  // this warp's v_new [16 columns, 64 tokens]
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    float4 const f = *reinterpret_cast<float4 const*>(vn_stage + nt * 128);
    vn[nt][0] = f.x, vn[nt][1] = f.y, vn[nt][2] = f.z, vn[nt][3] = f.w;
  }
  if (p.save) save_p_planes<T, kThreads>(planes, p.P, chunk_head, tid);

  // o = Z + P v_new; o, and v_new when saving, out by token rows: staged over the q tile and the warps' stages (both
  // dead once every warp is past its Z products and its v_new loads), stored whole by the block.
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    std::uint32_t a[kPF][4];
    a_from_acc<kPF>(vn[2 * ks], vn[2 * ks + 1], a);
#pragma unroll
    for (int np = ks; np < 4; ++np) {  // P is lower-triangular
      std::uint32_t b0[kPF][2], b1[kPF][2];
      load_b_planes_x2<kPF>(planes, 16 * np, 16 * ks, lane, b0, b1);
      mma_split<Pol::kOrder>(z[2 * np], a, b0);
      mma_split<Pol::kOrder>(z[2 * np + 1], a, b1);
    }
  }
  constexpr int kLdO = kK + 16 / int(sizeof(T)), kLdVn = kK + 4;
  static_assert(kLdO <= Sm::kLdK && sizeof(float) * kChunk * kLdVn <= Sm::kBytes - Sm::kStage,
                "o's rows fit over the q tile, v_new's over the stages");
  T* const o_rows = q_tile;
  float* const vn_rows = reinterpret_cast<float*>(gd_smem + Sm::kStage);
  __syncthreads();  // every warp is past its reads of the q tile and its stage
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    tile_to_rows(z[nt], o_rows + 16 * warp, kLdO, 8 * nt, lane);
    if (p.save) tile_to_rows(vn[nt], vn_rows + 16 * warp, kLdVn, 8 * nt, lane);
  }
  __syncthreads();
  std::int64_t const row0 = (t0 * Hv + hv) * V, stride = std::int64_t(Hv) * V;
  store_stage_rows<kChunk, int(sizeof(T)) * kK, kThreads>(static_cast<T*>(p.o) + row0, sizeof(T) * stride, o_rows,
                                                          int(sizeof(T)) * kLdO, L);
  if (p.save) {
    store_stage_rows<kChunk, 4 * kK, kThreads>(p.v_new + row0, 4 * stride, vn_rows, 4 * kLdVn, L);
  }
  if (blockIdx.x == gridDim.x - 1) grid_wait_prerequisites();  // this kernel ends after the chain
  if constexpr (gated_delta_trace_detail::kTraced) {
    __syncthreads();  // every thread's stores issued
    if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kOutputEnd);
  }
}

}  // namespace fusepack::gated_delta_fwd_detail
