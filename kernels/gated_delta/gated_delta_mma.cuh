// The warp-level tile products both passes of the gated delta rule run on: mma.sync m16n8k16 bf16 with fp32
// accumulation, ldmatrix fragment loads, cp.async copies, and the split-bf16 scheme that keeps fp32-level accuracy
// on bf16 tensor cores (SplitPolicy). Fragment and accumulator layouts are the PTX ISA's ("Matrix Fragments for
// mma.m16n8k16", .bf16).
#pragma once

#include "kernels/common/vec.cuh"
#include "kernels/gated_delta/gated_delta.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fusepack::gated_delta_mma {

static_assert(kGatedDeltaChunk == 64, "the kernels tile a chunk as 4 × 16 rows and 8 × 8 columns");
// Row stride of fp32 [64, 64] tiles and of bf16 [64, 64] planes (ldmatrix rows 144 bytes apart: 8 rows on 8
// distinct bank quads).
constexpr int kLdSq = kGatedDeltaChunk + 8;
constexpr int kPlane = kGatedDeltaChunk * kLdSq;  // elements of one bf16 plane
constexpr int kLdPad = 8;  // elements padding each row of a q / k / v tile (16 bytes at 16 bits)

constexpr std::size_t align16(std::size_t x) { return (x + 15) / 16 * 16; }

// The most shared memory one block may have on Hopper (H100 / H200): 227 KB of a multiprocessor's 228.
constexpr std::size_t kMaxBlockSmem = 227 * 1024;

// ---------------------------------------------------------------------------------------------------------------
// Warp-level primitives (mma.sync, ldmatrix, cp.async).

// d += a · b, one m16n8k16 bf16 tile product with fp32 accumulation. Fragment layouts (g = lane / 4, t = lane % 4):
// a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..];
// b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]; d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1].
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], std::uint32_t const (&a)[4],
                                               std::uint32_t const (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8×8 16-bit matrices: lanes 8m..8m+7 give the row addresses of matrix m; r[m] receives
// {M_m[g][2t], M_m[g][2t+1]}.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], void const* row) {
  auto const addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Four 8×8 16-bit matrices, transposed: lanes 8m..8m+7 give the row addresses of matrix m; r[m] receives
// {M_m[2t][g], M_m[2t+1][g]}.
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], void const* row) {
  auto const addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// 16 bytes global → shared, bypassing L1; src_bytes = 0 writes zeros (rows past a chunk's end).
__device__ __forceinline__ void cp_async16(void* smem, void const* gmem, int src_bytes) {
  auto const addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem), "r"(src_bytes) : "memory");
}
// kRows rows of kRowBytes bytes (whole 16-byte vectors) global → shared by cp.async over the kThreads threads of the
// block: global rows `stride` bytes apart from `src`, shared rows `ld` bytes apart from `dst`; rows at or past
// `valid` are written as zeros (nothing is read for them). Not unrolled by default: most callers are kernels at the
// register limit, where a copy's unrolled addresses would spill; kUnrolled for a kernel with registers to spare, where
// each copy then costs a few instructions instead of a loop's index arithmetic.
template <int kRows, int kRowBytes, int kThreads, bool kUnrolled = false>
__device__ __forceinline__ void copy_rows_async(void* dst, int ld, void const* src, std::int64_t stride, int valid) {
  static_assert(kRowBytes % 16 == 0, "whole 16-byte vectors");
  constexpr int kVecs = kRowBytes / 16, kTotal = kRows * kVecs, kIters = (kTotal + kThreads - 1) / kThreads;
  int const tid = threadIdx.x;
  auto const copy = [&](int idx) {
    int const r = idx / kVecs, cv = idx % kVecs;
    bool const in = r < valid;
    auto const* from = static_cast<unsigned char const*>(src) + (in ? r * stride + 16 * cv : 0);
    cp_async16(static_cast<unsigned char*>(dst) + r * ld + 16 * cv, from, in ? 16 : 0);
  };
  if constexpr (kUnrolled) {  // each thread on one column of vectors, kThreads / kVecs rows apart
    static_assert(kThreads % kVecs == 0 && kTotal % kThreads == 0, "whole rows per pass, whole passes");
    constexpr int kRowStep = kThreads / kVecs;
    int const r0 = tid / kVecs, cv = tid % kVecs;
    auto const* from = static_cast<unsigned char const*>(src) + r0 * stride + 16 * cv;
    auto* to = static_cast<unsigned char*>(dst) + r0 * ld + 16 * cv;
    if (valid >= kRows) {  // no guards: one address increment per copy (a caller passing kRows folds the branch)
#pragma unroll
      for (int u = 0; u < kIters; ++u) cp_async16(to + u * kRowStep * ld, from + u * kRowStep * stride, 16);
      return;
    }
#pragma unroll
    for (int u = 0; u < kIters; ++u) {
      bool const in = r0 + u * kRowStep < valid;
      cp_async16(to + u * kRowStep * ld, in ? from + u * kRowStep * stride : src, in ? 16 : 0);
    }
  } else {
#pragma unroll 1
    for (int u = 0; u < kIters; ++u) {
      int const idx = tid + u * kThreads;
      if (kTotal % kThreads != 0 && idx >= kTotal) break;
      copy(idx);
    }
  }
}
// Runs copy(valid), a chunk's copy_rows_async calls, with valid as the constant kRows when every row is valid, so that
// unrolled copies drop their per-vector guards there (the last chunk of an example keeps them).
template <int kRows, bool kUnrolled, typename Copy>
__device__ __forceinline__ void copy_whole_or_guarded(Copy const& copy, int valid) {
  if (kUnrolled && valid == kRows) {
    copy(kRows);
  } else {
    copy(valid);
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// ---------------------------------------------------------------------------------------------------------------
// A producer kernel handing chunks to a consumer kernel that runs beside it (programmatic dependent launch, sm_90+).
// The producer lets the consumer's launch begin once every producer block has started (so a consumer block that
// waits never holds a place a producer block needs), and publishes how many chunks each of its blocks has written
// (a release store at gpu scope, after a block barrier: every thread's earlier stores are visible to a thread that
// acquires the count). The consumer acquires a count before it reads what the count covers; its global reads of
// those tensors bypass L1 (__ldcg, cp.async.cg), which may hold lines from before the writes.
__device__ __forceinline__ void grid_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
// Waits until the kernels this one was launched to depend on have completed and their writes are visible.
__device__ __forceinline__ void grid_wait_prerequisites() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void publish_count(int* count, int value) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(count), "r"(value) : "memory");
}
__device__ __forceinline__ int acquire_count(int const* count) {
  int value;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(count) : "memory");
  return value;
}

// ---------------------------------------------------------------------------------------------------------------
// Split-bf16 tile products. An fp32 operand is split into P bf16 parts (x = hi + lo [+ lo2], each the bf16 rounding
// of what the previous parts left), and a product sums the part products a_i·b_j with i + j <= kOrder, accumulated
// in fp32 by the tensor cores. kOrder = 1 (bf16 and fp16 inputs): relative error ~2^-16 per product, far below the
// output's rounding step (2^-9 / 2^-12). kOrder = 2 (fp32 inputs): ~2^-24, the accuracy of fp32 arithmetic. Raw
// inputs need no split in bf16; fp16 values are exact as two bf16 parts, fp32 values as three.
//
// kGradParts: the parts of an fp32 intermediate in the 16-bit backward's per-chunk products (y, v_new in do v_newᵀ and
// y v_newᵀ, the dq̂ / dk̂ coefficients, h), whose results reach only dq, dk, dβ (rounded to T) and dg (judged at one
// step of T): one for bf16 (2^-9 relative, the size of those outputs' own rounding), two for fp16 (whose step is
// 2^-11). The recurrences keep kOrder + 1 parts: their errors carry from chunk to chunk.
// kVnDhParts: the parts of v_new and dh_next in the per-chunk product v_new dh_nextᵀ, at least two. Its row sums
// c_i = e^{G_last − G_i} k̂_i·(dh_next v_new_i) enter dg as dg_t ⊃ Σ_{i<t} c_i, up to 63 rows of K·V products each,
// while the rule judges dg at one step of its largest entry: with one bf16 part per operand (2^-9 each) a unit-scale
// dh_next (a final-state gradient) put dg 1.4 bf16 steps off at 65536 tokens. The CPU tests
// GatedDeltaChunked.Bf16SplitPolicy* hold this policy to dg's budget in fp64 (GatedDeltaChunkedOperands).
template <typename T>
struct SplitPolicy;
template <>
struct SplitPolicy<__nv_bfloat16> {
  static constexpr int kOrder = 1, kRawParts = 1, kGradParts = 1, kVnDhParts = 2;
};
template <>
struct SplitPolicy<__half> {
  static constexpr int kOrder = 1, kRawParts = 2, kGradParts = 2, kVnDhParts = 2;
};
template <>
struct SplitPolicy<float> {
  static constexpr int kOrder = 2, kRawParts = 3, kGradParts = 3, kVnDhParts = 3;
};

// The storage type of y (backward recurrence → per-chunk kernel), whose only consumer is the per-chunk kernel: where
// it takes one part (kGradParts = 1, bf16 runs) y is stored as that part, bf16; fp32 otherwise
// (gated_delta_y_bytes on the host). v_new is fp32 in every run (kVnDhParts).
template <typename T>
using Handover = std::conditional_t<SplitPolicy<T>::kGradParts == 1, __nv_bfloat16, float>;

__device__ __forceinline__ std::uint32_t bf16x2_bits(__nv_bfloat162 v) {
  std::uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// (x, y) → P bf16x2 words, x in the low half; x = Σ_p low(w[p]) up to the last part's rounding.
template <int P>
__device__ __forceinline__ void split_pair(float x, float y, std::uint32_t (&w)[P]) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    __nv_bfloat162 const b = __floats2bfloat162_rn(x, y);
    w[i] = bf16x2_bits(b);
    if (i + 1 < P) {
      x -= __low2float(b);
      y -= __high2float(b);
    }
  }
}

// x → P bf16 parts, leading bits first.
template <int P>
__device__ __forceinline__ void split_one(float x, __nv_bfloat16 (&w)[P]) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    w[i] = __float2bfloat16_rn(x);
    if (i + 1 < P) x -= __bfloat162float(w[i]);
  }
}

// e^x: expf for fp32 runs; __expf (ex2.approx, ~2^-21 relative at the |x| <= ~50 that matter) for bf16/fp16 runs,
// whose outputs round at 2^-9 / 2^-12.
template <typename T>
__device__ __forceinline__ float policy_exp(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(x);
  } else {
    return __expf(x);
  }
}

// Two consecutive elements of a shared-memory tile as P bf16x2 parts.
template <typename E, int P>
__device__ __forceinline__ void load_pair(E const* p, std::uint32_t (&w)[P]) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    static_assert(P == 1, "bf16 values are one bf16 part");
    w[0] = *reinterpret_cast<std::uint32_t const*>(p);
  } else if constexpr (std::is_same_v<E, __half>) {
    float2 const f = __half22float2(*reinterpret_cast<__half2 const*>(p));
    split_pair<P>(f.x, f.y, w);
  } else {
    float2 const f = *reinterpret_cast<float2 const*>(p);
    split_pair<P>(f.x, f.y, w);
  }
}

// A 16-bit pair that ldmatrix delivered (elements of type E) as P bf16x2 parts.
template <typename E, int P>
__device__ __forceinline__ void parts_of_word(std::uint32_t u, std::uint32_t (&w)[P]) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    static_assert(P == 1, "bf16 values are one bf16 part");
    w[0] = u;
  } else {
    static_assert(std::is_same_v<E, __half>, "ldmatrix carries 16-bit elements");
    __half2 h;
    memcpy(&h, &u, sizeof(u));
    float2 const f = __half22float2(h);
    split_pair<P>(f.x, f.y, w);
  }
}

// A fragment (rows m0..m0+15, columns k0..k0+15) of a row-major tile with row stride ld.
template <typename E, int P>
__device__ __forceinline__ void load_a_rows(E const* tile, int ld, int m0, int k0, int lane,
                                            std::uint32_t (&a)[P][4]) {
  std::uint32_t w[4][P];
  if constexpr (sizeof(E) == 2) {
    int const m = lane >> 3, r = lane & 7;
    std::uint32_t q[4];
    ldmatrix_x4(q, tile + (m0 + r + 8 * (m & 1)) * ld + k0 + 8 * (m >> 1));
#pragma unroll
    for (int j = 0; j < 4; ++j) parts_of_word<E, P>(q[j], w[j]);
  } else {
    int const g = lane >> 2, t = lane & 3;
    E const* r0 = tile + (m0 + g) * ld + k0 + 2 * t;
    E const* r1 = r0 + 8 * ld;
    load_pair<E, P>(r0, w[0]);
    load_pair<E, P>(r1, w[1]);
    load_pair<E, P>(r0 + 8, w[2]);
    load_pair<E, P>(r1 + 8, w[3]);
  }
#pragma unroll
  for (int i = 0; i < P; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) a[i][r] = w[r][i];
  }
}

// B fragment (k rows k0..k0+15, n columns n0..n0+7) of B[k][n] = tile[n][k] (the tile stores B's columns as rows).
template <typename E, int P>
__device__ __forceinline__ void load_b_cols(E const* tile, int ld, int n0, int k0, int lane,
                                            std::uint32_t (&b)[P][2]) {
  int const g = lane >> 2, t = lane & 3;
  E const* r = tile + (n0 + g) * ld + k0 + 2 * t;
  std::uint32_t w[2][P];
  load_pair<E, P>(r, w[0]);
  load_pair<E, P>(r + 8, w[1]);
#pragma unroll
  for (int i = 0; i < P; ++i) {
    b[i][0] = w[0][i];
    b[i][1] = w[1][i];
  }
}

// The four 8×8 matrices of the B fragments of two neighbouring n tiles (n0..n0+7: words 0, 1; n0+8..: words 2, 3;
// k rows k0..k0+15) by one x4 ldmatrix of a 16-bit matrix M with rows ld elements apart: B[k][n] = M[n][k] (M holds
// B's columns as rows) or, kRowMajor, B[k][n] = M[k][n] (ldmatrix.trans).
template <bool kRowMajor, typename E>
__device__ __forceinline__ void ldmatrix_b_pair(std::uint32_t (&q)[4], E const* m, int ld, int n0, int k0, int lane) {
  int const mi = lane >> 3, r = lane & 7;
  if constexpr (kRowMajor) {
    ldmatrix_x4_trans(q, m + (k0 + r + 8 * (mi & 1)) * ld + n0 + 8 * (mi >> 1));
  } else {
    ldmatrix_x4(q, m + (n0 + r + 8 * (mi >> 1)) * ld + k0 + 8 * (mi & 1));
  }
}

// The B fragments of two neighbouring n tiles from the four words of an x4 ldmatrix (words 0, 1: b0; 2, 3: b1), each
// word as P parts.
template <int P>
__device__ __forceinline__ void b_pair_from_words(std::uint32_t const (&w)[4][P], std::uint32_t (&b0)[P][2],
                                                  std::uint32_t (&b1)[P][2]) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    b0[i][0] = w[0][i];
    b0[i][1] = w[1][i];
    b1[i][0] = w[2][i];
    b1[i][1] = w[3][i];
  }
}

// The same from the words of 16-bit elements of type E, split into P parts.
template <typename E, int P>
__device__ __forceinline__ void b_pair_from_x4(std::uint32_t const (&q)[4], std::uint32_t (&b0)[P][2],
                                               std::uint32_t (&b1)[P][2]) {
  std::uint32_t w[4][P];
#pragma unroll
  for (int j = 0; j < 4; ++j) parts_of_word<E, P>(q[j], w[j]);
  b_pair_from_words<P>(w, b0, b1);
}

// B fragments of two neighbouring n tiles (n0..n0+7 into b0, n0+8..n0+15 into b1; k rows k0..k0+15) of
// B[k][n] = tile[n][k]: one ldmatrix for 16-bit elements.
template <typename E, int P>
__device__ __forceinline__ void load_b_cols_x2(E const* tile, int ld, int n0, int k0, int lane,
                                               std::uint32_t (&b0)[P][2], std::uint32_t (&b1)[P][2]) {
  if constexpr (sizeof(E) == 2) {
    std::uint32_t q[4];
    ldmatrix_b_pair<false>(q, tile, ld, n0, k0, lane);
    b_pair_from_x4<E, P>(q, b0, b1);
  } else {
    load_b_cols<E, P>(tile, ld, n0, k0, lane, b0);
    load_b_cols<E, P>(tile, ld, n0 + 8, k0, lane, b1);
  }
}

// Matrices stored as P bf16 planes: plane i (`stride` elements after plane i − 1) holds part i of the matrix,
// row-major with rows `ld` elements apart.

// The A fragment (rows m0..m0+15, k columns k0..k0+15) of A = the planes' matrix.
template <int P>
__device__ __forceinline__ void load_a_planes(__nv_bfloat16 const* planes, int stride, int ld, int m0, int k0,
                                              int lane, std::uint32_t (&a)[P][4]) {
  int const m = lane >> 3, r = lane & 7;
#pragma unroll
  for (int i = 0; i < P; ++i) ldmatrix_x4(a[i], planes + i * stride + (m0 + r + 8 * (m & 1)) * ld + k0 + 8 * (m >> 1));
}

// B fragments of two neighbouring n tiles (n0.., n0+8..; k rows k0..k0+15) of B[k][n] = M[n][k] or, kRowMajor,
// M[k][n], M the planes' matrix.
template <bool kRowMajor, int P>
__device__ __forceinline__ void load_b_planes_pair(__nv_bfloat16 const* planes, int stride, int ld, int n0, int k0,
                                                   int lane, std::uint32_t (&b0)[P][2], std::uint32_t (&b1)[P][2]) {
  std::uint32_t w[4][P];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    std::uint32_t q[4];
    ldmatrix_b_pair<kRowMajor>(q, planes + i * stride, ld, n0, k0, lane);
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j][i] = q[j];
  }
  b_pair_from_words<P>(w, b0, b1);
}
template <int P>  // B[k][n] = M[n][k]
__device__ __forceinline__ void load_b_planes_cols_x2(__nv_bfloat16 const* planes, int stride, int ld, int n0, int k0,
                                                      int lane, std::uint32_t (&b0)[P][2], std::uint32_t (&b1)[P][2]) {
  load_b_planes_pair<false, P>(planes, stride, ld, n0, k0, lane, b0, b1);
}

// The same from [P][64][kLdSq] planes (one [64, 64] matrix per part).
template <int P>
__device__ __forceinline__ void load_b_planes_x2(__nv_bfloat16 const* planes, int n0, int k0, int lane,
                                                 std::uint32_t (&b0)[P][2], std::uint32_t (&b1)[P][2]) {
  load_b_planes_cols_x2<P>(planes, kPlane, kLdSq, n0, k0, lane, b0, b1);
}

template <int P>  // B[k][n] = M[k][n]
__device__ __forceinline__ void load_b_planes_rows_x2(__nv_bfloat16 const* planes, int stride, int ld, int k0, int n0,
                                                      int lane, std::uint32_t (&b0)[P][2], std::uint32_t (&b1)[P][2]) {
  load_b_planes_pair<true, P>(planes, stride, ld, n0, k0, lane, b0, b1);
}

// B fragments of two neighbouring n tiles (n0..n0+7 into b0, n0+8..n0+15 into b1; k rows k0..k0+15) of
// B[k][n] = tile[k][n] (row-major B): ldmatrix.trans for 16-bit elements, element loads for fp32.
template <typename E, int P>
__device__ __forceinline__ void load_b_rows_x2(E const* tile, int ld, int k0, int n0, int lane,
                                               std::uint32_t (&b0)[P][2], std::uint32_t (&b1)[P][2]) {
  if constexpr (sizeof(E) == 2) {
    std::uint32_t q[4];
    ldmatrix_b_pair<true>(q, tile, ld, n0, k0, lane);
    b_pair_from_x4<E, P>(q, b0, b1);
  } else {
    int const g = lane >> 2, t = lane & 3;
    E const* c = tile + (k0 + 2 * t) * ld + n0 + g;
    std::uint32_t w[4][P];
    split_pair<P>(c[0], c[ld], w[0]);
    split_pair<P>(c[8 * ld], c[9 * ld], w[1]);
    split_pair<P>(c[8], c[ld + 8], w[2]);
    split_pair<P>(c[8 * ld + 8], c[9 * ld + 8], w[3]);
    b_pair_from_words<P>(w, b0, b1);
  }
}

// An A fragment from its eight fp32 values, split into P bf16 parts: x[2r], x[2r + 1] are the two elements of
// fragment register r (A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]).
template <int P>
__device__ __forceinline__ void a_from_floats(float const (&x)[8], std::uint32_t (&a)[P][4]) {
  std::uint32_t w[4][P];
#pragma unroll
  for (int r = 0; r < 4; ++r) split_pair<P>(x[2 * r], x[2 * r + 1], w[r]);
#pragma unroll
  for (int i = 0; i < P; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) a[i][r] = w[r][i];
  }
}

// The A fragment (16 rows, k columns 16s..16s+15) of a matrix a warp holds as fp32 accumulators: the accumulator
// tiles of columns 16s..16s+7 (c0) and 16s+8..16s+15 (c1) are exactly an A fragment's halves.
template <int P>
__device__ __forceinline__ void a_from_acc(float const (&c0)[4], float const (&c1)[4], std::uint32_t (&a)[P][4]) {
  float const x[8] = {c0[0], c0[1], c0[2], c0[3], c1[0], c1[1], c1[2], c1[3]};
  a_from_floats<P>(x, a);
}
// Every K step's A fragment of a warp's rows of warpgroup accumulators over 16·kSteps columns, held flat as wgmma
// holds them (tile j in acc[4j .. 4j + 3]): step s from tiles 2s and 2s + 1.
template <int P, int kSteps>
__device__ __forceinline__ void a_from_acc_steps(float const (&acc)[8 * kSteps], std::uint32_t (&a)[kSteps][P][4]) {
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    a_from_acc<P>(reinterpret_cast<float const(&)[4]>(acc[8 * ks]),
                  reinterpret_cast<float const(&)[4]>(acc[8 * ks + 4]), a[ks]);
  }
}

// The A fragment (rows m0..m0+15, k columns k0..k0+15) of A[m][k] = tile[k][m] (a row-major tile read transposed),
// as the fp32 values a_from_floats takes: ldmatrix.trans for 16-bit elements, element loads for fp32.
template <typename E>
__device__ __forceinline__ void load_a_trans_floats(E const* tile, int ld, int m0, int k0, int lane, float (&x)[8]) {
  if constexpr (sizeof(E) == 2) {
    int const m = lane >> 3, r = lane & 7;
    std::uint32_t q[4];
    ldmatrix_x4_trans(q, tile + (k0 + r + 8 * (m >> 1)) * ld + m0 + 8 * (m & 1));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 f;
      if constexpr (std::is_same_v<E, __nv_bfloat16>) {
        __nv_bfloat162 h;
        memcpy(&h, &q[j], sizeof(h));
        f = __bfloat1622float2(h);
      } else {
        __half2 h;
        memcpy(&h, &q[j], sizeof(h));
        f = __half22float2(h);
      }
      x[2 * j] = f.x;
      x[2 * j + 1] = f.y;
    }
  } else {
    int const g = lane >> 2, t = lane & 3;
    E const* c = tile + (k0 + 2 * t) * ld + m0 + g;
    x[0] = c[0];
    x[1] = c[ld];
    x[2] = c[8];
    x[3] = c[ld + 8];
    x[4] = c[8 * ld];
    x[5] = c[9 * ld];
    x[6] = c[8 * ld + 8];
    x[7] = c[9 * ld + 8];
  }
}


// The saved states hᵀ (forward) and dh_nextᵀ (backward recurrence), [V][K] per chunk and value head, are stored in
// the recurrences' accumulator-tile order: the tile of value rows 16·vb.. and state columns 8·nt.. is 128 consecutive
// floats, lane l's four (rows 16·vb + l/4 and + 8, columns 8·nt + 2·(l%4) and + 1, in the accumulator's order) at
// 4·l. A warp saves a tile with one coalesced 16-byte store per lane; the per-chunk kernels read whole tiles.
__host__ __device__ constexpr std::int64_t state_tile(int K, int vb, int nt) {
  return (std::int64_t(vb) * (K / 8) + nt) * 128;
}

// A warp's accumulator tiles handed to its partner warp through shared memory, in register order: tile `slot`'s four
// floats of a lane in one 16-byte word at 16·(32·slot + lane) bytes, so that a warp writes or reads a tile with one
// 16-byte access per lane (four conflict-free wavefronts) rather than four 4-byte ones: the same bytes in a quarter of
// the shared-memory instructions on the recurrences' serial paths. `buf` must be 16-byte aligned.
__device__ __forceinline__ void tile_to_exchange(float const (&d)[4], float* buf, int slot, int lane) {
  reinterpret_cast<float4*>(buf)[slot * 32 + lane] = make_float4(d[0], d[1], d[2], d[3]);
}
// Tile `slot` of a lane from the exchange into d, or added to d.
__device__ __forceinline__ void tile_from_exchange(float (&d)[4], float const* buf, int slot, int lane) {
  float4 const f = reinterpret_cast<float4 const*>(buf)[slot * 32 + lane];
  d[0] = f.x, d[1] = f.y, d[2] = f.z, d[3] = f.w;
}
__device__ __forceinline__ void tile_add_from_exchange(float (&d)[4], float const* buf, int slot, int lane) {
  float4 const f = reinterpret_cast<float4 const*>(buf)[slot * 32 + lane];
  d[0] += f.x, d[1] += f.y, d[2] += f.z, d[3] += f.w;
}
// A warp's [16, 64] accumulator tiles (eight, tile nt at slot nt) to the exchange, or added from it.
__device__ __forceinline__ void tiles_to_exchange(float const (&x)[8][4], float* buf, int lane) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) tile_to_exchange(x[nt], buf, nt, lane);
}
__device__ __forceinline__ void tiles_add_from_exchange(float (&x)[8][4], float const* buf, int lane) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) tile_add_from_exchange(x[nt], buf, nt, lane);
}

// One accumulator tile of the recurrences' transposed frame (d[e] at value column g + 8·(e/2), token 2t + e%2, with
// g = lane / 4, t = lane % 4) out to a token-major tensor as E, row `token` at dst + token·stride, for tokens < valid.
// Lanes g and g ^ 1 trade one element, so that each stores two adjacent value columns of one token (one 2-element
// vector) instead of two scalars: half the store instructions on the recurrences' serial path. All lanes must call.
template <typename E>
__device__ __forceinline__ void store_tile_pairs(float const (&d)[4], int lane, E* dst, std::int64_t stride,
                                                 int token0, int valid) {
  int const g = lane >> 2, t = lane & 3;
  bool const odd = (g & 1) != 0;  // keeps token 2t + 1 (its own e = 1, 3), gives token 2t to the partner
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float const other = __shfl_xor_sync(0xffffffffu, odd ? d[2 * hf] : d[2 * hf + 1], 4);
    int const token = token0 + 2 * t + (odd ? 1 : 0), col = (g & ~1) + 8 * hf;
    float const lo = odd ? other : d[2 * hf], hi = odd ? d[2 * hf + 1] : other;
    if (token < valid) {
      E* const at = dst + token * stride + col;
      if constexpr (std::is_same_v<E, float>) {
        *reinterpret_cast<float2*>(at) = make_float2(lo, hi);
      } else {
        E const pair[2] = {from_float<E>(lo), from_float<E>(hi)};
        std::uint32_t w;
        memcpy(&w, pair, sizeof(w));
        *reinterpret_cast<std::uint32_t*>(at) = w;
      }
    }
  }
}

// Row staging: an accumulator tile (rows: 16 value columns, columns: 8 tokens from token0; lane g, t holds columns
// g, g + 8 of tokens 2t, 2t + 1) written as E into a [token][value column] stage of `ld` elements, so that a block can
// store whole token rows (store_stage_rows) once its warps have staged their tiles. With ld = columns + 16 bytes of
// padding, the four t of a store land in different banks.
template <typename E>
__device__ __forceinline__ void tile_to_rows(float const (&d)[4], E* stage, int ld, int token0, int lane) {
  int const g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int e = 0; e < 4; ++e) stage[(token0 + 2 * t + (e & 1)) * ld + g + 8 * (e >> 1)] = from_float<E>(d[e]);
}
// kRows rows of kRowBytes bytes from a stage (`ld` bytes apart) to global memory (`stride` bytes apart, 16-byte
// aligned), the rows below `valid` only, in 16-byte vectors over the kThreads threads of the block: each thread on one
// column of vectors, kThreads / (kRowBytes / 16) rows apart, so that a store costs an address increment.
template <int kRows, int kRowBytes, int kThreads>
__device__ __forceinline__ void store_stage_rows(void* dst, std::int64_t stride, void const* stage, int ld, int valid) {
  constexpr int kVecs = kRowBytes / 16, kRowStep = kThreads / kVecs;
  static_assert(kRowBytes % 16 == 0 && kThreads % kVecs == 0 && kRows % kRowStep == 0, "whole rows, whole passes");
  int const r0 = static_cast<int>(threadIdx.x) / kVecs, cv = static_cast<int>(threadIdx.x) % kVecs;
  auto* to = static_cast<unsigned char*>(dst) + r0 * stride + 16 * cv;
  auto const* const from = static_cast<unsigned char const*>(stage) + r0 * ld + 16 * cv;
  std::int64_t const step = kRowStep * stride;
#pragma unroll
  for (int u = 0; u < kRows / kRowStep; ++u, to += step) {
    if (r0 + u * kRowStep < valid) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<uint4 const*>(from + u * kRowStep * ld);
    }
  }
}

// A recurrence's state slab as accumulator tiles: the warp's 16 value columns (state columns of `off`, the slab's
// first value column plus g = lane / 4, in [.., K, V] state tensors) over its key rows d0.., s[nt][e] holding
// S[d0 + 8·nt + 2t + (e&1)][8·(e>>1)] relative to `off` (t = lane % 4). Loaded from `src` (zeros when null) and
// stored to `dst`.
template <int kTiles>
__device__ __forceinline__ void load_state_slab(float (&s)[kTiles][4], float const* src, std::int64_t off, int d0,
                                                int V, int t) {
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int const d = d0 + 8 * nt + 2 * t + (e & 1), vr = 8 * (e >> 1);
      s[nt][e] = src != nullptr ? src[off + std::int64_t(d) * V + vr] : 0.0f;
    }
  }
}
template <int kTiles>
__device__ __forceinline__ void store_state_slab(float const (&s)[kTiles][4], float* dst, std::int64_t off, int d0,
                                                 int V, int t) {
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int const d = d0 + 8 * nt + 2 * t + (e & 1), vr = 8 * (e >> 1);
      dst[off + std::int64_t(d) * V + vr] = s[nt][e];
    }
  }
}

// The lean-chain recurrences (gated_delta_schedule.h) run two warps kh = 0, 1 per 16 value columns; a lower-triangular
// [64, 64] product over a chunk's four 16-token row blocks is split between them as {0, 3} and {1, 2}, 5 of its 10
// tile products each. Whether warp kh owns row block np:
__device__ __forceinline__ bool lean_owns_token_block(int kh, int np) {
  return kh == 0 ? (np == 0 || np == 3) : (np == 1 || np == 2);
}

// d += a · b over the part products a_i · b_j with i + j <= kOrder, smallest first. For fp32-level accuracy
// (kOrder = 2) the parts are summed into a fresh accumulator and that is added to d by an IEEE fp32 addition: tensor
// cores accumulate fp32 by truncation (terms aligned to the largest, lower bits dropped; Fasi et al. 2021 for earlier
// generations), which, accumulated over the K/16 steps of a product, came to ~3× the error of plain fp32 arithmetic
// in an emulation of that truncation, and to ≤ 1.4× with the fresh accumulator.
template <int kOrder, int PA, int PB>
__device__ __forceinline__ void mma_split(float (&d)[4], std::uint32_t const (&a)[PA][4],
                                          std::uint32_t const (&b)[PB][2]) {
  float step[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float(&acc)[4] = kOrder >= 2 ? step : d;
#pragma unroll
  for (int s = kOrder; s >= 0; --s) {
#pragma unroll
    for (int i = 0; i < PA; ++i) {
      if (s - i >= 0 && s - i < PB) mma_bf16_16816(acc, a[i], b[s - i]);
    }
  }
  if constexpr (kOrder >= 2) {
#pragma unroll
    for (int e = 0; e < 4; ++e) d[e] += step[e];
  }
}

}  // namespace fusepack::gated_delta_mma
