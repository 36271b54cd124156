#include "deferred_table.h"

#include <algorithm>
#include <string>

#include "embedding_bag.h"
#include "errors.h"
#include "pooled_gradients.h"

namespace recdev::store {

DeferredTable::DeferredTable(std::shared_ptr<TableHandle> table) : table_(std::move(table)) {}

DeferredTable::Pending DeferredTable::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  Pending taken = std::move(pending_);
  pending_ = Pending{};
  return taken;
}

void DeferredTable::record(const uint64_t* ids, size_t n, const float* const* rows) {
  const size_t dim = table_->row_words();
  const uint64_t num_rows = table_->num_rows();
  for (size_t i = 0; i < n; ++i) {
    // Checked now, as the wrapped table's update would: a bad id must fail in this backward.
    if (ids[i] >= num_rows) {
      throw StoreError(ErrorCode::OutOfRange, "row id " + std::to_string(ids[i]) + " is out of range for a table of " +
                                                  std::to_string(num_rows) + " rows");
    }
  }
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.ids.insert(pending_.ids.end(), ids, ids + n);
    const size_t start = pending_.grads.size();
    pending_.grads.resize(start + n * dim);
    for (size_t i = 0; i < n; ++i) std::copy(rows[i], rows[i] + dim, pending_.grads.data() + start + i * dim);
    hook = on_record_;
  }
  if (hook) hook();
}

void DeferredTable::set_on_record(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_record_ = std::move(hook);
}

void DeferredTable::update(const uint64_t* ids, size_t n, const void* grads) {
  const float* values = static_cast<const float*>(grads);
  std::vector<const float*> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = values + i * size_t{table_->row_words()};
  record(ids, n, rows.data());
}

void DeferredTable::update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                                  PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                                  int64_t padding_idx, const void* bag_grads) {
  const EmbeddingBag bag{ids, num_ids, offsets, num_bags, include_last_offset, mode, per_sample_weights, padding_idx};
  validate_embedding_bag(bag, table_->num_rows());
  const PooledGradients<float> gradients(bag, static_cast<const float*>(bag_grads), table_->row_words(),
                                         ElementType::Float32);
  record(gradients.ids(), gradients.size(), gradients.rows());
}

}  // namespace recdev::store
