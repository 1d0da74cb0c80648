#include "packing/batch.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace fusepack::packing {
namespace {

std::int64_t count_targets(std::vector<std::int32_t> const& labels) {
  return std::count_if(labels.begin(), labels.end(), [](std::int32_t l) { return l != kIgnoreIndex; });
}

// Throws "<type> invariant '<invariant>' violated: <detail...>".
template <class... Detail>
[[noreturn]] void violated(char const* type, char const* invariant, Detail const&... detail) {
  std::ostringstream os;
  os << type << " invariant '" << invariant << "' violated: ";
  (os << ... << detail);
  throw std::invalid_argument(os.str());
}

Example const& pick(std::vector<Example> const& dataset, std::int64_t id, char const* builder) {
  if (id < 0 || id >= static_cast<std::int64_t>(dataset.size())) {
    throw std::invalid_argument(std::string(builder) + ": example id " + std::to_string(id) +
                                " is outside the dataset of " + std::to_string(dataset.size()) + " examples");
  }
  Example const& ex = dataset[static_cast<std::size_t>(id)];
  if (ex.input_ids.empty()) {
    throw std::invalid_argument(std::string(builder) + ": example " + std::to_string(id) +
                                " is empty (zero tokens); empty examples are rejected at dataset load");
  }
  if (ex.labels.size() != ex.input_ids.size()) {
    throw std::invalid_argument(std::string(builder) + ": example " + std::to_string(id) + " has " +
                                std::to_string(ex.labels.size()) + " labels for " +
                                std::to_string(ex.input_ids.size()) + " input_ids");
  }
  for (std::size_t p = 0; p < ex.labels.size(); ++p) {
    if (ex.labels[p] != kIgnoreIndex && ex.labels[p] != ex.input_ids[p]) {
      throw std::invalid_argument(std::string(builder) + ": example " + std::to_string(id) + " has labels[" +
                                  std::to_string(p) + "]=" + std::to_string(ex.labels[p]) +
                                  ", neither -100 nor input_ids[" + std::to_string(p) +
                                  "]=" + std::to_string(ex.input_ids[p]));
    }
  }
  return ex;
}

std::int64_t cut_length(Example const& ex, std::int64_t max_length) {
  auto const len = static_cast<std::int64_t>(ex.input_ids.size());
  return max_length == kNoLengthLimit ? len : std::min(len, max_length);
}

void check_max_length(std::int64_t max_length, char const* builder) {
  if (max_length != kNoLengthLimit && max_length < 1) {
    throw std::invalid_argument(std::string(builder) + ": max_length must be >= 1 or kNoLengthLimit; got " +
                                std::to_string(max_length));
  }
}

std::vector<std::int64_t> iota_ids(std::size_t n) {
  std::vector<std::int64_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int64_t>(i);
  return ids;
}

}  // namespace

std::vector<std::int32_t> shifted_labels(Example const& example, std::int64_t max_length) {
  std::int64_t const len = cut_length(example, max_length);
  std::vector<std::int32_t> out(static_cast<std::size_t>(std::max<std::int64_t>(len, 0)), kIgnoreIndex);
  for (std::int64_t p = 0; p + 1 < len; ++p) out[p] = example.labels[p + 1];
  return out;
}

std::int64_t PackedBatch::num_targets() const { return count_targets(labels); }

std::int64_t PackedBatch::num_examples() const {
  return static_cast<std::int64_t>(example_ids.size()) - (filler_tokens() > 0 ? 1 : 0);
}

std::int64_t PackedBatch::filler_tokens() const {
  if (example_ids.empty() || example_ids.back() != kFillerExampleId || cu_seqlens.size() != example_ids.size() + 1) {
    return 0;
  }
  return cu_seqlens[cu_seqlens.size() - 1] - cu_seqlens[cu_seqlens.size() - 2];
}

void complete_to_budget(PackedBatch& batch, std::int64_t budget, std::int32_t filler_token) {
  std::int64_t const T = batch.num_tokens();
  if (T > budget) {
    throw std::invalid_argument("complete_to_budget: the batch holds " + std::to_string(T) +
                                " tokens, more than the token budget of " + std::to_string(budget));
  }
  if (!batch.example_ids.empty() && batch.example_ids.back() == kFillerExampleId) {
    throw std::invalid_argument("complete_to_budget: the batch ends in a filler already");
  }
  if (filler_token < 0) {
    throw std::invalid_argument("complete_to_budget: the filler token must be an id >= 0; got " +
                                std::to_string(filler_token));
  }
  if (budget > std::numeric_limits<std::int32_t>::max()) {
    throw std::invalid_argument("complete_to_budget: a budget of " + std::to_string(budget) +
                                " tokens exceeds cu_seqlens' int32 range (at most 2147483647)");
  }
  if (T == budget) return;
  auto const n = static_cast<std::int32_t>(budget - T);
  auto const size = static_cast<std::size_t>(budget);
  batch.tokens.resize(size, filler_token);
  batch.labels.resize(size, kIgnoreIndex);
  batch.seq_idx.resize(size, static_cast<std::int32_t>(batch.example_ids.size()));
  for (std::int32_t p = 0; p < n; ++p) batch.position_ids.push_back(p);
  batch.cu_seqlens.push_back(static_cast<std::int32_t>(budget));
  batch.max_seqlen = std::max(batch.max_seqlen, n);
  batch.example_ids.push_back(kFillerExampleId);
}

void PackedBatch::validate() const {
  char const* const type = "PackedBatch";
  auto const T = static_cast<std::int64_t>(tokens.size());
  if (cu_seqlens.size() < 2) {
    violated(type, "at least one example: cu_seqlens has N+1 >= 2 entries", "cu_seqlens has ", cu_seqlens.size(),
             " entries");
  }
  std::size_t const N = cu_seqlens.size() - 1;
  if (labels.size() != tokens.size() || position_ids.size() != tokens.size() || seq_idx.size() != tokens.size()) {
    violated(type, "tokens, labels, position_ids and seq_idx all have T entries", "tokens ", tokens.size(), ", labels ",
             labels.size(), ", position_ids ", position_ids.size(), ", seq_idx ", seq_idx.size());
  }
  if (example_ids.size() != N) {
    violated(type, "example_ids has N entries", example_ids.size(), " example_ids for N=", N);
  }
  if (cu_seqlens[0] != 0) violated(type, "cu_seqlens[0] == 0", "cu_seqlens[0]=", cu_seqlens[0]);
  std::int32_t longest = 0;
  for (std::size_t i = 0; i < N; ++i) {
    if (cu_seqlens[i] >= cu_seqlens[i + 1]) {
      violated(type, "cu_seqlens strictly increasing (no empty example)", "cu_seqlens[", i, "]=", cu_seqlens[i],
               " >= cu_seqlens[", i + 1, "]=", cu_seqlens[i + 1]);
    }
    longest = std::max(longest, cu_seqlens[i + 1] - cu_seqlens[i]);
  }
  if (cu_seqlens[N] != T) {
    violated(type, "T == cu_seqlens[N] (no tokens outside every example)", "cu_seqlens[", N, "]=", cu_seqlens[N],
             " but T=", T);
  }
  if (max_seqlen != longest) {
    violated(type, "max_seqlen is the longest example", "max_seqlen=", max_seqlen, ", longest=", longest);
  }
  for (std::size_t i = 0; i < N; ++i) {
    for (std::int32_t t = cu_seqlens[i]; t < cu_seqlens[i + 1]; ++t) {
      if (seq_idx[t] != static_cast<std::int32_t>(i)) {
        violated(type, "seq_idx[t] is the example holding t", "seq_idx[", t, "]=", seq_idx[t], " but t is in example ",
                 i);
      }
      if (position_ids[t] != t - cu_seqlens[i]) {
        violated(type, "position_ids restart at 0 at every example start", "position_ids[", t, "]=", position_ids[t],
                 ", expected ", t - cu_seqlens[i], " (example ", i, " starts at ", cu_seqlens[i], ")");
      }
      if (tokens[t] < 0) violated(type, "tokens are ids >= 0", "tokens[", t, "]=", tokens[t]);
      if (t + 1 < cu_seqlens[i + 1] && labels[t] != kIgnoreIndex && labels[t] != tokens[t + 1]) {
        violated(type, "labels[t] is -100 or tokens[t+1] of the same example", "labels[", t, "]=", labels[t],
                 ", tokens[", t + 1, "]=", tokens[t + 1]);
      }
    }
    std::int32_t const last = cu_seqlens[i + 1] - 1;
    if (labels[last] != kIgnoreIndex) {
      violated(type, "labels are -100 at the last token of every example (no target crosses a boundary)", "labels[",
               last, "]=", labels[last], " at the last token of example ", i);
    }
    if (example_ids[i] < 0 && (example_ids[i] != kFillerExampleId || i + 1 != N)) {
      violated(type, "example ids are dataset indices >= 0, or -1 for a filler at the end", "example_ids[", i, "]=",
               example_ids[i], " of N=", N);
    }
    if (example_ids[i] == kFillerExampleId) {
      for (std::int32_t t = cu_seqlens[i]; t < cu_seqlens[i + 1]; ++t) {
        if (labels[t] != kIgnoreIndex) {
          violated(type, "a filler has no targets (labels all -100)", "labels[", t, "]=", labels[t],
                   " in the filler (example ", i, ")");
        }
      }
    }
  }
}

std::int64_t PaddedBatch::num_tokens() const { return std::count(attention_mask.begin(), attention_mask.end(), 1); }

std::int64_t PaddedBatch::num_targets() const { return count_targets(labels); }

std::int64_t PaddedBatch::row_length(std::int64_t row) const {
  auto const begin = attention_mask.begin() + row * cols;
  return std::count(begin, begin + cols, 1);
}

void PaddedBatch::validate() const {
  char const* const type = "PaddedBatch";
  if (rows < 1 || cols < 1) {
    violated(type, "at least one row and one column", "rows=", rows, ", cols=", cols);
  }
  auto const slots = static_cast<std::size_t>(rows * cols);
  if (tokens.size() != slots || attention_mask.size() != slots || labels.size() != slots ||
      position_ids.size() != slots) {
    violated(type, "tokens, attention_mask, labels and position_ids all have rows*cols entries", "rows*cols=", slots,
             "; tokens ", tokens.size(), ", attention_mask ", attention_mask.size(), ", labels ", labels.size(),
             ", position_ids ", position_ids.size());
  }
  if (example_ids.size() != static_cast<std::size_t>(rows)) {
    violated(type, "example_ids has one entry per row", example_ids.size(), " example_ids for ", rows, " rows");
  }
  std::int64_t longest = 0;
  for (std::int64_t b = 0; b < rows; ++b) {
    std::int32_t const* mask = attention_mask.data() + b * cols;
    std::int64_t len = 0;
    while (len < cols && mask[len] == 1) ++len;
    for (std::int64_t p = len; p < cols; ++p) {
      if (mask[p] != 0) {
        violated(type, "attention_mask is 1 on a prefix of each row (right padding) and 0 after it", "attention_mask[",
                 b, ", ", p, "]=", mask[p], " after a 0 or non-binary entry at column ", len);
      }
    }
    if (len == 0) violated(type, "every row holds at least one real token", "row ", b, " is empty");
    longest = std::max(longest, len);
    for (std::int64_t p = 0; p < cols; ++p) {
      std::size_t const k = static_cast<std::size_t>(b * cols + p);
      bool const real = p < len;
      if (position_ids[k] != (real ? p : 0)) {
        violated(type, "position_ids are 0..len-1 on real tokens and 0 on padding", "position_ids[", b, ", ", p,
                 "]=", position_ids[k], ", expected ", (real ? p : 0));
      }
      if (real && tokens[k] < 0) {
        violated(type, "tokens are ids >= 0", "tokens[", b, ", ", p, "]=", tokens[k]);
      }
      if (!real && tokens[k] != pad_token_id) {
        violated(type, "padding holds pad_token_id", "tokens[", b, ", ", p, "]=", tokens[k],
                 ", pad_token_id=", pad_token_id);
      }
      if (!real && labels[k] != kIgnoreIndex) {
        violated(type, "labels are -100 on padding", "labels[", b, ", ", p, "]=", labels[k]);
      }
      if (p + 1 < len && labels[k] != kIgnoreIndex && labels[k] != tokens[k + 1]) {
        violated(type, "labels[b, p] is -100 or tokens[b, p+1] of the same row", "labels[", b, ", ", p, "]=", labels[k],
                 ", tokens[", b, ", ", p + 1, "]=", tokens[k + 1]);
      }
    }
    std::size_t const last = static_cast<std::size_t>(b * cols + len - 1);
    if (labels[last] != kIgnoreIndex) {
      violated(type, "labels are -100 at each row's last real token", "labels[", b, ", ", len - 1, "]=", labels[last]);
    }
  }
  if (longest != cols) {
    violated(type, "cols is the longest row (no all-padding column)", "cols=", cols, ", longest row ", longest);
  }
}

PackedBatch make_packed_batch(std::vector<Example> const& dataset, std::vector<std::int64_t> const& example_ids,
                              std::int64_t max_length) {
  char const* const builder = "make_packed_batch";
  check_max_length(max_length, builder);
  if (example_ids.empty()) throw std::invalid_argument("make_packed_batch: a packed batch needs at least 1 example");
  std::int64_t total = 0;
  for (std::int64_t id : example_ids) total += cut_length(pick(dataset, id, builder), max_length);
  if (total > std::numeric_limits<std::int32_t>::max()) {
    throw std::invalid_argument("make_packed_batch: " + std::to_string(total) + " tokens do not fit int32 cu_seqlens");
  }
  PackedBatch b;
  b.example_ids = example_ids;
  b.tokens.reserve(static_cast<std::size_t>(total));
  b.labels.reserve(static_cast<std::size_t>(total));
  b.position_ids.reserve(static_cast<std::size_t>(total));
  b.seq_idx.reserve(static_cast<std::size_t>(total));
  b.cu_seqlens.reserve(example_ids.size() + 1);
  b.cu_seqlens.push_back(0);
  for (std::size_t i = 0; i < example_ids.size(); ++i) {
    Example const& ex = dataset[static_cast<std::size_t>(example_ids[i])];
    auto const len = static_cast<std::int32_t>(cut_length(ex, max_length));
    std::vector<std::int32_t> const shifted = shifted_labels(ex, len);
    b.tokens.insert(b.tokens.end(), ex.input_ids.begin(), ex.input_ids.begin() + len);
    b.labels.insert(b.labels.end(), shifted.begin(), shifted.end());
    for (std::int32_t p = 0; p < len; ++p) b.position_ids.push_back(p);
    b.seq_idx.insert(b.seq_idx.end(), static_cast<std::size_t>(len), static_cast<std::int32_t>(i));
    b.cu_seqlens.push_back(b.cu_seqlens.back() + len);
    b.max_seqlen = std::max(b.max_seqlen, len);
  }
  return b;
}

PaddedBatch make_padded_batch(std::vector<Example> const& dataset, std::vector<std::int64_t> const& example_ids,
                              std::int64_t max_length, std::int32_t pad_token_id) {
  char const* const builder = "make_padded_batch";
  check_max_length(max_length, builder);
  if (example_ids.empty()) throw std::invalid_argument("make_padded_batch: a padded batch needs at least 1 example");
  if (pad_token_id < 0) {
    throw std::invalid_argument("make_padded_batch: pad_token_id must be >= 0; got " + std::to_string(pad_token_id));
  }
  PaddedBatch b;
  b.rows = static_cast<std::int64_t>(example_ids.size());
  for (std::int64_t id : example_ids) b.cols = std::max(b.cols, cut_length(pick(dataset, id, builder), max_length));
  b.example_ids = example_ids;
  b.pad_token_id = pad_token_id;
  auto const slots = static_cast<std::size_t>(b.rows * b.cols);
  b.tokens.assign(slots, pad_token_id);
  b.attention_mask.assign(slots, 0);
  b.labels.assign(slots, kIgnoreIndex);
  b.position_ids.assign(slots, 0);
  for (std::int64_t r = 0; r < b.rows; ++r) {
    Example const& ex = dataset[static_cast<std::size_t>(example_ids[r])];
    std::int64_t const len = cut_length(ex, max_length);
    std::vector<std::int32_t> const shifted = shifted_labels(ex, len);
    for (std::int64_t p = 0; p < len; ++p) {
      std::size_t const k = static_cast<std::size_t>(r * b.cols + p);
      b.tokens[k] = ex.input_ids[p];
      b.attention_mask[k] = 1;
      b.labels[k] = shifted[p];
      b.position_ids[k] = static_cast<std::int32_t>(p);
    }
  }
  return b;
}

PackedBatch make_packed_batch(std::vector<Example> const& examples) {
  return make_packed_batch(examples, iota_ids(examples.size()));
}

PaddedBatch make_padded_batch(std::vector<Example> const& examples) {
  return make_padded_batch(examples, iota_ids(examples.size()));
}

}  // namespace fusepack::packing
