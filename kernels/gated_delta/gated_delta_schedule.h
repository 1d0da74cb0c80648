// How the fused gated delta rule schedules its sequential chunk-to-chunk recurrences (the forward's state, the
// backward's state gradient). Plain C++, no CUDA headers: the LibTorch op takes it as an argument on every build.
#pragma once

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

inline char const* gated_delta_schedule_name(GatedDeltaSchedule s) {
  switch (s) {
    case GatedDeltaSchedule::kByShape: return "by shape";
    case GatedDeltaSchedule::kFullChain: return "full chain";
    case GatedDeltaSchedule::kLeanChain: return "lean chain";
  }
  return "?";
}

}  // namespace fusepack
