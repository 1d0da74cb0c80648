// What the caching allocator holds on a device, for the run's memory lines and the step profile.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace fusepack::train {

// Bytes allocated on `device` (CUDA; without an index: the current device): now, and the most since the last reset.
struct AllocatedBytes {
  std::int64_t current = 0;
  std::int64_t peak = 0;
};
AllocatedBytes allocated_bytes(c10::Device device);
void reset_peak_allocated_bytes(c10::Device device);

}  // namespace fusepack::train
