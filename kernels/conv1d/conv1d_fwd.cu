// Forward: y = act(Σ_j weight[:, j] ∘ x[t − (W−1) + j]) over packed examples, channel-last.
// A thread owns one pack of channels (4: 8 bytes of bf16/fp16 or 16 of fp32; one channel on the scalar path) and walks
// a run of kFwdRun tokens, keeping the last W−1 inputs in registers, so every input is read once (plus a W−1 token
// halo per run, mostly from L1/L2). The 32 lanes of a warp hold 32 neighbouring packs of the same token. The run is
// loaded in chunks of kFwdChunk tokens straight into registers, every load of a chunk issued before its first use.
#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/conv1d/conv1d.h"
#include "kernels/conv1d/conv1d_common.cuh"
#include "kernels/conv1d/conv1d_widths.h"

#include <algorithm>
#include <type_traits>

namespace fusepack {

namespace {

using namespace conv1d_detail;

constexpr int kFwdRows = 4;       // warps per block, each on its own run (the runs of a block are consecutive)
constexpr int kFwdThreads = kThreadsC * kFwdRows;
constexpr int kFwdRun = 32;       // tokens per run: the W−1 halo re-read is 3/32 of a run
constexpr int kFwdChunk = 4;      // tokens loaded before the first use: 4 × 256 bytes per warp in flight (bf16)
static_assert(kFwdRun % kFwdChunk == 0);
// Resident blocks per SM the registers are capped for: 8 × 128 threads at ≤ 64 registers (2-byte types); fp32 packs
// hold twice the bytes per token and need up to 80 registers: 6 × 128 threads.
template <typename T>
constexpr int kFwdMinBlocks = sizeof(T) == 4 ? 6 : 8;

template <typename T, int W, int kN, bool kSilu>
__global__ void __launch_bounds__(kFwdThreads, kFwdMinBlocks<T>) conv1d_fwd_channel_last(Conv1dFwdParams p) {
  auto const* x = static_cast<T const*>(p.x);
  std::int64_t const C = p.C;
  int const T_ = static_cast<int>(p.T);  // cu_seqlens is int32, so T < 2^31
  std::int64_t const c0 = (std::int64_t(blockIdx.x) * kThreadsC + threadIdx.x) * kN;
  if (c0 >= C) return;  // no block-level synchronisation below
  PartColumn<T> const y(p.y, c0);

  float w[W][kN];
  load_weight<T, W, kN>(static_cast<T const*>(p.weight), C, c0, w);

  int const num_runs = static_cast<int>((p.T + kFwdRun - 1) / kFwdRun);
  for (int run = blockIdx.y * kFwdRows + threadIdx.y; run < num_runs; run += gridDim.y * kFwdRows) {
    int const t0 = run * kFwdRun;
    int const len = T_ - t0 < kFwdRun ? T_ - t0 : kFwdRun;  // tokens of this run, 1..kFwdRun
    T const* const xr = x + std::int64_t(t0) * C + c0;      // x[t0 + i] is xr[i·C]
    T const* xp = xr;                                         // the next token to load
    T* yp = y.row(t0);                                        // the next token to store

    // The W−1 inputs before t0 and the first chunk, all issued before the example lookup.
    Raw<T, kN> halo[W - 1] = {};
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      if (t0 - (W - 1) + k >= 0) halo[k] = load_raw<T, kN>(xr - std::int64_t(W - 1 - k) * C);
    }
    Raw<T, kN> in[kFwdChunk] = {};
#pragma unroll
    for (int u = 0; u < kFwdChunk; ++u) {
      if (u < len) in[u] = load_raw<T, kN>(xp);
      xp += C;
    }

    ExampleSpan ex(p.cu_seqlens, p.N, t0);
    float hist[W - 1][kN];  // the W−1 inputs before the current token, zeros before the example's first token
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      bool const inside = t0 - (W - 1) + k >= ex.start;
      widen<T, kN>(halo[k], hist[k]);
#pragma unroll
      for (int i = 0; i < kN; ++i) hist[k][i] = inside ? hist[k][i] : 0.0f;
    }

    // The chunks stay a loop: unrolled over the whole run, the compiler kept a 64-bit offset per token in registers.
#pragma unroll 1
    for (int c = 0; c < len; c += kFwdChunk) {
      if (c > 0) {
#pragma unroll
        for (int u = 0; u < kFwdChunk; ++u) {
          if (c + u < len) in[u] = load_raw<T, kN>(xp);
          xp += C;
        }
      }
      // Every step computes (past the run's end on stale inputs) so that the history shifts by renaming registers.
      // A chunk that is whole and inside one example skips the per-token example walk and store guard.
      auto steps = [&](auto checked) {
        constexpr bool kChecked = decltype(checked)::value;
#pragma unroll
        for (int u = 0; u < kFwdChunk; ++u) {
          bool const valid = !kChecked || c + u < len;
          if (kChecked && valid && ex.advance(t0 + c + u)) {
#pragma unroll
            for (int k = 0; k < W - 1; ++k) {
#pragma unroll
              for (int j = 0; j < kN; ++j) hist[k][j] = 0.0f;
            }
          }
          float cur[kN], out[kN];
          widen<T, kN>(in[u], cur);
          pre_activation<W, kN>(w, hist, cur, out);
          if constexpr (kSilu) {
#pragma unroll
            for (int j = 0; j < kN; ++j) out[j] *= conv1d_sigmoid<T>(out[j]);
          }
          if (valid) store_pack<T, kN>(yp, out);
          yp += y.stride;
#pragma unroll
          for (int k = 0; k < W - 2; ++k) {
#pragma unroll
            for (int j = 0; j < kN; ++j) hist[k][j] = hist[k + 1][j];
          }
#pragma unroll
          for (int j = 0; j < kN; ++j) hist[W - 2][j] = cur[j];
        }
      };
      if (len - c >= kFwdChunk && ex.end - (t0 + c) >= kFwdChunk) {
        steps(std::false_type{});
      } else {
        steps(std::true_type{});
      }
    }
  }
}

}  // namespace

void run_conv1d_fwd(Conv1dFwdParams const& p, cudaStream_t stream) {
  if (p.T == 0 || p.C == 0) return;
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    constexpr int kPackBytes = kPackChannels * sizeof(T);
    bool const vec = p.C % kPackChannels == 0 && aligned_to(p.x, kPackBytes) &&
                     parts_pack_aligned(p.y, kPackChannels, kPackBytes);
    FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
      constexpr int kN = kVec ? kPackChannels : 1;
      FUSEPACK_BOOL_SWITCH(p.silu, kSilu, [&] {
        FUSEPACK_INT_SWITCH(Conv1dWidths, p.W, kW, [&] {
          std::int64_t const packs = (p.C + kN - 1) / kN;
          std::int64_t const runs = (p.T + kFwdRun - 1) / kFwdRun;
          dim3 const grid(static_cast<unsigned>((packs + kThreadsC - 1) / kThreadsC),
                          static_cast<unsigned>(std::min<std::int64_t>((runs + kFwdRows - 1) / kFwdRows, 65535)));
          conv1d_fwd_channel_last<T, kW, kN, kSilu><<<grid, dim3(kThreadsC, kFwdRows), 0, stream>>>(p);
          FUSEPACK_CUDA_CHECK_LAUNCH();
        });
      });
    });
  });
}

}  // namespace fusepack
