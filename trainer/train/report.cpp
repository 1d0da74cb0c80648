#include "trainer/train/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace fusepack::train {
namespace {

std::string printf_string(char const* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string percent(double fraction) { return printf_string("%.1f", 100.0 * fraction) + "%"; }

double share(std::int64_t part, std::int64_t whole) {
  return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

}  // namespace

double StepMetrics::padding_share() const { return share(slots - tokens, slots); }

double StepMetrics::tokens_per_second() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0; }

golden::StepRecord StepMetrics::record() const {
  golden::StepRecord r;
  r.step = step;
  r.loss = loss;
  r.grad_norm = grad_norm;
  r.tokens = targets;
  r.lr = lr;
  return r;
}

std::string step_log_line(StepMetrics const& m, std::int64_t total_steps) {
  int const width = static_cast<int>(std::to_string(total_steps).size());
  char head[64];
  std::snprintf(head, sizeof head, "step %*lld/%lld", width, static_cast<long long>(m.step),
                static_cast<long long>(total_steps));
  char body[256];
  std::snprintf(body, sizeof body, "  loss %.6f  grad norm %.4f  lr %.3e  targets %s  tokens %s  %s tok/s  padding %s",
                m.loss, m.grad_norm, m.lr, grouped(m.targets).c_str(), grouped(m.tokens).c_str(),
                grouped(static_cast<std::int64_t>(std::llround(m.tokens_per_second()))).c_str(),
                percent(m.padding_share()).c_str());
  return std::string(head) + body;
}

std::string eval_log_line(EvalMetrics const& m, std::int64_t total_steps) {
  int const width = static_cast<int>(std::to_string(total_steps).size());
  char line[256];
  std::snprintf(line, sizeof line, "eval %*lld/%lld  loss %.6f  targets %s  tokens %s  examples %s  %.1f s", width,
                static_cast<long long>(m.step), static_cast<long long>(total_steps), m.loss,
                grouped(m.targets).c_str(), grouped(m.tokens).c_str(), grouped(m.examples).c_str(), m.seconds);
  return line;
}

std::string progress_bar(std::int64_t steps_done, std::int64_t total_steps, double tokens_per_second,
                         double eta_seconds, int width) {
  double const done = total_steps > 0 ? std::clamp(share(steps_done, total_steps), 0.0, 1.0) : 0.0;
  int const filled = static_cast<int>(std::lround(done * width));
  std::string bar = "[" + std::string(filled, '#') + std::string(width - filled, '-') + "]";
  bar += " " + std::to_string(steps_done) + "/" + std::to_string(total_steps) + " steps";
  bar += "  " + grouped(static_cast<std::int64_t>(std::llround(tokens_per_second))) + " tok/s";
  bar += "  eta " + printf_string("%.0f", std::max(0.0, eta_seconds)) + " s";
  return bar;
}

double RunSummary::padding_share() const { return share(slots - tokens, slots); }

double RunSummary::tokens_per_second() const {
  return train_seconds > 0 ? static_cast<double>(tokens) / train_seconds : 0.0;
}

RunSummary summarize(std::vector<StepMetrics> const& steps, double wall_seconds) {
  if (steps.empty()) throw std::invalid_argument("summarize: the run has no step");
  RunSummary s;
  s.steps = static_cast<std::int64_t>(steps.size());
  for (StepMetrics const& m : steps) {
    s.targets += m.targets;
    s.tokens += m.tokens;
    s.slots += m.slots;
    s.examples += m.examples;
    s.train_seconds += m.seconds;
  }
  s.wall_seconds = wall_seconds;
  s.first_loss = steps.front().loss;
  s.final_loss = steps.back().loss;
  s.first_step = steps.front().step;
  return s;
}

std::string summary_text(RunSummary const& s) {
  std::string out;
  out += "summary: " + grouped(s.steps) + (s.steps == 1 ? " step, " : " steps, ") + grouped(s.targets) +
         " targets, " + grouped(s.tokens) + " tokens in " + grouped(s.examples) + " examples\n";
  out += "throughput: " + grouped(static_cast<std::int64_t>(std::llround(s.tokens_per_second()))) +
         " tokens/s (train time " + printf_string("%.2f", s.train_seconds) + " s, wall time " +
         printf_string("%.2f", s.wall_seconds) + " s)\n";
  out += "padding: " + percent(s.padding_share()) + " of " + grouped(s.slots) + " computed positions\n";
  out += "loss: " + printf_string("%.6f", s.first_loss) + " (step " + std::to_string(s.first_step) + ") -> " +
         printf_string("%.6f", s.final_loss) + " (step " + std::to_string(s.first_step + s.steps - 1) + ", final)\n";
  return out;
}

}  // namespace fusepack::train
