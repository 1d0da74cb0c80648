// The two batch layouts of docs/contracts.md, batches, built from examples:
//   PackedBatch  the optimized path: every example's tokens back to back in one row of T tokens, boundaries in
//                cu_seqlens, positions restarting at 0 per example, labels shifted per example;
//   PaddedBatch  the baseline: one example per row, right-padded to the longest.
// Both carry labels already shifted (labels[t] is the target of the prediction made at t), the HF shift done per
// example, so the loss is sum(CE(logits[t], labels[t]) over labels[t] != -100) / num_targets() in both paths and
// the two count exactly the same targets for the same examples.
#pragma once

#include "packing/example.h"

#include <cstdint>
#include <vector>

namespace fusepack::packing {

inline constexpr std::int64_t kNoLengthLimit = -1;

// The example id of the filler that completes a packed batch to its token budget (complete_to_budget): an example of
// its own at the batch's end, with no targets and from no dataset.
inline constexpr std::int64_t kFillerExampleId = -1;

struct PackedBatch {
  std::vector<std::int32_t> tokens;        // [T]
  std::vector<std::int32_t> labels;        // [T] target of position t, or -100; never crosses an example boundary
  std::vector<std::int32_t> position_ids;  // [T] 0 at every example start
  std::vector<std::int32_t> cu_seqlens;    // [N+1] 0 = cu[0] < cu[1] < ... < cu[N] = T
  std::vector<std::int32_t> seq_idx;       // [T] i for t in [cu[i], cu[i+1]): index of the example in this batch
  std::int32_t max_seqlen = 0;             // max over i of cu[i+1] - cu[i]
  std::vector<std::int64_t> example_ids;   // [N] dataset index of each example, in batch order (kFillerExampleId for
                                           // a filler, last)

  std::int64_t num_tokens() const { return static_cast<std::int64_t>(tokens.size()); }  // T, a filler's included
  std::int64_t num_examples() const;   // the dataset's examples: every entry but a filler
  std::int64_t filler_tokens() const;  // the filler's tokens, 0 without one
  std::int64_t num_example_tokens() const { return num_tokens() - filler_tokens(); }  // the dataset examples' tokens
  std::int64_t num_targets() const;    // labels != -100
  // Checks every docs/contracts.md, batches invariant; throws std::invalid_argument "PackedBatch invariant '<name>'
  // violated: ...".
  void validate() const;
};

struct PaddedBatch {
  std::int64_t rows = 0;                     // B examples
  std::int64_t cols = 0;                     // L = the longest example's length
  std::vector<std::int32_t> tokens;          // [B, L] row-major; pad_token_id on padding
  std::vector<std::int32_t> attention_mask;  // [B, L] 1 on the row's real tokens (a prefix), 0 on padding
  std::vector<std::int32_t> labels;          // [B, L] shifted per row; -100 on padding and at the last real token
  std::vector<std::int32_t> position_ids;    // [B, L] 0..len-1 on real tokens, 0 on padding
  std::vector<std::int64_t> example_ids;     // [B] dataset index of each row's example
  std::int32_t pad_token_id = 0;

  std::int64_t num_slots() const { return rows * cols; }
  std::int64_t num_tokens() const;   // real (unpadded) tokens
  std::int64_t num_targets() const;  // labels != -100
  std::int64_t row_length(std::int64_t row) const;
  // Checks every docs/contracts.md, batches invariant; throws std::invalid_argument "PaddedBatch invariant '<name>'
  // violated: ...".
  void validate() const;
};

// Completes `batch` to exactly `budget` tokens with a filler example of budget − T tokens at its end: its own entry in
// cu_seqlens (so no op lets it touch the other examples), every token `filler_token`, positions from 0, labels all
// -100 (no target, so neither the loss nor its gradient changes), example id kFillerExampleId. Nothing changes when the
// batch holds `budget` tokens already. A batch of fixed shape lets a step be captured once and replayed (CUDA graphs)
// and keeps every kernel's launch shape the same from step to step. Throws std::invalid_argument when the batch holds
// more than `budget` tokens, already ends in a filler, filler_token < 0, or budget exceeds cu_seqlens' int32 range.
void complete_to_budget(PackedBatch& batch, std::int64_t budget, std::int32_t filler_token);

// The HF shift of one example: out[p] = labels[p+1] for p+1 < length, -100 at p = length-1. `max_length` cuts the
// example first (its new last token gets -100).
std::vector<std::int32_t> shifted_labels(Example const& example, std::int64_t max_length = kNoLengthLimit);

// Batches of dataset[example_ids[0]], dataset[example_ids[1]], ... in that order, each cut to `max_length` tokens
// when given. Throw std::invalid_argument for no examples, an index outside the dataset, an empty example, labels
// of another length than input_ids, or a packed row longer than int32 cu_seqlens can address.
PackedBatch make_packed_batch(std::vector<Example> const& dataset, std::vector<std::int64_t> const& example_ids,
                              std::int64_t max_length = kNoLengthLimit);
PaddedBatch make_padded_batch(std::vector<Example> const& dataset, std::vector<std::int64_t> const& example_ids,
                              std::int64_t max_length = kNoLengthLimit, std::int32_t pad_token_id = 0);
// All of `examples`, in order (example_ids 0..n-1).
PackedBatch make_packed_batch(std::vector<Example> const& examples);
PaddedBatch make_padded_batch(std::vector<Example> const& examples);

}  // namespace fusepack::packing
