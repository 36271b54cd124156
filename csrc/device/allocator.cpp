#include "allocator.h"

#include "host_block_cache.h"
#include "memory_stats.h"
#include "storage_context.h"
#include "store/chunk_pool.h"
#include "store/memory_accounting.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>

#include <cstring>

namespace recdev::device {

c10::DataPtr HostAllocator::allocate(size_t nbytes) {
  // The bytes come from the CPU allocator so that a CPU storage can own them
  // and CPU kernels can run on them unchanged.
  c10::Allocator* cpu = c10::GetCPUAllocator();
  c10::DataPtr block = take_cached_block(nbytes);
  if (block.get() == nullptr) {
    block = cpu->allocate(nbytes);
  }
  c10::Storage cpu_storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                                 std::move(block), cpu,
                                                                 /*resizable=*/true));
  return host_data_ptr(std::move(cpu_storage), 0);
}

c10::DeleterFnPtr HostAllocator::raw_deleter() const {
  // Raw allocations cannot carry the context a recdev DataPtr needs.
  return nullptr;
}

void HostAllocator::copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }

namespace {

void check_device_index(c10::DeviceIndex device) {
  TORCH_CHECK_INDEX(device == 0 || device == -1, "recdev has one device, recdev:0; got device index ",
                    static_cast<int>(device));
}

}  // namespace

void empty_memory_caches() {
  empty_host_cache();
  store::release_cached_chunk_regions();
}

void HostAllocator::emptyCache(c10::MempoolId_t mempool_id) {
  TORCH_CHECK(mempool_id.first == 0 && mempool_id.second == 0,
              "recdev has no memory pools but the default one; got pool (", mempool_id.first, ", ", mempool_id.second,
              ")");
  empty_memory_caches();
}

c10::CachingDeviceAllocator::DeviceStats HostAllocator::getDeviceStats(c10::DeviceIndex device) {
  check_device_index(device);
  return device_stats();
}

void HostAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  check_device_index(device);
  store::reset_memory_accumulated();
}

void HostAllocator::resetPeakStats(c10::DeviceIndex device) {
  check_device_index(device);
  store::reset_memory_peaks();
}

std::pair<size_t, size_t> HostAllocator::getMemoryInfo(c10::DeviceIndex device) {
  check_device_index(device);
  return host_memory_info();
}

HostAllocator& host_allocator() {
  static HostAllocator allocator;
  return allocator;
}

namespace {
const bool registered = [] {
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &host_allocator());
  return true;
}();
}  // namespace

}  // namespace recdev::device
