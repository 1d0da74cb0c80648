// The learning-rate schedule: linear warmup, then cosine decay to min_lr, exactly as Hugging Face's
// get_cosine_with_min_lr_schedule_with_warmup (num_cycles 0.5; min_lr 0 gives get_cosine_schedule_with_warmup).
// Plain C++ (no torch).
#pragma once

#include <cstdint>

namespace fusepack::optim {

// lr(s) for the optimizer step s = 0, 1, ..., total_steps - 1 (0-based: lr(0) is the rate of the first update, as
// torch's LambdaLR gives it before the first scheduler.step()):
//   s <  W:  peak_lr · s / max(1, W)                       (so lr(0) = 0 when W > 0, as in HF)
//   s >= W:  peak_lr · (c · (1 − r) + r),  c = 0.5 · (1 + cos(π · 0.5 · 2 · p)),  p = (s − W) / max(1, N − W),
//            r = min_lr / peak_lr
// with W = warmup_steps, N = total_steps. lr(W) = peak_lr, lr(N) = min_lr; lr(N) is defined (the end of the
// decay) though a run of N steps never uses it. Steps outside [0, N] are an error: HF's formula would climb back up
// the cosine there.
struct CosineSchedule {
  double peak_lr = 0;            // > 0: the optimizer's base lr, reached at the end of warmup
  double min_lr = 0;             // in [0, peak_lr]: the rate at step total_steps
  std::int64_t warmup_steps = 0;  // W in [0, total_steps]
  std::int64_t total_steps = 0;   // N >= 1: optimizer steps of the run

  void validate() const;            // throws std::invalid_argument naming the field
  double lr(std::int64_t step) const;  // validates, then throws std::out_of_range outside [0, total_steps]
};

}  // namespace fusepack::optim
