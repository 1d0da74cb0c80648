#include "trainer/train/metrics.h"

#include <nlohmann/json.hpp>

#include <functional>
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

void MetricsFile::eval(EvalMetrics const& m) {
  Json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["targets"] = m.targets;
  j["tokens"] = m.tokens;
  j["examples"] = m.examples;
  j["micro_batches"] = m.micro_batches;
  j["seconds"] = m.seconds;
  line(Json{{"eval", j}}.dump());
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

namespace {

// Calls on_step / on_eval with each step or eval line of the metrics file `path`, in order; throws naming the line.
void read_metrics(std::string const& path, std::function<void(Json const&)> const& on_step,
                  std::function<void(Json const&)> const& on_eval) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("metrics file " + path + ": cannot be read");
  std::string text;
  for (std::int64_t n = 1; std::getline(in, text); ++n) {
    Json const j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    auto fail = [&](std::string const& what) {
      throw std::runtime_error("metrics file " + path + ":" + std::to_string(n) + ": " + what);
    };
    if (!j.is_object()) fail("not a JSON object");
    if (j.contains("run") || j.contains("summary")) continue;
    try {
      if (j.contains("eval")) {
        on_eval(j.at("eval"));
      } else if (j.contains("step")) {
        on_step(j);
      } else {
        fail("neither a run, a step, an eval nor a summary line");
      }
    } catch (Json::exception const&) {
      fail(j.contains("eval") ? "an eval line needs step, loss, targets, tokens, examples, micro_batches and seconds"
                              : "a step line needs step, loss, grad_norm, lr, targets, tokens, slots, examples, "
                                "micro_batches and seconds");
    }
  }
}

}  // namespace

std::vector<StepMetrics> read_metrics_steps(std::string const& path) {
  std::vector<StepMetrics> steps;
  read_metrics(
      path,
      [&](Json const& j) {
        StepMetrics m;
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
        steps.push_back(m);
      },
      [](Json const&) {});
  return steps;
}

std::vector<EvalMetrics> read_metrics_evals(std::string const& path) {
  std::vector<EvalMetrics> evals;
  read_metrics(
      path, [](Json const&) {},
      [&](Json const& j) {
        EvalMetrics m;
        m.step = j.at("step").get<std::int64_t>();
        m.loss = j.at("loss").get<double>();
        m.targets = j.at("targets").get<std::int64_t>();
        m.tokens = j.at("tokens").get<std::int64_t>();
        m.examples = j.at("examples").get<std::int64_t>();
        m.micro_batches = j.at("micro_batches").get<std::int64_t>();
        m.seconds = j.at("seconds").get<double>();
        evals.push_back(m);
      });
  return evals;
}

}  // namespace fusepack::train
