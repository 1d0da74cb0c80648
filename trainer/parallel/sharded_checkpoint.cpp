#include "trainer/parallel/sharded_checkpoint.h"

#include "trainer/checkpoint/qwen35_names.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/parameters.h"
#include "trainer/parallel/collectives.h"
#include "trainer/parallel/fully_shard.h"

#include <ATen/ATen.h>

#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fusepack::parallel {

LoadedRows load_sharded_checkpoint(FullyShardedWeights& weights, std::string const& path) {
  checkpoint::Qwen35TextIndex const index = checkpoint::index_qwen35_text_checkpoint(path);
  std::set<std::string> expected;
  for (optim::NamedParameter const& p : weights.parameters()) expected.insert(p.name);
  std::vector<std::string> unexpected;
  for (auto const& [name, where] : index.tensors) {
    if (expected.count(name) == 0) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    std::string list;
    for (std::size_t i = 0; i < unexpected.size() && i < 8; ++i) list += (i ? ", " : "") + unexpected[i];
    if (unexpected.size() > 8) list += ", and " + std::to_string(unexpected.size() - 8) + " more";
    throw std::invalid_argument("checkpoint " + path + ": tensors the model does not have: [" + list + "]");
  }
  weights.load_rows([&](std::string const& name, std::int64_t begin, std::int64_t end) {
    auto const it = index.tensors.find(name);
    if (it == index.tensors.end()) throw std::invalid_argument(name + " is missing");
    std::vector<std::int64_t> const& shape = it->second.info.shape;
    ShardLayout const& layout = weights.layout(name);
    if (shape.empty() || shape[0] != layout.rows || model::numel(shape) != layout.rows * layout.row_numel) {
      std::ostringstream os;
      os << name << " has shape [";
      for (std::size_t d = 0; d < shape.size(); ++d) os << (d ? ", " : "") << shape[d];
      os << "] in the checkpoint; the model's has " << layout.rows << " rows of " << layout.row_numel << " elements";
      throw std::invalid_argument(os.str());
    }
    return checkpoint::read_rows(it->second, begin, end);
  });
  LoadedRows out;
  out.tensors = static_cast<std::int64_t>(index.tensors.size());
  out.files = static_cast<std::int64_t>(index.files.size());
  out.skipped = index.skipped_visual + index.skipped_mtp;
  return out;
}

void save_sharded_checkpoint(FullyShardedWeights& weights, Collectives& comm, std::string const& dir,
                             model::Qwen35Config const& config) {
  bool const writer_rank = comm.rank() == 0;
  std::unique_ptr<checkpoint::CheckpointWriter> writer;
  std::string order;  // rank 0's write order, one name per line, or "error: ..." when it cannot write
  if (writer_rank) {
    try {
      at::ScalarType const dtype = weights.parameters().front().param.scalar_type();
      std::vector<checkpoint::TensorEntry> entries;
      for (model::ParameterSpec const& spec : model::parameter_specs(config)) {
        entries.push_back({spec.name, dtype, spec.shape});
      }
      writer = std::make_unique<checkpoint::CheckpointWriter>(dir, entries);
      for (std::string const& name : writer->write_order()) order += name + "\n";
    } catch (std::exception const& e) {
      order = std::string("error: ") + e.what();
    }
  }
  order = comm.exchange(writer_rank ? order : std::string(), "exchange of the checkpoint's write order")[0];
  if (order.rfind("error: ", 0) == 0) {
    throw std::runtime_error("writing the checkpoint " + dir + " failed on rank 0: " + order.substr(7));
  }
  std::istringstream names(order);
  std::string name;
  std::string failure;
  while (std::getline(names, name)) {
    at::Tensor const full = weights.gather_parameter(name);
    if (writer && failure.empty()) {
      try {
        writer->write(name, full);
      } catch (std::exception const& e) {
        failure = e.what();  // keep gathering: the other ranks are in the same loop
      }
    }
  }
  if (writer && failure.empty()) {
    try {
      writer->finish();
      std::string const path = dir + "/config.json";
      std::ofstream out(path);
      out << config.to_json() << '\n';
      if (!out) throw std::runtime_error("cannot write '" + path + "'");
    } catch (std::exception const& e) {
      failure = e.what();
    }
  }
  require_all_ranks(&comm, failure, "writing the checkpoint " + dir);
}

}  // namespace fusepack::parallel
