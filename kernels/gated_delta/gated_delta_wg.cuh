// Pieces shared by the recurrences in warpgroup products (gated_delta_fwd_chain_wg.cuh, gated_delta_bwd_state_wg.cuh),
// where one warpgroup carries the state (hᵀ, or its gradient dhᵀ) of 64 value columns over the 128 state columns as
// the fp32 accumulators of m64n128 products (kernels/common/wgmma.cuh: warp w on the columns 16w .. 16w + 15, the
// accumulator tile j over the state columns 8j .. 8j + 7) and reads it back as two bf16 parts in registers.
#pragma once

#include "kernels/common/wgmma.cuh"
#include "kernels/gated_delta/gated_delta_mma.cuh"

#include <cstdint>

namespace fusepack::gated_delta_mma {

// The state out to `at` (the warp's 16-column block in state_tile order, plus 4·lane), one 16-byte store per tile.
__device__ __forceinline__ void store_state(float const (&s)[64], float* at) {
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    *reinterpret_cast<float4*>(at + state_tile(128, 0, nt)) =
        make_float4(s[4 * nt], s[4 * nt + 1], s[4 * nt + 2], s[4 * nt + 3]);
  }
}

// Registers that products still running read (A fragments) or write (accumulators), held where they are until the
// wgmma::wait after them: the compiler sees them used here, so it neither reuses an A fragment's registers nor moves
// an accumulator while the products run (the recurrences issue their copies and stores between a commit and its
// wait).
template <int kN, int kParts>
__device__ __forceinline__ void hold_registers(std::uint32_t (&a)[kN][kParts][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
#pragma unroll
      for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[i][part][r])::"memory");
    }
  }
}
template <int kN>
__device__ __forceinline__ void hold_registers(float (&acc)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// Issues Xᵀ [64 columns × 64 tokens] = Sᵀ kᵀ over the 128 state columns and commits it (the caller waits): A = the
// state's parts, B = the chunk's k tile as two K-major tiles of 64 state columns, 8 KB apart from desc_k's. The low
// part first, as mma_split.
__device__ __forceinline__ void issue_state_times_kt(float (&x)[32], std::uint32_t const (&a)[8][2][4],
                                                     std::uint64_t desc_k) {
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    std::uint64_t const desc = wgmma::k_step(desc_k + std::uint64_t((ks >> 2) * (8192 >> 4)), ks & 3);
    wgmma::mma_m64n64k16_bf16_rs(x, a[ks][1], desc, ks > 0);
    wgmma::mma_m64n64k16_bf16_rs(x, a[ks][0], desc, true);
  }
  wgmma::commit();
}

}  // namespace fusepack::gated_delta_mma
