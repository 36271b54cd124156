// The embedded store behind the TableHandle / StoreClient contract (table_handle.h): LocalTable is a
// store::Table of this process, EmbeddedStoreClient a store::Store of this process. Every call goes
// straight to the store engine, so the embedded store behaves exactly as the engine does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "store.h"
#include "table_handle.h"

namespace recdev::store {

class LocalTable final : public TableHandle {
 public:
  explicit LocalTable(std::shared_ptr<Table> table);

  uint64_t id() const override;
  TableConfig config() const override;
  uint64_t num_rows() const override { return table_->num_rows(); }
  uint32_t row_words() const override { return table_->row_words(); }
  bool in_process() const override { return true; }
  // Pools and takes bag gradients of every type it computes in float32, rounding as CPU does; one
  // request per batch only under a policy (otherwise kernels may split a batch over threads).
  RowPathTraits row_path_traits() const override {
    const bool pools = computes_in_float32(table_->dtype());
    return RowPathTraits{pools, pools, table_->has_policy()};
  }
  uint64_t init_stream() const override;

  void set_init(const InitRule& rule) override;
  void gather(const uint64_t* ids, size_t n, float* out) override;
  void peek(const uint64_t* ids, size_t n, float* out) const override;
  void gather_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags, PoolingMode mode,
                     const float* per_sample_weights, bool include_last_offset, int64_t padding_idx,
                     const PooledOutput& out, int64_t* max_positions) override;
  void write(const uint64_t* ids, size_t n, const float* rows) override;
  void read_bytes(uint64_t byte_offset, uint64_t nbytes, void* out) const override;
  void write_bytes(uint64_t byte_offset, uint64_t nbytes, const void* data) override;
  void check_byte_range(uint64_t byte_offset, uint64_t nbytes) const override;
  void exists(const uint64_t* ids, size_t n, uint8_t* out) const override;
  void erase(const uint64_t* ids, size_t n) override;
  TableStats stats() const override;
  void set_policy(const TablePolicyConfig& config) override;
  TablePolicyConfig policy() const override;
  std::optional<TablePolicyState> policy_state() const override;
  void restore_policy_state(const TablePolicyState& state) override;

  void set_optimizer(const OptimizerConfig& config) override;
  OptimizerConfig optimizer() const override;
  void set_learning_rate(double lr) override;
  uint64_t optimizer_step() const override;
  void set_optimizer_step(uint64_t step) override;
  ElementType dtype() const override { return table_->dtype(); }
  void update(const uint64_t* ids, size_t n, const void* grads) override;
  void update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags, PoolingMode mode,
                     const float* per_sample_weights, bool include_last_offset, int64_t padding_idx,
                     const void* bag_grads) override;
  uint32_t gather_state(const uint64_t* ids, size_t n, std::vector<float>& out) const override;
  void scan_into(const std::function<RowArrays(const TableScanHeader&)>& allocate) const override;
  TableSnapshot snapshot() const override;
  void install(RowSet& rows, const InitRule& init, uint64_t init_stream, const OptimizerConfig& optimizer,
               uint64_t optimizer_step) override;

 private:
  const std::shared_ptr<Table> table_;
};

class EmbeddedStoreClient final : public StoreClient {
 public:
  std::shared_ptr<TableHandle> create_table(const TableConfig& config, std::optional<uint64_t> init_stream) override;
  std::shared_ptr<TableHandle> declare(const std::string& name, const TableDeclaration& declaration) override;
  std::optional<std::shared_ptr<TableHandle>> find(const std::string& name) override;
  void free_table(TableHandle& table) noexcept override;

  void save(const std::string& path) override;
  std::vector<std::string> load(const std::string& path) override;
  uint64_t checkpoint(const std::string& directory) override;
  std::pair<uint64_t, std::vector<std::string>> restore(const std::string& directory,
                                                        std::optional<uint64_t> version) override;
  uint64_t export_tables(const std::string& directory, std::optional<ElementType> dtype) override;

  std::string kind() const override;
  std::vector<std::string> servers() const override;

 private:
  Store store_;
};

}  // namespace recdev::store
