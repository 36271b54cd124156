#include "allocator.h"

#include "host_block_cache.h"
#include "storage_context.h"

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
