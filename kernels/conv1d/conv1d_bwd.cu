// Backward: with g = dy ∘ act'(pre) (pre recomputed from x), dx[s] = Σ_j g[s + (W−1) − j] ∘ weight[:, j] over the
// taps that stay in s's example, and dweight[:, j] = Σ_t g[t] ∘ x[t − (W−1) + j].
// A thread owns one pack of channels and walks a run of kBwdRun tokens (plus W−1 tokens past it, whose g reaches
// back into the run), loading x and dy in chunks straight into registers and scattering each g[t] into W registers of
// pending dx: dx[t − (W−1)] is then complete and stored. dweight: each chunk's terms are summed in fp32 in token order,
// the chunk sums in chunk order per thread, a block sums its rows in row order through shared memory into one fp32
// partial per block row of the grid, and a second kernel sums the partials in index order: no atomics, the same bits
// on every run.
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

// Warps per block, each on its own run (the runs of a block are consecutive). The block writes one dweight partial,
// so 8 rows halve the workspace traffic of 4 at the same number of resident threads.
constexpr int kBwdRows = 8;
constexpr int kBwdThreads = kThreadsC * kBwdRows;
constexpr int kBwdMinBlocks = 2;  // resident blocks per SM the registers are capped for (≤ 128 per thread)
constexpr int kBwdRun = 64;       // tokens per run: halo re-reads (W−1 before, W−1 after) are 9/128 of the loads
constexpr int kBwdBlockTokens = kBwdRows * kBwdRun;
// Tokens of x and dy loaded before their first use: 128 bytes per thread either way (8 × (8 + 8) bf16/fp16,
// 4 × (16 + 16) fp32).
template <typename T>
constexpr int kBwdChunk = sizeof(T) == 4 ? 4 : 8;

std::int64_t bwd_token_blocks(std::int64_t T) {
  return std::min<std::int64_t>((T + kBwdBlockTokens - 1) / kBwdBlockTokens, 65535);
}

template <typename T, int W, int kN, bool kSilu>
__global__ void __launch_bounds__(kBwdThreads, kBwdMinBlocks) conv1d_bwd_channel_last(Conv1dBwdParams p) {
  constexpr int kChunk = kBwdChunk<T>;
  static_assert(kChunk >= W - 1, "every step of a chunk after the first is W-1 past the run start and stores a dx");
  // Each thread's dweight sum over its chunks, [row][tap][lane][channel of the pack]: a thread reads and writes its
  // own kN contiguous floats per tap (conflict-free), and after the walk the block sums its rows from here.
  __shared__ alignas(16) Pack<float, kN> dw_rows[kBwdRows][W][kThreadsC];

  auto const* x = static_cast<T const*>(p.x);
  auto* dx = static_cast<T*>(p.dx);
  std::int64_t const C = p.C;
  int const T_ = static_cast<int>(p.T);  // cu_seqlens is int32, so T < 2^31
  std::int64_t const c0 = (std::int64_t(blockIdx.x) * kThreadsC + threadIdx.x) * kN;
  bool const has_channels = c0 < C;  // no early return: every thread reaches the block's barriers
  PartColumn<T> const dy(p.dy, has_channels ? c0 : 0);

  float w[W][kN];
  load_weight<T, W, kN>(static_cast<T const*>(p.weight), C, c0, w);
  Pack<float, kN>* const dw = &dw_rows[threadIdx.y][0][threadIdx.x];  // tap j at dw[j · kThreadsC]
#pragma unroll
  for (int j = 0; j < W; ++j) {
#pragma unroll
    for (int i = 0; i < kN; ++i) dw[j * kThreadsC].v[i] = 0.0f;
  }

  int const num_runs = static_cast<int>((p.T + kBwdRun - 1) / kBwdRun);
  for (int run = blockIdx.y * kBwdRows + threadIdx.y; has_channels && run < num_runs;
       run += gridDim.y * kBwdRows) {
    int const t0 = run * kBwdRun;
    int const len = T_ - t0 < kBwdRun ? T_ - t0 : kBwdRun;  // own tokens t0 .. t0+len−1, 1..kBwdRun
    std::int64_t const run_at = std::int64_t(t0) * C + c0;  // [t0, c0] in x and dx
    std::int64_t at = run_at;                                  // the next own token to load, in x
    T const* dyp = dy.row(t0);                                 // and in dy
    T* dxp = dx + run_at;  // the next dx to store (stores run W−1 steps behind)

    // The W−1 inputs before t0 and the first chunk, all issued before the example lookup.
    Raw<T, kN> halo[W - 1] = {};
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      if (t0 - (W - 1) + k >= 0) halo[k] = load_raw<T, kN>(x + run_at - std::int64_t(W - 1 - k) * C);
    }
    Raw<T, kN> xin[kChunk] = {}, dyin[kChunk] = {};
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      if (u < len) {
        xin[u] = load_raw<T, kN>(x + at);
        dyin[u] = load_raw<T, kN>(dyp);
      }
      at += C;
      dyp += dy.stride;
    }

    ExampleSpan ex(p.cu_seqlens, p.N, t0);
    float hist[W - 1][kN];  // x of the W−1 tokens before the current one, zeros before the example's start
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      bool const inside = t0 - (W - 1) + k >= ex.start;
      widen<T, kN>(halo[k], hist[k]);
#pragma unroll
      for (int i = 0; i < kN; ++i) hist[k][i] = inside ? hist[k][i] : 0.0f;
    }
    float pending[W - 1][kN];  // dx of the W−1 tokens before the current one, still collecting contributions
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
#pragma unroll
      for (int i = 0; i < kN; ++i) pending[k][i] = 0.0f;
    }
    float dwc[W][kN];  // the current chunk's dweight terms, summed in token order

    // The end of step i (token t0 + i): dx[t0 + i − (W−1)] is complete; `store` says it is one of the run's own
    // (i >= W−1; i − (W−1) < len always holds). Then the history moves on by one token.
    auto finish = [&](bool store, float const(&cur)[kN], float const(&done)[kN]) {
      if (store) {
        store_pack<T, kN>(dxp, pending[0]);
        dxp += C;
      }
#pragma unroll
      for (int k = 0; k < W - 2; ++k) {
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          pending[k][j] = pending[k + 1][j];
          hist[k][j] = hist[k + 1][j];
        }
      }
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        pending[W - 2][j] = done[j];
        hist[W - 2][j] = cur[j];
      }
    };
    // Step i: g[t] from x[t], dy[t] and the history; for an own token (kOwn) its dweight terms; its contributions to
    // the pending dx, masked by position unless kMasked is false (every tap inside the example).
    auto step = [&](auto own, auto masked, int i, bool store, Raw<T, kN> const& xt, Raw<T, kN> const& dyt) {
      constexpr bool kOwn = decltype(own)::value, kMasked = decltype(masked)::value;
      float cur[kN], g[kN], done[kN];
      widen<T, kN>(xt, cur);
      widen<T, kN>(dyt, g);
      if constexpr (kSilu) {
        float pre[kN];
        pre_activation<W, kN>(w, hist, cur, pre);
#pragma unroll
        for (int j = 0; j < kN; ++j) g[j] *= silu_grad<T>(pre[j]);
      }
      if constexpr (kOwn) {
#pragma unroll
        for (int j = 0; j < kN; ++j) {
#pragma unroll
          for (int k = 0; k < W - 1; ++k) dwc[k][j] = fmaf(g[j], hist[k][j], dwc[k][j]);
          dwc[W - 1][j] = fmaf(g[j], cur[j], dwc[W - 1][j]);
        }
      }
      int const pos = t0 + i - ex.start;  // position in the example: taps before 0 are padding
#pragma unroll
      for (int k = 0; k < W - 1; ++k) {
        if (!kMasked || pos >= W - 1 - k) {
#pragma unroll
          for (int j = 0; j < kN; ++j) pending[k][j] = fmaf(g[j], w[k][j], pending[k][j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kN; ++j) done[j] = g[j] * w[W - 1][j];  // first contribution to dx[t]
      finish(store, cur, done);
    };

    // The chunks of own tokens stay a loop (see the forward).
#pragma unroll 1
    for (int c = 0; c < len; c += kChunk) {
      if (c > 0) {
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
          if (c + u < len) {
            xin[u] = load_raw<T, kN>(x + at);
            dyin[u] = load_raw<T, kN>(dyp);
          }
          at += C;
          dyp += dy.stride;
        }
      }
#pragma unroll
      for (int j = 0; j < W; ++j) {
#pragma unroll
        for (int i = 0; i < kN; ++i) dwc[j][i] = 0.0f;
      }
      if (len - c >= kChunk && ex.end - (t0 + c) >= kChunk && (t0 + c) - ex.start >= W - 1) {
        // Whole, inside one example, every tap inside it: no example walk, no masks.
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
          step(std::true_type{}, std::false_type{}, c + u, u >= W - 1 || c > 0, xin[u], dyin[u]);
        }
      } else {
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
          if (c + u < len) {
            if (ex.advance(t0 + c + u)) {
#pragma unroll
              for (int k = 0; k < W - 1; ++k) {
#pragma unroll
                for (int j = 0; j < kN; ++j) hist[k][j] = 0.0f;
              }
            }
            step(std::true_type{}, std::true_type{}, c + u, c + u >= W - 1, xin[u], dyin[u]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < W; ++j) {
        Pack<float, kN> sum = dw[j * kThreadsC];
#pragma unroll
        for (int i = 0; i < kN; ++i) sum.v[i] += dwc[j][i];
        dw[j * kThreadsC] = sum;
      }
    }

    // W−1 steps past the run: tokens of the next run whose g reaches back to our last W−1 tokens. Only those in the
    // example of the run's last token (ex.end <= T) contribute; each step completes one dx (one of ours when
    // len + k >= W−1).
    Raw<T, kN> xtail[W - 1] = {}, dytail[W - 1] = {};
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      if (t0 + len + k < ex.end) {
        std::int64_t const tail_at = std::int64_t(t0 + len + k) * C + c0;
        xtail[k] = load_raw<T, kN>(x + tail_at);
        dytail[k] = load_raw<T, kN>(dy.row(t0 + len + k));
      }
    }
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      if (t0 + len + k < ex.end) {
        step(std::false_type{}, std::true_type{}, len + k, len + k >= W - 1, xtail[k], dytail[k]);
      } else {
        float const zeros[kN] = {};
        finish(len + k >= W - 1, zeros, zeros);
      }
    }
  }

  // The block's rows summed in row order; row 0 writes the block's partial [blockIdx.y, c, j].
  __syncthreads();
  if (threadIdx.y == 0 && has_channels) {
    float sum[kN][W];  // [channel of the pack][tap]: the order of the [C, W] workspace
#pragma unroll
    for (int j = 0; j < W; ++j) {
      Pack<float, kN> s = dw_rows[0][j][threadIdx.x];
#pragma unroll
      for (int r = 1; r < kBwdRows; ++r) {
        Pack<float, kN> const row = dw_rows[r][j][threadIdx.x];
#pragma unroll
        for (int i = 0; i < kN; ++i) s.v[i] += row.v[i];
      }
#pragma unroll
      for (int i = 0; i < kN; ++i) sum[i][j] = s.v[i];
    }
    float* out = p.dweight_partial + std::int64_t(blockIdx.y) * C * W + c0 * W;  // [c0 .. c0+kN) × W, contiguous
    float const* flat = &sum[0][0];
    if constexpr (kN % 4 == 0) {
      // Pack path: C and c0 are multiples of kN, the workspace is 16-byte aligned (checked), so out is too.
#pragma unroll
      for (int e = 0; e < W * kN; e += 4) {
        *reinterpret_cast<float4*>(out + e) = make_float4(flat[e], flat[e + 1], flat[e + 2], flat[e + 3]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < W * kN; ++e) out[e] = flat[e];
    }
  }
}

// dweight[e] = Σ_b partial[b, e] in a fixed order: groups of kGroup consecutive partials summed in index order, then
// the group sums in index order; zeros when there are no partials (T = 0). One running sum over the 64 partials
// T = 8192 once had used 80% of the docs/contracts.md, numerics budget (each add can lose an ulp of the growing total);
// the two-level sum adds at most kGroup + num_partials / kGroup terms to any running sum.
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
      constexpr int kPackBytes = kPackChannels * sizeof(T);
      bool const vec = p.C % kPackChannels == 0 && aligned_to(p.x, kPackBytes) &&
                       parts_pack_aligned(p.dy, kPackChannels, kPackBytes) && aligned_to(p.dx, kPackBytes) &&
                       aligned_to(p.dweight_partial, 16);
      FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
        constexpr int kN = kVec ? kPackChannels : 1;
        FUSEPACK_BOOL_SWITCH(p.silu, kSilu, [&] {
          FUSEPACK_INT_SWITCH(Conv1dWidths, p.W, kW, [&] {
            std::int64_t const packs = (p.C + kN - 1) / kN;
            dim3 const grid(static_cast<unsigned>((packs + kThreadsC - 1) / kThreadsC),
                            static_cast<unsigned>(num_partials));
            conv1d_bwd_channel_last<T, kW, kN, kSilu><<<grid, dim3(kThreadsC, kBwdRows), 0, stream>>>(p);
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
