#include "kernels/common/cuda_check.h"
#include "kernels/gated_rmsnorm/gated_rmsnorm.h"
#include "kernels/rmsnorm/norm_rows.cuh"

namespace fusepack {

// One read of x and z: each row of x is loaded into registers once and reduced (sum of squares in fp32); z is read
// after the reduction, next to its use. Row layout: NormRowLayout (a warp or part of one per row at head_v_dim 128).
template <typename T, bool kVec, int kIters, bool kBlockRow>
__global__ void __launch_bounds__(kNormMaxThreads<kBlockRow, kVec, kIters>)
    gated_rmsnorm_fwd_rows(GatedRmsNormFwdParams p, int lanes) {
  using Chunk = NormChunk<T, kVec>;
  constexpr int kN = Chunk::kN;
  __shared__ float red[32];
  auto const* x = static_cast<T const*>(p.x);
  auto const* z = static_cast<T const*>(p.z);
  auto const* weight = static_cast<T const*>(p.weight);
  auto* y = static_cast<T*>(p.y);
  std::int64_t const dim = p.dim, chunks = dim / kN;
  NormRowThread const t = norm_row_thread<kBlockRow>(lanes);
  std::int64_t const row = std::int64_t(blockIdx.x) * t.groups + t.group;
  bool const valid = row < p.rows;  // out-of-range rows still join the row sum (the shuffles need every lane)

  Chunk xv[kIters], zv[kIters];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    std::int64_t const c = t.lane + std::int64_t(i) * lanes;
    if (valid && c < chunks) {
      xv[i] = load_chunk<T, kVec>(x + row * dim + c * kN);
      zv[i] = load_chunk<T, kVec>(z + row * dim + c * kN);  // issued before the reduction: both loads in flight
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        float const f = to_float(xv[i].v[j]);
        ss += f * f;
      }
    }
  }
  ss = norm_row_sum<kBlockRow>(ss, lanes, red);
  if (!valid) return;
  float const rstd = 1.0f / sqrtf(ss / static_cast<float>(dim) + p.eps);
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    std::int64_t const c = t.lane + std::int64_t(i) * lanes;
    if (c < chunks) {
      Chunk const w = load_chunk<T, kVec>(weight + c * kN);
      Chunk out;
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        float const zf = to_float(zv[i].v[j]);
        out.v[j] = from_float<T>(to_float(xv[i].v[j]) * rstd * to_float(w.v[j]) * (zf * norm_sigmoid<T>(zf)));
      }
      store_chunk<T, kVec>(y + row * dim + c * kN, out);
    }
  }
  if (t.lane == 0) p.rstd[row] = rstd;
}

void run_gated_rmsnorm_fwd(GatedRmsNormFwdParams const& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  bool const aligned = aligned16(p.x) && aligned16(p.z) && aligned16(p.weight) && aligned16(p.y);
  NormRowLayout const l = norm_row_layout_or_throw("gated_rmsnorm_fwd", p.dim, p.dtype, aligned,
                                                    /*small_row_iters=*/2);
  auto const kernel = norm_kernel_for<void (*)(GatedRmsNormFwdParams, int)>(
      "gated_rmsnorm_fwd", l, p.dtype, [](auto type, auto vec, auto iters, auto block_row) {
        return &gated_rmsnorm_fwd_rows<typename decltype(type)::type, decltype(vec)::value, decltype(iters)::value,
                                       decltype(block_row)::value>;
      });
  kernel<<<norm_fwd_blocks("gated_rmsnorm_fwd", l, p.rows), l.threads, 0, stream>>>(p, l.lanes);
  FUSEPACK_CUDA_CHECK_LAUNCH();
}

}  // namespace fusepack
