// Hopper's warpgroup matrix products (wgmma, sm_90a only): D[64 × N] += A[64 × 16] · B[N × 16]ᵀ in fp32 from bf16
// operands, B in shared memory and A in shared memory or registers, issued by a warpgroup (four consecutive warps, the
// first at a warp index divisible by 4) and run asynchronously: fence before the first product that reads accumulators
// written by other instructions, commit the products issued, wait before reading the accumulators. The building block
// of warp-specialised kernels, where one warpgroup's products run while other warpgroups load and store (PTX ISA,
// "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"); mma.sync (HMMA), which the kernels use so far, runs a
// warp's products in lockstep with its other instructions and keeps both operands in registers.
//
// Shared-memory operands: K-major bf16 tiles (or MN-major ones, read transposed: sw128_mn_desc) with the 128-byte
// swizzle, the layout the tensor cores read without bank conflicts: rows of 64 elements of K (128 bytes), row r at
// r·128 bytes from a tile base aligned to 1024 bytes, its eight 16-byte chunks permuted within the row, chunk j at
// position j ^ (r mod 8). A tile of R rows holds R / 8 such 1024-byte groups. A product over 16 of the 64 K elements
// (32 bytes) starts 32 bytes further into the rows: its descriptor's start address advanced by 2 (units of 16 bytes);
// the hardware applies the swizzle to the address it forms.
#pragma once

#include <cstdint>

namespace fusepack::wgmma {

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128-byte-swizzled K-major tile.
__host__ __device__ constexpr int sw128_offset(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

// The matrix descriptor of a 128-byte-swizzled K-major tile at `tile` (shared memory, 1024-byte aligned): the start
// address in bits 0-13, the leading-dimension byte offset in 16-29 (unused by swizzled K-major layouts; 1 by
// convention), the stride-dimension byte offset in 32-45 (1024: from one group of 8 rows to the next), the base offset
// in 49-51 (0: the tile is aligned) and the swizzle mode in 62-63 (1: 128 bytes); addresses and offsets in units of 16
// bytes.
__device__ __forceinline__ std::uint64_t sw128_desc(void const* tile) {
  auto const address = static_cast<std::uint64_t>(static_cast<std::uint32_t>(__cvta_generic_to_shared(tile)));
  return ((address & 0x3FFFF) >> 4) | (std::uint64_t{1} << 16) | (std::uint64_t{1024 >> 4} << 32) |
         (std::uint64_t{1} << 62);
}

// The descriptor of the product over K elements 16·k .. 16·k + 15 of a tile whose descriptor is `desc`.
__device__ __forceinline__ std::uint64_t k_step(std::uint64_t desc, int k) { return desc + std::uint64_t(2 * k); }

// An operand stored MN-major (read transposed, kTransB) with the 128-byte swizzle: rows of K, each holding 64 elements
// of M or N (128 bytes), row r at r·128 bytes, chunk j at j ^ (r mod 8), in blocks of 64 MN elements `mn_block_bytes`
// apart (a block of R rows of K takes R·128 bytes); the tile starts on a 1024-byte boundary. Its descriptor: the
// leading-dimension byte offset is the distance between MN blocks, the stride-dimension byte offset the distance
// between groups of 8 rows of K (1024), swizzle mode 1.
__device__ __forceinline__ std::uint64_t sw128_mn_desc(void const* tile, int mn_block_bytes) {
  auto const address = static_cast<std::uint64_t>(static_cast<std::uint32_t>(__cvta_generic_to_shared(tile)));
  return ((address & 0x3FFFF) >> 4) | (std::uint64_t(mn_block_bytes >> 4) << 16) | (std::uint64_t{1024 >> 4} << 32) |
         (std::uint64_t{1} << 62);
}

// The descriptor of the product over K rows 16·k .. 16·k + 15 of an MN-major tile: 16 rows, 2048 bytes further.
__device__ __forceinline__ std::uint64_t k_step_mn(std::uint64_t desc, int k) {
  return desc + std::uint64_t(128 * k);
}

// Shared-memory stores by ordinary instructions become visible to the products (the async proxy) only after this
// fence, by each writing thread, and a barrier among the writers.
__device__ __forceinline__ void fence_shared_to_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Before a warpgroup's first product whose accumulators other instructions wrote (or read) since its last wait.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// The products issued since the last commit become one group.
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Until at most kPending committed groups are still running (0: all done; their accumulators may be read).
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// D[64 × N] = A[64 × 16] · B[N × 16]ᵀ + (accumulate ? D : 0), bf16 operands, fp32 accumulators. With w = t / 32,
// g = (t % 32) / 4, q = t % 4 for thread t of the warpgroup (warp w on rows 16w .. 16w + 15):
// - A from shared memory (desc_a, K-major), or in the _rs forms from registers, mma.sync's m16k16 A fragment: a[0] =
//   A[16w + g][2q, 2q + 1], a[1] = A[16w + g + 8][2q, 2q + 1], a[2] = A[16w + g][2q + 8, 2q + 9], a[3] =
//   A[16w + g + 8][2q + 8, 2q + 9], each a bf16 pair with the lower column in the low half.
// - B from shared memory, K-major (kTransB false: rows of N, K contiguous; sw128_desc) or read transposed (kTransB
//   true: MN-major, rows of K with N contiguous; sw128_mn_desc).
// - The accumulators, mma.sync's m16n8 layout for each 8-column block j: d[4j] = D[16w + g][8j + 2q], d[4j + 1] =
//   D[16w + g][8j + 2q + 1], d[4j + 2] = D[16w + g + 8][8j + 2q], d[4j + 3] = D[16w + g + 8][8j + 2q + 1].
template <bool kTransB = false>
__device__ __forceinline__ void mma_m64n64k16_bf16(float (&d)[32], std::uint64_t desc_a, std::uint64_t desc_b,
                                                  bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, %35;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(int{kTransB}));
}

template <bool kTransB = false>
__device__ __forceinline__ void mma_m64n64k16_bf16_rs(float (&d)[32], std::uint32_t const (&a)[4],
                                                     std::uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(int{kTransB}));
}

template <bool kTransB = false>
__device__ __forceinline__ void mma_m64n128k16_bf16_rs(float (&d)[64], std::uint32_t const (&a)[4],
                                                      std::uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(int{kTransB}));
}

}  // namespace fusepack::wgmma
