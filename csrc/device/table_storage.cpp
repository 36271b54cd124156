#include "table_storage.h"

#include "allocator.h"
#include "current_store.h"
#include "opaque_address.h"
#include "placement.h"

#include "store/table_handle.h"

#include <c10/core/StorageImpl.h>

#include <utility>

namespace recdev::device {

TableBlock::TableBlock(std::shared_ptr<store::TableHandle> table_in, std::shared_ptr<store::StoreClient> client_in,
                       uint64_t nbytes_in, uint32_t row_bytes_in, bool owns_table_in)
    : StorageContext(StorageKind::Table),
      client(std::move(client_in)),
      nbytes(nbytes_in),
      row_bytes(row_bytes_in),
      base(reserve_opaque_range(nbytes_in)),
      owns_table(owns_table_in),
      table_(std::move(table_in)) {}

TableBlock::~TableBlock() {
  release_opaque_range(base);
  if (owns_table) {
    client->free_table(*table_);
  }
}

store::TableHandle& TableBlock::table() const {
  if (has_pending_.load(std::memory_order_acquire)) {
    // Dropped after the lock is released: dropping the loaded tensors may take the GIL, which a
    // thread waiting for this lock may hold.
    PendingRows installed;
    std::lock_guard<std::mutex> lock(pending_mutex_);
    if (pending_) {
      pending_(*table_);  // on an error the rows stay pending, and the next use meets it again
      installed = std::exchange(pending_, nullptr);
      has_pending_.store(false, std::memory_order_release);
    }
  }
  return *table_;
}

void TableBlock::defer_rows(PendingRows rows) {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  pending_ = std::move(rows);
  has_pending_.store(static_cast<bool>(pending_), std::memory_order_release);
}

bool TableBlock::install_pending_into(store::TableHandle& other) const {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  if (!pending_) {
    return false;
  }
  pending_(other);
  return true;
}

c10::Storage wrap_table(std::shared_ptr<store::TableHandle> table, std::shared_ptr<store::StoreClient> client,
                        uint64_t nbytes, uint32_t row_bytes, bool owns_table) {
  auto block = std::make_unique<TableBlock>(std::move(table), std::move(client), nbytes, row_bytes, owns_table);
  void* address = reinterpret_cast<void*>(block->base);
  c10::DataPtr data_ptr(address, block.release(), &delete_storage_context,
                        c10::Device(c10::DeviceType::PrivateUse1, 0));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            std::move(data_ptr), &host_allocator(),
                                                            /*resizable=*/false));
}

store::ElementType element_type_of(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float: return store::ElementType::Float32;
    case c10::ScalarType::Half: return store::ElementType::Float16;
    case c10::ScalarType::BFloat16: return store::ElementType::BFloat16;
    case c10::ScalarType::Double: return store::ElementType::Float64;
    default: return store::ElementType::Bytes;
  }
}

c10::ScalarType scalar_type_of(store::ElementType type) {
  switch (type) {
    case store::ElementType::Float32: return c10::ScalarType::Float;
    case store::ElementType::Float16: return c10::ScalarType::Half;
    case store::ElementType::BFloat16: return c10::ScalarType::BFloat16;
    case store::ElementType::Float64: return c10::ScalarType::Double;
    case store::ElementType::Bytes: break;
  }
  TORCH_CHECK(false, "recdev: a table of bytes has no torch dtype of its own");
}

c10::Storage make_table_storage(uint64_t nbytes, uint32_t row_bytes, store::ElementType type) {
  TORCH_CHECK(row_bytes > 0 && row_bytes % 4 == 0, "recdev: table rows are whole 4-byte words");
  store::TableConfig config;
  config.num_rows = (nbytes + row_bytes - 1) / row_bytes;
  config.row_words = row_bytes / 4;
  config.dtype = type;
  // A float64 row must be whole elements; a storage whose rows are not is held as bytes.
  if (config.dtype == store::ElementType::Float64 && config.row_words % 2 != 0)
    config.dtype = store::ElementType::Bytes;
  std::shared_ptr<store::StoreClient> client = current_store();
  std::shared_ptr<store::TableHandle> table = client->create_table(config, /*init_stream=*/0);
  try {
    return wrap_table(table, client, nbytes, row_bytes, /*owns_table=*/true);
  } catch (...) {
    client->free_table(*table);
    throw;
  }
}

TableBlock* table_block(const c10::Storage& storage) {
  StorageContext* context = storage_context(storage.data_ptr());
  if (context == nullptr || context->kind != StorageKind::Table) {
    return nullptr;
  }
  return static_cast<TableBlock*>(context);
}

void check_fallback_size(uint64_t nbytes, const std::string& what) {
  const uint64_t limit = max_fallback_bytes();
  TORCH_CHECK(nbytes <= limit, "recdev: ", what, " would move ", nbytes,
              " bytes of a store table to the CPU, more than max_fallback_bytes (", limit,
              "). Look up only the rows you need (weight[ids], F.embedding, index_select), "
              "or raise the limit with torch_recdev.set_max_fallback_bytes().");
}

}  // namespace recdev::device
