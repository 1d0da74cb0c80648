// Hugging Face checkpoints for a sharded model: each rank reads only its own rows of every parameter, and the
// consolidated checkpoint is written by rank 0 one gathered parameter at a time, so no rank ever holds the whole model.
#pragma once

#include "trainer/model/config.h"

#include <cstdint>
#include <string>

namespace fusepack::parallel {

class Collectives;
class FullyShardedWeights;

struct LoadedRows {
  std::int64_t tensors = 0;  // parameters read
  std::int64_t files = 0;    // safetensors files of the checkpoint
  std::int64_t skipped = 0;  // vision tower and MTP tensors of a Qwen3.5 VLM checkpoint, never read
};

// `path`: a safetensors file or a checkpoint folder (single file or index + shards; Qwen3.5's model.language_model.
// names mapped, model.visual.* and mtp.* skipped). Every rank reads its own rows of every parameter (only those bytes)
// and converts them to the master dtype. Missing, unexpected and mis-shaped tensors are collected and thrown together
// as one std::invalid_argument before anything is copied, as Qwen35ForCausalLM::load_state does.
LoadedRows load_sharded_checkpoint(FullyShardedWeights& weights, std::string const& path);

// config.json and model.safetensors (Hugging Face names, the master dtype) in `dir`, written by rank 0 as
// write_weights (trainer/train/run.h) writes them for one process. Collective: every rank calls it. Each parameter is
// all-gathered in turn and written straight to the file. An error on rank 0 (say, `dir` cannot be written) is raised
// on every rank.
void save_sharded_checkpoint(FullyShardedWeights& weights, Collectives& comm, std::string const& dir,
                             model::Qwen35Config const& config);

}  // namespace fusepack::parallel
