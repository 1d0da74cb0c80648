#include "kernels/common/cuda_check.h"
#include "kernels/rmsnorm/norm_rows.cuh"
#include "kernels/rmsnorm/rmsnorm.h"

namespace fusepack {

// One read of x (and z): each row of x is loaded into registers once and reduced (sum of squares in fp32); the gate's
// loads are issued before the reduction, so both are in flight together. Rows of small D share a warp (lanes threads
// each), rows of large D take a block (NormRowLayout).
template <typename T, bool kVec, int kIters, bool kBlockRow, bool kGated>
__global__ void __launch_bounds__(kNormMaxThreads<kBlockRow, kVec, kIters>)
    rmsnorm_fwd_rows(RmsNormFwdParams p, int lanes) {
  using Chunk = NormChunk<T, kVec>;
  constexpr int kN = Chunk::kN;
  __shared__ float red[32];
  auto const* x = static_cast<T const*>(p.x);
  [[maybe_unused]] auto const* z = static_cast<T const*>(p.z);  // gated form only
  auto const* weight = static_cast<T const*>(p.weight);
  auto* y = static_cast<T*>(p.y);
  std::int64_t const dim = p.dim, chunks = dim / kN;
  NormRowThread const t = norm_row_thread<kBlockRow>(lanes);
  std::int64_t const row = std::int64_t(blockIdx.x) * t.groups + t.group;
  bool const valid = row < p.rows;  // out-of-range rows still join the row sum (the shuffles need every lane)

  Chunk xv[kIters];
  [[maybe_unused]] Chunk zv[kGated ? kIters : 1];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    std::int64_t const c = t.lane + std::int64_t(i) * lanes;
    if (valid && c < chunks) {
      xv[i] = load_chunk<T, kVec>(x + row * dim + c * kN);
      if constexpr (kGated) zv[i] = load_chunk<T, kVec>(z + row * dim + c * kN);
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
        float const n = to_float(xv[i].v[j]) * rstd;
        if constexpr (kGated) {
          float const zf = to_float(zv[i].v[j]);
          out.v[j] = from_float<T>(n * to_float(w.v[j]) * (zf * norm_sigmoid<T>(zf)));
        } else {
          out.v[j] = from_float<T>(n * (1.0f + to_float(w.v[j])));
        }
      }
      store_chunk<T, kVec>(y + row * dim + c * kN, out);
    }
  }
  if (t.lane == 0) p.rstd[row] = rstd;
}

void run_rmsnorm_fwd(RmsNormFwdParams const& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  bool const gated = p.z != nullptr;
  char const* const op = gated ? "gated_rmsnorm_fwd" : "rmsnorm_fwd";
  bool const aligned = aligned16(p.x) && (!gated || aligned16(p.z)) && aligned16(p.weight) && aligned16(p.y);
  // Accesses per thread on small rows: four 16-byte loads in flight (8 lanes per row at D = 256 bf16); the gated form
  // loads x and z, so two of each (8 lanes per row at D = 128: 59 registers, 4 blocks per SM).
  NormRowLayout const l = norm_row_layout_or_throw(op, p.dim, p.dtype, aligned, /*small_row_iters=*/gated ? 2 : 4);
  auto const kernel = norm_kernel_for<void (*)(RmsNormFwdParams, int)>(
      op, l, p.dtype, gated, [](auto type, auto vec, auto iters, auto block_row, auto gate) {
        return &rmsnorm_fwd_rows<typename decltype(type)::type, decltype(vec)::value, decltype(iters)::value,
                                 decltype(block_row)::value, decltype(gate)::value>;
      });
  kernel<<<norm_fwd_blocks(op, l, p.rows), l.threads, 0, stream>>>(p, l.lanes);
  FUSEPACK_CUDA_CHECK_LAUNCH();
}

}  // namespace fusepack
