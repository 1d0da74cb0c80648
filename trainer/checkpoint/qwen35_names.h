// Qwen3.5 checkpoint names → the text model's (Qwen3_5ForCausalLM) names (as transformers' Qwen3.5 code loads them):
// released checkpoints are the VLM, with the text model under "model.language_model.", a vision tower under
// "model.visual." and a multi-token-prediction head under "mtp."; a text trainer keeps only the text model.
#pragma once

#include "trainer/checkpoint/safetensors.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fusepack::checkpoint {

enum class Qwen35Part { kText, kVisual, kMtp };

struct Qwen35Name {
  Qwen35Part part;
  std::string name;  // kText: the text model's name; empty for the skipped parts
};

// "model.language_model.X" → "model.X"; "model.visual.*" → kVisual; "mtp.*" → kMtp; any other name (lm_head.weight,
// a text-only checkpoint's "model.X") is kept as it is.
Qwen35Name qwen35_text_name(std::string const& checkpoint_name);

struct Qwen35TextCheckpoint {
  TensorMap tensors;                // under the text model's names
  Metadata metadata;                // as read_checkpoint returns it
  std::vector<std::string> files;   // the safetensors files read
  std::int64_t skipped_visual = 0;  // model.visual.* tensors, never read
  std::int64_t skipped_mtp = 0;     // mtp.* tensors, never read
};

// read_checkpoint (file or folder, single or sharded) through qwen35_text_name. Throws std::runtime_error when two
// checkpoint names map to one text name (e.g. both "model.language_model.norm.weight" and "model.norm.weight").
Qwen35TextCheckpoint read_qwen35_text_checkpoint(std::string const& path);

struct Qwen35TextIndex {
  std::map<std::string, TensorLocation> tensors;  // under the text model's names, for read_rows
  Metadata metadata;                              // as index_checkpoint returns it
  std::vector<std::string> files;                 // the safetensors files indexed
  std::int64_t skipped_visual = 0;                // model.visual.* tensors
  std::int64_t skipped_mtp = 0;                   // mtp.* tensors
};

// index_checkpoint through qwen35_text_name, refusing two names for one text tensor as read_qwen35_text_checkpoint
// does.
Qwen35TextIndex index_qwen35_text_checkpoint(std::string const& path);

}  // namespace fusepack::checkpoint
