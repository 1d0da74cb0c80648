// How the fused gated delta rule schedules its sequential chunk-to-chunk recurrences (the forward's state, the
// backward's state gradient). Plain C++, no CUDA headers: the LibTorch op takes it as an argument on every build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fusepack {

enum class GatedDeltaSchedule {
  // The launchers pick (gated_delta_schedule, kernels/gated_delta/gated_delta_fwd.cu): the only choice the model and
  // the trainer make.
  kByShape,
  // The sequential kernels do all of a chunk's work: the forward's also computes o (and the saved P), the backward's
  // runs one warp per 16 value columns over all of K. Right when many examples fill the GPU with their blocks.
  kFullChain,
  // The sequential kernels do only what the next chunk needs, with two warps per 16 value columns, each over half of
  // K; the forward computes o (and P) for every chunk at once afterwards. Right for few long examples, where the
  // chain is the whole time.
  kLeanChain,
};

// Value columns per block of both passes' lean recurrences (two slabs of 16; the launchers assert it): a shape runs
// N·Hv·V/32 lean blocks in each pass.
inline constexpr int kGatedDeltaLeanColumns = 32;
inline std::int64_t gated_delta_lean_blocks(std::int64_t N, std::int64_t Hv, std::int64_t V) {
  return N * Hv * (V / kGatedDeltaLeanColumns);
}

// Blocks of `block_smem` bytes of shared memory that one multiprocessor with `smem_per_sm` bytes holds (each also
// reserves 1 KB for the system), at least 1: a block that does not fit fails at its launch, not here.
inline std::int64_t gated_delta_blocks_per_sm(std::size_t block_smem, int smem_per_sm) {
  if (smem_per_sm < 1) {
    throw std::invalid_argument("gated_delta: shared memory per multiprocessor must be positive; got " +
                                std::to_string(smem_per_sm) + " bytes");
  }
  std::int64_t const fit = static_cast<std::int64_t>(std::size_t(smem_per_sm) / (block_smem + 1024));
  return fit > 1 ? fit : 1;
}

// The by-shape rule of both passes, in one place: the lean chain when all of its blocks are resident at once (one
// wave) on `sms` multiprocessors holding `lean_blocks_per_sm` each, so that few long examples, whose chain is the
// whole time, get every multiprocessor; the full chain otherwise. A forced schedule is returned as it is.
inline GatedDeltaSchedule gated_delta_pick_schedule(GatedDeltaSchedule requested, std::int64_t lean_blocks,
                                                    std::int64_t sms, std::int64_t lean_blocks_per_sm) {
  if (lean_blocks < 0 || sms < 1 || lean_blocks_per_sm < 1) {
    throw std::invalid_argument("gated_delta_pick_schedule: expected lean_blocks >= 0, sms >= 1 and "
                                "lean_blocks_per_sm >= 1; got " + std::to_string(lean_blocks) + ", " +
                                std::to_string(sms) + " and " + std::to_string(lean_blocks_per_sm));
  }
  if (requested != GatedDeltaSchedule::kByShape) return requested;
  return lean_blocks <= sms * lean_blocks_per_sm ? GatedDeltaSchedule::kLeanChain : GatedDeltaSchedule::kFullChain;
}

inline char const* gated_delta_schedule_name(GatedDeltaSchedule s) {
  switch (s) {
    case GatedDeltaSchedule::kByShape: return "by shape";
    case GatedDeltaSchedule::kFullChain: return "full chain";
    case GatedDeltaSchedule::kLeanChain: return "lean chain";
  }
  return "?";
}

}  // namespace fusepack
