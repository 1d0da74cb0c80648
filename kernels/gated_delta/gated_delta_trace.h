// A timeline of the gated delta forward, block by block: when (the GPU's global timer, ns) and where (the
// multiprocessor) each block of the WY kernel, of the lean state chain and of the output kernel beside it started and
// ended, when each chain block began each chunk, when each output block had built P and when it found its chunk
// published. What it is for: the chain and the output kernel share multiprocessors, so neither kernel's time alone
// says what bounds the forward (kernels/gated_delta/NOTES.md, where the chain's blocks sit). ci/gated_delta_trace.py
// summarizes a trace.
// Only a build configured with -DFUSEPACK_GATED_DELTA_TRACE=ON records (one atomic add and one 16-byte store per
// event, by one thread of a block); other builds compile the hooks to nothing and refuse gated_delta_trace_begin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fusepack {

enum class GatedDeltaTraceKind : int {
  kWyStart = 0,       // a block of the WY kernel starts (block = its blockIdx.x)
  kWyEnd = 1,         // ... has written its outputs
  kChainStart = 2,    // a lean chain block starts
  kChainStep = 3,     // ... begins chunk `step` of its example (after the barrier that starts the chunk)
  kChainEnd = 4,      // ... has written its last chunk and published it
  kOutputStart = 5,   // an output block starts
  kOutputReady = 6,   // ... finds its chunk published by the chain (step = the chunk's index in its example)
  kOutputEnd = 7,     // ... has written o
  kOutputBuilt = 8,   // ... has built its first warp's share of P and polls for its chunk (between start and ready)
};
inline constexpr int kGatedDeltaTraceKinds = 9;
// "wy_start", "wy_end", "chain_start", "chain_step", "chain_end", "output_start", "output_ready", "output_end",
// "output_built".
char const* gated_delta_trace_kind_name(GatedDeltaTraceKind kind);

struct GatedDeltaTraceEvent {
  std::uint64_t ns = 0;  // %globaltimer
  GatedDeltaTraceKind kind = GatedDeltaTraceKind::kWyStart;
  int sm = 0;     // %smid
  int block = 0;  // blockIdx.x of its kernel
  int step = 0;   // kChainStep, kOutputReady: the chunk's index within its example; 0 otherwise
};

// An event as the device records it, in 16 bytes: the time, then one word of kind (bits 60..63), SM (48..59), block
// (24..47) and step (0..23), each field cut to its bits (a block or step past 2^24 - 1 wraps).
constexpr std::uint64_t gated_delta_trace_pack(GatedDeltaTraceKind kind, int sm, int block, int step) {
  return (std::uint64_t(static_cast<int>(kind)) & 0xFu) << 60 | (std::uint64_t(sm) & 0xFFFu) << 48 |
         (std::uint64_t(block) & 0xFFFFFFu) << 24 | (std::uint64_t(step) & 0xFFFFFFu);
}
constexpr GatedDeltaTraceEvent gated_delta_trace_unpack(std::uint64_t ns, std::uint64_t word) {
  GatedDeltaTraceEvent e;
  e.ns = ns;
  e.kind = static_cast<GatedDeltaTraceKind>(word >> 60);
  e.sm = static_cast<int>((word >> 48) & 0xFFFu);
  e.block = static_cast<int>((word >> 24) & 0xFFFFFFu);
  e.step = static_cast<int>(word & 0xFFFFFFu);
  return e;
}

// Events a trace holds; gated_delta_trace_end refuses a trace that recorded more.
inline constexpr std::size_t kGatedDeltaTraceCapacity = std::size_t(1) << 20;

// Whether this build records (configured with -DFUSEPACK_GATED_DELTA_TRACE=ON).
bool gated_delta_trace_built();
// Waits for the device and clears the trace: the forwards run after it record. std::runtime_error naming the
// configure option in a build that does not record.
void gated_delta_trace_begin();
// Waits for the device and returns the events recorded since gated_delta_trace_begin, in the order they claimed their
// slots. std::runtime_error when more than kGatedDeltaTraceCapacity were recorded (trace fewer forwards or a smaller
// shape) or when the build does not record.
std::vector<GatedDeltaTraceEvent> gated_delta_trace_end();

}  // namespace fusepack
