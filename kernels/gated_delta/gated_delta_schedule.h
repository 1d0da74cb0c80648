// How the fused gated delta rule schedules its sequential chunk-to-chunk recurrences (the forward's state, the
// backward's state gradient). Plain C++, no CUDA headers: the LibTorch op takes it as an argument on every build.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <queue>
#include <stdexcept>
#include <string>
#include <vector>

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

// Value columns per block of both passes' lean recurrences (two slabs of 16; the launchers assert it): each example
// runs Hv·V/32 lean blocks in each pass, but for bf16 at K = 128, whose recurrences run 64 columns a block in warpgroup
// products (gated_delta_fwd_chain_places and gated_delta_bwd_chain_places say how each pass counts them).
inline constexpr int kGatedDeltaLeanColumns = 32;
inline std::int64_t gated_delta_lean_blocks_per_example(std::int64_t Hv, std::int64_t V) {
  return Hv * (V / kGatedDeltaLeanColumns);
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

// A ratio as printf's %g writes it ("1.5", not to_string's "1.500000").
inline std::string gated_delta_format(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// Chunk steps from a recurrence's first block starting to its last block ending: `blocks_per_example` blocks per
// example, each running its example's chunks one after another, handed out in the order given (the chunk table's
// by_length order: most chunks first) to `slots` resident places, each to the place that frees first, as the GPU's
// block scheduler hands out a grid's blocks in index order. For examples of equal length it is waves × length; for a
// pack, at least its longest example's chunks and at least the blocks' chunks over the slots.
inline std::int64_t gated_delta_chain_steps(std::vector<std::int64_t> const& chunks_longest_first,
                                            std::int64_t blocks_per_example, std::int64_t slots) {
  if (blocks_per_example < 1 || slots < 1) {
    throw std::invalid_argument("gated_delta_chain_steps: expected blocks_per_example >= 1 and slots >= 1; got " +
                                std::to_string(blocks_per_example) + " and " + std::to_string(slots));
  }
  std::int64_t blocks = 0, previous = -1;
  for (std::int64_t const chunks : chunks_longest_first) {
    if (chunks < 0 || (previous >= 0 && chunks > previous)) {
      throw std::invalid_argument("gated_delta_chain_steps: chunk counts must be >= 0 and in non-increasing order; "
                                  "got " + std::to_string(chunks) + " after " + std::to_string(previous));
    }
    previous = chunks;
    blocks += chunks > 0 ? blocks_per_example : 0;
  }
  // Every block starts at once when there are places for all: the longest example's chunks.
  if (blocks <= slots) return chunks_longest_first.empty() ? 0 : chunks_longest_first.front();
  // The places' end times, soonest first; only the places some block has taken (at most `slots`).
  std::priority_queue<std::int64_t, std::vector<std::int64_t>, std::greater<>> ends;
  std::int64_t last = 0;
  for (std::int64_t const chunks : chunks_longest_first) {
    if (chunks == 0) break;  // the rest are empty too: their blocks end at once
    for (std::int64_t b = 0; b < blocks_per_example; ++b) {
      std::int64_t start = 0;
      if (static_cast<std::int64_t>(ends.size()) == slots) {
        start = ends.top();
        ends.pop();
      }
      ends.push(start + chunks);
      last = std::max(last, start + chunks);
    }
  }
  return last;
}

// How many of the lean chain's chunk steps take as long as one of the full chain's, per pass: the full chain's step
// does more (the forward's also forms P and o, the backward's runs each warp over all of K), so the lean chain may
// take more steps and still finish first. Each set between the step ratios (lean / full, gated_delta_chain_steps) at
// which the H200 measured either schedule faster (fusepack-bench gated_delta, bf16, K = V = 128; eight training packs
// at Hv = 16 and the fixed shapes; kernels/gated_delta/NOTES.md): the forward's lean chain was faster at every ratio
// up to 1.13 (all the packs, one example of 8192 tokens) and slower at 2.0 (8 × 1024); the backward's faster up to
// 2.0 (packs whose short examples' lean blocks queue behind the longest, one example of 8192 tokens at Hv = 48, where
// the lean blocks take two waves), even at 2.86 (0.685 against 0.693 ms) and slower at 4.0 (8 × 1024). The bf16
// backward at K = 128, whose lean blocks are counted as the 64-column warpgroup blocks they are, was then timed on an
// H100 at 8 × 1024, a ratio of 2.0: lean 0.985 against 1.102 ms at Hv = 32, 1.416 against 1.589 at Hv = 48.
inline constexpr double kGatedDeltaFwdLeanStepsPerFullStep = 1.5;
inline constexpr double kGatedDeltaBwdLeanStepsPerFullStep = 2.5;

// The by-shape rule of both passes, in one place: the lean chain when its chunk steps (gated_delta_chain_steps over
// its blocks) are at most `lean_steps_per_full_step` times the full chain's, the full chain otherwise. A pack's time
// is its longest chain when the blocks fit at once, so a pack whose blocks outnumber the places can still run lean
// when its short examples' blocks fill in behind its longest one. A forced schedule is returned as it is.
inline GatedDeltaSchedule gated_delta_pick_schedule(GatedDeltaSchedule requested, std::int64_t lean_steps,
                                                    std::int64_t full_steps, double lean_steps_per_full_step) {
  if (lean_steps < 0 || full_steps < 0 || !(lean_steps_per_full_step > 0)) {
    throw std::invalid_argument("gated_delta_pick_schedule: expected lean_steps >= 0, full_steps >= 0 and "
                                "lean_steps_per_full_step > 0; got " + std::to_string(lean_steps) + ", " +
                                std::to_string(full_steps) + " and " + gated_delta_format(lean_steps_per_full_step));
  }
  if (requested != GatedDeltaSchedule::kByShape) return requested;
  return static_cast<double>(lean_steps) <= lean_steps_per_full_step * static_cast<double>(full_steps)
             ? GatedDeltaSchedule::kLeanChain
             : GatedDeltaSchedule::kFullChain;
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
