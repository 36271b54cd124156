// TableHandle and StoreClient: what the device needs of a table and of a store, wherever the rows
// live — in this process (LocalTable / EmbeddedStoreClient over store::Store, local_store.h), or on
// recdev-server shards (net::RemoteStoreClient, csrc/net/client/remote_store.h).
//
// Every method keeps the meaning, the validation and the error codes of the store::Table method of
// the same name (table.h): an implementation that talks to servers validates ids, offsets and
// gradients before sending, so a bad batch fails with the same StoreError code and changes nothing,
// and reports transport failures as StoreError(Unavailable) naming the server and the operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "declaration.h"
#include "table.h"

namespace recdev::store {

class DeferredTable;
class SyncSteps;

// What the kernels ask of a table before choosing how to call its row path, instead of inferring it
// from the table's type or where its rows live.
struct RowPathTraits {
  // gather_pooled gives what CPU's embedding_bag gives for this table's type. Otherwise the kernel
  // gathers the rows and pools them on CPU (remote half tables: shards would add partial sums in
  // another order than CPU's).
  bool pools_rows = false;
  // update_pooled takes this table's bag gradients. Otherwise the caller expands them to a row per
  // id and sends them through update.
  bool pools_gradients = false;
  // A batch should reach the table in one call: it spreads the batch over its shards or threads
  // itself, or its policy decides each request's touches once (then the backward's update of the
  // lookup's ids is a repeat, table_policy.h). Otherwise a kernel may split a batch over PyTorch's
  // threads, as the table is safe for concurrent readers.
  bool one_request_per_batch = false;
  // send_gather and send_update may return before the work is done, leaving their answers to
  // wait_for_answers (a remote table): a backward pass then waits at its end.
  bool answers_later = false;
  // A backward pass need not wait for send_update's answers: the table's next request reads them and
  // raises a failure among them (a remote table of connect(..., overlap_updates=True)).
  bool updates_answered_by_next_request = false;
};

// The row path: what kernels call on every step.
class TableRowPath {
 public:
  virtual ~TableRowPath() = default;

  virtual RowPathTraits row_path_traits() const = 0;
  // config().num_rows, .row_words (4-byte words of a row) and .dtype, which never change: known without
  // asking any server.
  virtual uint64_t num_rows() const = 0;
  virtual uint32_t row_words() const = 0;
  virtual ElementType dtype() const = 0;

  virtual void gather(const uint64_t* ids, size_t n, float* out) = 0;
  // Like gather, but rows that are not materialized are computed from the init rule and stay
  // unmaterialized (what copies of a table to CPU use).
  virtual void peek(const uint64_t* ids, size_t n, float* out) const = 0;
  virtual void gather_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                             PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                             int64_t padding_idx, const PooledOutput& out, int64_t* max_positions) = 0;
  virtual void write(const uint64_t* ids, size_t n, const float* rows) = 0;
  virtual void read_bytes(uint64_t byte_offset, uint64_t nbytes, void* out) const = 0;
  virtual void write_bytes(uint64_t byte_offset, uint64_t nbytes, const void* data) = 0;
  virtual void check_byte_range(uint64_t byte_offset, uint64_t nbytes) const = 0;
  virtual void exists(const uint64_t* ids, size_t n, uint8_t* out) const = 0;
  virtual void erase(const uint64_t* ids, size_t n) = 0;
  virtual void update(const uint64_t* ids, size_t n, const void* grads) = 0;
  // bag_grads: num_bags rows in the table's type, as update's grads (Table::update_pooled); only
  // where row_path_traits().pools_gradients.
  virtual void update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                             PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                             int64_t padding_idx, const void* bag_grads) = 0;
  virtual uint32_t gather_state(const uint64_t* ids, size_t n, std::vector<float>& out) const = 0;
  // gather, update and update_pooled for a caller that reads the answers later, in
  // wait_for_answers(): lookups of several tables (their requests cross the network together), or a
  // backward pass, whose end waits for every table it updated. A remote table sends the requests and
  // returns (its session's next request reads their answers first; out must stay alive until then);
  // a table in this process does the work now.
  virtual void send_gather(const uint64_t* ids, size_t n, float* out) { gather(ids, n, out); }
  virtual void send_update(const uint64_t* ids, size_t n, const void* grads) { update(ids, n, grads); }
  virtual void send_update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                                  PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                                  int64_t padding_idx, const void* bag_grads) {
    update_pooled(ids, num_ids, offsets, num_bags, mode, per_sample_weights, include_last_offset, padding_idx,
                  bag_grads);
  }
  // Reads the answers of every request sent and throws the first refusal or failure among them.
  virtual void wait_for_answers() {}
};

// Administration: what the bindings and optimizers ask and set, rarely.
class TableAdministration {
 public:
  virtual ~TableAdministration() = default;

  // Unique among the live tables of one StoreClient (diagnostics, not routing).
  virtual uint64_t id() const = 0;
  virtual TableConfig config() const = 0;
  // Whether the rows live in this process (a synchronous fleet's embedded replicas).
  virtual bool in_process() const = 0;
  virtual uint64_t init_stream() const = 0;
  virtual void set_init(const InitRule& rule) = 0;
  virtual TableStats stats() const = 0;

  virtual void set_optimizer(const OptimizerConfig& config) = 0;
  virtual OptimizerConfig optimizer() const = 0;
  // Whether an update has an optimizer to go to (backward asks before each one).
  virtual bool has_optimizer() const { return optimizer().kind != OptimizerKind::None; }
  virtual void set_learning_rate(double lr) = 0;
  virtual uint64_t optimizer_step() const = 0;
  virtual void set_optimizer_step(uint64_t step) = 0;
};

// Budget, eviction and admission (table_policy.h).
class TablePolicies {
 public:
  virtual ~TablePolicies() = default;

  virtual void set_policy(const TablePolicyConfig& config) = 0;
  virtual TablePolicyConfig policy() const = 0;
  // The policy with its touch metadata (nullopt without a policy), and restoring it after the rows
  // were installed (Table::policy_state, restore_policy_state): what torch.save of a table carries.
  virtual std::optional<TablePolicyState> policy_state() const = 0;
  virtual void restore_policy_state(const TablePolicyState& state) = 0;
};

// Whole tables, for torch.save / torch.load and whole-table copies
// (csrc/python/table_serialization.cpp, csrc/device/table_copy.cpp): a point-in-time view
// (Table::scan) written into arrays (torch.save) or copied into a snapshot (copy_, load_state_dict),
// and the rows of a snapshot installed at once.
class TableTransfers {
 public:
  virtual ~TableTransfers() = default;

  virtual void scan_into(const std::function<RowArrays(const TableScanHeader&)>& allocate) const = 0;
  virtual TableSnapshot snapshot() const = 0;
  virtual void install(RowSet& rows, const InitRule& init, uint64_t init_stream, const OptimizerConfig& optimizer,
                       uint64_t optimizer_step) = 0;
};

// A table with every facet, as a StoreClient hands it out.
class TableHandle : public TableRowPath, public TableAdministration, public TablePolicies, public TableTransfers {
 public:
  // Synchronous staging (deferred_table.h): the table whose updates wait for the fleet's exchange,
  // or null for a table that applies its updates.
  virtual DeferredTable* sync_staging() { return nullptr; }
};

class StoreClient {
 public:
  virtual ~StoreClient() = default;

  // A new anonymous table, owned by the caller: freed by free_table, or (remote) when this client's
  // session lease lapses. init_stream as in Store::create_table.
  virtual std::shared_ptr<TableHandle> create_table(const TableConfig& config, std::optional<uint64_t> init_stream) = 0;
  // The named table as declared (Store::declare_table: created if it does not exist, kept if the
  // declaration matches, reset on request; a mismatch is StoreError(InvalidArgument)).
  virtual std::shared_ptr<TableHandle> declare(const std::string& name, const TableDeclaration& declaration) = 0;
  virtual std::optional<std::shared_ptr<TableHandle>> find(const std::string& name) = 0;
  // Frees an anonymous table created by create_table. Must not throw (called from storage deleters):
  // an unreachable server is left to free it when the session lease lapses.
  virtual void free_table(TableHandle& table) noexcept = 0;

  // Every named table with its optimizer state to / from one checkpoint file on this machine, in the
  // format of checkpoint.h. load returns the names loaded.
  virtual void save(const std::string& path) = 0;
  virtual std::vector<std::string> load(const std::string& path) = 0;
  // Incremental checkpoints (checkpoint_versions.h) in a directory on this machine: checkpoint writes
  // the next version of every named table and returns its number; restore loads the newest version
  // (or the one given) and returns it with the names loaded.
  virtual uint64_t checkpoint(const std::string& directory) = 0;
  virtual std::pair<uint64_t, std::vector<std::string>> restore(const std::string& directory,
                                                                std::optional<uint64_t> version) = 0;
  // An export for inference into the same kind of directory: every named table's rows without
  // optimizer state, narrowed to `dtype` if given, as a base version (checkpoint_versions.h's
  // exported); returns its number.
  virtual uint64_t export_tables(const std::string& directory, std::optional<ElementType> dtype) = 0;

  // "embedded", or "remote"; the servers (empty when embedded).
  virtual std::string kind() const = 0;
  virtual std::vector<std::string> servers() const = 0;
  // How long a request waits for a server (nullopt when embedded).
  virtual std::optional<double> timeout_seconds() const { return std::nullopt; }
  // Whether backward leaves its updates' answers to the next request (connect's overlap_updates).
  virtual bool overlaps_updates() const { return false; }
  // Reads the answers of every request sent without waiting for them, and throws a failure of an
  // overlapped update among them (torch.recdev.synchronize()).
  virtual void wait_for_answers() {}
  // Synchronous steps on shards, or null where tables apply their own (the embedded store).
  virtual SyncSteps* sync_steps() { return nullptr; }
};

}  // namespace recdev::store
