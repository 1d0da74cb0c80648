// kernels/common/wgmma.cuh on the GPU: one warpgroup's products D = A·Bᵀ (bf16 in, fp32 out, K = 64 in four steps)
// against the product of the same bf16 values on the host, in the three forms the header has: both operands from
// 128-byte-swizzled K-major tiles (64 × 64); A from registers (64 × 64); A from registers and B read transposed from
// an MN-major tile (64 × 128). Each checks the accumulator layout, the descriptors and their K steps, the swizzle, and
// the first product ignoring its accumulators' old values (they start as NaN).
#include "kernels/common/cuda_check.h"
#include "kernels/common/wgmma.cuh"

#include "tests/support/env.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace fusepack::test {
namespace {

constexpr int kM = 64, kN = 64, kK = 64;

// One warpgroup: A [64 × 64] and B [64 × 64] (row-major, K contiguous) into shared memory, with the 128-byte swizzle
// when kSwizzled (the layout the descriptor says), as plain rows otherwise (the negative control); D = A·Bᵀ in four
// K steps, the first without accumulating (its accumulators start as NaN, which it must not read).
template <bool kSwizzled>
__global__ void __launch_bounds__(128) product_kernel(std::uint16_t const* a, std::uint16_t const* b, float* d) {
  __shared__ __align__(1024) unsigned char tiles[2][kM * kK * 2];
  int const tid = static_cast<int>(threadIdx.x);
  for (int i = tid; i < 2 * kM * 8; i += 128) {  // 16-byte chunk j of row r of A, then of B
    int const t = i / (kM * 8), r = (i / 8) % kM, j = i % 8;
    std::uint16_t const* src = (t == 0 ? a : b) + r * kK + 8 * j;
    int const offset = kSwizzled ? wgmma::sw128_offset(r, j) : r * 128 + 16 * j;
    *reinterpret_cast<uint4*>(tiles[t] + offset) = *reinterpret_cast<uint4 const*>(src);
  }
  wgmma::fence_shared_to_async();
  __syncthreads();

  float acc[32];
  for (float& x : acc) x = __int_as_float(0x7FC00000);  // quiet NaN
  std::uint64_t const desc_a = wgmma::sw128_desc(tiles[0]), desc_b = wgmma::sw128_desc(tiles[1]);
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < kK / 16; ++k) {
    wgmma::mma_m64n64k16_bf16(acc, wgmma::k_step(desc_a, k), wgmma::k_step(desc_b, k), k > 0);
  }
  wgmma::commit();
  wgmma::wait<0>();

  int const w = tid / 32, g = (tid % 32) / 4, q = tid % 4;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int const row = 16 * w + g + 8 * (e / 2), col = 8 * j + 2 * q + e % 2;
      d[row * kN + col] = acc[4 * j + e];
    }
  }
}

// Thread t's A fragment of K step k (mma.sync's m16k16 layout) from A [64][64] row-major in global memory.
__device__ void a_fragment(std::uint16_t const* a, int k, std::uint32_t (&frag)[4]) {
  int const t = static_cast<int>(threadIdx.x), w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int i = 0; i < 4; ++i) {
    int const row = 16 * w + g + 8 * (i & 1), col = 16 * k + 2 * q + 8 * (i >> 1);
    frag[i] = std::uint32_t{a[row * kK + col]} | (std::uint32_t{a[row * kK + col + 1]} << 16);
  }
}

// The accumulators of a [64 × kCols] product out to d, row-major (the layout wgmma.cuh describes).
template <int kCols>
__device__ void store_accumulators(float const (&acc)[kCols / 2], float* d) {
  int const t = static_cast<int>(threadIdx.x), w = t / 32, g = (t % 32) / 4, q = t % 4;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) d[(16 * w + g + 8 * (e / 2)) * kCols + 8 * j + 2 * q + e % 2] = acc[4 * j + e];
  }
}

// A from registers, B [64][64] (N rows, K contiguous) from a K-major swizzled tile: D [64 × 64].
__global__ void __launch_bounds__(128) product_rs_kernel(std::uint16_t const* a, std::uint16_t const* b, float* d) {
  __shared__ __align__(1024) unsigned char tile[kN * kK * 2];
  for (int i = static_cast<int>(threadIdx.x); i < kN * 8; i += 128) {
    int const r = i / 8, j = i % 8;
    *reinterpret_cast<uint4*>(tile + wgmma::sw128_offset(r, j)) = *reinterpret_cast<uint4 const*>(b + r * kK + 8 * j);
  }
  wgmma::fence_shared_to_async();
  __syncthreads();
  float acc[32];
  for (float& x : acc) x = __int_as_float(0x7FC00000);  // quiet NaN
  std::uint32_t frag[kK / 16][4];
  for (int k = 0; k < kK / 16; ++k) a_fragment(a, k, frag[k]);
  std::uint64_t const desc_b = wgmma::sw128_desc(tile);
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < kK / 16; ++k) wgmma::mma_m64n64k16_bf16_rs(acc, frag[k], wgmma::k_step(desc_b, k), k > 0);
  wgmma::commit();
  wgmma::wait<0>();
  store_accumulators<kN>(acc, d);
}

// A from registers, B read transposed: bt [64 K][128 N] (N contiguous) into an MN-major swizzled tile of two blocks of
// 64 N (8 KB each): D [64 × 128].
constexpr int kWideN = 128;
__global__ void __launch_bounds__(128) product_rs_mn_kernel(std::uint16_t const* a, std::uint16_t const* bt, float* d) {
  __shared__ __align__(1024) unsigned char tile[kK * kWideN * 2];
  for (int i = static_cast<int>(threadIdx.x); i < kK * kWideN / 8; i += 128) {  // 16-byte chunk c of K row r
    int const r = i / (kWideN / 8), c = i % (kWideN / 8), block = c / 8, j = c % 8;
    *reinterpret_cast<uint4*>(tile + block * kK * 128 + wgmma::sw128_offset(r, j)) =
        *reinterpret_cast<uint4 const*>(bt + r * kWideN + 8 * c);
  }
  wgmma::fence_shared_to_async();
  __syncthreads();
  float acc[64];
  for (float& x : acc) x = __int_as_float(0x7FC00000);  // quiet NaN
  std::uint32_t frag[kK / 16][4];
  for (int k = 0; k < kK / 16; ++k) a_fragment(a, k, frag[k]);
  std::uint64_t const desc_b = wgmma::sw128_mn_desc(tile, kK * 128);
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < kK / 16; ++k) {
    wgmma::mma_m64n128k16_bf16_rs<true>(acc, frag[k], wgmma::k_step_mn(desc_b, k), k > 0);
  }
  wgmma::commit();
  wgmma::wait<0>();
  store_accumulators<kWideN>(acc, d);
}

// float → bf16 bits, rounding to nearest even (finite inputs), and back.
std::uint16_t to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<std::uint16_t>(u >> 16);
}
double from_bf16(std::uint16_t h) {
  std::uint32_t const u = std::uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

bool have_sm90() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  cudaDeviceProp prop{};
  FUSEPACK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.major == 9;
}

// D of the kernel and, per element, the exact product of the bf16 values and Σ_k |a_k b_k|.
struct Products {
  int cols = 0;
  std::vector<float> got;
  std::vector<double> want, magnitude;
};

// The forms under test: both operands from shared memory (swizzled as the descriptor says, or plain rows: the negative
// control), A from registers, A from registers with B read transposed (64 × 128).
enum class Form { kSwizzledTiles, kPlainTiles, kRegistersA, kRegistersATransposedB };

Products run_products(Form form, std::uint64_t seed) {
  int const cols = form == Form::kRegistersATransposedB ? kWideN : kN;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<std::uint16_t> a(kM * kK), b(cols * kK);  // b [cols][K]: D = A·Bᵀ
  for (auto& x : a) x = to_bf16(normal(rng));
  for (auto& x : b) x = to_bf16(normal(rng));
  std::vector<std::uint16_t> b_sent = b;
  if (form == Form::kRegistersATransposedB) {  // sent as Bᵀ [K][cols], N contiguous
    for (int n = 0; n < cols; ++n) {
      for (int k = 0; k < kK; ++k) b_sent[k * cols + n] = b[n * kK + k];
    }
  }
  std::uint16_t *da = nullptr, *db = nullptr;
  float* dd = nullptr;
  FUSEPACK_CUDA_CHECK(cudaMalloc(&da, a.size() * 2));
  FUSEPACK_CUDA_CHECK(cudaMalloc(&db, b_sent.size() * 2));
  FUSEPACK_CUDA_CHECK(cudaMalloc(&dd, kM * cols * sizeof(float)));
  FUSEPACK_CUDA_CHECK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  FUSEPACK_CUDA_CHECK(cudaMemcpy(db, b_sent.data(), b_sent.size() * 2, cudaMemcpyHostToDevice));
  switch (form) {
    case Form::kSwizzledTiles: product_kernel<true><<<1, 128>>>(da, db, dd); break;
    case Form::kPlainTiles: product_kernel<false><<<1, 128>>>(da, db, dd); break;
    case Form::kRegistersA: product_rs_kernel<<<1, 128>>>(da, db, dd); break;
    case Form::kRegistersATransposedB: product_rs_mn_kernel<<<1, 128>>>(da, db, dd); break;
  }
  FUSEPACK_CUDA_CHECK_LAUNCH();
  Products p;
  p.cols = cols;
  p.got.resize(kM * cols);
  FUSEPACK_CUDA_CHECK(cudaMemcpy(p.got.data(), dd, p.got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (void* ptr : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dd)}) {
    FUSEPACK_CUDA_CHECK(cudaFree(ptr));
  }
  p.want.assign(kM * cols, 0.0);
  p.magnitude.assign(kM * cols, 0.0);
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < cols; ++n) {
      for (int k = 0; k < kK; ++k) {
        double const term = from_bf16(a[m * kK + k]) * from_bf16(b[n * kK + k]);  // exact in double
        p.want[m * cols + n] += term;
        p.magnitude[m * cols + n] += std::fabs(term);
      }
    }
  }
  return p;
}

// Each product of two bf16 values is exact in fp32 (8 + 8 significand bits); the tensor cores add the 64 of an
// element in fp32, so it is off by at most ~64 roundings of 2^-24 relative to Σ|terms| (a generous bound: the adds
// run as a tree in hardware). A wrong layout, descriptor or K step errs by O(Σ|terms|).
constexpr double kAddBound = 64.0 * 0x1p-24;

void expect_host_product(Products const& p) {
  for (int i = 0; i < kM * p.cols; ++i) {
    ASSERT_TRUE(std::isfinite(p.got[i])) << "D[" << i / p.cols << "][" << i % p.cols << "]: the first product read NaN";
    ASSERT_LE(std::fabs(p.got[i] - p.want[i]), kAddBound * p.magnitude[i] + 1e-30)
        << "D[" << i / p.cols << "][" << i % p.cols << "] = " << p.got[i] << ", want " << p.want[i];
  }
}

TEST(Wgmma, ProductOfSwizzledTilesMatchesTheHostProduct) {
  if (!have_sm90()) GTEST_SKIP() << "needs a Hopper GPU (sm_90): wgmma is an sm_90a instruction";
  expect_host_product(run_products(Form::kSwizzledTiles, test_seed()));
}

TEST(Wgmma, ProductWithAFromRegistersMatchesTheHostProduct) {
  if (!have_sm90()) GTEST_SKIP() << "needs a Hopper GPU (sm_90): wgmma is an sm_90a instruction";
  expect_host_product(run_products(Form::kRegistersA, test_seed()));
}

TEST(Wgmma, ProductWithBReadTransposedMatchesTheHostProduct) {
  if (!have_sm90()) GTEST_SKIP() << "needs a Hopper GPU (sm_90): wgmma is an sm_90a instruction";
  expect_host_product(run_products(Form::kRegistersATransposedB, test_seed()));
}

// The negative control: the same tiles stored as plain rows, read through the swizzled descriptor, give wrong
// products (rows other than the first of each group of 8 have their chunks permuted; an element is right only where
// its A and B rows share the permutation, 1 in 8), so the checks above can fail.
TEST(Wgmma, PlainRowsThroughASwizzledDescriptorGiveWrongProducts) {
  if (!have_sm90()) GTEST_SKIP() << "needs a Hopper GPU (sm_90): wgmma is an sm_90a instruction";
  Products const p = run_products(Form::kPlainTiles, test_seed());
  int wrong = 0;
  for (int i = 0; i < kM * kN; ++i) {
    if (!(std::fabs(p.got[i] - p.want[i]) <= kAddBound * p.magnitude[i] + 1e-30)) ++wrong;
  }
  EXPECT_GT(wrong, kM * kN / 2) << "a layout error went unseen";
}

}  // namespace
}  // namespace fusepack::test
