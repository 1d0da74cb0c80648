// Backward: with g = dy ∘ act'(pre) (pre recomputed from x), dx[s] = Σ_j g[s + (W−1) − j] ∘ weight[:, j] over the
// taps that stay in s's example, and dweight[:, j] = Σ_t g[t] ∘ x[t − (W−1) + j].
// A thread owns one pack of channels and walks a run of kBwdRun tokens (plus W−1 tokens past it, whose g reaches
// back into the run), scattering each g[t] into W registers of pending dx: dx[t − (W−1)] is then complete and
// stored. dweight: each thread sums its run in fp32 in token order, a block sums its rows in row order through shared
// memory into one fp32 partial per block row of the grid, and a second kernel sums the partials in index order: no
// atomics, the same bits on every run.
#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/conv1d/conv1d.h"
#include "kernels/conv1d/conv1d_common.cuh"

#include <algorithm>

namespace fusepack {

namespace {

using namespace conv1d_detail;

constexpr int kBwdRows = 4;        // warps per block, each on its own runs of tokens
constexpr int kBwdThreads = kThreadsC * kBwdRows;
constexpr int kBwdMinBlocks = 3;   // resident blocks per SM the registers are capped for (≤ 168 per thread)
constexpr int kBwdRun = 32;        // tokens per run: halo re-reads (W−1 before, W−1 after) are 6/32 of a run
constexpr int kBwdChunk = 4;       // tokens per ring stage
constexpr int kBwdStages = 4;      // ring depth: 3 chunks of x and dy (384 bytes) in flight per thread
constexpr int kBwdPackBytes = 16;  // a thread's channels: 8 bf16 or 4 fp32
constexpr int kBwdRingSlots = kBwdStages * kBwdChunk * 2;  // int4 slots per thread: x and dy
constexpr int kBwdBlockTokens = kBwdRows * kBwdRun;

std::int64_t bwd_token_blocks(std::int64_t T) {
  return std::min<std::int64_t>((T + kBwdBlockTokens - 1) / kBwdBlockTokens, 65535);
}

// Dynamic shared memory: the ring on the pack path, then (after the walk) the block's dweight rows.
template <typename T, int W, int kN>
constexpr std::size_t bwd_smem_bytes() {
  std::size_t const ring = kN * sizeof(T) == 16 ? std::size_t(kBwdRingSlots) * kBwdThreads * sizeof(int4) : 0;
  std::size_t const rows = std::size_t(kBwdRows) * W * kN * kThreadsC * sizeof(float);
  return ring > rows ? ring : rows;
}

template <typename T, int W, int kN, bool kSilu>
__global__ void __launch_bounds__(kBwdThreads, kBwdMinBlocks) conv1d_bwd_channel_last(Conv1dBwdParams p) {
  constexpr bool kAsync = kN * sizeof(T) == 16;
  extern __shared__ int4 smem[];
  int4* const ring = smem;  // [stage][token][x | dy][thread]: conflict-free
  auto const* x = static_cast<T const*>(p.x);
  auto const* dy = static_cast<T const*>(p.dy);
  auto* dx = static_cast<T*>(p.dx);
  std::int64_t const C = p.C, T_ = p.T;
  int const tid = threadIdx.y * kThreadsC + threadIdx.x;
  std::int64_t const c0 = (std::int64_t(blockIdx.x) * kThreadsC + threadIdx.x) * kN;
  bool const has_channels = c0 < C;  // no early return: every thread joins the block's dweight reduction

  float w[W][kN], dw[W][kN];
  load_weight<T, W, kN>(static_cast<T const*>(p.weight), C, c0, w);
#pragma unroll
  for (int j = 0; j < W; ++j) {
#pragma unroll
    for (int i = 0; i < kN; ++i) dw[j][i] = 0.0f;
  }

  std::int64_t const num_runs = (T_ + kBwdRun - 1) / kBwdRun;
  for (std::int64_t run = std::int64_t(blockIdx.y) * kBwdRows + threadIdx.y; has_channels && run < num_runs;
       run += std::int64_t(gridDim.y) * kBwdRows) {
    std::int64_t const t0 = run * kBwdRun, t1 = t0 + kBwdRun < T_ ? t0 + kBwdRun : T_;
    // Tokens t1 .. t1+W−2 belong to the next run but their g reaches back to our last W−1 tokens; the walk always
    // takes W−1 steps past t1 so that those are completed and stored (steps at or past T, or in a later example,
    // contribute nothing).
    std::int64_t const t_end = t1 + W - 1, t_load = t_end < T_ ? t_end : T_;
    int const num_chunks = static_cast<int>((t_end - t0 + kBwdChunk - 1) / kBwdChunk);
    auto slot = [&](int k, int u, int stream) {
      return &ring[(((k % kBwdStages) * kBwdChunk + u) * 2 + stream) * kBwdThreads + tid];
    };
    auto issue = [&](int k) {
      if constexpr (kAsync) {
#pragma unroll
        for (int u = 0; u < kBwdChunk; ++u) {
          std::int64_t const t = t0 + std::int64_t(k) * kBwdChunk + u;
          if (t < t_load) {
            cp_async16(slot(k, u, 0), x + t * C + c0);
            cp_async16(slot(k, u, 1), dy + t * C + c0);
          }
        }
        cp_async_commit();  // one group per chunk, empty ones included, so wait counts line up
      }
    };
#pragma unroll
    for (int k = 0; k < kBwdStages - 1; ++k) issue(k);

    ExampleSpan ex(p.cu_seqlens, p.N, t0);
    float hist[W - 1][kN];  // x of the W−1 tokens before the current one, zeros before the example's start
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
    float pending[W - 1][kN];  // dx of the W−1 tokens before the current one, still collecting contributions
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
#pragma unroll
      for (int i = 0; i < kN; ++i) pending[k][i] = 0.0f;
    }

    for (int k = 0; k < num_chunks; ++k) {
      std::int64_t const tc = t0 + std::int64_t(k) * kBwdChunk;
      // Pack path: chunk k waits in the ring and each token is read from it when used (registers are the limit);
      // scalar path: the chunk is loaded into registers.
      Pack<T, kN> xin[kAsync ? 1 : kBwdChunk], dyin[kAsync ? 1 : kBwdChunk];
      if constexpr (kAsync) {
        issue(k + kBwdStages - 1);
        cp_async_wait<kBwdStages - 1>();  // chunk k has landed
      } else {
#pragma unroll
        for (int u = 0; u < kBwdChunk; ++u) {
          if (tc + u < t_load) {
            xin[u] = load_raw<T, kN>(x + (tc + u) * C + c0);
            dyin[u] = load_raw<T, kN>(dy + (tc + u) * C + c0);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kBwdChunk; ++u) {
        std::int64_t const t = tc + u;
        if (t < t_end) {
          bool const own = t < t1;
          if (own && ex.advance(t)) {
#pragma unroll
            for (int k2 = 0; k2 < W - 1; ++k2) {
#pragma unroll
              for (int i = 0; i < kN; ++i) hist[k2][i] = 0.0f;
            }
          }
          // Past the run, only tokens of the example that holds the run's last token feed back into it.
          bool const live = own || (t < T_ && t < ex.end);
          float cur[kN], done[kN];
          if (live) {
            std::int64_t const pos = t - ex.start;  // position in the example: taps before 0 are padding
            float g[kN];
            Pack<T, kN> xt, dyt;
            if constexpr (kAsync) {
              xt = load_shared<T, kN>(slot(k, u, 0));
              dyt = load_shared<T, kN>(slot(k, u, 1));
            } else {
              xt = xin[u];
              dyt = dyin[u];
            }
#pragma unroll
            for (int i = 0; i < kN; ++i) cur[i] = to_float(xt.v[i]);
            if constexpr (kSilu) {
              float pre[kN];
              pre_activation<W, kN>(w, hist, cur, pre);
#pragma unroll
              for (int i = 0; i < kN; ++i) g[i] = to_float(dyt.v[i]) * silu_grad<T>(pre[i]);
            } else {
#pragma unroll
              for (int i = 0; i < kN; ++i) g[i] = to_float(dyt.v[i]);
            }
            if (own) {
#pragma unroll
              for (int i = 0; i < kN; ++i) {
#pragma unroll
                for (int k2 = 0; k2 < W - 1; ++k2) dw[k2][i] = fmaf(g[i], hist[k2][i], dw[k2][i]);
                dw[W - 1][i] = fmaf(g[i], cur[i], dw[W - 1][i]);
              }
            }
#pragma unroll
            for (int k2 = 0; k2 < W - 1; ++k2) {
              if (pos >= W - 1 - k2) {
#pragma unroll
                for (int i = 0; i < kN; ++i) pending[k2][i] = fmaf(g[i], w[k2][i], pending[k2][i]);
              }
            }
#pragma unroll
            for (int i = 0; i < kN; ++i) done[i] = g[i] * w[W - 1][i];  // first contribution to dx[t]
          } else {
#pragma unroll
            for (int i = 0; i < kN; ++i) cur[i] = done[i] = 0.0f;
          }
          // No later g reaches token t − (W−1): its dx is complete.
          std::int64_t const s = t - (W - 1);
          if (s >= t0) store_pack<T, kN>(dx + s * C + c0, pending[0]);
#pragma unroll
          for (int k2 = 0; k2 < W - 2; ++k2) {
#pragma unroll
            for (int i = 0; i < kN; ++i) {
              pending[k2][i] = pending[k2 + 1][i];
              hist[k2][i] = hist[k2 + 1][i];
            }
          }
#pragma unroll
          for (int i = 0; i < kN; ++i) {
            pending[W - 2][i] = done[i];
            hist[W - 2][i] = cur[i];
          }
        }
      }
    }
    if constexpr (kAsync) cp_async_wait<0>();  // only empty groups remain; the next run reuses the ring
  }

  // The block's rows summed in row order; row 0 writes the block's partial [blockIdx.y, c, j]. The rows reuse the
  // ring: every thread's copies have completed (waited above) once all threads pass the barrier.
  __syncthreads();
  auto* rows = reinterpret_cast<float*>(smem);  // [row][c·W + j of the pack][lane]: conflict-free
  auto row_at = [&](int r, int e) -> float& { return rows[(r * W * kN + e) * kThreadsC + threadIdx.x]; };
#pragma unroll
  for (int j = 0; j < W; ++j) {
#pragma unroll
    for (int i = 0; i < kN; ++i) row_at(threadIdx.y, i * W + j) = dw[j][i];
  }
  __syncthreads();
  if (threadIdx.y == 0 && has_channels) {
    float sum[W * kN];
#pragma unroll
    for (int e = 0; e < W * kN; ++e) {
      sum[e] = row_at(0, e);
#pragma unroll
      for (int r = 1; r < kBwdRows; ++r) sum[e] += row_at(r, e);
    }
    float* out = p.dweight_partial + std::int64_t(blockIdx.y) * C * W + c0 * W;  // [c0 .. c0+kN) × W, contiguous
    if constexpr (kN % 4 == 0) {
      // Pack path: C and c0 are multiples of kN, the workspace is 16-byte aligned, so out is too.
#pragma unroll
      for (int e = 0; e < W * kN; e += 4) {
        *reinterpret_cast<float4*>(out + e) = make_float4(sum[e], sum[e + 1], sum[e + 2], sum[e + 3]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < W * kN; ++e) out[e] = sum[e];
    }
  }
}

// dweight[e] = Σ_b partial[b, e] in a fixed order: groups of kGroup consecutive partials summed in index order, then
// the group sums in index order; zeros when there are no partials (T = 0). One running sum over all 64 partials of
// T = 8192 used 80% of the DESIGN section 5 budget (each add can lose an ulp of the growing total); the two-level sum
// adds at most kGroup + num_partials / kGroup terms to any running sum.
template <typename T>
__global__ void conv1d_bwd_reduce_dweight(float const* partial, std::int64_t num_partials, std::int64_t n,
                                          T* dweight) {
  constexpr std::int64_t kGroup = 8;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (std::int64_t g = 0; g < num_partials; g += kGroup) {
      float group = 0.0f;
      for (std::int64_t b = g; b < g + kGroup && b < num_partials; ++b) group += partial[b * n + e];
      sum += group;
    }
    dweight[e] = from_float<T>(sum);
  }
}

}  // namespace

std::int64_t conv1d_bwd_num_partials(Conv1dBwdParams const& p) { return bwd_token_blocks(p.T); }

void run_conv1d_bwd(Conv1dBwdParams const& p, cudaStream_t stream) {
  if (p.C == 0) return;
  std::int64_t const num_partials = conv1d_bwd_num_partials(p);
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    if (p.T > 0) {
      constexpr int kPackN = kBwdPackBytes / sizeof(T);
      bool const vec = p.C % kPackN == 0 && aligned_to(p.x, kBwdPackBytes) && aligned_to(p.dy, kBwdPackBytes) &&
                       aligned_to(p.dx, kBwdPackBytes) && aligned_to(p.dweight_partial, 16);
      FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
        constexpr int kN = kVec ? kPackN : 1;
        FUSEPACK_BOOL_SWITCH(p.silu, kSilu, [&] {
          FUSEPACK_CONV1D_WIDTH_SWITCH(p.W, kW, [&] {
            auto const kernel = conv1d_bwd_channel_last<T, kW, kN, kSilu>;
            constexpr std::size_t smem = bwd_smem_bytes<T, kW, kN>();
            if constexpr (smem > 48 * 1024) {  // per call: the attribute belongs to the current device
              FUSEPACK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(smem)));
            }
            std::int64_t const packs = (p.C + kN - 1) / kN;
            dim3 const grid(static_cast<unsigned>((packs + kThreadsC - 1) / kThreadsC),
                            static_cast<unsigned>(num_partials));
            kernel<<<grid, dim3(kThreadsC, kBwdRows), smem, stream>>>(p);
            FUSEPACK_CUDA_CHECK_LAUNCH();
          });
        });
      });
    }
    constexpr int kThreads = 256;
    std::int64_t const n = p.C * p.W;
    std::int64_t const blocks = std::min<std::int64_t>((n + kThreads - 1) / kThreads, 1 << 16);
    conv1d_bwd_reduce_dweight<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        p.dweight_partial, num_partials, n, static_cast<T*>(p.dweight));
    FUSEPACK_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace fusepack
