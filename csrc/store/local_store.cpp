#include "local_store.h"

#include "checkpoint.h"
#include "checkpoint_versions.h"
#include "errors.h"

namespace recdev::store {

LocalTable::LocalTable(std::shared_ptr<Table> table) : table_(std::move(table)) {}

uint64_t LocalTable::id() const { return table_->id(); }
TableConfig LocalTable::config() const { return table_->config(); }
uint64_t LocalTable::init_stream() const { return table_->init_stream(); }

void LocalTable::set_init(const InitRule& rule) { table_->set_init(rule); }

void LocalTable::gather(const uint64_t* ids, size_t n, float* out) { table_->gather(ids, n, out); }

void LocalTable::peek(const uint64_t* ids, size_t n, float* out) const { table_->peek(ids, n, out); }

void LocalTable::gather_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                               PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                               int64_t padding_idx, const PooledOutput& out, int64_t* max_positions) {
  table_->gather_pooled(ids, num_ids, offsets, num_bags, mode, per_sample_weights, include_last_offset, padding_idx,
                        out, max_positions);
}

void LocalTable::write(const uint64_t* ids, size_t n, const float* rows) { table_->write(ids, n, rows); }

void LocalTable::read_bytes(uint64_t byte_offset, uint64_t nbytes, void* out) const {
  table_->read_bytes(byte_offset, nbytes, out);
}

void LocalTable::write_bytes(uint64_t byte_offset, uint64_t nbytes, const void* data) {
  table_->write_bytes(byte_offset, nbytes, data);
}

void LocalTable::check_byte_range(uint64_t byte_offset, uint64_t nbytes) const {
  table_->check_byte_range(byte_offset, nbytes);
}

void LocalTable::exists(const uint64_t* ids, size_t n, uint8_t* out) const { table_->exists(ids, n, out); }
void LocalTable::erase(const uint64_t* ids, size_t n) { table_->erase(ids, n); }
TableStats LocalTable::stats() const { return table_->stats(); }
void LocalTable::set_policy(const TablePolicyConfig& config) { table_->set_policy(config); }
TablePolicyConfig LocalTable::policy() const { return table_->policy(); }
std::optional<TablePolicyState> LocalTable::policy_state() const { return table_->policy_state(); }
void LocalTable::restore_policy_state(const TablePolicyState& state) { table_->restore_policy_state(state); }

void LocalTable::set_optimizer(const OptimizerConfig& config) { table_->set_optimizer(config); }
OptimizerConfig LocalTable::optimizer() const { return table_->optimizer(); }
void LocalTable::set_learning_rate(double lr) { table_->set_learning_rate(lr); }
uint64_t LocalTable::optimizer_step() const { return table_->optimizer_step(); }
void LocalTable::set_optimizer_step(uint64_t step) { table_->set_optimizer_step(step); }
void LocalTable::update(const uint64_t* ids, size_t n, const void* grads) { table_->update(ids, n, grads); }

void LocalTable::update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                               PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                               int64_t padding_idx, const void* bag_grads) {
  table_->update_pooled(ids, num_ids, offsets, num_bags, mode, per_sample_weights, include_last_offset, padding_idx,
                        bag_grads);
}

void LocalTable::scan_into(const std::function<RowArrays(const TableScanHeader&)>& allocate) const {
  table_->scan_into(allocate);
}

TableSnapshot LocalTable::snapshot() const { return table_->snapshot(); }

void LocalTable::install(RowSet& rows, const InitRule& init, uint64_t init_stream, const OptimizerConfig& optimizer,
                         uint64_t optimizer_step) {
  table_->install(rows, init, init_stream, optimizer, optimizer_step);
}

uint32_t LocalTable::gather_state(const uint64_t* ids, size_t n, std::vector<float>& out) const {
  return table_->gather_state(ids, n, out);
}

std::shared_ptr<TableHandle> EmbeddedStoreClient::create_table(const TableConfig& config,
                                                               std::optional<uint64_t> init_stream) {
  const uint64_t id = store_.create_table(config, init_stream);
  return std::make_shared<LocalTable>(store_.table(id));
}

std::shared_ptr<TableHandle> EmbeddedStoreClient::declare(const std::string& name,
                                                          const TableDeclaration& declaration) {
  return std::make_shared<LocalTable>(store_.table(store_.declare_table(name, declaration).id));
}

std::optional<std::shared_ptr<TableHandle>> EmbeddedStoreClient::find(const std::string& name) {
  const std::optional<uint64_t> id = store_.find(name);
  if (!id) return std::nullopt;
  return std::make_shared<LocalTable>(store_.table(*id));
}

void EmbeddedStoreClient::free_table(TableHandle& table) noexcept {
  try {
    store_.free_table(table.id());
  } catch (const StoreError&) {
    // Already freed: nothing is left to release.
  }
}

void EmbeddedStoreClient::save(const std::string& path) { save_store(path, store_); }
std::vector<std::string> EmbeddedStoreClient::load(const std::string& path) { return load_store(path, store_); }
uint64_t EmbeddedStoreClient::checkpoint(const std::string& directory) {
  return checkpoint_store_version(directory, store_).version;
}
std::pair<uint64_t, std::vector<std::string>> EmbeddedStoreClient::restore(const std::string& directory,
                                                                           std::optional<uint64_t> version) {
  return restore_version(directory, version, store_);
}
uint64_t EmbeddedStoreClient::export_tables(const std::string& directory, std::optional<ElementType> dtype) {
  return export_store_version(directory, store_, dtype).version;
}

std::string EmbeddedStoreClient::kind() const { return "embedded"; }
std::vector<std::string> EmbeddedStoreClient::servers() const { return {}; }

}  // namespace recdev::store
