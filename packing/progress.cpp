#include "packing/progress.h"

#include <chrono>
#include <cstdio>
#include <ostream>
#include <utility>

namespace fusepack::packing {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ProgressPhase::ProgressPhase(Progress const* progress, std::string what)
    : progress_(progress != nullptr && progress->out != nullptr ? progress : nullptr), what_(std::move(what)) {
  if (progress_) start_ = last_ = progress_->clock();
}

bool ProgressPhase::due() {
  if (!progress_) return false;
  double const now = progress_->clock();
  if (now - last_ < progress_->interval_seconds) return false;
  last_ = now;
  return true;
}

void ProgressPhase::print(std::string const& line) {
  if (progress_->before_line) progress_->before_line();
  *progress_->out << line << '\n';
  progress_->out->flush();
}

void ProgressPhase::done(std::string const& summary) {
  if (!progress_) return;
  double const seconds = progress_->clock() - start_;
  if (seconds < progress_->interval_seconds) return;
  char took[32];
  std::snprintf(took, sizeof took, " in %.1f s", seconds);
  print(what_ + ": " + summary + took);
}

std::string grouped(std::int64_t v) {
  std::string const digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string megabytes(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

std::string megabytes_per_second(std::int64_t bytes, double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB/s", seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0.0);
  return buf;
}

}  // namespace fusepack::packing
