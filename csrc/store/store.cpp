#include "store.h"

#include <algorithm>

#include "errors.h"
#include "mix64.h"

namespace recdev::store {
namespace {

// FNV-1a over the name's bytes, then mixed: stable across processes, platforms and builds.
uint64_t name_init_stream(const std::string& name) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (const char c : name) hash = (hash ^ uint8_t(c)) * 0x100000001B3ull;
  return mix64(hash);
}

}  // namespace

uint64_t Store::create_table(const TableConfig& config, std::optional<uint64_t> init_stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_;
  tables_.emplace(id, Entry{std::make_shared<Table>(id, init_stream.value_or(id), config), {}});
  ++next_id_;
  return id;
}

uint64_t Store::create_named_table(const std::string& name, const TableConfig& config) {
  if (name.empty()) throw StoreError(ErrorCode::InvalidArgument, "a named table needs a non-empty name");
  validate_table_config(config);  // first, so an invalid config is reported as such, not as a mismatch
  std::lock_guard<std::mutex> lock(mutex_);
  if (const auto found = ids_by_name_.find(name); found != ids_by_name_.end()) {
    const TableConfig existing = tables_.at(found->second).table->config();
    // state_words is not compared: it follows the table's optimizer, which set_optimizer changes.
    if (existing.num_rows != config.num_rows || existing.row_words != config.row_words ||
        existing.init != config.init || existing.dtype != config.dtype) {
      throw StoreError(ErrorCode::InvalidArgument, "table '" + name + "' already exists with " + describe(existing) +
                                                       ", which differs from the requested " + describe(config));
    }
    return found->second;
  }
  const uint64_t id = next_id_;
  tables_.emplace(id, Entry{std::make_shared<Table>(id, name_init_stream(name), config), name});
  ids_by_name_.emplace(name, id);
  ++next_id_;
  return id;
}

DeclaredTable Store::declare_table(const std::string& name, const TableDeclaration& declaration) {
  if (name.empty()) throw StoreError(ErrorCode::InvalidArgument, "a named table needs a non-empty name");
  TableConfig config = declaration.config;
  config.state_words = 0;
  validate_table_config(config);
  if (declaration.optimizer) validate_optimizer(*declaration.optimizer);
  std::shared_ptr<Table> dropped;  // a replaced table, destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mutex_);
  DeclaredTable result;
  if (const auto found = ids_by_name_.find(name); found != ids_by_name_.end()) {
    const std::shared_ptr<Table>& table = tables_.at(found->second).table;
    const TableConfig existing = table->config();
    if (!declaration.reset) {
      const std::string mismatch = declaration_mismatch(existing, table->optimizer(), declaration);
      if (!mismatch.empty()) throw StoreError(ErrorCode::InvalidArgument, declaration_error(name, mismatch));
      // Same kind: set_optimizer keeps every row's state and the step.
      const std::optional<OptimizerConfig> optimizer = declared_optimizer(declaration, table->optimizer());
      if (optimizer && *optimizer != table->optimizer()) table->set_optimizer(*optimizer);
      result.id = found->second;
      return result;
    }
    // In place only when the rows keep their shape and type, so that other clients' handles stay
    // valid and read what they expect; a handle of another dtype must never see these bytes.
    if (existing.num_rows == config.num_rows && existing.row_words == config.row_words &&
        existing.dtype == config.dtype) {
      // The optimizer as declared, none if none is (a reset makes the table as declared), as for a
      // reset that replaces the table below.
      table->reset(declaration.declares_init ? config.init : existing.init,
                   declared_optimizer(declaration, table->optimizer()).value_or(OptimizerConfig{}));
      result.id = found->second;
      return result;
    }
    result.replaced = found->second;
    dropped = std::move(tables_.at(found->second).table);
    tables_.erase(found->second);
    ids_by_name_.erase(found);
  }
  const uint64_t id = next_id_;
  auto table = std::make_shared<Table>(id, name_init_stream(name), config);
  if (declaration.optimizer) table->set_optimizer(*declaration.optimizer);
  tables_.emplace(id, Entry{std::move(table), name});
  ids_by_name_.emplace(name, id);
  ++next_id_;
  result.id = id;
  result.created = true;
  return result;
}

std::shared_ptr<Table> Store::table(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = tables_.find(id);
  if (found == tables_.end()) throw StoreError(ErrorCode::NotFound, "no table with id " + std::to_string(id));
  return found->second.table;
}

void Store::free_table(uint64_t id) {
  std::shared_ptr<Table> freed;  // destroyed after the lock is released: freeing rows takes time
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = tables_.find(id);
  if (found == tables_.end()) throw StoreError(ErrorCode::NotFound, "no table with id " + std::to_string(id));
  freed = std::move(found->second.table);
  if (!found->second.name.empty()) ids_by_name_.erase(found->second.name);
  tables_.erase(found);
}

std::optional<uint64_t> Store::find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = ids_by_name_.find(name);
  if (found == ids_by_name_.end()) return std::nullopt;
  return found->second;
}

std::vector<TableInfo> Store::list() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TableInfo> infos;
  infos.reserve(tables_.size());
  for (const auto& [id, entry] : tables_) infos.push_back(TableInfo{id, entry.name});
  return infos;
}

std::vector<std::pair<std::string, std::shared_ptr<Table>>> Store::named_tables() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, std::shared_ptr<Table>>> named;
  named.reserve(ids_by_name_.size());
  for (const auto& [name, id] : ids_by_name_) named.emplace_back(name, tables_.at(id).table);
  std::sort(named.begin(), named.end(), [](const auto& lhs, const auto& rhs) { return lhs.first < rhs.first; });
  return named;
}

}  // namespace recdev::store
