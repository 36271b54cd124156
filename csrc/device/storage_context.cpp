#include "storage_context.h"

#include "host_block_cache.h"
#include "memory_stats.h"

#include <c10/core/StorageImpl.h>

namespace recdev::device {

void delete_storage_context(void* context) { delete static_cast<StorageContext*>(context); }

StorageContext* storage_context(const c10::DataPtr& data_ptr) {
  if (data_ptr.get_deleter() != &delete_storage_context) {
    return nullptr;
  }
  return static_cast<StorageContext*>(data_ptr.get_context());
}

HostBlock::HostBlock(c10::Storage cpu_storage)
    : StorageContext(StorageKind::Host), cpu(std::move(cpu_storage)), counted_bytes(cpu.nbytes()) {
  count_host_block(static_cast<int64_t>(counted_bytes));
}

HostBlock::~HostBlock() {
  count_host_block(-static_cast<int64_t>(counted_bytes));
  c10::StorageImpl* impl = cpu.unsafeGetStorageImpl();
  if (impl != nullptr && cpu.use_count() == 1 && impl->nbytes() >= kMinCachedBlockBytes) {
    const size_t nbytes = impl->nbytes();
    return_block(impl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU))), nbytes);
  }
}

c10::DataPtr host_data_ptr(c10::Storage cpu_storage, c10::DeviceIndex index) {
  void* data = cpu_storage.mutable_data();
  auto* block = new HostBlock(std::move(cpu_storage));
  return c10::DataPtr(data, block, &delete_storage_context, c10::Device(c10::DeviceType::PrivateUse1, index));
}

StorageKind storage_kind(const c10::Storage& storage) {
  const StorageContext* context = storage_context(storage.data_ptr());
  return context == nullptr ? StorageKind::Host : context->kind;
}

}  // namespace recdev::device
