// Backward of the chunked gated delta rule: three launches (gated_delta_bwd_kernels.cuh; two for 16-bit runs, whose
// forward saved what the first computes) over the inputs and the tensors the forward saved. Contract: fp32 state
// gradient and accumulations, split-bf16 tensor-core products (fp64 FMAs in the per-chunk kernels of fp32 runs, see
// the kernels' header), one rounding of dq, dk, dv, dbeta to the input dtype; bitwise deterministic (no atomics: every
// sum, the GQA sum over value heads included, runs in a fixed order).
#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/gated_delta/gated_delta.h"
#include "kernels/gated_delta/gated_delta_bwd_kernels.cuh"

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

// K = V ∈ {64, 128}: one place for the head sizes the backward is compiled for.
#define FUSEPACK_GATED_DELTA_BWD_DIM_SWITCH(dim, NAME, ...)                                                     \
  [&] {                                                                                                         \
    if ((dim) == 64) {                                                                                          \
      constexpr static int NAME = 64;                                                                           \
      return __VA_ARGS__();                                                                                     \
    } else if ((dim) == 128) {                                                                                  \
      constexpr static int NAME = 128;                                                                          \
      return __VA_ARGS__();                                                                                     \
    }                                                                                                           \
    throw std::invalid_argument("gated_delta backward: head size " + std::to_string(dim) + " is not compiled"); \
  }()

namespace fusepack {

namespace {

using namespace gated_delta_bwd_detail;

void check_bwd_params(GatedDeltaBwdParams const& p) {
  auto fail = [](std::string const& what) { throw std::invalid_argument("gated_delta backward: " + what); };
  if (p.K != p.V || (p.K != 64 && p.K != 128)) {
    fail("the fused backward needs K = V = 64 or 128; got K=" + std::to_string(p.K) +
         " (q/k dimension 2), V=" + std::to_string(p.V) + " (v dimension 2)");
  }
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

// An H100/H200 block may have 227 KB of shared memory; the recurrence and the per-chunk kernel run one block per SM.
constexpr std::size_t kMaxBlockSmem = 227 * 1024;
static_assert(StateSmem<float, 128, 8>::kBytes <= kMaxBlockSmem &&
              StateSmem<__nv_bfloat16, 128, 8>::kBytes <= kMaxBlockSmem);
static_assert(chunk_smem_bytes<128, 128>() <= kMaxBlockSmem && ChunkMmaSmem<__half, 128, 128>::kBytes <= kMaxBlockSmem);
// gated_delta_handover_bytes (the host's sizes of v_new and y) agrees with the kernels' Handover.
static_assert(sizeof(Handover<__nv_bfloat16>) == 2 && sizeof(Handover<__half>) == 4 && sizeof(Handover<float>) == 4);

template <typename T, int K, int kBWarps>
void launch_state(GatedDeltaBwdParams const& p, __nv_bfloat16 const* P_planes, float const* rec, float* dh,
                  Handover<T>* y, cudaStream_t stream) {
  using Sm = StateSmem<T, K, kBWarps>;
  auto const kernel = gated_delta_bwd_state<T, K, kBWarps>;
  allow_smem(kernel, Sm::kBytes);
  std::int64_t const blocks = std::int64_t(p.N) * p.Hv * (p.V / Sm::kBV);
  if (blocks > INT_MAX) {
    throw std::invalid_argument("gated_delta backward: N·Hv·V/" + std::to_string(Sm::kBV) + " = " +
                                std::to_string(blocks) + " blocks exceed the grid limit");
  }
  kernel<<<static_cast<unsigned>(blocks), kBWarps * 32, Sm::kBytes, stream>>>(p, P_planes, rec, dh, y);
  FUSEPACK_CUDA_CHECK_LAUNCH();
}

// One block per (example, value head, 128 value columns) when that fills the GPU, else 64 columns: each warp's chunk
// step is the same either way, narrower blocks only spread few examples' chains over more multiprocessors.
template <typename T, int K, int V>
void launch_state_for(GatedDeltaBwdParams const& p, __nv_bfloat16 const* P_planes, float const* rec, float* dh,
                      Handover<T>* y, cudaStream_t stream) {
  if constexpr (V % 128 == 0) {
    int device = 0, sms = 0;
    FUSEPACK_CUDA_CHECK(cudaGetDevice(&device));
    FUSEPACK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (std::int64_t(p.N) * p.Hv * (V / 128) >= sms) {
      return launch_state<T, K, 8>(p, P_planes, rec, dh, y, stream);
    }
  }
  launch_state<T, K, 4>(p, P_planes, rec, dh, y, stream);
}

template <typename T, int K, int V>
void launch(GatedDeltaBwdParams const& p, cudaStream_t stream) {
  BwdWorkspace const w = bwd_workspace(p);
  auto* ws = static_cast<char*>(p.workspace);
  auto region = [&](std::size_t offset) { return reinterpret_cast<float*>(ws + offset); };
  auto planes = [&](std::size_t offset) { return reinterpret_cast<__nv_bfloat16*>(ws + offset); };
  float* const dh = region(w.dh);
  auto* const y = reinterpret_cast<Handover<T>*>(ws + w.y);
  // P and the records: saved by the forward of 16-bit runs (whose per-chunk kernel forms Â itself), computed here
  // with Â for fp32 runs
  bool const saved = gated_delta_saves_intra(p.dtype);
  float *const A = region(w.A), *const rec = saved ? p.brec : region(w.rec);
  auto* const P_planes = saved ? reinterpret_cast<__nv_bfloat16*>(p.P) : planes(w.P_planes);
  if (p.NC > 0 && !saved) {
    auto const kernel = gated_delta_bwd_intra<T, K>;
    allow_smem(kernel, intra_smem_bytes<K>());
    unsigned const blocks = static_cast<unsigned>(std::int64_t(p.NC) * p.Hv);
    kernel<<<blocks, kThreads, intra_smem_bytes<K>(), stream>>>(p, P_planes, A, rec);
    FUSEPACK_CUDA_CHECK_LAUNCH();
  }
  if (p.NC > 0 || p.dinitial_state) {  // without chunks it only passes dfinal_state through to dinitial_state
    launch_state_for<T, K, V>(p, P_planes, rec, dh, y, stream);
  }
  if (p.NC > 0) {  // fp32 runs: fp64-FMA products on fp32 tiles; 16-bit runs: split-bf16 products on bf16 planes
    unsigned const blocks = static_cast<unsigned>(std::int64_t(p.NC) * p.Hk);
    if constexpr (std::is_same_v<T, float>) {
      auto const kernel = gated_delta_bwd_chunk<T, K, V>;
      allow_smem(kernel, chunk_smem_bytes<K, V>());
      kernel<<<blocks, kThreads, chunk_smem_bytes<K, V>(), stream>>>(p, P_planes, A, dh, y);
    } else {
      auto const kernel = gated_delta_bwd_chunk_mma<T, K, V>;
      allow_smem(kernel, ChunkMmaSmem<T, K, V>::kBytes);
      kernel<<<blocks, kThreads, ChunkMmaSmem<T, K, V>::kBytes, stream>>>(p, dh, y);
    }
    FUSEPACK_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

std::size_t gated_delta_bwd_workspace_bytes(GatedDeltaBwdParams const& p) { return bwd_workspace(p).bytes; }

void run_gated_delta_bwd(GatedDeltaBwdParams const& p, cudaStream_t stream) {
  check_bwd_params(p);
  if (p.N == 0) return;
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    FUSEPACK_GATED_DELTA_BWD_DIM_SWITCH(p.K, kDim, [&] { launch<T, kDim, kDim>(p, stream); });
  });
}

}  // namespace fusepack
