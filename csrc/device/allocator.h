#pragma once
// The allocator registered for the recdev device. It hands out host storage;
// table storage is created by the table layer, not by byte-size allocation.
// It is a DeviceAllocator, which is what torch.accelerator's memory APIs ask of
// every device's allocator: its stats count host storage and tables
// (memory_stats.h), and empty_cache gives back what both keep for reuse.

#include <c10/core/CachingDeviceAllocator.h>

namespace recdev::device {

class HostAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id) override;
  // recdev runs every kernel to completion on the calling thread (one stream), so a block is
  // free for reuse as soon as its last reference is gone: nothing to record.
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;
};

// Frees what recdev keeps for reuse: the host block cache and the store's cached chunk regions.
void empty_memory_caches();

HostAllocator& host_allocator();

}  // namespace recdev::device
