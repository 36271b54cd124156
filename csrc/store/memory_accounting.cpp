#include "memory_accounting.h"

#include <algorithm>
#include <mutex>

namespace recdev::store {
namespace {

struct Accounts {
  std::mutex mutex;
  MemoryReading reading;
};

Accounts& accounts() {
  // Leaked on purpose: chunks and blocks freed during static destruction are still counted.
  static Accounts* instance = new Accounts();
  return *instance;
}

void change(MemoryGauge& gauge, int64_t delta) {
  gauge.current += delta;
  if (delta > 0) {
    gauge.allocated += delta;
    gauge.peak = std::max(gauge.peak, gauge.current);
  } else {
    gauge.freed -= delta;
  }
}

// A change of `bytes` (one block) in every scope `kind` belongs to.
void count(MemoryGauge (&bytes_gauges)[kMemoryScopes], MemoryGauge (&count_gauges)[kMemoryScopes], MemoryKind kind,
           int64_t bytes) {
  const MemoryScope pool = kind == MemoryKind::SmallHostBlock ? kSmallPool : kLargePool;
  const MemoryScope split = kind == MemoryKind::Table ? kTableMemory : kHostMemory;
  const int64_t one = bytes > 0 ? 1 : -1;
  for (MemoryScope scope : {kAllMemory, pool, split}) {
    change(bytes_gauges[scope], bytes);
    change(count_gauges[scope], one);
  }
}

template <typename Fn>
void for_each_gauge(MemoryReading& reading, Fn fn) {
  for (MemoryGauge* gauges : {reading.allocated_bytes, reading.reserved_bytes, reading.allocations, reading.segments}) {
    std::for_each(gauges, gauges + kMemoryScopes, fn);
  }
}

}  // namespace

void count_allocated(MemoryKind kind, int64_t bytes) {
  if (bytes == 0) return;
  Accounts& a = accounts();
  std::lock_guard<std::mutex> lock(a.mutex);
  count(a.reading.allocated_bytes, a.reading.allocations, kind, bytes);
}

void count_reserved(MemoryKind kind, int64_t bytes) {
  if (bytes == 0) return;
  Accounts& a = accounts();
  std::lock_guard<std::mutex> lock(a.mutex);
  count(a.reading.reserved_bytes, a.reading.segments, kind, bytes);
}

MemoryReading read_memory() {
  Accounts& a = accounts();
  std::lock_guard<std::mutex> lock(a.mutex);
  return a.reading;
}

void reset_memory_peaks() {
  Accounts& a = accounts();
  std::lock_guard<std::mutex> lock(a.mutex);
  for_each_gauge(a.reading, [](MemoryGauge& gauge) { gauge.peak = gauge.current; });
}

void reset_memory_accumulated() {
  Accounts& a = accounts();
  std::lock_guard<std::mutex> lock(a.mutex);
  for_each_gauge(a.reading, [](MemoryGauge& gauge) { gauge.allocated = gauge.freed = 0; });
}

}  // namespace recdev::store
