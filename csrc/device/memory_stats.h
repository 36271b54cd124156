#pragma once
// recdev's memory as PyTorch's device-generic memory APIs read it (torch.accelerator.memory_stats,
// memory_allocated, max_memory_allocated, ...): the process's memory accounts
// (store/memory_accounting.h) as a c10 DeviceStats. Host blocks are counted here; table memory by
// the store's chunk pool. docs/device.md ("Memory") says what each stat name counts.

#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>

namespace recdev::device {

// A host block of `bytes` made (> 0) or freed (< 0): in use and reserved.
void count_host_block(int64_t bytes);
// A freed host block of `bytes` kept in (> 0) or taken from or dropped by (< 0) the host block cache.
void count_cached_host_block(int64_t bytes);

c10::CachingDeviceAllocator::DeviceStats device_stats();

// (free, total) bytes of the host's memory, which recdev's host storage and tables share.
std::pair<size_t, size_t> host_memory_info();

}  // namespace recdev::device
