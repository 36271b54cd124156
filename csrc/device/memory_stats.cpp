#include "memory_stats.h"

#include "host_block_cache.h"
#include "store/memory_accounting.h"

#include <unistd.h>

namespace recdev::device {

namespace {

using store::MemoryGauge;
using store::MemoryKind;
using Stat = c10::CachingAllocator::Stat;
using StatArray = c10::CachingAllocator::StatArray;

MemoryKind host_kind(int64_t bytes) {
  const size_t size = static_cast<size_t>(bytes < 0 ? -bytes : bytes);
  return size < kMinCachedBlockBytes ? MemoryKind::SmallHostBlock : MemoryKind::LargeHostBlock;
}

Stat as_stat(const MemoryGauge& gauge) {
  Stat stat;
  stat.current = gauge.current;
  stat.peak = gauge.peak;
  stat.allocated = gauge.allocated;
  stat.freed = gauge.freed;
  return stat;
}

// PyTorch's three scopes (all, small pool, large pool) of a gauge array.
StatArray as_stat_array(const MemoryGauge (&gauges)[store::kMemoryScopes]) {
  return {as_stat(gauges[store::kAllMemory]), as_stat(gauges[store::kSmallPool]), as_stat(gauges[store::kLargePool])};
}

}  // namespace

void count_host_block(int64_t bytes) {
  const MemoryKind kind = host_kind(bytes);
  store::count_allocated(kind, bytes);
  store::count_reserved(kind, bytes);
}

void count_cached_host_block(int64_t bytes) { store::count_reserved(host_kind(bytes), bytes); }

c10::CachingDeviceAllocator::DeviceStats device_stats() {
  const store::MemoryReading reading = store::read_memory();
  c10::CachingDeviceAllocator::DeviceStats stats;
  stats.allocation = as_stat_array(reading.allocations);
  stats.segment = as_stat_array(reading.segments);
  stats.active = stats.allocation;  // a block is free for reuse once its last reference is gone: one stream
  stats.allocated_bytes = as_stat_array(reading.allocated_bytes);
  stats.active_bytes = stats.allocated_bytes;
  stats.requested_bytes = stats.allocated_bytes;  // no rounding: a block is the bytes asked for
  stats.reserved_bytes = as_stat_array(reading.reserved_bytes);
  return stats;
}

std::pair<size_t, size_t> host_memory_info() {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return {static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page, static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page};
}

}  // namespace recdev::device
