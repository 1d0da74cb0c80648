// ModelBatch: one batch as the model reads it, device tensors in the packed layout, built from a packing::PackedBatch
// or a packing::PaddedBatch (docs/contracts.md, batches).
//
// A PaddedBatch [B, L] runs as B examples of length L: its rows are laid end to end (T = B·L) with cu_seqlens
// 0, L, 2L, ..., B·L. Padding is on the right, so within a row every pad comes after every real token; all the model's
// token mixers are causal within an example (attention: block-diagonal causal; the conv1d and the DeltaNet state only
// carry information forward) and everything else is per token, so a real token's output never depends on a pad.
// Pads carry label -100 (and position 0), so they add nothing to the loss or to the target count: the padded batch
// gives each example exactly the loss it gets alone or inside a pack. No attention mask is needed.
#pragma once

#include "packing/batch.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fusepack::model {

inline constexpr std::int64_t kIgnoreIndex = -100;

struct ModelBatch {
  at::Tensor tokens;        // [T] int64, ids in [0, vocab_size)
  at::Tensor labels;        // [T] int64, the target of the prediction made at t (already shifted), or -100
  at::Tensor position_ids;  // [T] int64, 0 at every example start (RoPE positions)
  at::Tensor seq_idx;       // [T] int64, the example (row) each token belongs to
  at::Tensor cu_seqlens;    // [N+1] int32, 0 = cu[0] < ... < cu[N] = T
  std::int64_t max_seqlen = 0;   // max over examples of cu[i+1] - cu[i]
  std::int64_t num_examples = 0;  // N
  std::int64_t num_targets = 0;   // labels != -100; the loss is summed over these
  std::int32_t max_token = -1;    // largest token id (host side, so the model checks the vocabulary without a sync)
  std::int32_t max_label = -1;    // largest label (-100 when no target)

  std::int64_t num_tokens() const { return tokens.defined() ? tokens.size(0) : 0; }
};

// The batch's invariants are checked first (PackedBatch::validate / PaddedBatch::validate).
ModelBatch make_model_batch(packing::PackedBatch const& batch, at::Device device);
ModelBatch make_model_batch(packing::PaddedBatch const& batch, at::Device device);

}  // namespace fusepack::model
