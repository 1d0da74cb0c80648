#include "trainer/train/device_memory.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstddef>

namespace fusepack::train {
namespace {

c10::DeviceIndex device_index(c10::Device device) {
  return device.has_index() ? device.index() : c10::impl::VirtualGuardImpl(device.type()).getDevice().index();
}

}  // namespace

AllocatedBytes allocated_bytes(c10::Device device) {
  auto const stats = c10::getDeviceAllocator(device.type())->getDeviceStats(device_index(device));
  auto const& stat = stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return {stat.current, stat.peak};
}

void reset_peak_allocated_bytes(c10::Device device) {
  c10::getDeviceAllocator(device.type())->resetPeakStats(device_index(device));
}

}  // namespace fusepack::train
