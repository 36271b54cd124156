#pragma once
// Every recdev storage carries a StorageContext in its DataPtr. The context
// says which of the two storage kinds (DESIGN.md, "Memory model") the bytes
// are, so kernels and the fallback can branch on the kind without guessing
// from addresses.

#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <cstdint>

namespace recdev::device {

enum class StorageKind : uint8_t {
  // Ordinary host memory owned by this process; CPU kernels run on it in place.
  Host,
  // Rows live in the store; the DataPtr address is opaque and never
  // dereferenceable.
  Table,
};

struct StorageContext {
  explicit StorageContext(StorageKind kind) : kind(kind) {}
  virtual ~StorageContext() = default;
  const StorageKind kind;
};

// The deleter of every recdev DataPtr; frees the context through its virtual
// destructor, whatever its kind.
void delete_storage_context(void* context);

// The context of a recdev DataPtr, or nullptr when the DataPtr was made
// elsewhere (for example wrapped around foreign memory).
StorageContext* storage_context(const c10::DataPtr& data_ptr);

// Host memory is held as a CPU storage, so that a CPU tensor over exactly the
// same bytes can be made without a copy (see cpu_view.h).
// Its bytes are counted in the process's memory accounts (store/memory_accounting.h) for as long
// as it lives, at the size it had when it was made.
struct HostBlock final : StorageContext {
  explicit HostBlock(c10::Storage cpu_storage);
  // Offers large blocks nobody else holds to the host block cache.
  ~HostBlock() override;
  c10::Storage cpu;
  const size_t counted_bytes;
};

// Wraps a CPU storage as the DataPtr of a recdev storage (zero copy).
c10::DataPtr host_data_ptr(c10::Storage cpu_storage, c10::DeviceIndex index);

StorageKind storage_kind(const c10::Storage& storage);

}  // namespace recdev::device
