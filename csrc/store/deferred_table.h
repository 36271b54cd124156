// DeferredTable: a table whose updates wait to be exchanged (synchronous fleets, torch_recdev.optim's
// sync=True). Every other operation goes straight to the table it wraps; update and update_pooled only
// record their per-id gradient rows, in call and batch order, which take() hands over. The caller
// combines every rank's rows for the step and applies them once (through apply() on a replica; on
// shards the shards do it, net/client/sync_step.h), so that N ranks with batch B update the table exactly as
// one process with batch N * B does. float32 tables only (the
// exchange moves float32 rows); sync_table refuses others.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "table_handle.h"

namespace recdev::store {

class DeferredTable final : public TableHandle {
 public:
  explicit DeferredTable(std::shared_ptr<TableHandle> table);

  struct Pending {
    std::vector<uint64_t> ids;
    std::vector<float> grads;  // ids.size() * row_words
  };
  // The rows recorded since the last take, and none left.
  Pending take();
  // Called after each update or update_pooled has recorded its rows (outside the lock, on the
  // recording thread): how apply_optimizer_in_backward(..., sync=True) learns that a backward
  // reached the table, so that the step runs when that backward ends, without a step() call.
  void set_on_record(std::function<void()> hook);
  // Applies rows through the wrapped table's optimizer (one step of it).
  void apply(const uint64_t* ids, size_t n, const float* grads) { table_->update(ids, n, grads); }
  const std::shared_ptr<TableHandle>& wrapped() const { return table_; }

  uint64_t id() const override { return table_->id(); }
  TableConfig config() const override { return table_->config(); }
  uint64_t num_rows() const override { return table_->num_rows(); }
  uint32_t row_words() const override { return table_->row_words(); }
  ElementType dtype() const override { return table_->dtype(); }
  bool in_process() const override { return table_->in_process(); }
  RowPathTraits row_path_traits() const override { return table_->row_path_traits(); }
  DeferredTable* sync_staging() override { return this; }
  uint64_t init_stream() const override { return table_->init_stream(); }
  void set_init(const InitRule& rule) override { table_->set_init(rule); }
  void gather(const uint64_t* ids, size_t n, float* out) override { table_->gather(ids, n, out); }
  void peek(const uint64_t* ids, size_t n, float* out) const override { table_->peek(ids, n, out); }
  void gather_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags, PoolingMode mode,
                     const float* per_sample_weights, bool include_last_offset, int64_t padding_idx,
                     const PooledOutput& out, int64_t* max_positions) override {
    table_->gather_pooled(ids, num_ids, offsets, num_bags, mode, per_sample_weights, include_last_offset, padding_idx,
                          out, max_positions);
  }
  void write(const uint64_t* ids, size_t n, const float* rows) override { table_->write(ids, n, rows); }
  void read_bytes(uint64_t byte_offset, uint64_t nbytes, void* out) const override {
    table_->read_bytes(byte_offset, nbytes, out);
  }
  void write_bytes(uint64_t byte_offset, uint64_t nbytes, const void* data) override {
    table_->write_bytes(byte_offset, nbytes, data);
  }
  void check_byte_range(uint64_t byte_offset, uint64_t nbytes) const override {
    table_->check_byte_range(byte_offset, nbytes);
  }
  void exists(const uint64_t* ids, size_t n, uint8_t* out) const override { table_->exists(ids, n, out); }
  void erase(const uint64_t* ids, size_t n) override { table_->erase(ids, n); }
  TableStats stats() const override { return table_->stats(); }
  void set_policy(const TablePolicyConfig& config) override { table_->set_policy(config); }
  TablePolicyConfig policy() const override { return table_->policy(); }
  std::optional<TablePolicyState> policy_state() const override { return table_->policy_state(); }
  void restore_policy_state(const TablePolicyState& state) override { table_->restore_policy_state(state); }
  void set_optimizer(const OptimizerConfig& config) override { table_->set_optimizer(config); }
  OptimizerConfig optimizer() const override { return table_->optimizer(); }
  void set_learning_rate(double lr) override { table_->set_learning_rate(lr); }
  uint64_t optimizer_step() const override { return table_->optimizer_step(); }
  void set_optimizer_step(uint64_t step) override { table_->set_optimizer_step(step); }
  // grads and bag_grads: float32 rows (the wrapped table is float32).
  void update(const uint64_t* ids, size_t n, const void* grads) override;
  void update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags, PoolingMode mode,
                     const float* per_sample_weights, bool include_last_offset, int64_t padding_idx,
                     const void* bag_grads) override;
  uint32_t gather_state(const uint64_t* ids, size_t n, std::vector<float>& out) const override {
    return table_->gather_state(ids, n, out);
  }
  void scan_into(const std::function<RowArrays(const TableScanHeader&)>& allocate) const override {
    table_->scan_into(allocate);
  }
  TableSnapshot snapshot() const override { return table_->snapshot(); }
  void install(RowSet& rows, const InitRule& init, uint64_t init_stream, const OptimizerConfig& optimizer,
               uint64_t optimizer_step) override {
    table_->install(rows, init, init_stream, optimizer, optimizer_step);
  }

 private:
  void record(const uint64_t* ids, size_t n, const float* const* rows);

  const std::shared_ptr<TableHandle> table_;
  std::mutex mutex_;
  Pending pending_;
  std::function<void()> on_record_;  // guarded by mutex_
};

}  // namespace recdev::store
