// Backward of the chunked gated delta rule: the workspace and the launcher of three stages (gated_delta_bwd_intra.cuh,
// _state.cuh, _chunk.cuh; two for 16-bit runs, whose forward saved what the first computes) over the inputs and the
// tensors the forward saved. Contract: fp32 state gradient and accumulations, split-bf16 tensor-core products (fp64
// FMAs in the per-chunk kernels of fp32 runs, see gated_delta_bwd_common.cuh), one rounding of dq, dk, dv, dbeta to
// the input dtype; bitwise deterministic (no atomics: every sum, the GQA sum over value heads included, runs in a
// fixed order).
#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/gated_delta/gated_delta.h"
#include "kernels/gated_delta/gated_delta_bwd_chunk.cuh"
#include "kernels/gated_delta/gated_delta_bwd_intra.cuh"
#include "kernels/gated_delta/gated_delta_bwd_state.cuh"
#include "kernels/gated_delta/gated_delta_bwd_state_wg.cuh"
#include "kernels/gated_delta/gated_delta_head_dims.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace fusepack {

namespace {

using namespace gated_delta_bwd_detail;

// The workspace, what the stages hand each other: byte offsets of its regions (each 256-byte aligned) and its size.
// P_planes, A and rec for fp32 runs only: the forward of 16-bit runs saved P and rec (gated_delta_saves_intra), and
// their per-chunk kernel forms Â itself.
struct BwdWorkspace {
  std::size_t P_planes = 0;  // bf16 [NC, Hv, parts, 64, 64]: P of every chunk, split
  std::size_t A = 0;         // [NC, Hv, 64, 64] Â of every chunk
  std::size_t rec = 0;       // [T, Hv, kBwdRecord] the recurrence's row scales
  std::size_t dh = 0;        // [NC, Hv, V, K] dh_nextᵀ: the gradient of the state leaving every chunk, transposed
  std::size_t y = 0;         // [T, Hv, V] y = Ainvᵀ dv_new, fp32 or bf16 (gated_delta_y_bytes)
  std::size_t done = 0;      // int [N, Hv, V / 64]: the recurrence in warpgroup products' published chunk counts
  std::size_t bytes = 0;
};
BwdWorkspace bwd_workspace(GatedDeltaBwdParams const& p) {
  auto const at = [](std::size_t& offset, std::size_t floats) {
    std::size_t const begin = offset;
    offset += (floats * sizeof(float) + 255) / 256 * 256;
    return begin;
  };
  auto const size = [](std::int64_t x) { return x > 0 ? std::size_t(x) : std::size_t(0); };
  std::size_t const NC = size(p.NC), T = size(p.T), N = size(p.N), Hv = size(p.Hv), K = size(p.K), V = size(p.V);
  BwdWorkspace w;
  std::size_t o = 0;
  if (!gated_delta_saves_intra(p.dtype)) {
    w.P_planes = at(o, NC * Hv * gated_delta_ainv_parts(p.dtype) * kChunk * kChunk / 2);  // bf16 pairs
    w.A = at(o, NC * Hv * kChunk * kChunk);
    w.rec = at(o, T * Hv * kBwdRecord);
  }
  w.dh = at(o, NC * Hv * K * V);
  w.y = at(o, T * Hv * V * gated_delta_y_bytes(p.dtype) / 4);
  w.done = at(o, N * Hv * ((V + 63) / 64));  // ints, as many as floats
  w.bytes = o;
  return w;
}

void check_bwd_params(GatedDeltaBwdParams const& p) {
  auto fail = [](std::string const& what) { throw std::invalid_argument("gated_delta backward: " + what); };
  if (!gated_delta_head_dims_supported(p.K, p.V)) fail(gated_delta_head_dims_refusal(p.K, p.V));
  if (p.Hk < 1 || p.Hv < p.Hk || p.Hv % p.Hk != 0) {
    fail("the value heads Hv=" + std::to_string(p.Hv) +
         " must be a positive multiple of the key heads Hk=" + std::to_string(p.Hk));
  }
  if (p.T < 0 || p.N < 0 || p.NC < 0 || (p.T == 0) != (p.NC == 0)) {
    fail("T=" + std::to_string(p.T) + ", N=" + std::to_string(p.N) + ", NC=" + std::to_string(p.NC) +
         " do not describe a packed batch (T = 0 exactly when there are no chunks)");
  }
  if (p.N > 0 && !p.chunks) fail("chunks (the chunk table on the device) is null");
  if (p.T > 0) {
    struct Named {
      void const* ptr;
      char const* name;
    };
    for (Named const& t : {Named{p.q, "q"}, Named{p.k, "k"}, Named{p.v, "v"}, Named{p.g, "g"}, Named{p.beta, "beta"},
                           Named{p.dout, "dout"}, Named{p.dq, "dq"}, Named{p.dk, "dk"}, Named{p.dv, "dv"},
                           Named{p.dg, "dg"}, Named{p.dbeta, "dbeta"}}) {
      if (!t.ptr) fail(std::string(t.name) + " is null");
    }
    // The kernels copy q, k, v and dout and store dv in 16-byte vectors.
    for (Named const& t : {Named{p.q, "q"}, Named{p.k, "k"}, Named{p.v, "v"}, Named{p.dout, "dout"},
                           Named{p.dv, "dv"}}) {
      if (std::string const why = gated_delta_misaligned(t.ptr, t.name); !why.empty()) fail(why);
    }
    auto const saved = [&](Named const& t) {
      if (!t.ptr) fail(std::string(t.name) + " is null: the backward reads what the forward saved (save = true)");
    };
    for (Named const& t : {Named{p.q_rstd, "q_rstd"}, Named{p.k_rstd, "k_rstd"}, Named{p.Ainv, "Ainv"}, Named{p.h, "h"},
                           Named{p.v_new, "v_new"}}) {
      saved(t);
    }
    if (gated_delta_saves_intra(p.dtype)) {
      for (Named const& t : {Named{p.P, "P"}, Named{p.brec, "brec"}}) saved(t);
    }
  }
  if (gated_delta_bwd_workspace_bytes(p) > 0 && reinterpret_cast<std::uintptr_t>(p.workspace) % 256 != 0) {
    fail(p.workspace ? "workspace must be 256-byte aligned" : "workspace is null");
  }
}

template <typename Kernel>
void allow_smem(Kernel kernel, std::size_t bytes) {  // per call: the attribute belongs to the current device
  if (bytes > 48 * 1024) {
    FUSEPACK_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

// The largest blocks (the 8-warp recurrence, the per-chunk kernels of fp32 and fp16 runs) fit at every head size.
template <int... kDims>
constexpr bool smem_fits(IntList<kDims...>) {
  return ((StateSmem<float, kDims, 8>::kBytes <= kMaxBlockSmem &&
           StateSmem<__nv_bfloat16, kDims, 8>::kBytes <= kMaxBlockSmem &&
           chunk_smem_bytes<kDims, kDims>() <= kMaxBlockSmem &&
           ChunkMmaSmem<__half, kDims, kDims>::kBytes <= kMaxBlockSmem) &&
          ...);
}
static_assert(smem_fits(GatedDeltaHeadDims{}), "the backward's blocks need more shared memory than Hopper allows");
// gated_delta_y_bytes (the host's size of y) agrees with the kernels' Handover.
static_assert(sizeof(Handover<__nv_bfloat16>) == 2 && sizeof(Handover<__half>) == 4 && sizeof(Handover<float>) == 4);

// One block of kSlabs slabs of 16 value columns, each slab kKSplit warps (gated_delta_bwd_state.cuh).
template <typename T, int K, int kSlabs, int kKSplit>
void launch_state(GatedDeltaBwdParams const& p, __nv_bfloat16 const* P_planes, float const* rec, float* dh,
                  Handover<T>* y, cudaStream_t stream) {
  using Sm = StateBlockSmem<T, K, kSlabs, kKSplit>;
  static_assert(Sm::kBytes <= kMaxBlockSmem, "the state recurrence's shared memory fits a Hopper block");
  auto const kernel = gated_delta_bwd_state<T, K, kSlabs, kKSplit>;
  allow_smem(kernel, Sm::kBytes);
  std::int64_t const blocks = std::int64_t(p.N) * p.Hv * (p.V / Sm::Stage::kBV);
  if (blocks > INT_MAX) {
    throw std::invalid_argument("gated_delta backward: N·Hv·V/" + std::to_string(Sm::Stage::kBV) + " = " +
                                std::to_string(blocks) + " blocks exceed the grid limit");
  }
  kernel<<<static_cast<unsigned>(blocks), kSlabs * kKSplit * 32, Sm::kBytes, stream>>>(p, P_planes, rec, dh, y);
  FUSEPACK_CUDA_CHECK_LAUNCH();
}

// The lean chain of bf16 runs at K = 128: one warpgroup per 64 value columns (gated_delta_bwd_state_wg.cuh), the
// per-chunk kernel beside it (launch_chunk_beside).
template <typename T, int K>
constexpr bool kStateInWarpgroups = std::is_same_v<T, __nv_bfloat16> && K == 128;

void launch_state_wg(GatedDeltaBwdParams const& p, __nv_bfloat16 const* P_planes, float const* rec, float* dh,
                     __nv_bfloat16* y, int* done, cudaStream_t stream) {
  static_assert(WgStateSmem::kBytes <= kMaxBlockSmem, "the warpgroup recurrence's shared memory fits a Hopper block");
  allow_smem(gated_delta_bwd_state_wg, WgStateSmem::kBytes);
  std::int64_t const blocks = std::int64_t(p.N) * p.Hv * (p.V / kWgStateColumns);
  if (blocks > INT_MAX) {
    throw std::invalid_argument("gated_delta backward: N·Hv·V/" + std::to_string(kWgStateColumns) + " = " +
                                std::to_string(blocks) + " blocks exceed the grid limit");
  }
  FUSEPACK_CUDA_CHECK(cudaMemsetAsync(done, 0, sizeof(int) * std::size_t(blocks), stream));
  gated_delta_bwd_state_wg<<<static_cast<unsigned>(blocks), 128, WgStateSmem::kBytes, stream>>>(p, P_planes, rec, dh,
                                                                                                 y, done);
  FUSEPACK_CUDA_CHECK_LAUNCH();
}

// The lean chain (gated_delta_schedule.h): two slabs of two warps per block.
constexpr int kLeanSlabs = 2;

static_assert(16 * kLeanSlabs == kGatedDeltaLeanColumns, "gated_delta_lean_blocks_per_example counts these blocks");

// The full chain's block: 8 slabs (128 value columns) where that leaves every SM a block, 4 otherwise.
int full_chain_slabs(GatedDeltaFwdParams const& p, int sms) {
  return p.V % 128 == 0 && std::int64_t(p.N) * p.Hv * (p.V / 128) >= sms ? 8 : 4;
}

// The recurrence of `schedule` (the pass's, gated_delta_bwd_schedule): the lean chain, or the full chain in the block
// shape full_chain_slabs picks.
template <typename T, int K, int V>
void launch_state_for(GatedDeltaSchedule schedule, GatedDeltaBwdParams const& p, __nv_bfloat16 const* P_planes,
                      float const* rec, float* dh, Handover<T>* y, int* done, cudaStream_t stream) {
  if (schedule == GatedDeltaSchedule::kLeanChain) {
    if constexpr (kStateInWarpgroups<T, K>) {
      return launch_state_wg(p, P_planes, rec, dh, y, done, stream);
    } else {
      return launch_state<T, K, kLeanSlabs, 2>(p, P_planes, rec, dh, y, stream);
    }
  }
  int device = 0, sms = 0;
  FUSEPACK_CUDA_CHECK(cudaGetDevice(&device));
  FUSEPACK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if constexpr (V % 128 == 0) {
    if (full_chain_slabs(p, sms) == 8) return launch_state<T, K, 8, 1>(p, P_planes, rec, dh, y, stream);
  }
  launch_state<T, K, 4, 1>(p, P_planes, rec, dh, y, stream);
}

// The per-chunk kernel as the recurrence's programmatic dependent (gated_delta_bwd_chunk_mma's kBeside): its blocks
// start once every recurrence block has, take the SMs the recurrence leaves free, and each waits for its chunk. Where
// the device does not start a dependent early, it runs after the recurrence, with the same results.
template <typename T, int K, int V>
void launch_chunk_beside(GatedDeltaBwdParams const& p, float const* dh, Handover<T> const* y, int const* done,
                         cudaStream_t stream) {
  if constexpr (kStateInWarpgroups<T, K>) {
    auto const kernel = gated_delta_bwd_chunk_mma<T, K, V, true>;
    allow_smem(kernel, ChunkMmaSmem<T, K, V>::kBytes);
    cudaLaunchAttribute beside[1];
    beside[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    beside[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(std::int64_t(p.NC) * p.Hk));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = ChunkMmaSmem<T, K, V>::kBytes;
    config.stream = stream;
    config.attrs = beside;
    config.numAttrs = 1;
    FUSEPACK_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, dh, y, done));
  }
}

template <typename T, int K, int V>
void launch(GatedDeltaBwdParams const& p, cudaStream_t stream) {
  BwdWorkspace const w = bwd_workspace(p);
  auto* ws = static_cast<char*>(p.workspace);
  auto region = [&](std::size_t offset) { return reinterpret_cast<float*>(ws + offset); };
  auto planes = [&](std::size_t offset) { return reinterpret_cast<__nv_bfloat16*>(ws + offset); };
  GatedDeltaSchedule const schedule = gated_delta_bwd_schedule(p);  // asked once: both kernels follow it
  float* const dh = region(w.dh);
  int* const done = reinterpret_cast<int*>(ws + w.done);
  auto* const y = reinterpret_cast<Handover<T>*>(ws + w.y);
  // P and the records: saved by the forward of 16-bit runs (whose per-chunk kernel forms Â itself), computed here
  // with Â for fp32 runs
  bool const saved = gated_delta_saves_intra(p.dtype);
  float *const A = region(w.A), *const rec = saved ? p.brec : region(w.rec);
  auto* const P_planes = saved ? reinterpret_cast<__nv_bfloat16*>(p.P) : planes(w.P_planes);
  if constexpr (std::is_same_v<T, float>) {  // fp32 runs only, so the intra kernel is instantiated for fp32 alone
    if (p.NC > 0 && !saved) {
      auto const kernel = gated_delta_bwd_intra<T, K>;
      allow_smem(kernel, intra_smem_bytes<K>());
      unsigned const blocks = static_cast<unsigned>(std::int64_t(p.NC) * p.Hv);
      kernel<<<blocks, kThreads, intra_smem_bytes<K>(), stream>>>(p, P_planes, A, rec);
      FUSEPACK_CUDA_CHECK_LAUNCH();
    }
  }
  if (p.NC > 0 || p.dinitial_state) {  // without chunks it only passes dfinal_state through to dinitial_state
    launch_state_for<T, K, V>(schedule, p, P_planes, rec, dh, y, done, stream);
  }
  if (p.NC > 0) {  // fp32 runs: fp64-FMA products on fp32 tiles; 16-bit runs: split-bf16 products on bf16 planes
    unsigned const blocks = static_cast<unsigned>(std::int64_t(p.NC) * p.Hk);
    if constexpr (std::is_same_v<T, float>) {
      auto const kernel = gated_delta_bwd_chunk<T, K, V>;
      allow_smem(kernel, chunk_smem_bytes<K, V>());
      kernel<<<blocks, kThreads, chunk_smem_bytes<K, V>(), stream>>>(p, P_planes, A, dh, y);
    } else if (kStateInWarpgroups<T, K> && schedule == GatedDeltaSchedule::kLeanChain) {
      launch_chunk_beside<T, K, V>(p, dh, y, done, stream);
    } else {
      auto const kernel = gated_delta_bwd_chunk_mma<T, K, V>;
      allow_smem(kernel, ChunkMmaSmem<T, K, V>::kBytes);
      kernel<<<blocks, kThreads, ChunkMmaSmem<T, K, V>::kBytes, stream>>>(p, dh, y, nullptr);
    }
    FUSEPACK_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

std::size_t gated_delta_bwd_workspace_bytes(GatedDeltaBwdParams const& p) { return bwd_workspace(p).bytes; }

GatedDeltaChainPlaces gated_delta_bwd_chain_places(GatedDeltaFwdParams const& p, GatedDeltaSchedule schedule, int sms,
                                                   int smem_per_sm) {
  gated_delta_check_chain_places_args("gated_delta_bwd_chain_places", p, schedule, sms, smem_per_sm);
  if (schedule == GatedDeltaSchedule::kLeanChain) {
    // The recurrence block that runs (launch_state_for): its value columns and shared memory.
    using Block = std::pair<int, std::size_t>;  // value columns, shared memory
    Block const block = FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
      return FUSEPACK_GATED_DELTA_HEAD_DIM_SWITCH(p.K, kK, [&] {
        if constexpr (kStateInWarpgroups<T, kK>) return Block(kWgStateColumns, WgStateSmem::kBytes);
        return Block(kGatedDeltaLeanColumns, StateBlockSmem<T, kK, kLeanSlabs, 2>::kBytes);
      });
    });
    return {p.Hv * (p.V / block.first), sms * gated_delta_blocks_per_sm(block.second, smem_per_sm)};
  }
  int const slabs = full_chain_slabs(p, sms);
  std::size_t const smem = FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    return FUSEPACK_GATED_DELTA_HEAD_DIM_SWITCH(p.K, kK, [&] {
      return slabs == 8 ? StateBlockSmem<T, kK, 8, 1>::kBytes : StateBlockSmem<T, kK, 4, 1>::kBytes;
    });
  });
  // The full chain's kernel takes nearly every register (254 a thread): 65,536 a multiprocessor hold one block of 8
  // warps or two of 4.
  std::int64_t const per_sm = std::max<std::int64_t>(
      1, std::min<std::int64_t>(gated_delta_blocks_per_sm(smem, smem_per_sm), 65536 / (slabs * 32 * 256)));
  return {p.Hv * (p.V / (16 * slabs)), sms * per_sm};
}

// By shape (gated_delta_schedule_on_device): in bf16 at K = 128 the lean recurrence runs 64 value columns a block, one
// block per SM, so its steps stay within twice the full chain's at every shape and the backward runs lean (one
// example of 8192 tokens and 8 × 1024 at Hv = 32 and 48, the training packs); fp16 and K = 64 count 32-column blocks,
// and 8 × 1024 runs full there.
GatedDeltaSchedule gated_delta_bwd_schedule(GatedDeltaBwdParams const& p) {
  return gated_delta_schedule_on_device(p, GatedDeltaPass::kBackward);
}

void run_gated_delta_bwd(GatedDeltaBwdParams const& p, cudaStream_t stream) {
  check_bwd_params(p);
  if (p.N == 0) return;
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    FUSEPACK_GATED_DELTA_HEAD_DIM_SWITCH(p.K, kDim, [&] { launch<T, kDim, kDim>(p, stream); });
  });
}

}  // namespace fusepack
