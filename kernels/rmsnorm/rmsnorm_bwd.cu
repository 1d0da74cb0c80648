#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/rmsnorm/norm_rows.cuh"
#include "kernels/rmsnorm/rmsnorm.h"

namespace fusepack {

// With n = x·rstd and g = dy·(1 + w): dx = rstd·(g − n·mean(g·n)) per row, dweight = Σ_rows dy·n.
// A persistent grid: each block walks rows with a grid stride, keeping its dweight sums for the columns its threads
// own in fp32 registers, then writes them as one row of the workspace (norm_store_partial); run_norm_dweight_reduce
// adds the rows in a fixed order. No floating-point atomics, so the backward is bitwise deterministic.
// Vector path: x and dy arrive through the per-thread cp.async ring, `stages` - 1 rows ahead (norm_rows.cuh).
template <typename T, bool kVec, int kIters, bool kBlockRow>
__global__ void __launch_bounds__(kNormMaxThreads<kBlockRow, kVec, kIters>)
    rmsnorm_bwd_rows(RmsNormBwdParams p, int lanes, int stages, int ring_bytes) {
  using Chunk = NormChunk<T, kVec>;
  constexpr int kN = Chunk::kN;
  __shared__ float red[32];
  extern __shared__ int4 smem[];  // [ring_bytes: cp.async ring][groups × dim fp32: dweight partials]
  auto const* x = static_cast<T const*>(p.x);
  auto const* weight = static_cast<T const*>(p.weight);
  auto const* dy = static_cast<T const*>(p.dy);
  auto* dx = static_cast<T*>(p.dx);
  std::int64_t const dim = p.dim, chunks = dim / kN;
  float const inv_dim = 1.0f / static_cast<float>(dim);
  NormRowThread const t = norm_row_thread<kBlockRow>(lanes);
  std::int64_t const stride = std::int64_t(gridDim.x) * t.groups;
  float* part = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + ring_bytes);

  float dw[kIters][kN];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int j = 0; j < kN; ++j) dw[i][j] = 0.0f;
  }

  NormRing<T, 2, kIters> const ring{smem, stages};
  T const* const src[2] = {x, dy};
  if constexpr (kVec) {
    for (int s = 0; s + 1 < stages; ++s) {
      ring.issue(s, src, std::int64_t(blockIdx.x) * t.groups + t.group + s * stride, p.rows, dim, chunks, t.lane,
                 lanes);
    }
  }
  int stage = 0;  // the ring stage holding this iteration's row

  // The loop bound is the same for the whole block (the row sum needs every thread); `valid` masks the last rows.
  for (std::int64_t first = std::int64_t(blockIdx.x) * t.groups; first < p.rows; first += stride) {
    std::int64_t const row = first + t.group;
    bool const valid = row < p.rows;
    Chunk xv[kIters], dyv[kIters];
    if constexpr (kVec) {
      ring.issue(stage == 0 ? stages - 1 : stage - 1, src, row + (stages - 1) * stride, p.rows, dim, chunks, t.lane,
                 lanes);
      cp_async_wait(stages - 1);  // this row's group has landed
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        xv[i] = ring.read(stage, 0, i);
        dyv[i] = ring.read(stage, 1, i);
      }
      stage = stage + 1 == stages ? 0 : stage + 1;
    } else {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        std::int64_t const c = t.lane + std::int64_t(i) * lanes;
        if (valid && c < chunks) {
          xv[i] = load_chunk<T, kVec>(x + row * dim + c * kN);
          dyv[i] = load_chunk<T, kVec>(dy + row * dim + c * kN);
        }
      }
    }
    float const rstd = valid ? p.rstd[row] : 0.0f;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      std::int64_t const c = t.lane + std::int64_t(i) * lanes;
      if (valid && c < chunks) {
        Chunk const w = load_chunk<T, kVec>(weight + c * kN);  // L1-resident: the same for every row
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float const n = to_float(xv[i].v[j]) * rstd, d = to_float(dyv[i].v[j]);
          dot += d * (1.0f + to_float(w.v[j])) * n;
        }
      }
    }
    float const mean_gn = norm_row_sum<kBlockRow>(dot, lanes, red) * inv_dim;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      std::int64_t const c = t.lane + std::int64_t(i) * lanes;
      if (valid && c < chunks) {
        Chunk const w = load_chunk<T, kVec>(weight + c * kN);
        Chunk out;
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float const n = to_float(xv[i].v[j]) * rstd, d = to_float(dyv[i].v[j]);
          float const g = d * (1.0f + to_float(w.v[j]));
          out.v[j] = from_float<T>(rstd * (g - n * mean_gn));
          dw[i][j] += d * n;
        }
        store_chunk<T, kVec>(dx + row * dim + c * kN, out);
      }
    }
  }
  if constexpr (kVec) cp_async_wait(0);  // the copies issued past the last row (all zero-filled) are done
  norm_store_partial<kBlockRow, kIters, kN>(dw, t, lanes, chunks, dim, part, p.dweight_partial);
}

// dweight[c] = Σ_b partial[b, c]: 32 columns per block; warp ty adds rows ty, ty + 32, ... in order, then the 32
// warp sums are added pairwise. Reads are coalesced (a warp reads 32 consecutive columns of one row).
template <typename T>
__global__ void __launch_bounds__(1024)
    norm_dweight_reduce(float const* partial, std::int64_t num_partials, std::int64_t dim, T* dweight) {
  __shared__ float sums[32][33];
  std::int64_t const col = std::int64_t(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (col < dim) {
    for (std::int64_t b = threadIdx.y; b < num_partials; b += 32) s += partial[b * dim + col];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  // Pairwise, in a fixed order: a running fp32 sum of 32 terms loses up to an ulp of the total per add (seen: 117%
  // of the docs/contracts.md, numerics budget on [37, 5120] fp32, where ATen's tree-shaped sum stayed within it).
  for (int stride = 16; stride > 0; stride >>= 1) {
    if (threadIdx.y < stride) sums[threadIdx.y][threadIdx.x] += sums[threadIdx.y + stride][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < dim) dweight[col] = from_float<T>(sums[0][threadIdx.x]);
}

void run_norm_dweight_reduce(float const* partial, std::int64_t num_partials, std::int64_t dim, void* dweight,
                             DType dtype, cudaStream_t stream) {
  if (dim == 0) return;
  std::int64_t const blocks = (dim + 31) / 32;
  FUSEPACK_DTYPE_SWITCH(dtype, T, [&] {
    norm_dweight_reduce<T><<<static_cast<int>(blocks), dim3(32, 32), 0, stream>>>(partial, num_partials, dim,
                                                                                 static_cast<T*>(dweight));
    FUSEPACK_CUDA_CHECK_LAUNCH();
  });
}

namespace {

NormBwdLaunch<RmsNormBwdParams> rmsnorm_bwd_launch(RmsNormBwdParams const& p) {
  bool const aligned = aligned16(p.x) && aligned16(p.weight) && aligned16(p.dy) && aligned16(p.dx);
  return norm_bwd_launch("rmsnorm_bwd", p, aligned, /*tensors=*/2, [](auto type, auto vec, auto iters, auto block_row) {
    return &rmsnorm_bwd_rows<typename decltype(type)::type, decltype(vec)::value, decltype(iters)::value,
                             decltype(block_row)::value>;
  });
}

}  // namespace

std::int64_t rmsnorm_bwd_num_partials(RmsNormBwdParams const& p) { return rmsnorm_bwd_launch(p).blocks; }

void run_rmsnorm_bwd(RmsNormBwdParams const& p, cudaStream_t stream) {
  if (p.dim == 0) return;
  run_norm_bwd("rmsnorm_bwd", "rmsnorm_bwd_num_partials", rmsnorm_bwd_launch(p), p, stream);
}

}  // namespace fusepack
