#include "trainer/checkpoint/qwen35_names.h"

#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

namespace fusepack::checkpoint {
namespace {

bool starts_with(std::string const& s, std::string const& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// Which checkpoint tensors the text model keeps, asked name by name: counts the skipped parts and refuses two
// checkpoint names for one text name.
class TextNames {
 public:
  explicit TextNames(std::string const& path) : path_(path) {}

  std::optional<std::string> map(std::string const& name) {
    Qwen35Name mapped = qwen35_text_name(name);
    if (mapped.part == Qwen35Part::kVisual) ++skipped_visual;
    if (mapped.part == Qwen35Part::kMtp) ++skipped_mtp;
    if (mapped.part != Qwen35Part::kText) return std::nullopt;
    auto const [it, inserted] = source_.emplace(mapped.name, name);
    if (!inserted) {
      throw std::runtime_error("checkpoint " + path_ + ": tensors '" + it->second + "' and '" + name +
                               "' both map to the text model's '" + mapped.name + "'");
    }
    return std::move(mapped.name);
  }

  std::int64_t skipped_visual = 0;
  std::int64_t skipped_mtp = 0;

 private:
  std::string path_;
  std::map<std::string, std::string> source_;  // text name → the checkpoint name it came from
};

}  // namespace

Qwen35Name qwen35_text_name(std::string const& checkpoint_name) {
  static std::string const kLanguageModel = "model.language_model.";
  if (starts_with(checkpoint_name, "model.visual.")) return {Qwen35Part::kVisual, ""};
  if (starts_with(checkpoint_name, "mtp.")) return {Qwen35Part::kMtp, ""};
  if (starts_with(checkpoint_name, kLanguageModel)) {
    return {Qwen35Part::kText, "model." + checkpoint_name.substr(kLanguageModel.size())};
  }
  return {Qwen35Part::kText, checkpoint_name};
}

Qwen35TextCheckpoint read_qwen35_text_checkpoint(std::string const& path) {
  TextNames names(path);
  Safetensors read = read_checkpoint(path, [&](std::string const& name) { return names.map(name).has_value(); });
  Qwen35TextCheckpoint out;
  for (auto& [name, tensor] : read.tensors) out.tensors.emplace(qwen35_text_name(name).name, std::move(tensor));
  out.metadata = std::move(read.metadata);
  out.files = std::move(read.files);
  out.skipped_visual = names.skipped_visual;
  out.skipped_mtp = names.skipped_mtp;
  return out;
}

Qwen35TextIndex index_qwen35_text_checkpoint(std::string const& path) {
  TextNames names(path);
  CheckpointIndex index = index_checkpoint(path);
  Qwen35TextIndex out;
  for (auto& [name, where] : index.tensors) {
    if (std::optional<std::string> text = names.map(name)) out.tensors.emplace(std::move(*text), std::move(where));
  }
  out.metadata = std::move(index.metadata);
  out.files = std::move(index.files);
  out.skipped_visual = names.skipped_visual;
  out.skipped_mtp = names.skipped_mtp;
  return out;
}

}  // namespace fusepack::checkpoint
