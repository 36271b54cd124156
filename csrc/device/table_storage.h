#pragma once
// Table storage: a recdev storage whose bytes live in a store table, in this
// process or on servers (store/table_handle.h). The DataPtr holds an opaque
// address (opaque_address.h) and a TableBlock naming the table, the store
// client it lives in, and its row width. Byte b of the storage is byte b of
// the table seen as a dense [rows, row_bytes] array.

#include "storage_context.h"

#include "store/element_type.h"

#include <ATen/core/Tensor.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace recdev::store {
class StoreClient;
class TableHandle;
}  // namespace recdev::store

namespace recdev::device {

// Rows a table was restored with but has not installed yet: puts them, with the table's init rule
// and optimizer, into the table it is given. May throw (a damaged file); installs nothing then.
using PendingRows = std::function<void(store::TableHandle& into)>;

struct TableBlock final : StorageContext {
  TableBlock(std::shared_ptr<store::TableHandle> table, std::shared_ptr<store::StoreClient> client, uint64_t nbytes,
             uint32_t row_bytes, bool owns_table);
  ~TableBlock() override;

  // The table, its pending rows (if any) installed first.
  store::TableHandle& table() const;
  bool same_table(const TableBlock& other) const { return table_ == other.table_; }
  // The table, shared (its pending rows installed first): for a view of it through another handle.
  std::shared_ptr<store::TableHandle> table_shared() const {
    table();
    return table_;
  }

  // torch.load gives a table its saved rows this way, so that load_state_dict can copy them
  // straight into the model's table (install_pending_into) rather than into this one and then
  // again into the model's: one copy of every row instead of two. Any other use installs them here.
  void defer_rows(PendingRows rows);
  // Installs this table's pending rows into `other`, leaving them pending here; false if there are none.
  bool install_pending_into(store::TableHandle& other) const;

  // The client the table lives in: an anonymous table is freed through it
  // even after the current store changed.
  const std::shared_ptr<store::StoreClient> client;
  const uint64_t nbytes;  // the storage's size; the last row may be partly padding
  const uint32_t row_bytes;
  const uintptr_t base;   // the opaque address of byte 0
  const bool owns_table;  // anonymous tables are freed with their storage

 private:
  const std::shared_ptr<store::TableHandle> table_;
  mutable std::mutex pending_mutex_;
  mutable PendingRows pending_;                   // under pending_mutex_
  mutable std::atomic<bool> has_pending_{false};  // whether pending_ is set: table()'s fast path
};

// A new anonymous table storage of `nbytes` bytes, rows of `row_bytes`, in
// the current store.
// `type` is the table's element type (element_type_of the tensor's dtype), its identity in the store;
// a float64 table whose rows are not whole elements is held as bytes.
c10::Storage make_table_storage(uint64_t nbytes, uint32_t row_bytes, store::ElementType type);

// The store's element type for a torch dtype: float32, float16, bfloat16 and float64 tables are
// computed on; every other dtype is held as bytes.
store::ElementType element_type_of(c10::ScalarType dtype);
// The torch dtype of a table of this element type (Bytes has none: throws).
c10::ScalarType scalar_type_of(store::ElementType type);

// A recdev storage over an existing table of `client` (a named one,
// owns_table=false, outlives the storage).
c10::Storage wrap_table(std::shared_ptr<store::TableHandle> table, std::shared_ptr<store::StoreClient> client,
                        uint64_t nbytes, uint32_t row_bytes, bool owns_table);

// The TableBlock of a storage, or nullptr for host storage.
TableBlock* table_block(const c10::Storage& storage);

inline bool is_table(const at::Tensor& t) {
  return t.defined() && t.is_privateuseone() && table_block(t.storage()) != nullptr;
}

// Refuses, naming `what`, a move of `nbytes` out of a table past the
// max_fallback_bytes limit.
void check_fallback_size(uint64_t nbytes, const std::string& what);

}  // namespace recdev::device
