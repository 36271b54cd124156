#pragma once
// Table storage: a recdev storage whose bytes live in a store table, in this
// process or on servers (store/table_handle.h). The DataPtr holds an opaque
// address (opaque_address.h) and a TableBlock naming the table, the store
// client it lives in, and its row width. Byte b of the storage is byte b of
// the table seen as a dense [rows, row_bytes] array.

#include "storage_context.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

namespace recdev::store {
class StoreClient;
class TableHandle;
} // namespace recdev::store

namespace recdev::device {

struct TableBlock final : StorageContext {
  TableBlock(
      std::shared_ptr<store::TableHandle> table,
      std::shared_ptr<store::StoreClient> client,
      uint64_t nbytes,
      uint32_t row_bytes,
      bool owns_table);
  ~TableBlock() override;

  const std::shared_ptr<store::TableHandle> table;
  // The client the table lives in: an anonymous table is freed through it
  // even after the current store changed.
  const std::shared_ptr<store::StoreClient> client;
  const uint64_t nbytes;    // the storage's size; the last row may be partly padding
  const uint32_t row_bytes;
  const uintptr_t base;     // the opaque address of byte 0
  const bool owns_table;    // anonymous tables are freed with their storage
};

// A new anonymous table storage of `nbytes` bytes, rows of `row_bytes`, in
// the current store.
c10::Storage make_table_storage(uint64_t nbytes, uint32_t row_bytes);

// A recdev storage over an existing table of `client` (a named one,
// owns_table=false, outlives the storage).
c10::Storage wrap_table(
    std::shared_ptr<store::TableHandle> table,
    std::shared_ptr<store::StoreClient> client,
    uint64_t nbytes,
    uint32_t row_bytes,
    bool owns_table);

// The TableBlock of a storage, or nullptr for host storage.
TableBlock* table_block(const c10::Storage& storage);

inline bool is_table(const at::Tensor& t) {
  return t.defined() && t.is_privateuseone() && table_block(t.storage()) != nullptr;
}

// Refuses, naming `what`, a move of `nbytes` out of a table past the
// max_fallback_bytes limit.
void check_fallback_size(uint64_t nbytes, const std::string& what);

} // namespace recdev::device
