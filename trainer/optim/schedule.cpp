#include "trainer/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

namespace fusepack::optim {

namespace {

constexpr double kPi = 3.141592653589793;  // Python's math.pi

std::string text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

void CosineSchedule::validate() const {
  auto fail = [](std::string const& field, std::string const& what) {
    throw std::invalid_argument("CosineSchedule: " + field + " " + what);
  };
  if (!(std::isfinite(peak_lr) && peak_lr > 0)) fail("peak_lr", "must be finite and > 0; got " + text(peak_lr));
  if (!(min_lr >= 0 && min_lr <= peak_lr)) {
    fail("min_lr", "must be in [0, peak_lr = " + text(peak_lr) + "]; got " + text(min_lr));
  }
  if (total_steps < 1) fail("total_steps", "must be >= 1; got " + std::to_string(total_steps));
  if (warmup_steps < 0 || warmup_steps > total_steps) {
    fail("warmup_steps", "must be in [0, total_steps = " + std::to_string(total_steps) + "]; got " +
                             std::to_string(warmup_steps));
  }
}

double CosineSchedule::lr(std::int64_t step) const {
  validate();
  if (step < 0 || step > total_steps) {
    throw std::out_of_range("CosineSchedule::lr: step " + std::to_string(step) + " is outside [0, total_steps = " +
                            std::to_string(total_steps) + "]");
  }
  // The operations and their order are HF's, in double like Python's floats, so the rates match bit for bit.
  double factor;
  if (step < warmup_steps) {
    factor = static_cast<double>(step) / static_cast<double>(std::max<std::int64_t>(1, warmup_steps));
  } else {
    double const progress = static_cast<double>(step - warmup_steps) /
                            static_cast<double>(std::max<std::int64_t>(1, total_steps - warmup_steps));
    double const min_lr_rate = min_lr / peak_lr;
    double const num_cycles = 0.5;
    factor = 0.5 * (1.0 + std::cos(kPi * num_cycles * 2.0 * progress));
    factor = factor * (1 - min_lr_rate) + min_lr_rate;
    factor = std::max(0.0, factor);
  }
  return peak_lr * factor;
}

}  // namespace fusepack::optim
