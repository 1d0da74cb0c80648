// One tokenized training example in the Hugging Face convention: labels are unshifted (labels[p] is the target of
// position p as a token, compared with the prediction made at p-1) and -100 marks a position not supervised.
#pragma once

#include <cstdint>
#include <vector>

namespace fusepack::packing {

inline constexpr std::int32_t kIgnoreIndex = -100;

struct Example {
  std::vector<std::int32_t> input_ids;  // [len], ids in [0, vocab_size), len >= 1
  std::vector<std::int32_t> labels;     // [len], each kIgnoreIndex or an id in [0, vocab_size)
};

}  // namespace fusepack::packing
