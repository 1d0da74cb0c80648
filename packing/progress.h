// Progress of long phases (reading a large dataset, planning an epoch, building a large model) as lines on a stream,
// rate-limited in one place: a line every `interval` (2 s) while a phase runs and one when it ends; a phase that ends
// within the interval prints nothing, so fast runs stay quiet. The clock is injectable for tests. No torch here.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>

namespace fusepack::packing {

using SecondsClock = std::function<double()>;  // seconds on a monotonic clock
double steady_seconds();                       // std::chrono::steady_clock, the default

inline constexpr double kProgressIntervalSeconds = 2.0;

// Where progress lines go and how often; every phase of a run shares one. A null `Progress const*`: silent.
struct Progress {
  std::ostream* out = nullptr;  // nullptr: silent
  double interval_seconds = kProgressIntervalSeconds;
  SecondsClock clock = steady_seconds;
  std::function<void()> before_line;  // e.g. erase a progress bar drawn on the same terminal; may be empty
};

// One phase, named in its lines: "<what>: <status>" while it runs, "<what>: <summary> in 4.1 s" when it ends.
class ProgressPhase {
 public:
  // Reads the clock once (the phase's start); with a null or silent `progress` it never reads it.
  ProgressPhase(Progress const* progress, std::string what);

  // Prints "<what>: <status(seconds since the phase began)>" when the interval has passed since the phase began or
  // since its last line, and returns true; `status` is called only then. Otherwise one clock read: call it per item,
  // or every few thousand items of a loop whose items take nanoseconds.
  template <typename Status>
  bool update(Status&& status) {
    if (!due()) return false;
    print(what_ + ": " + std::forward<Status>(status)(last_ - start_));
    return true;
  }
  // The phase is over: "<what>: <summary> in 4.1 s" when it lasted at least the interval (it printed or would have
  // printed a line); nothing for a shorter one.
  void done(std::string const& summary);

 private:
  bool due();
  void print(std::string const& line);

  Progress const* progress_;
  std::string what_;
  double start_ = 0;
  double last_ = 0;  // the start, or when the last line was printed
};

// Helpers for status texts: 1234567 -> "1,234,567"; bytes as megabytes ("812.3 MB"); a rate ("401.2 MB/s").
std::string grouped(std::int64_t v);
std::string megabytes(std::int64_t bytes);
std::string megabytes_per_second(std::int64_t bytes, double seconds);

}  // namespace fusepack::packing
