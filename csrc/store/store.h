// Store: the tables of one store (one process, or one shard of a remote store), by id and by name.
//
// Table ids start at 1 (0 never names a table) and are never reused within a Store.
// Init streams: an anonymous table's init values are drawn with its id as the Philox table id; a
// named table's with a hash of its name, so that every shard of a remote store, and the same store
// after a restart, compute the same init values for the same named table.
// Thread-safe; a table stays usable through a shared_ptr obtained before it was freed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "declaration.h"
#include "table.h"

namespace recdev::store {

// What Store::declare_table did: the table's id, whether it was made now, and the id of a table the
// declaration replaced (reset=True with another shape), which no longer exists.
struct DeclaredTable {
  uint64_t id = 0;
  bool created = false;
  std::optional<uint64_t> replaced;
};

struct TableInfo {
  uint64_t id;
  std::string name;  // empty for an anonymous table
};

class Store {
 public:
  // init_stream defaults to the new table's id. A caller whose init rules
  // already carry a seed unique to the table (the device, which draws one per
  // init op from torch's generator) passes a fixed stream instead, so that the
  // same seed gives the same table whatever tables were created before.
  uint64_t create_table(const TableConfig& config, std::optional<uint64_t> init_stream = std::nullopt);
  // Returns the id of the table named `name`, creating it if there is none. An existing table must
  // have config's num_rows, row_words and init rule, else StoreError(InvalidArgument); its state_words is
  // not compared, since it follows the table's optimizer (Table::set_optimizer), which another client
  // may have attached since.
  uint64_t create_named_table(const std::string& name, const TableConfig& config);

  // The named table as declared (declaration.h), atomically: created with the declared init rule and
  // optimizer if there is none; else kept with its rows and optimizer state when the declaration
  // matches it (a declared optimizer's hyperparameters are applied), StoreError(InvalidArgument)
  // naming every difference when not; with reset, its rows and optimizer state dropped (same shape:
  // in place, same id; another shape: a new table replaces it under the name).
  DeclaredTable declare_table(const std::string& name, const TableDeclaration& declaration);

  // StoreError(NotFound) for an id that names no table.
  std::shared_ptr<Table> table(uint64_t id) const;
  void free_table(uint64_t id);
  std::optional<uint64_t> find(const std::string& name) const;
  std::vector<TableInfo> list() const;  // by id
  // The named tables, by name, as one consistent snapshot (what a store checkpoint holds).
  std::vector<std::pair<std::string, std::shared_ptr<Table>>> named_tables() const;

 private:
  struct Entry {
    std::shared_ptr<Table> table;
    std::string name;
  };

  mutable std::mutex mutex_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Entry> tables_;
  std::unordered_map<std::string, uint64_t> ids_by_name_;
};

}  // namespace recdev::store
