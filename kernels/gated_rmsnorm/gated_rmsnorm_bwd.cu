#include "kernels/common/cuda_check.h"
#include "kernels/gated_rmsnorm/gated_rmsnorm.h"
#include "kernels/rmsnorm/norm_rows.cuh"

namespace fusepack {

// With n = x·rstd, s = silu(z) and g = dy·w·s: dx = rstd·(g − n·mean(g·n)), dz = dy·w·n·silu'(z) per row,
// dweight = Σ_rows dy·n·s. A persistent grid: each block walks rows with a grid stride, keeping its dweight sums in
// fp32 registers, then writes them as one row of the workspace; run_norm_dweight_reduce (kernels/rmsnorm) adds the
// rows in a fixed order. No floating-point atomics, so the backward is bitwise deterministic.
// Vector path: x, z and dy arrive through the per-thread cp.async ring, `stages` - 1 rows ahead (norm_rows.cuh).
template <typename T, bool kVec, int kIters, bool kBlockRow>
__global__ void __launch_bounds__(kNormMaxThreads<kBlockRow, kVec, kIters>)
    gated_rmsnorm_bwd_rows(GatedRmsNormBwdParams p, int lanes, int stages, int ring_bytes) {
  using Chunk = NormChunk<T, kVec>;
  constexpr int kN = Chunk::kN;
  __shared__ float red[32];
  extern __shared__ int4 smem[];  // [ring_bytes: cp.async ring][groups × dim fp32: dweight partials]
  auto const* x = static_cast<T const*>(p.x);
  auto const* z = static_cast<T const*>(p.z);
  auto const* weight = static_cast<T const*>(p.weight);
  auto const* dy = static_cast<T const*>(p.dy);
  auto* dx = static_cast<T*>(p.dx);
  auto* dz = static_cast<T*>(p.dz);
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

  NormRing<T, 3, kIters> const ring{smem, stages};
  T const* const src[3] = {x, z, dy};
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
    Chunk xv[kIters], zv[kIters], dyv[kIters];
    if constexpr (kVec) {
      ring.issue(stage == 0 ? stages - 1 : stage - 1, src, row + (stages - 1) * stride, p.rows, dim, chunks, t.lane,
                 lanes);
      cp_async_wait(stages - 1);  // this row's group has landed
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        xv[i] = ring.read(stage, 0, i);
        zv[i] = ring.read(stage, 1, i);
        dyv[i] = ring.read(stage, 2, i);
      }
      stage = stage + 1 == stages ? 0 : stage + 1;
    } else {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        std::int64_t const c = t.lane + std::int64_t(i) * lanes;
        if (valid && c < chunks) {
          xv[i] = load_chunk<T, kVec>(x + row * dim + c * kN);
          zv[i] = load_chunk<T, kVec>(z + row * dim + c * kN);
          dyv[i] = load_chunk<T, kVec>(dy + row * dim + c * kN);
        }
      }
    }
    float const rstd = valid ? p.rstd[row] : 0.0f;
    float dot = 0.0f;
    float sig[kIters][kN];  // σ(z), computed once per element
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      std::int64_t const c = t.lane + std::int64_t(i) * lanes;
      if (valid && c < chunks) {
        Chunk const w = load_chunk<T, kVec>(weight + c * kN);  // L1-resident: the same for every row
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float const n = to_float(xv[i].v[j]) * rstd, zf = to_float(zv[i].v[j]);
          sig[i][j] = norm_sigmoid<T>(zf);
          dot += to_float(dyv[i].v[j]) * to_float(w.v[j]) * (zf * sig[i][j]) * n;
        }
      }
    }
    float const mean_gn = norm_row_sum<kBlockRow>(dot, lanes, red) * inv_dim;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      std::int64_t const c = t.lane + std::int64_t(i) * lanes;
      if (valid && c < chunks) {
        Chunk const w = load_chunk<T, kVec>(weight + c * kN);
        Chunk dxo, dzo;
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float const n = to_float(xv[i].v[j]) * rstd, zf = to_float(zv[i].v[j]), d = to_float(dyv[i].v[j]);
          float const sg = sig[i][j], s = zf * sg, dyw = d * to_float(w.v[j]);
          dxo.v[j] = from_float<T>(rstd * (dyw * s - n * mean_gn));
          dzo.v[j] = from_float<T>(dyw * n * (sg * (1.0f + zf * (1.0f - sg))));
          dw[i][j] += d * n * s;
        }
        store_chunk<T, kVec>(dx + row * dim + c * kN, dxo);
        store_chunk<T, kVec>(dz + row * dim + c * kN, dzo);
      }
    }
  }
  if constexpr (kVec) cp_async_wait(0);  // the copies issued past the last row (all zero-filled) are done
  norm_store_partial<kBlockRow, kIters, kN>(dw, t, lanes, chunks, dim, part, p.dweight_partial);
}

namespace {

NormBwdLaunch<GatedRmsNormBwdParams> gated_rmsnorm_bwd_launch(GatedRmsNormBwdParams const& p) {
  bool const aligned = aligned16(p.x) && aligned16(p.z) && aligned16(p.weight) && aligned16(p.dy) &&
                       aligned16(p.dx) && aligned16(p.dz);
  return norm_bwd_launch("gated_rmsnorm_bwd", p, aligned, /*tensors=*/3,
                         [](auto type, auto vec, auto iters, auto block_row) {
                           return &gated_rmsnorm_bwd_rows<typename decltype(type)::type, decltype(vec)::value, decltype(iters)::value,
                                                          decltype(block_row)::value>;
                         });
}

}  // namespace

std::int64_t gated_rmsnorm_bwd_num_partials(GatedRmsNormBwdParams const& p) {
  return gated_rmsnorm_bwd_launch(p).blocks;
}

void run_gated_rmsnorm_bwd(GatedRmsNormBwdParams const& p, cudaStream_t stream) {
  if (p.dim == 0) return;
  run_norm_bwd("gated_rmsnorm_bwd", "gated_rmsnorm_bwd_num_partials", gated_rmsnorm_bwd_launch(p), p, stream);
}

}  // namespace fusepack
