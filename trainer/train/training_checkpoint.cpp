#include "trainer/train/training_checkpoint.h"

#include "golden/golden_file.h"
#include "trainer/checkpoint/files.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/parallel/collectives.h"
#include "trainer/train/fingerprint.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace fusepack::train {
namespace {

using Json = nlohmann::ordered_json;
using checkpoint::join;

constexpr char kFormat[] = "fusepack training checkpoint";
constexpr int kVersion = 1;
constexpr char kMetaFile[] = "meta.json";
constexpr char kLatestFile[] = "latest";

std::string step_folder(std::int64_t steps_taken) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(steps_taken));
  return name;
}

bool is_step_folder(std::string const& name) {
  return name.size() == 13 && name.rfind("step-", 0) == 0 &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

std::string rank_file(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05d-of-%05d.safetensors", rank, world);
  return name;
}

std::string hex(std::uint64_t v) {
  char s[24];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

template <typename F>
std::string attempt(F&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return {};
}

// Removes the step-N.tmp folders of `dir`: saves that were interrupted (no save runs while another prepares).
void remove_interrupted_saves(std::string const& dir) {
  for (std::string const& name : checkpoint::list_dir(dir)) {
    bool const tmp = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
                     is_step_folder(name.substr(0, name.size() - 4));
    if (tmp) checkpoint::remove_tree(join(dir, name));
  }
}

// Keeps the newest `keep` step folders of `dir` (by step number) and removes the others.
void keep_newest(std::string const& dir, std::int64_t keep) {
  std::vector<std::string> steps;
  for (std::string const& name : checkpoint::list_dir(dir)) {
    if (is_step_folder(name)) steps.push_back(name);
  }
  std::sort(steps.begin(), steps.end());  // zero-padded: name order is step order
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i) {
    checkpoint::remove_tree(join(dir, steps[i]));
  }
}

Json read_json(std::string const& path, std::string const& what) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(what + ": cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  try {
    return Json::parse(s.str());
  } catch (std::exception const& e) {
    throw std::invalid_argument(what + ": " + path + " is not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

std::string resolve_checkpoint(std::string const& path) {
  using checkpoint::PathKind;
  if (checkpoint::path_kind(path) != PathKind::kDirectory) {
    throw std::invalid_argument("resume: " + path + " is not a folder (give a checkpoint folder step-N, or the save "
                                "dir that holds `latest`)");
  }
  if (checkpoint::path_kind(join(path, kMetaFile)) == PathKind::kFile) return path;
  std::string const latest = join(path, kLatestFile);
  if (checkpoint::path_kind(latest) != PathKind::kFile) {
    throw std::invalid_argument("resume: " + path + " holds neither " + kMetaFile + " (a checkpoint) nor `" +
                                kLatestFile + "` (a save dir with one)");
  }
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  if (!is_step_folder(name)) {
    throw std::invalid_argument("resume: " + latest + " does not name a step folder: '" + name + "'");
  }
  std::string const dir = join(path, name);
  if (checkpoint::path_kind(join(dir, kMetaFile)) != PathKind::kFile) {
    throw std::invalid_argument("resume: " + latest + " names " + dir + ", which holds no " + kMetaFile);
  }
  return dir;
}

std::string save_training_checkpoint(SaveOptions const& options, TrainingProgress const& progress,
                                     std::vector<ParameterRows> const& params, optim::AdamW const& adamw,
                                     std::string const& fingerprint, parallel::Collectives* comm) {
  if (options.keep < 1) throw std::invalid_argument("save_training_checkpoint: keep must be >= 1");
  int const rank = comm ? comm->rank() : 0, world = comm ? comm->world_size() : 1;
  std::string const name = step_folder(progress.steps_taken);
  std::string const final_dir = join(options.dir, name), tmp_dir = final_dir + ".tmp";
  std::string const what = "saving checkpoint " + final_dir;

  parallel::require_all_ranks(comm, rank != 0 ? std::string() : attempt([&] {
    checkpoint::make_dirs(options.dir);
    remove_interrupted_saves(options.dir);
    checkpoint::make_dirs(tmp_dir);
  }), what + " (preparing " + tmp_dir + ")");

  // This rank's file: its rows and AdamW's moments, with their row ranges.
  std::string const file = rank_file(rank, world);
  std::string record;  // "bytes checksum" for meta.json
  std::string const error = attempt([&] {
    checkpoint::TensorMap tensors;
    Json rows = Json::object();
    for (ParameterRows const& p : params) {
      tensors.emplace("param/" + p.name, p.param.detach());
      std::int64_t step = 0;
      if (adamw.has_state(p.name)) {
        optim::AdamWState const& s = adamw.state(p.name);
        tensors.emplace("exp_avg/" + p.name, s.exp_avg);
        tensors.emplace("exp_avg_sq/" + p.name, s.exp_avg_sq);
        step = s.step;
      }
      rows[p.name] = Json{{"begin", p.row_begin}, {"rows", p.rows}, {"adam_step", step}};
    }
    Json const meta{{"rank", rank}, {"world_size", world}, {"parameters", rows}};
    std::string const path = join(tmp_dir, file);
    checkpoint::write_safetensors(path, tensors, {{"fusepack", meta.dump()}});
    std::int64_t bytes = 0;
    checkpoint::path_kind(path, &bytes);
    record = std::to_string(bytes) + " " + hex(checkpoint::file_checksum(path));
  });
  parallel::require_all_ranks(comm, error, what + " (the rank files)");
  std::vector<std::string> const records = comm ? comm->exchange(record, what) : std::vector<std::string>{record};

  parallel::require_all_ranks(comm, rank != 0 ? std::string() : attempt([&] {
    Json files = Json::array();
    for (int r = 0; r < world; ++r) {
      std::istringstream in(records[static_cast<std::size_t>(r)]);
      std::int64_t bytes = 0;
      std::string checksum;
      in >> bytes >> checksum;
      files.push_back(Json{{"name", rank_file(r, world)}, {"bytes", bytes}, {"checksum", checksum}});
    }
    Json const meta{{"format", kFormat},
                    {"version", kVersion},
                    {"steps_taken", progress.steps_taken},
                    {"epochs_started", progress.epochs_started},
                    {"next_micro_batch", progress.next_micro_batch},
                    {"world_size", world},
                    {"created", golden::utc_now_iso8601()},
                    {"settings", Json::parse(fingerprint)},
                    {"files", files}};
    checkpoint::write_file_atomically(join(tmp_dir, kMetaFile), meta.dump(2) + "\n");
    checkpoint::fsync_path(tmp_dir);
    // A checkpoint of this step from an earlier run (resumed from before it) is replaced only once the new one is
    // complete.
    std::string const old_dir = final_dir + ".old";
    bool const replacing = checkpoint::path_kind(final_dir) != checkpoint::PathKind::kMissing;
    if (replacing) checkpoint::rename_durably(final_dir, old_dir);
    checkpoint::rename_durably(tmp_dir, final_dir);
    checkpoint::write_file_atomically(join(options.dir, kLatestFile), name + "\n");
    if (replacing) checkpoint::remove_tree(old_dir);
    keep_newest(options.dir, options.keep);
  }), what);
  return final_dir;
}

TrainingProgress load_training_checkpoint(std::string const& path, std::vector<ParameterRows> const& params,
                                          optim::AdamW& adamw, std::string const& fingerprint) {
  std::string const dir = resolve_checkpoint(path);
  std::string const meta_path = join(dir, kMetaFile);
  std::string const where = "resume from " + dir;
  Json const meta = read_json(meta_path, where);
  if (meta.value("format", "") != kFormat || meta.value("version", 0) != kVersion) {
    throw std::invalid_argument(where + ": " + meta_path + " is not a fusepack training checkpoint of version " +
                                std::to_string(kVersion));
  }
  // The run's settings against the checkpoint's: anything but the fusepack version changes what the steps compute.
  std::string diffs;
  for (SettingDifference const& d : setting_differences(meta.at("settings").dump(), fingerprint, {"fusepack"})) {
    diffs += "\n  " + d.path + ": " + d.first + " in the checkpoint, " + d.second + " in this run";
  }
  if (!diffs.empty()) {
    throw std::invalid_argument(where + ": the checkpoint was written by a run with other settings (a resumed run "
                                "must repeat them):" + diffs);
  }

  // Every rank file: present, of the recorded size, its header valid; read in full and checked against its checksum
  // only when this rank reads from it.
  std::int64_t const world = meta.at("world_size").get<std::int64_t>();
  Json const& files = meta.at("files");
  if (!files.is_array() || static_cast<std::int64_t>(files.size()) != world) {
    throw std::invalid_argument(where + ": " + meta_path + " lists " + std::to_string(files.size()) +
                                " rank files for a world of " + std::to_string(world));
  }
  struct RankFile {
    std::string path;
    std::string checksum;
    bool checked = false;
    checkpoint::CheckpointIndex index;
    Json rows;  // name → {begin, rows, adam_step}
  };
  std::vector<RankFile> ranks;
  for (Json const& f : files) {
    RankFile r;
    r.path = join(dir, f.at("name").get<std::string>());
    r.checksum = f.at("checksum").get<std::string>();
    std::int64_t bytes = -1;
    if (checkpoint::path_kind(r.path, &bytes) != checkpoint::PathKind::kFile) {
      throw std::invalid_argument(where + ": the rank file " + r.path + " is missing");
    }
    if (bytes != f.at("bytes").get<std::int64_t>()) {
      throw std::invalid_argument(where + ": " + r.path + " holds " + std::to_string(bytes) + " bytes; meta.json " +
                                  "recorded " + f.at("bytes").dump() + " (truncated or replaced)");
    }
    try {
      r.index = checkpoint::index_checkpoint(r.path);
      r.rows = Json::parse(r.index.metadata.at("fusepack")).at("parameters");
    } catch (std::exception const& e) {
      throw std::invalid_argument(where + ": " + r.path + " is damaged: " + e.what());
    }
    ranks.push_back(std::move(r));
  }

  TrainingProgress progress;
  progress.checkpoint = dir;
  progress.steps_taken = meta.at("steps_taken").get<std::int64_t>();
  progress.epochs_started = meta.at("epochs_started").get<std::uint64_t>();
  progress.next_micro_batch = meta.at("next_micro_batch").get<std::int64_t>();
  at::NoGradGuard no_grad;
  for (ParameterRows const& p : params) {
    std::int64_t const begin = p.row_begin, end = p.row_begin + p.param.size(0);
    at::Tensor exp_avg = at::zeros_like(p.param), exp_avg_sq = at::zeros_like(p.param);
    std::int64_t covered = 0, adam_step = -1;
    for (RankFile& r : ranks) {
      if (!r.rows.contains(p.name)) throw std::invalid_argument(where + ": " + r.path + " lacks parameter " + p.name);
      Json const& info = r.rows.at(p.name);
      std::int64_t const fb = info.at("begin").get<std::int64_t>();
      std::int64_t const total = info.at("rows").get<std::int64_t>();
      if (total != p.rows) {
        throw std::invalid_argument(where + ": " + r.path + " holds " + p.name + " with " + std::to_string(total) +
                                    " rows; this model's has " + std::to_string(p.rows));
      }
      auto const location = [&](std::string const& kind) -> checkpoint::TensorLocation const& {
        auto const it = r.index.tensors.find(kind + "/" + p.name);
        if (it == r.index.tensors.end()) {
          throw std::invalid_argument(where + ": " + r.path + " lacks " + kind + "/" + p.name);
        }
        return it->second;
      };
      std::int64_t const fe = fb + location("param").info.shape.at(0);
      std::int64_t const lo = std::max(begin, fb), hi = std::min(end, fe);
      if (lo >= hi) continue;
      if (!r.checked) {
        std::string const got = hex(checkpoint::file_checksum(r.path));
        if (got != r.checksum) {
          throw std::invalid_argument(where + ": " + r.path + " is damaged: its checksum is " + got + ", meta.json " +
                                      "recorded " + r.checksum);
        }
        r.checked = true;
      }
      at::Tensor const rows = checkpoint::read_rows(location("param"), lo - fb, hi - fb);
      if (rows.sizes().slice(1) != p.param.sizes().slice(1)) {
        std::ostringstream os;
        os << where << ": " << r.path << " holds " << p.name << " rows of shape " << rows.sizes().slice(1)
           << "; this model's are " << p.param.sizes().slice(1);
        throw std::invalid_argument(os.str());
      }
      p.param.narrow(0, lo - begin, hi - lo).copy_(rows);
      std::int64_t const step = info.at("adam_step").get<std::int64_t>();
      if (step > 0) {
        for (auto [kind, moment] : {std::pair<char const*, at::Tensor*>{"exp_avg", &exp_avg},
                                    std::pair<char const*, at::Tensor*>{"exp_avg_sq", &exp_avg_sq}}) {
          moment->narrow(0, lo - begin, hi - lo).copy_(checkpoint::read_rows(location(kind), lo - fb, hi - fb));
        }
      }
      adam_step = step;
      covered += hi - lo;
    }
    if (covered != end - begin) {
      throw std::invalid_argument(where + ": the rank files hold " + std::to_string(covered) + " of rows [" +
                                  std::to_string(begin) + ", " + std::to_string(end) + ") of " + p.name);
    }
    if (adam_step > 0) adamw.load_state(p.name, {adam_step, exp_avg, exp_avg_sq});
  }
  return progress;
}

}  // namespace fusepack::train
