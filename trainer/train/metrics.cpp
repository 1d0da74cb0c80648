#include "trainer/train/metrics.h"

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <utility>

namespace fusepack::train {
namespace {

using Json = nlohmann::json;

}  // namespace

MetricsFile::MetricsFile(std::string path, std::string const& run_json, bool append)
    : path_(std::move(path)), out_(path_, append ? std::ios::app : std::ios::trunc) {
  if (!out_) throw std::runtime_error("--metrics: cannot open " + path_ + " for writing");
  Json run;
  run["run"] = Json::parse(run_json);
  if (append) run["run"]["resumed"] = true;
  line(run.dump());
}

void MetricsFile::step(StepMetrics const& m, std::int64_t device_bytes) {
  Json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["grad_norm"] = m.grad_norm;
  j["lr"] = m.lr;
  j["targets"] = m.targets;
  j["tokens"] = m.tokens;
  j["slots"] = m.slots;
  j["examples"] = m.examples;
  j["micro_batches"] = m.micro_batches;
  j["padding"] = m.padding_share();
  j["seconds"] = m.seconds;
  j["tokens_per_second"] = m.tokens_per_second();
  if (device_bytes >= 0) j["device_gib"] = static_cast<double>(device_bytes) / (1 << 30);
  line(j.dump());
}

void MetricsFile::summary(RunSummary const& s) {
  Json j;
  j["steps"] = s.steps;
  j["targets"] = s.targets;
  j["tokens"] = s.tokens;
  j["examples"] = s.examples;
  j["padding"] = s.padding_share();
  j["tokens_per_second"] = s.tokens_per_second();
  j["train_seconds"] = s.train_seconds;
  j["wall_seconds"] = s.wall_seconds;
  j["first_step"] = s.first_step;
  j["first_loss"] = s.first_loss;
  j["final_loss"] = s.final_loss;
  line(Json{{"summary", j}}.dump());
}

void MetricsFile::line(std::string const& json) {
  out_ << json << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("--metrics: writing " + path_ + " failed (disk full?)");
}

std::vector<StepMetrics> read_metrics_steps(std::string const& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("metrics file " + path + ": cannot be read");
  std::vector<StepMetrics> steps;
  std::string text;
  for (std::int64_t n = 1; std::getline(in, text); ++n) {
    Json const j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    auto fail = [&](std::string const& what) {
      throw std::runtime_error("metrics file " + path + ":" + std::to_string(n) + ": " + what);
    };
    if (!j.is_object()) fail("not a JSON object");
    if (j.contains("run") || j.contains("summary")) continue;
    if (!j.contains("step")) fail("neither a run, a step nor a summary line");
    StepMetrics m;
    try {
      m.step = j.at("step").get<std::int64_t>();
      m.loss = j.at("loss").get<double>();
      m.grad_norm = j.at("grad_norm").get<double>();
      m.lr = j.at("lr").get<double>();
      m.targets = j.at("targets").get<std::int64_t>();
      m.tokens = j.at("tokens").get<std::int64_t>();
      m.slots = j.at("slots").get<std::int64_t>();
      m.examples = j.at("examples").get<std::int64_t>();
      m.micro_batches = j.at("micro_batches").get<std::int64_t>();
      m.seconds = j.at("seconds").get<double>();
    } catch (Json::exception const&) {
      fail("a step line needs step, loss, grad_norm, lr, targets, tokens, slots, examples, micro_batches and seconds");
    }
    steps.push_back(m);
  }
  return steps;
}

}  // namespace fusepack::train
