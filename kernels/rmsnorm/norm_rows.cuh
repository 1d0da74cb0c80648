// Device helpers of the RMSNorm row kernels (rmsnorm_fwd.cu, rmsnorm_bwd.cu): the per-row thread geometry of
// NormRowLayout (norm_layout.h), register chunks of a row, the row sum, the backward's cp.async ring, the block's
// dweight partial, the persistent grid size, and the kernel instance of a layout (dtype, iters and flags switched over).
#pragma once

#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/common/vec.cuh"
#include "kernels/rmsnorm/rmsnorm.h"

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace fusepack {

// One access of a row: a 16-byte vector (kVec) or one element.
template <typename T, bool kVec>
struct alignas(kVec ? 16 : alignof(T)) NormChunk {
  static constexpr int kN = kVec ? Vec16<T>::kN : 1;
  T v[kN];
};

template <typename T, bool kVec>
__device__ __forceinline__ NormChunk<T, kVec> load_chunk(T const* p) {
  NormChunk<T, kVec> r;
  if constexpr (kVec) {
    *reinterpret_cast<int4*>(&r) = __ldg(reinterpret_cast<int4 const*>(p));
  } else {
    r.v[0] = p[0];
  }
  return r;
}

template <typename T, bool kVec>
__device__ __forceinline__ void store_chunk(T* p, NormChunk<T, kVec> const& r) {
  if constexpr (kVec) {
    *reinterpret_cast<int4*>(p) = *reinterpret_cast<int4 const*>(&r);
  } else {
    p[0] = r.v[0];
  }
}

// Threads per block a kernel instance is compiled for: 1024 only for the long scalar rows (one row per block with 4
// or 8 elements per thread, norm_row_layout's second choice), 256 otherwise, which leaves the compiler up to 255
// registers for rows kept in registers.
template <bool kBlockRow, bool kVec, int kIters>
inline constexpr int kNormMaxThreads = (kBlockRow && !kVec && kIters >= 4) ? 1024 : 256;

// Where this thread sits: `lane` within its row's threads, `group` = which of the block's rows.
struct NormRowThread {
  int lane, group, groups;
};

template <bool kBlockRow>
__device__ __forceinline__ NormRowThread norm_row_thread(int lanes) {
  if constexpr (kBlockRow) {
    return {static_cast<int>(threadIdx.x), 0, 1};
  } else {
    return {static_cast<int>(threadIdx.x) & (lanes - 1), static_cast<int>(threadIdx.x) / lanes,
            static_cast<int>(blockDim.x) / lanes};
  }
}

// Sum of `v` over the threads of one row: `lanes` (a power of two <= 32) consecutive lanes of a warp, or the whole
// block (kBlockRow; blockDim.x a multiple of 32, `red` >= blockDim.x / 32 floats). Every thread of the row gets the
// bitwise same value (a butterfly: lane i and lane i^o add the same two numbers), and the order depends only on the
// layout, so the result is deterministic. Every thread of the block must call it.
template <bool kBlockRow>
__device__ __forceinline__ float norm_row_sum(float v, int lanes, float* red) {
  if constexpr (!kBlockRow) {
    for (int o = lanes >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  } else {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int const warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < warps; ++w) s += red[w];
    __syncthreads();  // `red` is free again for the next row
    return s;
  }
}

// Writes this block's dweight partial, partial[blockIdx.x, :] = Σ over the block's rows of `acc`, where thread
// (lane, group) holds acc[i][j] for column (lane + i·lanes)·kN + j. The groups of a block share columns and are added
// in group order through shared memory (`part`: groups × dim floats, unused for one row per block). Every thread of
// the block must call it.
template <bool kBlockRow, int kIters, int kN>
__device__ __forceinline__ void norm_store_partial(float const (&acc)[kIters][kN], NormRowThread t, int lanes,
                                                   std::int64_t chunks, std::int64_t dim, float* part,
                                                   float* partial) {
  float* out = partial + std::int64_t(blockIdx.x) * dim;
  if constexpr (kBlockRow) {
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      std::int64_t const c = t.lane + std::int64_t(i) * lanes;
      if (c < chunks) {
#pragma unroll
        for (int j = 0; j < kN; ++j) out[c * kN + j] = acc[i][j];
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      std::int64_t const c = t.lane + std::int64_t(i) * lanes;
      if (c < chunks) {
#pragma unroll
        for (int j = 0; j < kN; ++j) part[t.group * dim + c * kN + j] = acc[i][j];
      }
    }
    __syncthreads();
    for (std::int64_t col = threadIdx.x; col < dim; col += blockDim.x) {
      float s = 0.0f;
      for (int g = 0; g < t.groups; ++g) s += part[g * dim + col];
      out[col] = s;
    }
  }
}

// The (iters, elems per access) pairs norm_row_layout can produce: the launchers instantiate only these.
template <bool kBlockRow>
constexpr bool norm_layout_reachable(int iters, int elems) {
  return kBlockRow ? iters * elems <= 32 : iters <= 4;
}

// The layout of a pass, or std::invalid_argument naming the op when the row is too long (the ops layer checks first).
inline NormRowLayout norm_row_layout_or_throw(char const* op, std::int64_t dim, DType dtype, bool aligned,
                                              int small_row_iters) {
  int const elem_bytes = dtype == DType::kF32 ? 4 : 2;
  NormRowLayout const l = norm_row_layout(dim, elem_bytes, aligned, small_row_iters);
  if (!l.supported) {
    throw std::invalid_argument(std::string(op) + ": dim " + std::to_string(dim) + " is outside the fused kernel's "
                                "range 1.." + std::to_string(kNormMaxDim));
  }
  return l;
}

// ---- the backward's load pipeline (vector path) ------------------------------------------------------------------
// Registers bound how many loads a thread can keep in flight when each row lives in registers until its reduction:
// at D = 256 bf16 about 32 KB per SM, under the ~30 KB that H200's bandwidth × latency needs. The backward therefore
// stages rows through shared memory with cp.async, `stages` - 1 rows ahead. Each thread copies and later reads only
// its own 16-byte slots, so cp.async.wait_group alone orders them: no barrier.

__device__ __forceinline__ void cp_async16(void* smem, void const* gmem, bool pred) {
  unsigned const dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int const src_bytes = pred ? 16 : 0;  // 0: nothing is read, the slot is zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `pending` (0..3) of this thread's committed groups are still in flight.
__device__ __forceinline__ void cp_async_wait(int pending) {
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
  }
}

// A ring of `stages` rows in shared memory: stage s holds this thread's kIters 16-byte chunks of each of kTensors
// tensors. Slot (s, k, i) of thread t sits at ((s·kTensors + k)·kIters + i)·blockDim.x + t (16-byte units), so a
// warp's accesses are consecutive and conflict-free.
template <typename T, int kTensors, int kIters>
struct NormRing {
  static constexpr int kN = NormChunk<T, true>::kN;
  int4* base;
  int stages;

  __device__ __forceinline__ int4* slot(int stage, int k, int i) const {
    return base + ((stage * kTensors + k) * kIters + i) * blockDim.x + threadIdx.x;
  }
  // Starts the copies of `row` (zero-filled when row >= rows) into `stage` and commits them as one group.
  __device__ __forceinline__ void issue(int stage, T const* const (&src)[kTensors], std::int64_t row,
                                        std::int64_t rows, std::int64_t dim, std::int64_t chunks, int lane,
                                        int lanes) const {
#pragma unroll
    for (int k = 0; k < kTensors; ++k) {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        std::int64_t const c = lane + std::int64_t(i) * lanes;
        bool const pred = row < rows && c < chunks;
        cp_async16(slot(stage, k, i), pred ? src[k] + row * dim + c * kN : src[k], pred);
      }
    }
    cp_async_commit();
  }
  __device__ __forceinline__ NormChunk<T, true> read(int stage, int k, int i) const {
    NormChunk<T, true> r;
    *reinterpret_cast<int4*>(&r) = *slot(stage, k, i);
    return r;
  }
};

// Shared memory of a backward block: the ring (vector path; `stages` is 2..4, as many as fit in 48 KB) and, when
// rows share a block, groups × dim fp32 for the dweight partial. 48 KB rather than 64: at D = 5120 bf16 (20 KB per
// stage) two stages per block let four blocks share an SM instead of three with three stages — more rows in flight
// per SM, 0.141 → 0.138 ms forward+backward on the H200 (NOTES.md).
struct NormBwdSmem {
  int stages = 0;
  std::size_t ring_bytes = 0, bytes = 0;
};

inline NormBwdSmem norm_bwd_smem(NormRowLayout const& l, int tensors) {
  NormBwdSmem m;
  if (l.vec) {
    std::size_t const per_stage = std::size_t(tensors) * l.iters * l.threads * 16, budget = 48 << 10;
    std::size_t const fit = budget / per_stage;
    m.stages = fit >= 4 ? 4 : (fit >= 2 ? static_cast<int>(fit) : 2);
    m.ring_bytes = m.stages * per_stage;
  }
  m.bytes = m.ring_bytes + (l.block_per_row ? 0 : sizeof(float) * l.rows_per_block() * l.chunks * l.elems);
  return m;
}

// With one row per block, each block writes dim fp32 partials that the reduction reads back: 2·blocks·dim·4 bytes
// against 3·rows·dim·sizeof(T) of the pass (at 8192 rows of bf16, 2.1 % per block per SM). Four blocks per SM, each
// with its cp.async ring a row ahead, keep ~160 KB of rows per SM at D = 5120 bf16 (the [8192, 5120] forward+backward
// on the H200: 2 blocks 0.151 ms, 3 blocks 0.141 ms, 4 blocks with the 48 KB ring 0.138 ms, 5 or 6 no better;
// NOTES.md).
inline constexpr int kNormBlockRowBlocksPerSm = 4;

// Persistent grid of a backward kernel: as many blocks as fit on the device at once (capped for one row per block),
// no more than there are rows. Depends only on the device and the layout, so the backward's summation order does too.
// Raises the kernel's dynamic shared memory limit first when `smem` is over the default 48 KB. The device queries
// cost microseconds and each backward asks twice (workspace size, launch), so the answer is cached per device,
// kernel, block size and shared memory.
template <typename Kernel>
std::int64_t norm_persistent_blocks(Kernel kernel, NormRowLayout const& l, std::size_t smem, std::int64_t rows) {
  struct Entry {
    int device;
    Kernel kernel;
    int threads;
    std::size_t smem;
    std::int64_t resident;
  };
  static std::mutex mutex;
  static std::vector<Entry> cache;
  int device = 0;
  FUSEPACK_CUDA_CHECK(cudaGetDevice(&device));
  std::int64_t resident = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (Entry const& e : cache) {
      if (e.device == device && e.kernel == kernel && e.threads == l.threads && e.smem == smem) resident = e.resident;
    }
    if (resident == 0) {
      int sms = 0, per_sm = 0;
      FUSEPACK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      if (smem > (48 << 10)) {
        FUSEPACK_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      }
      FUSEPACK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, l.threads, smem));
      if (per_sm < 1) {
        throw std::invalid_argument("norm backward: a block of " + std::to_string(l.threads) + " threads with " +
                                    std::to_string(smem) + " bytes of shared memory does not fit on the device");
      }
      if (l.block_per_row && per_sm > kNormBlockRowBlocksPerSm) per_sm = kNormBlockRowBlocksPerSm;
      resident = std::int64_t(sms) * per_sm;
      cache.push_back({device, kernel, l.threads, smem, resident});
    }
  }
  std::int64_t const needed = (rows + l.rows_per_block() - 1) / l.rows_per_block();
  return needed < 1 ? 1 : (needed < resident ? needed : resident);
}

// Sigmoid of the gate (the gated form). fp32 outputs are held to a few ulp against the ATen composite: expf and an
// IEEE division. bf16/fp16 outputs round at 2^-9 / 2^-12 relative, far above the ~2^-21 of __expf and the approximate
// division, which save ~15 instructions per element (at D = 128 the gated backward is otherwise close to issue-bound).
template <typename T>
__device__ __forceinline__ float norm_sigmoid(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return 1.0f / (1.0f + expf(-x));
  } else {
    return __fdividef(1.0f, 1.0f + __expf(-x));  // x → −∞: __expf gives inf, __fdividef(1, inf) gives 0
  }
}

// ---- the launchers (host) ------------------------------------------------------------------------------------------

template <typename T>
struct NormTypeTag {
  using type = T;
};

// The kernel instance of a pass for layout `l`: pick(NormTypeTag<T>, kVec, kIters, kBlockRow, kGated), each flag a
// std::integral_constant, returns &kernel<T, kVec, kIters, kBlockRow, kGated>; only layouts norm_row_layout can
// produce are instantiated. Every compile-time value reaches `pick` as a type: the flags as std::integral_constant
// arguments of the generic lambdas, kIters made a type in the body of its switch. With FUSEPACK_BOOL_SWITCH's
// `constexpr static` flags read inside a nested generic lambda of this template, nvcc 13 instantiated (and launched) a
// kernel for another layout on the H200.
template <typename KernelPtr, typename Pick>
KernelPtr norm_kernel_for(char const* op, NormRowLayout const& l, DType dtype, bool gated, Pick const& pick) {
  KernelPtr kernel = nullptr;
  auto with_flags = [&](auto type, auto vec, auto block_row, auto gate) {
    using T = typename std::decay_t<decltype(type)>::type;
    using Vec = std::decay_t<decltype(vec)>;
    using BlockRow = std::decay_t<decltype(block_row)>;
    FUSEPACK_INT_SWITCH(NormIters, l.iters, kIters, [&] {
      using Iters = std::integral_constant<int, kIters>;
      if constexpr (norm_layout_reachable<BlockRow::value>(Iters::value, NormChunk<T, Vec::value>::kN)) {
        kernel = pick(NormTypeTag<T>{}, Vec{}, Iters{}, BlockRow{}, gate);
      } else {
        throw std::logic_error(std::string(op) + ": norm_row_layout produced an unreachable layout");
      }
    });
  };
  auto with_gate = [&](auto type, auto vec, auto block_row) {
    gated ? with_flags(type, vec, block_row, std::true_type{}) : with_flags(type, vec, block_row, std::false_type{});
  };
  auto with_type = [&](auto type) {
    if (l.vec) {
      l.block_per_row ? with_gate(type, std::true_type{}, std::true_type{})
                      : with_gate(type, std::true_type{}, std::false_type{});
    } else {
      l.block_per_row ? with_gate(type, std::false_type{}, std::true_type{})
                      : with_gate(type, std::false_type{}, std::false_type{});
    }
  };
  FUSEPACK_DTYPE_SWITCH(dtype, T, [&] { with_type(NormTypeTag<T>{}); });
  return kernel;
}

// One block per row group of the forward, or std::invalid_argument naming the op past the grid's limit.
inline int norm_fwd_blocks(char const* op, NormRowLayout const& l, std::int64_t rows) {
  std::int64_t const blocks = (rows + l.rows_per_block() - 1) / l.rows_per_block();
  if (blocks > 0x7fffffff) throw std::invalid_argument(std::string(op) + ": too many rows: " + std::to_string(rows));
  return static_cast<int>(blocks);
}

}  // namespace fusepack
