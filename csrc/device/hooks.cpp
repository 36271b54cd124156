// PrivateUse1 hooks: what PyTorch core asks of a backend it does not know
// (availability, generators, storage resizing).

#include "allocator.h"
#include "generator.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

namespace recdev::device {

namespace {

// Pinned memory: CPU memory from this allocator, remembered by address range so that isPinnedPtr
// answers for any pointer into it (a view, a storage slice), as CUDA's does for its host allocator.
// It is not page-locked: copies to and from recdev are memcpy, with no DMA engine that needs locked
// pages, so locking would only count against RLIMIT_MEMLOCK.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(registry().mutex);
      registry().blocks.emplace(reinterpret_cast<uintptr_t>(data), nbytes);
    }
    return {data, data, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  static bool contains(const void* ptr) {
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(registry().mutex);
    auto next = registry().blocks.upper_bound(address);
    if (next == registry().blocks.begin()) {
      return false;
    }
    const auto& [start, nbytes] = *std::prev(next);
    return address < start + nbytes;
  }

 private:
  struct Registry {
    std::mutex mutex;
    std::map<uintptr_t, size_t> blocks;  // start address -> bytes
  };
  // Never destroyed: pinned tensors may be freed by other static destructors at exit.
  static Registry& registry() {
    static auto* instance = new Registry;
    return *instance;
  }
  static void free_pinned(void* data) {
    if (data == nullptr) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(registry().mutex);
      registry().blocks.erase(reinterpret_cast<uintptr_t>(data));
    }
    c10::free_cpu(data);
  }
};

PinnedAllocator pinned_allocator;

struct RecdevHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    TORCH_CHECK(device == 0, "recdev has one device, recdev:0; got index ", static_cast<int>(device));
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    setCurrentDevice(device);
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override { return default_generator(index); }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<RecdevGenerator>(index < 0 ? 0 : index);
  }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(c10::DeviceType::PrivateUse1, 0); }
  bool isPinnedPtr(const void* data) const override { return PinnedAllocator::contains(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "recdev: trying to resize a storage that is not resizable");
    c10::DataPtr fresh = host_allocator().allocate(new_bytes);
    const size_t keep = std::min(new_bytes, impl->nbytes());
    if (keep > 0) {
      std::memcpy(fresh.get(), impl->data(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(new_bytes);
  }
};

const bool registered = [] {
  static RecdevHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();

}  // namespace

}  // namespace recdev::device
