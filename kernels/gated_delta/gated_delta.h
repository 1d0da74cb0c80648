// The chunked gated delta rule (Gated DeltaNet) over packed examples, fused forward and backward.
// Chunks of kGatedDeltaChunk tokens never span two examples (an example's last chunk may be short); the state is
// reset to the example's initial state (or zeros) at every example start. q/k l2-normalisation and the scale are
// fused in. Numerical contract: inputs widened to fp32; state, its chunk-to-chunk recurrence and every accumulation
// in fp32; one rounding of o (and of dq, dk, dv, dbeta) to the input dtype; 16-bit runs' products on the tensor cores
// over bf16 parts of their operands (gated_delta_mma.cuh's SplitPolicy: ~2^-16 relative; 2^-9 for most fp32
// intermediates of the bf16 backward's per-chunk products, which reach only its rounded gradients and dg, whose
// budget the CPU checks the policy against in tests/reference/gated_delta_chunked_test.cpp). The backward is bitwise
// deterministic: every sum has a fixed order (no atomics), including the sum over the value heads of a key head.
#pragma once

#include "kernels/common/dtype.h"
#include "kernels/gated_delta/gated_delta_head_dims.h"
#include "kernels/gated_delta/gated_delta_schedule.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fusepack {

inline constexpr int kGatedDeltaChunk = 64;

// The chunk table, built on the host from cu_seqlens (gated_delta_chunk_table) and copied to the device once.
// chunk c of the packed batch covers tokens [chunk_start[c], chunk_start[c] + chunk_len[c]) of example
// chunk_example[c]; an example's chunks are consecutive, in order; chunk_offsets[n] is the first chunk of example n
// (an empty example owns no chunk: chunk_offsets[n] == chunk_offsets[n + 1]). by_length lists the examples from the
// most chunks to the fewest (ties in example order): the sequential recurrences take their examples in that order,
// so that the longest chains, which bound a pack's time, start first and the short ones fill in behind them.
struct GatedDeltaChunkTable {
  // [chunk_start: NC][chunk_len: NC][chunk_example: NC][chunk_offsets: N+1][by_length: N]
  std::vector<std::int32_t> data;
  int N = 0, NC = 0;
};
GatedDeltaChunkTable gated_delta_chunk_table(std::vector<std::int32_t> const& cu_seqlens);

// GatedDeltaChunkTable::data read by field name (FlashAttention's SeqlenInfo idea): the one reader of its layout.
struct GatedDeltaChunks {
  std::int32_t const* data = nullptr;  // GatedDeltaChunkTable::data
  int NC = 0, N = 0;
  __host__ __device__ std::int32_t start(int c) const { return data[c]; }             // chunk c's first token
  __host__ __device__ std::int32_t len(int c) const { return data[NC + c]; }          // its tokens, 1..kGatedDeltaChunk
  __host__ __device__ std::int32_t example(int c) const { return data[2 * NC + c]; }  // the example holding it
  // Example n's first chunk (its chunks are first_chunk(n) .. first_chunk(n + 1) - 1; first_chunk(N) = NC).
  __host__ __device__ std::int32_t first_chunk(int n) const { return data[3 * NC + n]; }
  // The example with the i-th most chunks (by_length[i]): the one a recurrence's i-th group of blocks runs.
  __host__ __device__ std::int32_t example_by_length(int i) const { return data[3 * NC + N + 1 + i]; }
  // Block `block` of a sequential recurrence's grid, ordered [example by length][value head][value tile] (Hv heads of
  // `tiles` tiles): the example, value head and tile it runs.
  struct ChainBlock {
    int example, head, tile;
  };
  __host__ __device__ ChainBlock chain_block(std::int64_t block, int Hv, int tiles) const {
    int const tile = static_cast<int>(block % tiles);
    block /= tiles;
    int const head = static_cast<int>(block % Hv);
    return {example_by_length(static_cast<int>(block / Hv)), head, tile};
  }
};

// bf16 parts the saved (I + A)^-1 is split into: 2 for bf16 and fp16 runs, 3 for fp32 runs (fp32 accuracy). The
// saved P has as many parts.
inline int gated_delta_ainv_parts(DType dtype) { return dtype == DType::kF32 ? 3 : 2; }

// Whether the forward also saves the backward's intra-chunk operands (P and the row records below): 16-bit runs,
// whose forward computes them anyway; the backward of fp32 runs (the accuracy path) recomputes them from an fp64
// cumulative sum of g, which the fp32 budgets need and the 16-bit ones do not (kernels/gated_delta/NOTES.md).
inline bool gated_delta_saves_intra(DType dtype) { return dtype != DType::kF32; }

// Bytes per element of the backward's y: bf16 runs store it as the one bf16 part their backward's per-chunk kernel
// reads (its products reach only gradients rounded to bf16, and dg; NOTES.md), other runs fp32.
inline int gated_delta_y_bytes(DType dtype) { return dtype == DType::kBF16 ? 2 : 4; }

// The backward recurrence's row scales: one record of kBwdRecord fp32 per (token, value head), G the in-chunk
// inclusive cumulative sum of g and G_last its value at the chunk's last token.
enum GatedDeltaBwdRecord : int {
  kBrCq,     // scale · rstd_q_i · e^{G_i}           (dhᵀ += (kBrCq ⊙ do)ᵀ q)
  kBrSrk,    // rstd_k_i · e^{G_last − G_i}          (dv_new_i = (P ᵀdo)_i + kBrSrk · k_i·dh)
  kBrCy,     // −rstd_k_i · β_i · e^{G_i}            (dhᵀ += (kBrCy ⊙ y)ᵀ k)
  kBrBeta,   // β_i                                   (dv = β ⊙ y)
  kBrGamma,  // e^{G_last} of the token's chunk
  kBwdRecord = 8
};

struct GatedDeltaFwdParams {
  void const* q = nullptr;                   // [T, Hk, K] contiguous, dtype
  void const* k = nullptr;                   // [T, Hk, K] contiguous, dtype
  void const* v = nullptr;                   // [T, Hv, V] contiguous, dtype
  float const* g = nullptr;                  // [T, Hv] fp32, log-space decay (<= 0 in the model)
  void const* beta = nullptr;                // [T, Hv] contiguous, dtype
  std::int32_t const* cu_seqlens = nullptr;  // [N+1] on the device
  std::int32_t const* chunks = nullptr;      // GatedDeltaChunkTable::data on the device
  std::int32_t const* chunks_host = nullptr;  // the same table on the host: the by-shape schedule reads each
                                              // example's chunks from it (a forced schedule does not need it)
  float const* initial_state = nullptr;      // [N, Hv, K, V] fp32, or nullptr for zeros
  void* o = nullptr;                         // [T, Hv, V] dtype
  float* final_state = nullptr;              // [N, Hv, K, V] fp32, or nullptr when not wanted
  // Saved for the backward; all fp32; written when `save` (training), untouched otherwise.
  bool save = false;
  float* q_rstd = nullptr;  // [T, Hk] 1/sqrt(Σq² + 1e-6) (1 when !use_qk_l2norm)
  float* k_rstd = nullptr;  // [T, Hk]
  std::uint16_t* Ainv = nullptr;  // bf16 bits [T, Hv, gated_delta_ainv_parts(dtype), kGatedDeltaChunk]: row i of the
                                  // chunk's (I + A)^-1 (lower unit-triangular) as bf16 parts (x = Σ parts, to ~2^-16
                                  // relative for 2 parts, fp32 accuracy for 3), columns j = 0..chunk_len-1 of the
                                  // chunk; the rest zero
  float* h = nullptr;       // [NC, Hv, V, K] state at the start of every chunk, transposed (hᵀ, as the kernels hold
                            // it), each chunk's [V][K] in the kernels' tile order (gated_delta_mma.cuh, state_tile)
  float* v_new = nullptr;   // [T, Hv, V] u − w·h, the chunk's corrected values
  // Saved as well when gated_delta_saves_intra(dtype), nullptr otherwise; rows past a chunk's end are zero:
  std::uint16_t* P = nullptr;  // bf16 bits [NC, Hv, parts, 64, 64]: P[i][j] = scale rstd_q_i rstd_k_j (q_i·k_j)
                               // e^{G_i − G_j} for j <= i (0 above the diagonal) as gated_delta_ainv_parts bf16 parts
  float* brec = nullptr;       // [T, Hv, kBwdRecord]: GatedDeltaBwdRecord of every token
  std::int64_t T = 0;
  int Hk = 0, Hv = 0, K = 128, V = 128;  // Hv % Hk == 0; value head j reads key head j / (Hv / Hk); K = V, one of
                                         // GatedDeltaHeadDims (gated_delta_head_dims.h)
  int N = 0, NC = 0;                     // examples, chunks
  GatedDeltaSchedule schedule = GatedDeltaSchedule::kByShape;  // both passes (gated_delta_schedule.h)
  float scale = 0;                       // applied to q after the l2 norm (K^-1/2 in the model)
  bool use_qk_l2norm = true;
  DType dtype = DType::kBF16;  // of q, k, v, beta, o (and do, dq, dk, dv, dbeta)
};

// The chunk table of p (p.chunks, p.NC, p.N).
__host__ __device__ inline GatedDeltaChunks gated_delta_chunks(GatedDeltaFwdParams const& p) {
  return {p.chunks, p.NC, p.N};
}

struct GatedDeltaBwdParams : GatedDeltaFwdParams {
  void const* dout = nullptr;             // [T, Hv, V] dtype
  float const* dfinal_state = nullptr;    // [N, Hv, K, V] fp32, or nullptr (zero)
  void* dq = nullptr;                     // [T, Hk, K] dtype
  void* dk = nullptr;                     // [T, Hk, K] dtype
  void* dv = nullptr;                     // [T, Hv, V] dtype
  float* dg = nullptr;                    // [T, Hv] fp32
  void* dbeta = nullptr;                  // [T, Hv] dtype
  float* dinitial_state = nullptr;        // [N, Hv, K, V] fp32, or nullptr when no initial_state was given
  void* workspace = nullptr;              // gated_delta_bwd_workspace_bytes(p) bytes, 256-byte aligned
};

// Bytes of the device workspace each pass needs (0 allowed); a function of the shapes, the dtype and (forward) of
// p.save only.
std::size_t gated_delta_fwd_workspace_bytes(GatedDeltaFwdParams const& p);
std::size_t gated_delta_bwd_workspace_bytes(GatedDeltaBwdParams const& p);

// The schedule a pass runs for p (gated_delta_schedule.h): p.schedule when forced, else gated_delta_pick_schedule on
// the chunk steps of both schedules' recurrences (gated_delta_chain_steps over p's examples, from p.chunks_host) with
// the blocks each runs per example and the places the current device has for them (below).
enum class GatedDeltaPass { kForward, kBackward };
GatedDeltaSchedule gated_delta_schedule_on_device(GatedDeltaFwdParams const& p, GatedDeltaPass pass);
GatedDeltaSchedule gated_delta_fwd_schedule(GatedDeltaFwdParams const& p);  // the forward's, the backward's
GatedDeltaSchedule gated_delta_bwd_schedule(GatedDeltaBwdParams const& p);

// A recurrence's blocks per example and how many of them the device holds at once (`sms` multiprocessors × the blocks
// one with `smem_per_sm` bytes of shared memory holds, by shared memory and registers), for one pass under a forced
// schedule, at p's shape and dtype. Host functions that need no device (the tests give them the H200's numbers).
struct GatedDeltaChainPlaces {
  std::int64_t blocks_per_example = 0, slots = 0;
};
GatedDeltaChainPlaces gated_delta_fwd_chain_places(GatedDeltaFwdParams const& p, GatedDeltaSchedule schedule, int sms,
                                                   int smem_per_sm);
GatedDeltaChainPlaces gated_delta_bwd_chain_places(GatedDeltaFwdParams const& p, GatedDeltaSchedule schedule, int sms,
                                                   int smem_per_sm);
// What both take, checked in one place: `sms` and `smem_per_sm` positive, K = V supported, a forced schedule.
// std::invalid_argument naming `who` and the values otherwise.
void gated_delta_check_chain_places_args(char const* who, GatedDeltaFwdParams const& p, GatedDeltaSchedule schedule,
                                         int sms, int smem_per_sm);
// The by-shape choice of a pass from those places and the examples' chunks (p.chunks_host), on `sms` and
// `smem_per_sm`: what gated_delta_schedule_on_device runs with the current device's numbers.
GatedDeltaSchedule gated_delta_pick_schedule_for(GatedDeltaFwdParams const& p, GatedDeltaPass pass, int sms,
                                                 int smem_per_sm);

// Each example's chunks, most first (the chunk table's by_length order): what gated_delta_chain_steps takes.
inline std::vector<std::int64_t> gated_delta_chunks_longest_first(GatedDeltaChunks const& c) {
  std::vector<std::int64_t> chunks(static_cast<std::size_t>(c.N));
  for (int i = 0; i < c.N; ++i) {
    int const n = c.example_by_length(i);
    chunks[static_cast<std::size_t>(i)] = c.first_chunk(n + 1) - c.first_chunk(n);
  }
  return chunks;
}

// The forward writes o (and final_state, and the saved tensors when p.save); `workspace` holds
// gated_delta_fwd_workspace_bytes(p) bytes. The backward reads the tensors the forward saved (same p fields).
// The kernels move q, k, v, o, v_new (and the backward's dout, dv) in 16-byte vectors: both refuse, by name, a pointer
// that is not 16-byte aligned (gated_delta_misaligned).
void run_gated_delta_fwd(GatedDeltaFwdParams const& p, void* workspace, cudaStream_t stream);
void run_gated_delta_bwd(GatedDeltaBwdParams const& p, cudaStream_t stream);

// Both passes' refusal of a pointer their kernels move in 16-byte vectors: empty when `ptr` is 16-byte aligned,
// otherwise what is wrong and by how many bytes.
inline std::string gated_delta_misaligned(void const* ptr, char const* name) {
  std::uintptr_t const off = reinterpret_cast<std::uintptr_t>(ptr) % 16;
  if (off == 0) return {};
  return std::string(name) + " must be 16-byte aligned; got an address " + std::to_string(off) +
         " bytes past a 16-byte boundary";
}

}  // namespace fusepack
