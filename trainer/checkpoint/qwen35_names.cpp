#include "trainer/checkpoint/qwen35_names.h"

#include <map>
#include <stdexcept>
#include <utility>

namespace fusepack::checkpoint {
namespace {

bool starts_with(std::string const& s, std::string const& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

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
  Qwen35TextCheckpoint out;
  std::map<std::string, std::string> source;  // text name → the checkpoint name it came from
  Safetensors read = read_checkpoint(path, [&](std::string const& name) {
    Qwen35Name const mapped = qwen35_text_name(name);
    if (mapped.part == Qwen35Part::kVisual) ++out.skipped_visual;
    if (mapped.part == Qwen35Part::kMtp) ++out.skipped_mtp;
    if (mapped.part != Qwen35Part::kText) return false;
    auto const [it, inserted] = source.emplace(mapped.name, name);
    if (!inserted) {
      throw std::runtime_error("checkpoint " + path + ": tensors '" + it->second + "' and '" + name +
                               "' both map to the text model's '" + mapped.name + "'");
    }
    return true;
  });
  for (auto& [name, tensor] : read.tensors) out.tensors.emplace(qwen35_text_name(name).name, std::move(tensor));
  out.metadata = std::move(read.metadata);
  out.files = std::move(read.files);
  return out;
}

}  // namespace fusepack::checkpoint
