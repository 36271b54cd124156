#pragma once
// The allocator registered for the recdev device. It hands out host storage;
// table storage is created by the table layer, not by byte-size allocation.

#include <c10/core/Allocator.h>

namespace recdev::device {

class HostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
};

HostAllocator& host_allocator();

}  // namespace recdev::device
