// Forward of the chunked gated delta rule: the chunk table, the workspace, the schedule and the launchers of the
// kernels in gated_delta_fwd_kernels.cuh (WY inverse per chunk, then the chunk-to-chunk recurrence with the output in
// it) and gated_delta_fwd_chain.cuh (the state chain, then the output of every chunk at once). Numerical contract: fp32
// state and accumulation; tensor-core products on bf16 parts of their operands (raw bf16 exact, fp16 as two parts,
// fp32 as three, fp32 intermediates as two, or three for fp32 inputs), which keeps fp32-level accuracy for fp32
// inputs and ~2^-16 relative error per product for bf16/fp16; one rounding of o to the input dtype.
#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/gated_delta/gated_delta.h"
#include "kernels/gated_delta/gated_delta_fwd_chain.cuh"
#include "kernels/gated_delta/gated_delta_fwd_chain_wg.cuh"
#include "kernels/gated_delta/gated_delta_fwd_kernels.cuh"
#include "kernels/gated_delta/gated_delta_head_dims.h"
#include "kernels/gated_delta/gated_delta_trace.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fusepack {

GatedDeltaChunkTable gated_delta_chunk_table(std::vector<std::int32_t> const& cu_seqlens) {
  if (cu_seqlens.empty()) {
    throw std::invalid_argument("gated_delta_chunk_table: cu_seqlens must hold N+1 >= 1 offsets; got none");
  }
  if (cu_seqlens[0] != 0) {
    throw std::invalid_argument("gated_delta_chunk_table: cu_seqlens[0] must be 0; got " +
                                std::to_string(cu_seqlens[0]));
  }
  int const N = static_cast<int>(cu_seqlens.size()) - 1;
  std::int64_t nc = 0;
  for (int n = 0; n < N; ++n) {
    if (cu_seqlens[n + 1] < cu_seqlens[n]) {
      throw std::invalid_argument("gated_delta_chunk_table: cu_seqlens must be non-decreasing; got cu_seqlens[" +
                                  std::to_string(n) + "]=" + std::to_string(cu_seqlens[n]) + " > cu_seqlens[" +
                                  std::to_string(n + 1) + "]=" + std::to_string(cu_seqlens[n + 1]));
    }
    nc += (std::int64_t(cu_seqlens[n + 1]) - cu_seqlens[n] + kGatedDeltaChunk - 1) / kGatedDeltaChunk;
  }
  GatedDeltaChunkTable table;
  table.N = N;
  table.NC = static_cast<int>(nc);
  table.data.resize(3 * nc + 2 * N + 1);
  std::int32_t* chunk_start = table.data.data();
  std::int32_t* chunk_len = chunk_start + nc;
  std::int32_t* chunk_example = chunk_len + nc;
  std::int32_t* chunk_offsets = chunk_example + nc;
  std::int32_t c = 0;
  for (int n = 0; n < N; ++n) {
    chunk_offsets[n] = c;
    for (std::int32_t t = cu_seqlens[n]; t < cu_seqlens[n + 1]; t += kGatedDeltaChunk, ++c) {
      chunk_start[c] = t;
      chunk_len[c] = cu_seqlens[n + 1] - t < kGatedDeltaChunk ? cu_seqlens[n + 1] - t : kGatedDeltaChunk;
      chunk_example[c] = n;
    }
  }
  chunk_offsets[N] = c;
  std::int32_t* by_length = chunk_offsets + N + 1;
  auto const chunks_of = [&](std::int32_t n) { return chunk_offsets[n + 1] - chunk_offsets[n]; };
  for (int n = 0; n < N; ++n) by_length[n] = n;
  std::stable_sort(by_length, by_length + N,
                   [&](std::int32_t a, std::int32_t b) { return chunks_of(a) > chunks_of(b); });
  return table;
}

namespace {

using namespace gated_delta_fwd_detail;

constexpr std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

[[noreturn]] void fail(std::string const& what) { throw std::invalid_argument("gated_delta forward: " + what); }

void check_shapes(GatedDeltaFwdParams const& p) {
  if (!gated_delta_head_dims_supported(p.K, p.V)) fail(gated_delta_head_dims_refusal(p.K, p.V));
  if (p.Hk < 1 || p.Hv < p.Hk || p.Hv % p.Hk != 0) {
    fail("the value heads Hv=" + std::to_string(p.Hv) + " must be a positive multiple of the key heads Hk=" +
         std::to_string(p.Hk));
  }
  if (p.T < 0 || p.N < 0 || p.NC < 0) {
    fail("T, N and NC must be >= 0; got T=" + std::to_string(p.T) + ", N=" + std::to_string(p.N) +
         ", NC=" + std::to_string(p.NC));
  }
  if (p.T > 0 && (p.N < 1 || p.NC < 1)) {
    fail("T=" + std::to_string(p.T) + " tokens need N >= 1 examples and NC >= 1 chunks; got N=" +
         std::to_string(p.N) + ", NC=" + std::to_string(p.NC));
  }
}

// Workspace: the token records [T, Hv, kRecord] fp32, then (I + A)^-1 as bf16 parts [T, Hv, parts, 64] (parts = 2
// for bf16/fp16 runs, 3 for fp32 runs: the recurrence's tensor-core operand); each part starts on a 256-byte boundary.
// With p.save the parts go to p.Ainv instead, which the backward reads, and the workspace holds the records only.
int ainv_parts(DType dtype) {
  int const parts = FUSEPACK_DTYPE_SWITCH(dtype, T, [&] { return SplitPolicy<T>::kOrder + 1; });
  if (parts != gated_delta_ainv_parts(dtype)) {
    throw std::logic_error("gated_delta: the kernels' Ainv parts disagree with gated_delta_ainv_parts");
  }
  return parts;
}
std::size_t record_bytes(GatedDeltaFwdParams const& p) {
  return align256(sizeof(float) * static_cast<std::size_t>(p.T) * p.Hv * kRecord);
}
std::size_t ainv_plane_bytes(GatedDeltaFwdParams const& p) {
  return align256(sizeof(__nv_bfloat16) * static_cast<std::size_t>(p.T) * p.Hv * ainv_parts(p.dtype) * kChunk);
}

// kLeanChain also hands the chain's results to the output kernel: v_new as fp32 tiles [NC, Hv, V/16, 8, 128]
// (vn_tile_offset), and, when not saving (p.h is then null), the states entering the chunks [NC, Hv, V, K].
std::size_t vn_tile_bytes(GatedDeltaFwdParams const& p) {
  return align256(sizeof(float) * static_cast<std::size_t>(p.NC) * p.Hv * p.V * kChunk);
}
std::size_t state_bytes(GatedDeltaFwdParams const& p) {
  return align256(sizeof(float) * static_cast<std::size_t>(p.NC) * p.Hv * p.V * p.K);
}
// And the chain's published chunk counts, one int per chain block [N, Hv, V/32], zeroed before every chain.
std::size_t done_bytes(GatedDeltaFwdParams const& p) {
  return align256(sizeof(int) * static_cast<std::size_t>(p.N) * gated_delta_lean_blocks_per_example(p.Hv, p.V));
}

void check_pointers(GatedDeltaFwdParams const& p, void const* workspace) {
  auto require = [](void const* ptr, char const* name) {
    if (ptr == nullptr) fail(std::string(name) + " is null");
  };
  auto require16 = [](void const* ptr, char const* name) {
    if (std::string const why = gated_delta_misaligned(ptr, name); !why.empty()) fail(why);
  };
  if (p.N > 0) {
    require(p.cu_seqlens, "cu_seqlens");
    require(p.chunks, "chunks (the device copy of GatedDeltaChunkTable::data)");
  }
  if (p.T > 0) {
    require(p.q, "q");
    require(p.k, "k");
    require(p.v, "v");
    require(p.g, "g");
    require(p.beta, "beta");
    require(p.o, "o");
    require(workspace, "workspace");
    require16(p.q, "q");
    require16(p.k, "k");
    require16(p.v, "v");
    require16(p.o, "o");
    require16(workspace, "workspace");
    if (p.save) {
      require(p.q_rstd, "q_rstd");
      require(p.k_rstd, "k_rstd");
      require(p.Ainv, "Ainv");
      require16(p.Ainv, "Ainv");
      require(p.h, "h");
      require(p.v_new, "v_new");
      require16(p.v_new, "v_new");
      if (gated_delta_saves_intra(p.dtype)) {
        require(p.P, "P");
        require16(p.P, "P");
        require(p.brec, "brec");
        require16(p.brec, "brec");
      }
    }
  }
}

template <typename T, int kK>
void launch_wy_inverse(GatedDeltaFwdParams const& p, float* rec, __nv_bfloat16* ainv, cudaStream_t stream) {
  auto const kernel = gated_delta_fwd_wy_inverse<T, kK>;
  constexpr std::size_t smem = WyInverseSmem<T, kK>::kBytes;
  if constexpr (smem > 48 * 1024) {  // per call: the attribute belongs to the current device
    FUSEPACK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem)));
  }
  std::int64_t const pairs = (p.Hv / p.Hk + 1) / 2;
  std::int64_t const blocks = std::int64_t(p.NC) * p.Hk * pairs;
  if (blocks > INT_MAX) {
    fail("NC·Hk·ceil(Hv/Hk / 2) = " + std::to_string(blocks) + " blocks exceed the grid limit");
  }
  kernel<<<static_cast<unsigned>(blocks), kWyThreads, smem, stream>>>(p, rec, ainv);
  FUSEPACK_CUDA_CHECK_LAUNCH();
}

// The recurrence's block shapes: kWarps warps in slabs of kKSplit warps, each slab on 16 value columns.
struct RecurrenceShape {
  int warps, ksplit;
  int columns() const { return 16 * warps / ksplit; }
};
constexpr RecurrenceShape kRecurrenceShapes[] = {{8, 1}, {8, 2}, {4, 2}, {2, 2}};
// Shapes whose shared memory exceeds a block's on Hopper (kMaxBlockSmem, 227 KB) are neither compiled nor chosen (fp32
// at K = 128 runs only [2 warps, split 2]). A multiprocessor has 228 KB, of which each resident block also takes 1 KB
// for the system.
constexpr std::size_t kSmemPerSm = 228 * 1024;

template <typename T, int kK>
std::size_t recurrence_smem(RecurrenceShape s) {
  if (s.warps == 8) return s.ksplit == 1 ? RecurrenceSmem<T, kK, 8, 1>::kBytes : RecurrenceSmem<T, kK, 8, 2>::kBytes;
  if (s.warps == 4) return RecurrenceSmem<T, kK, 4, 2>::kBytes;
  return RecurrenceSmem<T, kK, 2, 2>::kBytes;
}

template <typename T, int kK, int kWarps, int kKSplit>
void launch_recurrence_with(GatedDeltaFwdParams const& p, float const* rec, __nv_bfloat16 const* ainv,
                            cudaStream_t stream) {
  using Sm = RecurrenceSmem<T, kK, kWarps, kKSplit>;
  if constexpr (Sm::kBytes <= kMaxBlockSmem) {
    auto const kernel = gated_delta_fwd_chunk_recurrence<T, kK, kWarps, kKSplit>;
    if constexpr (Sm::kBytes > 48 * 1024) {
      FUSEPACK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(Sm::kBytes)));
    }
    std::int64_t const blocks = std::int64_t(p.N) * p.Hv * (p.V / Sm::kBV);
    if (blocks > INT_MAX) fail("N·Hv·V/" + std::to_string(Sm::kBV) + " blocks exceed the grid limit");
    kernel<<<static_cast<unsigned>(blocks), kWarps * 32, Sm::kBytes, stream>>>(p, rec, ainv);
    FUSEPACK_CUDA_CHECK_LAUNCH();
  } else {
    throw std::logic_error("gated_delta forward: chose a recurrence shape that does not fit in shared memory");
  }
}

// Model time of the recurrence in one block shape, in units of one warp's share of a chunk at kKSplit = 2 (u): a
// warp alone runs a unit in ~kUnitLatency, a multiprocessor's tensor cores and issue slots take ~kUnitThroughput per
// unit of all its resident warps (both from instruction counts; to be re-fitted to measurements). A block's chunk
// then takes max(latency of its slowest warp, its warps' units × throughput), and the kernel waves × that. Blocks
// per multiprocessor: as many as shared memory and registers (the kernels use up to 255 per thread) allow.
constexpr double kUnitLatency = 1500, kUnitThroughput = 400;  // cycles, estimated
std::int64_t recurrence_blocks_per_sm(RecurrenceShape s, std::size_t smem, std::size_t smem_per_sm) {
  std::int64_t const by_smem = static_cast<std::int64_t>(smem_per_sm / (smem + 1024));  // 1 KB reserved per block
  std::int64_t const by_regs = 65536 / (s.warps * 32 * 256);
  return std::max<std::int64_t>(1, std::min(by_smem, by_regs));
}
double recurrence_model_time(RecurrenceShape s, std::int64_t blocks, int sms, std::size_t smem,
                             std::size_t smem_per_sm) {
  double const units = s.ksplit == 1 ? 2.0 : 1.0;
  std::int64_t const per_sm = recurrence_blocks_per_sm(s, smem, smem_per_sm);
  std::int64_t const waves = (blocks + sms * per_sm - 1) / (sms * per_sm);
  double const chunk = std::max(units * kUnitLatency, s.warps * per_sm * units * kUnitThroughput);
  return static_cast<double>(waves) * chunk;
}

// One block per (example, value head, tile of value columns), each sequential over the example's chunks. Among the
// shapes whose shared memory fits `smem_limit`, the one of least model time; ties go to wider tiles, which share each
// chunk's q, k, Ainv loads and its P among more columns (8 × 1024 tokens, Hv = 32: [8 warps, split 1]; 1 × 8192:
// [4, 2]). {0, 0} when none fits.
template <typename T, int kK>
RecurrenceShape pick_recurrence(GatedDeltaFwdParams const& p, int sms, std::size_t smem_limit,
                                std::size_t smem_per_sm) {
  RecurrenceShape best{0, 0};
  double best_time = 0;
  for (RecurrenceShape const s : kRecurrenceShapes) {
    std::size_t const smem = recurrence_smem<T, kK>(s);
    if (p.V % s.columns() != 0 || smem > smem_limit) continue;
    std::int64_t const blocks = std::int64_t(p.N) * p.Hv * (p.V / s.columns());
    double const time = recurrence_model_time(s, blocks, sms, smem, smem_per_sm);
    if (best.warps == 0 || time < best_time || (time == best_time && s.columns() > best.columns())) {
      best = s;
      best_time = time;
    }
  }
  return best;
}

template <typename T, int kK>
void launch_recurrence(GatedDeltaFwdParams const& p, float const* rec, __nv_bfloat16 const* ainv,
                       cudaStream_t stream) {
  int device = 0, sms = 0, smem_optin = 0, smem_per_sm = 0;
  FUSEPACK_CUDA_CHECK(cudaGetDevice(&device));
  FUSEPACK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  FUSEPACK_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  FUSEPACK_CUDA_CHECK(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  RecurrenceShape const best =
      pick_recurrence<T, kK>(p, sms, std::min<std::size_t>(smem_optin, kMaxBlockSmem), smem_per_sm);
  if (best.warps == 0) {
    throw std::runtime_error("gated_delta forward: the recurrence needs " +
                             std::to_string(recurrence_smem<T, kK>({2, 2})) + " bytes of shared memory per block (" +
                             dtype_name(p.dtype) + ", K=" + std::to_string(kK) + "); the device allows " +
                             std::to_string(smem_optin));
  }
  if (best.warps == 8) {
    return best.ksplit == 1 ? launch_recurrence_with<T, kK, 8, 1>(p, rec, ainv, stream)
                            : launch_recurrence_with<T, kK, 8, 2>(p, rec, ainv, stream);
  }
  if (best.warps == 4) return launch_recurrence_with<T, kK, 4, 2>(p, rec, ainv, stream);
  return launch_recurrence_with<T, kK, 2, 2>(p, rec, ainv, stream);
}

// The lean chain (gated_delta_schedule.h): the state chain in blocks of two slabs (32 value columns, four warps: the
// slabs share each chunk's k rows and Ainv planes, and two blocks fit a multiprocessor), or for bf16 at K = 128 in
// warpgroup products (64 value columns, one warpgroup), and the output kernel over every (chunk, value head) beside
// it: launched as the chain's programmatic dependent, its blocks start once every chain block has, take the places the
// chain leaves free, and each waits for its chunk's state (one example of 8192 tokens at Hv = 32 runs 64 warpgroup
// chain blocks, one per SM, and the output's blocks on the other SMs; NOTES.md). Where the device does not start a
// dependent early, the output kernel runs after the chain, with the same results.
constexpr int kLeanSlabs = 2;

template <typename T, int kK>
void launch_lean_chain(GatedDeltaFwdParams const& p, float const* rec, __nv_bfloat16 const* ainv, float* h,
                       float* vn_tiles, int* done, cudaStream_t stream) {
  // bf16 at K = 128: the chain in warpgroup products, 64 value columns a block (gated_delta_fwd_chain_wg.cuh).
  constexpr bool kWg = std::is_same_v<T, __nv_bfloat16> && kK == 128;
  constexpr int kChainColumns = kWg ? kWgChainColumns : kGatedDeltaLeanColumns;
  // The old chain hands the state over as its bf16 parts when nothing is saved (kHAsParts), and the output kernel
  // reads them so; a saved h, every fp32 run's and the warpgroup chain's are fp32.
  bool const h_as_parts = !kWg && kHAsParts<T> && !p.save;
  if (done != nullptr) FUSEPACK_CUDA_CHECK(cudaMemsetAsync(done, 0, done_bytes(p), stream));  // null when T = 0
  std::int64_t const blocks = std::int64_t(p.N) * p.Hv * (p.V / kChainColumns);
  if (blocks > INT_MAX) fail("N·Hv·V/" + std::to_string(kChainColumns) + " blocks exceed the grid limit");
  if constexpr (kWg) {
    auto const chain = gated_delta_fwd_state_chain_wg<false>;
    FUSEPACK_CUDA_CHECK(cudaFuncSetAttribute(chain, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(WgChainSmem::kBytes)));
    chain<<<static_cast<unsigned>(blocks), 128, WgChainSmem::kBytes, stream>>>(p, rec, ainv, h, vn_tiles, done);
  } else {
    using Sm = ChainSmem<T, kK, kLeanSlabs>;
    static_assert(Sm::kBytes <= kMaxBlockSmem, "the state chain's shared memory fits a Hopper block");
    static_assert(Sm::kBV == kGatedDeltaLeanColumns, "the output kernel polls one count per chain block");
    auto const chain = h_as_parts ? gated_delta_fwd_state_chain<T, kK, kLeanSlabs, kHAsParts<T>>
                                  : gated_delta_fwd_state_chain<T, kK, kLeanSlabs, false>;
    if constexpr (Sm::kBytes > 48 * 1024) {
      FUSEPACK_CUDA_CHECK(cudaFuncSetAttribute(chain, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(Sm::kBytes)));
    }
    chain<<<static_cast<unsigned>(blocks), kLeanSlabs * 64, Sm::kBytes, stream>>>(p, rec, ainv, h, vn_tiles, done);
  }
  FUSEPACK_CUDA_CHECK_LAUNCH();
  if (p.NC == 0) return;

  using So = OutputSmem<T, kK>;
  static_assert(2 * (So::kBytes + 1024) <= kSmemPerSm,
                "two output blocks share a Hopper multiprocessor, as the kernel's register bound assumes");
  auto const output = h_as_parts ? gated_delta_fwd_chunk_output<T, kK, kHAsParts<T> && !kWg, kChainColumns>
                                 : gated_delta_fwd_chunk_output<T, kK, false, kChainColumns>;
  if constexpr (So::kBytes > 48 * 1024) {
    FUSEPACK_CUDA_CHECK(cudaFuncSetAttribute(output, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(So::kBytes)));
  }
  std::int64_t const out_blocks = std::int64_t(p.NC) * p.Hv;
  if (out_blocks > INT_MAX) fail("NC·Hv = " + std::to_string(out_blocks) + " blocks exceed the grid limit");
  cudaLaunchAttribute beside_the_chain[1];
  beside_the_chain[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  beside_the_chain[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(out_blocks));
  config.blockDim = dim3(kK * 2);
  config.dynamicSmemBytes = So::kBytes;
  config.stream = stream;
  config.attrs = beside_the_chain;
  config.numAttrs = 1;
  FUSEPACK_CUDA_CHECK(cudaLaunchKernelEx(&config, output, p, rec, h, vn_tiles, done));
}

}  // namespace

void gated_delta_check_chain_places_args(char const* who, GatedDeltaFwdParams const& p, GatedDeltaSchedule schedule,
                                         int sms, int smem_per_sm) {
  auto const refuse = [who](std::string const& what) { throw std::invalid_argument(std::string(who) + ": " + what); };
  if (sms < 1 || smem_per_sm < 1) {
    refuse("expected sms >= 1 and smem_per_sm >= 1; got " + std::to_string(sms) + " and " +
           std::to_string(smem_per_sm));
  }
  if (!gated_delta_head_dims_supported(p.K, p.V)) refuse(gated_delta_head_dims_refusal(p.K, p.V));
  if (schedule != GatedDeltaSchedule::kLeanChain && schedule != GatedDeltaSchedule::kFullChain) {
    refuse(std::string("needs a forced schedule; got '") + gated_delta_schedule_name(schedule) + "'");
  }
}

GatedDeltaChainPlaces gated_delta_fwd_chain_places(GatedDeltaFwdParams const& p, GatedDeltaSchedule schedule, int sms,
                                                   int smem_per_sm) {
  static_assert(16 * kLeanSlabs == kGatedDeltaLeanColumns, "gated_delta_lean_blocks_per_example counts these blocks");
  // bf16 at K = 128 runs 64-column chain blocks (kWgChainColumns), and these are still counted as 32-column ones on
  // purpose: the lean forward is fast where the output kernel runs beside the chain on the SMs it leaves free, which
  // the step ratio does not see. Counted as they run, one example of 8192 tokens and 8 × 1024 (Hv = 32) both come to
  // a ratio of 1.0, and the lean forward is the faster at the first (0.44 against 0.98 ms on an H100) and the slower
  // at the second (0.49 against 0.40), where its chain fills every SM; the 32-column count puts 8 × 1024 at 2.0.
  gated_delta_check_chain_places_args("gated_delta_fwd_chain_places", p, schedule, sms, smem_per_sm);
  if (schedule == GatedDeltaSchedule::kLeanChain) {
    std::size_t const smem = FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
      return FUSEPACK_GATED_DELTA_HEAD_DIM_SWITCH(p.K, kK, [&] { return ChainSmem<T, kK, kLeanSlabs>::kBytes; });
    });
    return {gated_delta_lean_blocks_per_example(p.Hv, p.V), sms * gated_delta_blocks_per_sm(smem, smem_per_sm)};
  }
  // The largest block the launcher may ask for: a multiprocessor's shared memory less the 1 KB reserved per block
  // (Hopper's opt-in limit, 227 of 228 KB).
  std::size_t const smem_limit = std::min<std::size_t>(std::size_t(smem_per_sm) - 1024, kMaxBlockSmem);
  return FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    return FUSEPACK_GATED_DELTA_HEAD_DIM_SWITCH(p.K, kK, [&] {
      RecurrenceShape const s = pick_recurrence<T, kK>(p, sms, smem_limit, smem_per_sm);
      if (s.warps == 0) fail("the full chain's recurrence fits no block of " + std::to_string(smem_limit) + " bytes");
      return GatedDeltaChainPlaces{p.Hv * (p.V / s.columns()),
                                   sms * recurrence_blocks_per_sm(s, recurrence_smem<T, kK>(s), smem_per_sm)};
    });
  });
}

namespace {

// The last by-shape choice of each pass with everything it depends on. Every layer of a model step asks again for
// the same pack, and the list schedule takes microseconds per thousand blocks (a pack of 300 short examples at
// Hv = 32 hands out 38,400), host time before the pass's first launch that shows whenever the GPU waits for it.
struct SchedulePick {
  std::vector<std::int64_t> chunks;
  int Hv = 0, V = 0, K = 0, sms = 0, smem_per_sm = 0;
  DType dtype = DType::kBF16;
  GatedDeltaSchedule schedule = GatedDeltaSchedule::kByShape;  // kByShape: nothing remembered yet
  bool same(std::vector<std::int64_t> const& c, GatedDeltaFwdParams const& p, int s, int smem) const {
    return schedule != GatedDeltaSchedule::kByShape && Hv == p.Hv && V == p.V && K == p.K && dtype == p.dtype &&
           sms == s && smem_per_sm == smem && chunks == c;
  }
};
thread_local SchedulePick last_pick[2];  // forward, backward

}  // namespace

GatedDeltaSchedule gated_delta_pick_schedule_for(GatedDeltaFwdParams const& p, GatedDeltaPass pass, int sms,
                                                 int smem_per_sm) {
  if (p.chunks_host == nullptr) {
    throw std::invalid_argument("gated_delta: the by-shape schedule reads each example's chunks from the host chunk "
                                "table (chunks_host); got nullptr");
  }
  bool const forward = pass == GatedDeltaPass::kForward;
  std::vector<std::int64_t> chunks = gated_delta_chunks_longest_first({p.chunks_host, p.NC, p.N});
  SchedulePick& last = last_pick[forward ? 0 : 1];
  if (last.same(chunks, p, sms, smem_per_sm)) return last.schedule;
  auto const places = [&](GatedDeltaSchedule s) {
    return forward ? gated_delta_fwd_chain_places(p, s, sms, smem_per_sm)
                   : gated_delta_bwd_chain_places(p, s, sms, smem_per_sm);
  };
  GatedDeltaChainPlaces const lean = places(GatedDeltaSchedule::kLeanChain);
  GatedDeltaChainPlaces const full = places(GatedDeltaSchedule::kFullChain);
  GatedDeltaSchedule const schedule = gated_delta_pick_schedule(
      GatedDeltaSchedule::kByShape, gated_delta_chain_steps(chunks, lean.blocks_per_example, lean.slots),
      gated_delta_chain_steps(chunks, full.blocks_per_example, full.slots),
      forward ? kGatedDeltaFwdLeanStepsPerFullStep : kGatedDeltaBwdLeanStepsPerFullStep);
  last.chunks = std::move(chunks);
  last.Hv = p.Hv;
  last.V = p.V;
  last.K = p.K;
  last.dtype = p.dtype;
  last.sms = sms;
  last.smem_per_sm = smem_per_sm;
  last.schedule = schedule;
  return schedule;
}

GatedDeltaSchedule gated_delta_schedule_on_device(GatedDeltaFwdParams const& p, GatedDeltaPass pass) {
  if (p.schedule != GatedDeltaSchedule::kByShape) return p.schedule;
  int device = 0, sms = 0, smem_per_sm = 0;
  FUSEPACK_CUDA_CHECK(cudaGetDevice(&device));
  FUSEPACK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  FUSEPACK_CUDA_CHECK(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  return gated_delta_pick_schedule_for(p, pass, sms, smem_per_sm);
}

// By shape on the H200 at V = 128, bf16: one example of 8192 tokens runs lean in both passes at Hv = 32 and 48,
// 8 × 1024 full in the forward and lean in the backward; the trainer's packs of mixed lengths lean in both
// (kernels/gated_delta/NOTES.md has both schedules' times).
GatedDeltaSchedule gated_delta_fwd_schedule(GatedDeltaFwdParams const& p) {
  return gated_delta_schedule_on_device(p, GatedDeltaPass::kForward);
}

std::size_t gated_delta_fwd_workspace_bytes(GatedDeltaFwdParams const& p) {
  check_shapes(p);
  if (p.T == 0) return 0;
  std::size_t bytes = record_bytes(p) + (p.save ? 0 : ainv_plane_bytes(p));
  if (gated_delta_fwd_schedule(p) == GatedDeltaSchedule::kLeanChain) {
    bytes += vn_tile_bytes(p) + done_bytes(p) + (p.save ? 0 : state_bytes(p));
  }
  return bytes;
}

void run_gated_delta_fwd(GatedDeltaFwdParams const& p, void* workspace, cudaStream_t stream) {
  check_shapes(p);
  check_pointers(p, workspace);
  if (p.N == 0 || (p.T == 0 && p.final_state == nullptr)) return;
  auto* const bytes = static_cast<unsigned char*>(workspace);
  auto* rec = reinterpret_cast<float*>(bytes);
  std::size_t at = record_bytes(p);
  __nv_bfloat16* ainv = reinterpret_cast<__nv_bfloat16*>(p.Ainv);
  if (!p.save) {
    ainv = reinterpret_cast<__nv_bfloat16*>(bytes + at);
    at += ainv_plane_bytes(p);
  }
  bool const lean = gated_delta_fwd_schedule(p) == GatedDeltaSchedule::kLeanChain;
  float* vn_tiles = nullptr;
  int* done = nullptr;
  float* h = p.h;
  if (lean && p.T > 0) {
    vn_tiles = reinterpret_cast<float*>(bytes + at);
    at += vn_tile_bytes(p);
    done = reinterpret_cast<int*>(bytes + at);
    at += done_bytes(p);
    if (!p.save) h = reinterpret_cast<float*>(bytes + at);
  }
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    FUSEPACK_GATED_DELTA_HEAD_DIM_SWITCH(p.K, kK, [&] {
      if (p.NC > 0) launch_wy_inverse<T, kK>(p, rec, ainv, stream);
      if (lean) {
        launch_lean_chain<T, kK>(p, rec, ainv, h, vn_tiles, done, stream);
      } else {
        launch_recurrence<T, kK>(p, rec, ainv, stream);
      }
    });
  });
}

char const* gated_delta_trace_kind_name(GatedDeltaTraceKind kind) {
  switch (kind) {
    case GatedDeltaTraceKind::kWyStart: return "wy_start";
    case GatedDeltaTraceKind::kWyEnd: return "wy_end";
    case GatedDeltaTraceKind::kChainStart: return "chain_start";
    case GatedDeltaTraceKind::kChainStep: return "chain_step";
    case GatedDeltaTraceKind::kChainEnd: return "chain_end";
    case GatedDeltaTraceKind::kOutputStart: return "output_start";
    case GatedDeltaTraceKind::kOutputReady: return "output_ready";
    case GatedDeltaTraceKind::kOutputEnd: return "output_end";
    case GatedDeltaTraceKind::kOutputBuilt: return "output_built";
  }
  return "unknown";
}

bool gated_delta_trace_built() { return gated_delta_trace_detail::kTraced; }

namespace {
void require_trace_build(char const* who) {
  if (!gated_delta_trace_detail::kTraced) {
    throw std::runtime_error(std::string(who) +
                             ": this build does not record the gated delta forward's timeline; configure with "
                             "-DFUSEPACK_GATED_DELTA_TRACE=ON");
  }
}
}  // namespace

void gated_delta_trace_begin() {
  require_trace_build("gated_delta_trace_begin");
#if defined(FUSEPACK_GATED_DELTA_TRACE)
  FUSEPACK_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long const zero = 0;
  FUSEPACK_CUDA_CHECK(cudaMemcpyToSymbol(gated_delta_trace_detail::trace_count, &zero, sizeof zero));
#endif
}

std::vector<GatedDeltaTraceEvent> gated_delta_trace_end() {
  require_trace_build("gated_delta_trace_end");
  std::vector<GatedDeltaTraceEvent> events;
#if defined(FUSEPACK_GATED_DELTA_TRACE)
  FUSEPACK_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long count = 0;
  FUSEPACK_CUDA_CHECK(cudaMemcpyFromSymbol(&count, gated_delta_trace_detail::trace_count, sizeof count));
  if (count > kGatedDeltaTraceCapacity) {
    throw std::runtime_error("gated_delta_trace_end: " + std::to_string(count) + " events recorded, more than the " +
                             std::to_string(kGatedDeltaTraceCapacity) +
                             " the trace holds; trace fewer forwards or a smaller shape");
  }
  std::vector<ulonglong2> raw(static_cast<std::size_t>(count));
  if (count > 0) {
    FUSEPACK_CUDA_CHECK(
        cudaMemcpyFromSymbol(raw.data(), gated_delta_trace_detail::trace_events, sizeof(ulonglong2) * raw.size()));
  }
  events.reserve(raw.size());
  for (ulonglong2 const& r : raw) events.push_back(gated_delta_trace_unpack(r.x, r.y));
#endif
  return events;
}

}  // namespace fusepack
