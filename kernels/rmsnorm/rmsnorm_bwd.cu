#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/rmsnorm/norm_rows.cuh"
#include "kernels/rmsnorm/rmsnorm.h"

namespace fusepack {

// With n = x·rstd, gain = 1 + w (plain) or w (gated), s = silu(z) (gated) and g = dy·gain (·s when gated):
// dx = rstd·(g − n·mean(g·n)), dz = dy·w·n·silu'(z) (gated) per row, dweight = Σ_rows dy·n (·s when gated).
// A persistent grid: each block walks rows with a grid stride, keeping its dweight sums for the columns its threads
// own in fp32 registers, then writes them as one row of the workspace (norm_store_partial); run_norm_dweight_reduce
// adds the rows in a fixed order. No floating-point atomics, so the backward is bitwise deterministic.
// Vector path: x, dy (and z) arrive through the per-thread cp.async ring, `stages` - 1 rows ahead (norm_rows.cuh).
template <typename T, bool kVec, int kIters, bool kBlockRow, bool kGated>
__global__ void __launch_bounds__(kNormMaxThreads<kBlockRow, kVec, kIters>)
    rmsnorm_bwd_rows(RmsNormBwdParams p, int lanes, int stages, int ring_bytes) {
  using Chunk = NormChunk<T, kVec>;
  constexpr int kN = Chunk::kN;
  constexpr int kTensors = kGated ? 3 : 2;  // ring slots: x, (z,) dy
  __shared__ float red[32];
  extern __shared__ int4 smem[];  // [ring_bytes: cp.async ring][groups × dim fp32: dweight partials]
  auto const* x = static_cast<T const*>(p.x);
  [[maybe_unused]] auto const* z = static_cast<T const*>(p.z);  // gated form only
  auto const* weight = static_cast<T const*>(p.weight);
  auto const* dy = static_cast<T const*>(p.dy);
  auto* dx = static_cast<T*>(p.dx);
  [[maybe_unused]] auto* dz = static_cast<T*>(p.dz);
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

  NormRing<T, kTensors, kIters> const ring{smem, stages};
  T const* src[kTensors];
  src[0] = x;
  if constexpr (kGated) src[1] = z;
  src[kTensors - 1] = dy;
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
    [[maybe_unused]] Chunk zv[kGated ? kIters : 1];
    if constexpr (kVec) {
      ring.issue(stage == 0 ? stages - 1 : stage - 1, src, row + (stages - 1) * stride, p.rows, dim, chunks, t.lane,
                 lanes);
      cp_async_wait(stages - 1);  // this row's group has landed
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        xv[i] = ring.read(stage, 0, i);
        if constexpr (kGated) zv[i] = ring.read(stage, 1, i);
        dyv[i] = ring.read(stage, kTensors - 1, i);
      }
      stage = stage + 1 == stages ? 0 : stage + 1;
    } else {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        std::int64_t const c = t.lane + std::int64_t(i) * lanes;
        if (valid && c < chunks) {
          xv[i] = load_chunk<T, kVec>(x + row * dim + c * kN);
          if constexpr (kGated) zv[i] = load_chunk<T, kVec>(z + row * dim + c * kN);
          dyv[i] = load_chunk<T, kVec>(dy + row * dim + c * kN);
        }
      }
    }
    float const rstd = valid ? p.rstd[row] : 0.0f;
    float dot = 0.0f;
    [[maybe_unused]] float sig[kGated ? kIters : 1][kGated ? kN : 1];  // σ(z), computed once per element
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      std::int64_t const c = t.lane + std::int64_t(i) * lanes;
      if (valid && c < chunks) {
        Chunk const w = load_chunk<T, kVec>(weight + c * kN);  // L1-resident: the same for every row
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float const n = to_float(xv[i].v[j]) * rstd, d = to_float(dyv[i].v[j]);
          if constexpr (kGated) {
            float const zf = to_float(zv[i].v[j]);
            sig[i][j] = norm_sigmoid<T>(zf);
            dot += d * to_float(w.v[j]) * (zf * sig[i][j]) * n;
          } else {
            dot += d * (1.0f + to_float(w.v[j])) * n;
          }
        }
      }
    }
    float const mean_gn = norm_row_sum<kBlockRow>(dot, lanes, red) * inv_dim;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      std::int64_t const c = t.lane + std::int64_t(i) * lanes;
      if (valid && c < chunks) {
        Chunk const w = load_chunk<T, kVec>(weight + c * kN);
        Chunk dxo;
        [[maybe_unused]] Chunk dzo;
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float const n = to_float(xv[i].v[j]) * rstd, d = to_float(dyv[i].v[j]);
          if constexpr (kGated) {
            float const zf = to_float(zv[i].v[j]), sg = sig[i][j], s = zf * sg, dyw = d * to_float(w.v[j]);
            dxo.v[j] = from_float<T>(rstd * (dyw * s - n * mean_gn));
            dzo.v[j] = from_float<T>(dyw * n * (sg * (1.0f + zf * (1.0f - sg))));
            dw[i][j] += d * n * s;
          } else {
            float const g = d * (1.0f + to_float(w.v[j]));
            dxo.v[j] = from_float<T>(rstd * (g - n * mean_gn));
            dw[i][j] += d * n;
          }
        }
        store_chunk<T, kVec>(dx + row * dim + c * kN, dxo);
        if constexpr (kGated) store_chunk<T, kVec>(dz + row * dim + c * kN, dzo);
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

namespace {

// dweight[c] = Σ_b partial[b, c] over b = 0..num_partials-1 in a fixed order, rounded once to `dtype`.
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

// A backward pass: its kernel instance, layout, shared memory and persistent grid, in one place for num_partials and
// the launch.
struct NormBwdLaunch {
  void (*kernel)(RmsNormBwdParams, int, int, int) = nullptr;
  NormRowLayout layout;
  NormBwdSmem smem;
  std::int64_t blocks = 0;
};

char const* bwd_op(RmsNormBwdParams const& p) { return p.z != nullptr ? "gated_rmsnorm_bwd" : "rmsnorm_bwd"; }

NormBwdLaunch rmsnorm_bwd_launch(RmsNormBwdParams const& p) {
  bool const gated = p.z != nullptr;
  bool const aligned = aligned16(p.x) && aligned16(p.weight) && aligned16(p.dy) && aligned16(p.dx) &&
                       (!gated || (aligned16(p.z) && aligned16(p.dz)));
  NormBwdLaunch b;
  b.layout = norm_row_layout_or_throw(bwd_op(p), p.dim, p.dtype, aligned, /*small_row_iters=*/1);
  b.smem = norm_bwd_smem(b.layout, /*tensors=*/gated ? 3 : 2);
  b.kernel = norm_kernel_for<void (*)(RmsNormBwdParams, int, int, int)>(
      bwd_op(p), b.layout, p.dtype, gated, [](auto type, auto vec, auto iters, auto block_row, auto gate) {
        return &rmsnorm_bwd_rows<typename decltype(type)::type, decltype(vec)::value, decltype(iters)::value,
                                 decltype(block_row)::value, decltype(gate)::value>;
      });
  b.blocks = norm_persistent_blocks(b.kernel, b.layout, b.smem.bytes, p.rows);
  return b;
}

}  // namespace

std::int64_t rmsnorm_bwd_num_partials(RmsNormBwdParams const& p) { return rmsnorm_bwd_launch(p).blocks; }

// Checks the dweight workspace against the launch, runs the rows kernel and the fixed-order dweight reduction.
void run_rmsnorm_bwd(RmsNormBwdParams const& p, cudaStream_t stream) {
  if (p.dim == 0) return;
  if (p.z != nullptr && p.dz == nullptr) {
    throw std::invalid_argument("gated_rmsnorm_bwd: the gated form (z given) writes dz, but dz is null");
  }
  NormBwdLaunch const b = rmsnorm_bwd_launch(p);
  if (p.num_partials != b.blocks || p.dweight_partial == nullptr) {
    throw std::invalid_argument(std::string(bwd_op(p)) + ": the dweight workspace must have "
                                "rmsnorm_bwd_num_partials() = " + std::to_string(b.blocks) + " rows; got " +
                                std::to_string(p.num_partials));
  }
  if (p.rows == 0) {  // no rows: dweight is the empty sum, 0
    run_norm_dweight_reduce(p.dweight_partial, 0, p.dim, p.dweight, p.dtype, stream);
    return;
  }
  b.kernel<<<static_cast<int>(b.blocks), b.layout.threads, b.smem.bytes, stream>>>(
      p, b.layout.lanes, b.smem.stages, static_cast<int>(b.smem.ring_bytes));
  FUSEPACK_CUDA_CHECK_LAUNCH();
  run_norm_dweight_reduce(p.dweight_partial, b.blocks, p.dim, p.dweight, p.dtype, stream);
}

}  // namespace fusepack
