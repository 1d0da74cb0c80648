// The device side of the forward's timeline (gated_delta_trace.h): trace_event records one event from the calling
// thread when the build defines FUSEPACK_GATED_DELTA_TRACE, and is empty otherwise. Included by the forward's kernels
// only (one translation unit, gated_delta_fwd.cu, which owns the buffer and the host functions).
#pragma once

#include "kernels/gated_delta/gated_delta_trace.h"

#include <cstdint>

namespace fusepack::gated_delta_trace_detail {

#if defined(FUSEPACK_GATED_DELTA_TRACE)
inline constexpr bool kTraced = true;
__device__ ulonglong2 trace_events[kGatedDeltaTraceCapacity];  // {ns, gated_delta_trace_pack}
__device__ unsigned long long trace_count;                       // events claimed (may pass the capacity)
#else
inline constexpr bool kTraced = false;
#endif

__device__ __forceinline__ void trace_event(GatedDeltaTraceKind kind, int step = 0) {
#if defined(FUSEPACK_GATED_DELTA_TRACE)
  unsigned long long ns;
  unsigned sm;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  unsigned long long const slot = atomicAdd(&trace_count, 1ull);
  if (slot < kGatedDeltaTraceCapacity) {
    trace_events[slot] =
        make_ulonglong2(ns, gated_delta_trace_pack(kind, static_cast<int>(sm), static_cast<int>(blockIdx.x), step));
  }
#else
  (void)kind;
  (void)step;
#endif
}

}  // namespace fusepack::gated_delta_trace_detail
