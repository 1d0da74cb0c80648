// Forward: y = act(Σ_j weight[:, j] ∘ x[t − (W−1) + j]) over packed examples, channel-last.
// A thread owns one pack of channels (16 bytes: 8 bf16 or 4 fp32; one channel on the scalar path) and walks a run of
// kFwdRun tokens, keeping the last W−1 inputs in registers, so every input is read once (plus a W−1 token halo per
// run). The 32 lanes of a warp hold 32 neighbouring packs of the same token: 512 contiguous bytes per access.
// Pack path: the run streams through a per-thread ring of kFwdStages × kFwdChunk shared-memory slots filled by
// cp.async, kFwdStages − 1 chunks ahead of the arithmetic, so loads stay in flight without holding registers.
#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/conv1d/conv1d.h"
#include "kernels/conv1d/conv1d_common.cuh"

#include <algorithm>

namespace fusepack {

namespace {

using namespace conv1d_detail;

constexpr int kFwdRows = 4;        // warps per block, each on its own runs of tokens
constexpr int kFwdThreads = kThreadsC * kFwdRows;
constexpr int kFwdMinBlocks = 5;   // resident blocks per SM the registers are capped for (≤ 102 per thread)
constexpr int kFwdRun = 32;        // tokens per run: the W−1 halo re-read is 3/32 of a run, mostly from L2
constexpr int kFwdChunk = 4;       // tokens per ring stage
constexpr int kFwdStages = 4;      // ring depth: 3 chunks (12 tokens, 192 bytes) in flight per thread
constexpr int kFwdPackBytes = 16;  // a thread's channels: 8 bf16 or 4 fp32
constexpr int kFwdRingSlots = kFwdStages * kFwdChunk;  // int4 slots per thread

template <typename T, int W, int kN, bool kSilu>
__global__ void __launch_bounds__(kFwdThreads, kFwdMinBlocks) conv1d_fwd_channel_last(Conv1dFwdParams p) {
  constexpr bool kAsync = kN * sizeof(T) == 16;
  __shared__ int4 ring[kAsync ? kFwdRingSlots * kFwdThreads : 1];  // [stage][token][thread]: conflict-free
  auto const* x = static_cast<T const*>(p.x);
  auto* y = static_cast<T*>(p.y);
  std::int64_t const C = p.C, T_ = p.T;
  int const tid = threadIdx.y * kThreadsC + threadIdx.x;
  std::int64_t const c0 = (std::int64_t(blockIdx.x) * kThreadsC + threadIdx.x) * kN;
  if (c0 >= C) return;  // no block-level synchronisation below

  float w[W][kN];
  load_weight<T, W, kN>(static_cast<T const*>(p.weight), C, c0, w);

  std::int64_t const num_runs = (T_ + kFwdRun - 1) / kFwdRun;
  for (std::int64_t run = std::int64_t(blockIdx.y) * kFwdRows + threadIdx.y; run < num_runs;
       run += std::int64_t(gridDim.y) * kFwdRows) {
    std::int64_t const t0 = run * kFwdRun, t1 = t0 + kFwdRun < T_ ? t0 + kFwdRun : T_;
    int const num_chunks = static_cast<int>((t1 - t0 + kFwdChunk - 1) / kFwdChunk);
    // Chunk k of the run into ring stage k % kFwdStages (tokens past t1 are not copied, never read).
    auto issue = [&](int k) {
      if constexpr (kAsync) {
#pragma unroll
        for (int u = 0; u < kFwdChunk; ++u) {
          std::int64_t const t = t0 + std::int64_t(k) * kFwdChunk + u;
          if (t < t1) cp_async16(&ring[((k % kFwdStages) * kFwdChunk + u) * kFwdThreads + tid], x + t * C + c0);
        }
        cp_async_commit();  // one group per chunk, empty ones included, so wait counts line up
      }
    };
#pragma unroll
    for (int k = 0; k < kFwdStages - 1; ++k) issue(k);

    ExampleSpan ex(p.cu_seqlens, p.N, t0);
    // The W−1 inputs before t0, zeros where they lie before the example's first token.
    float hist[W - 1][kN];
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      std::int64_t const t = t0 - (W - 1) + k;
      if (t >= ex.start) {
        Pack<T, kN> const r = load_raw<T, kN>(x + t * C + c0);
#pragma unroll
        for (int i = 0; i < kN; ++i) hist[k][i] = to_float(r.v[i]);
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) hist[k][i] = 0.0f;
      }
    }

    for (int k = 0; k < num_chunks; ++k) {
      std::int64_t const tc = t0 + std::int64_t(k) * kFwdChunk;
      Pack<T, kN> in[kFwdChunk];
      if constexpr (kAsync) {
        issue(k + kFwdStages - 1);
        cp_async_wait<kFwdStages - 1>();  // chunk k has landed
#pragma unroll
        for (int u = 0; u < kFwdChunk; ++u) {
          in[u] = load_shared<T, kN>(&ring[((k % kFwdStages) * kFwdChunk + u) * kFwdThreads + tid]);
        }
      } else {
#pragma unroll
        for (int u = 0; u < kFwdChunk; ++u) {
          if (tc + u < t1) in[u] = load_raw<T, kN>(x + (tc + u) * C + c0);
        }
      }
#pragma unroll
      for (int u = 0; u < kFwdChunk; ++u) {
        std::int64_t const t = tc + u;
        if (t < t1) {
          if (ex.advance(t)) {
#pragma unroll
            for (int k2 = 0; k2 < W - 1; ++k2) {
#pragma unroll
              for (int i = 0; i < kN; ++i) hist[k2][i] = 0.0f;
            }
          }
          float cur[kN], out[kN];
#pragma unroll
          for (int i = 0; i < kN; ++i) cur[i] = to_float(in[u].v[i]);
          pre_activation<W, kN>(w, hist, cur, out);
          if constexpr (kSilu) {
#pragma unroll
            for (int i = 0; i < kN; ++i) out[i] *= conv1d_sigmoid<T>(out[i]);
          }
          store_pack<T, kN>(y + t * C + c0, out);
#pragma unroll
          for (int k2 = 0; k2 < W - 2; ++k2) {
#pragma unroll
            for (int i = 0; i < kN; ++i) hist[k2][i] = hist[k2 + 1][i];
          }
#pragma unroll
          for (int i = 0; i < kN; ++i) hist[W - 2][i] = cur[i];
        }
      }
    }
    if constexpr (kAsync) cp_async_wait<0>();  // only empty groups remain; the next run reuses the ring
  }
}

}  // namespace

void run_conv1d_fwd(Conv1dFwdParams const& p, cudaStream_t stream) {
  if (p.T == 0 || p.C == 0) return;
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    constexpr int kPackN = kFwdPackBytes / sizeof(T);
    bool const vec = p.C % kPackN == 0 && aligned_to(p.x, kFwdPackBytes) && aligned_to(p.y, kFwdPackBytes);
    FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
      constexpr int kN = kVec ? kPackN : 1;
      FUSEPACK_BOOL_SWITCH(p.silu, kSilu, [&] {
        FUSEPACK_CONV1D_WIDTH_SWITCH(p.W, kW, [&] {
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
