// Table: one embedding table of the store — num_rows rows of row_words 4-byte words of weights, in the
// table's element type (element_type.h: float32, float16, bfloat16, float64, or bytes), of which only
// the rows that were touched are held in memory. A row that was never written (or was erased) reads as
// its init value (init_rule.h); reading it through gather materializes it.
//
// Layout of a materialized row's record: [row_words words of weights in the element type | state_words
// words of optimizer state, in the compute type: float32, or float64 for float64 tables].
// New records start with their init value and the optimizer's initial state (optimizer.h; 0 without
// an optimizer).
//
// Optimizer: a table may carry a fused optimizer (set_optimizer); update() then applies gradients to
// rows through it, under each row's sub-shard lock, so concurrent updates of the same rows all apply
// (none is lost) and readers never see a half-updated row. state_words always equals
// optimizer_state_words(optimizer kind, dtype, row_words) once an optimizer was set; a table created with
// state_words > 0 and no optimizer just carries that many zeroed floats per row.
//
// Thread safety: every method may be called concurrently with every other. Rows are spread over
// kNumShards sub-shards (shard_route.h), each guarded by a reader-writer lock; a row is only copied in
// or out under its sub-shard's lock, so no reader sees a torn row and no write is lost. Writing
// batches take each sub-shard's lock once, so a large write blocks readers of one sub-shard at a time,
// for a 1/kNumShards share of the batch, rather than the whole table for all of it. Reading batches
// (gather, peek, gather_pooled) go in batch order instead, a block of about a thousand ids at a time,
// holding the read locks of all the block's sub-shards, so a writer may wait for such a block.
// Whole-table operations (set_init, set_optimizer, install, scan) hold every sub-shard's lock, so
// they are atomic with respect to batches. A large update spreads its sub-shards over the machine's
// cores, each sub-shard updated by one thread under its lock.
//
// Errors: every argument is validated before anything changes, so an error such as an out-of-range id
// anywhere in a batch leaves the table untouched. The exception is StoreError(Full) — memory
// exhausted halfway through a batch — after which the rows already written keep their new values
// (each row is still all or nothing).
//
// Direct index: a table whose ids are dense enough also maps every row id straight to its record
// (direct_index.h), which batch reads use instead of the hash index. It is built by the first batch
// read that finds the table dense enough, and follows every change of where records live below.
//
// Snapshots are point-in-time: every request that changes rows (write, write_bytes, erase, update,
// update_pooled) holds request_mutex_ shared from its first row to its last, and scan / scan_into /
// snapshot hold it exclusively, so a snapshot holds each request wholly or not at all. Whole-table
// changes (set_init, set_optimizer, install) hold every sub-shard's write lock, which excludes a view
// too. Without this, a write taking sub-shard locks one at a time could be seen half applied.
//
// Policy (table_policy.h: budget, eviction, admission): on a table with a policy, every request that
// touches rows holds policy_mutex_ from its first row to its last (so such requests run one at a
// time), lets the policy decide, erases the victims and materializes the admitted rows under their
// sub-shard write locks, then runs as usual on the rows the policy stores. Views hold policy_mutex_
// too, so a snapshot's rows and touch metadata agree. A request on a table without a policy holds
// unpoliced_mutex_ shared instead, and set_policy takes it exclusively to adopt the rows held and
// publish the policy: a request that saw no policy has finished materializing by then, so no row
// escapes the policy's budget.
//
// Disk tier (spill=True, disk_tier.h): the rows the policy evicts go to disk_ instead of away, and a
// row the policy stores again comes back from it. A row is in memory or on disk, never both, and
// moves between the two only under its sub-shard's write lock (victims staged before they are erased,
// rows back materialized before the disk tier forgets them), so a reader that looks in both under the
// read lock (peek, read_bytes, exists, gather_state) finds it in exactly one. Disk reads and the
// write buffer's flush happen in decide(), before the policy applies: a disk that fails refuses the
// request with nothing changed. Views (scan, snapshot) include the disk's rows.
//
// Lock order: policy_mutex_, unpoliced_mutex_, request_mutex_, then sub-shard locks in index order,
// then init_mutex_, then the disk tier's own lock.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "coalesce.h"
#include "direct_index.h"
#include "disk_tier.h"
#include "element_type.h"
#include "embedding_bag.h"
#include "flat_id_map.h"
#include "init_rule.h"
#include "optimizer.h"
#include "row_index.h"
#include "shard_route.h"
#include "table_policy.h"

namespace recdev::store {

struct TableConfig {
  uint64_t num_rows = 0;
  // Weight words (4 bytes) per row: row_words * 4 / element_bytes(dtype) elements.
  uint32_t row_words = 0;
  // Optimizer state per row, kept after the weight in the same record. Follows the optimizer:
  // set_optimizer (and a checkpoint load) change it.
  uint32_t state_words = 0;
  InitRule init;
  ElementType dtype = ElementType::Float32;
};

// The elements of a row: row_words * 4 / element_bytes(dtype).
uint32_t row_elements(const TableConfig& config);
// The optimizer-state words per row of a table of this type and width: the kind's state elements
// (optimizer_state_elements of the row's elements) in the compute type.
uint32_t optimizer_state_words(OptimizerKind kind, ElementType dtype, uint32_t row_words);

bool operator==(const TableConfig& lhs, const TableConfig& rhs);
bool operator!=(const TableConfig& lhs, const TableConfig& rhs);
std::string describe(const TableConfig& config);

// Throws StoreError(OutOfRange) unless [byte_offset, byte_offset + nbytes) lies within the dense
// [num_rows, row_words] float32 view of a table; `table` names it in the message. (128-bit: with sparse
// 64-bit row ids, the dense view can exceed 2^64 bytes.)
void check_dense_byte_range(uint64_t num_rows, uint32_t row_words, uint64_t byte_offset, uint64_t nbytes,
                            const std::string& table);

// Throws StoreError(InvalidArgument) unless row_words >= 1, a record is at most 1 GiB, the init rule is
// valid, the element type is known, a float64 row is whole elements (even row_words) and a bytes table's
// init rule is Zero. Any num_rows is fine: row ids may be sparse 64-bit keys.
void validate_table_config(const TableConfig& config);

struct TableStats {
  uint64_t num_rows;
  uint32_t row_words;
  uint64_t rows;     // materialized rows
  uint64_t bytes;    // all memory the table holds: records, index, sub-shards
  uint64_t reads;    // rows returned by gather, gather_pooled and read_bytes since creation
  uint64_t writes;   // rows written by write and write_bytes since creation
  uint64_t updates;  // rows moved by update since creation (distinct rows per call)
  // With a policy (table_policy.h; bytes then includes its touch metadata and sketch):
  uint64_t evicted = 0;
  uint64_t admitted = 0;
  uint64_t pending = 0;
  // With spill (rows counts both tiers; bytes counts the disk tier's index and write buffer; evicted
  // counts evictions from either: rows the policy moved to disk, and rows past max_disk_bytes dropped):
  uint64_t rows_in_memory = 0;
  uint64_t rows_on_disk = 0;
  uint64_t disk_bytes = 0;       // the disk tier's files
  uint64_t disk_live_bytes = 0;  // the records of the rows on disk
  uint64_t disk_reads = 0;       // rows read back from disk
  uint64_t disk_read_ops = 0;    // blocks read for them (rows spilled together share blocks)
  uint64_t disk_writes = 0;      // rows written to disk
};

// What Table::scan reports before the rows: everything a checkpoint records besides them.
struct TableScanHeader {
  TableConfig config;
  uint64_t init_stream;
  OptimizerConfig optimizer;
  uint64_t optimizer_step;
  uint64_t row_count;
};

// Where scan_into writes a table's rows: row_count ids, and row_count records of row_words + state_words
// floats each.
struct RowArrays {
  uint64_t* ids;
  float* records;
};

// A complete set of rows built off to the side (by a checkpoint load) and then swapped into a table
// at once with Table::install, so that a table is never seen half loaded.
class RowSet {
 public:
  explicit RowSet(uint32_t record_words);
  uint32_t record_words() const { return record_words_; }
  // Adds a row with its whole record (weight and state). Returns false if the row is already there.
  bool insert(uint64_t row_id, const float* record);
  // Adds rows ids[i] with records + i * record_words() for i in [0, n), the sub-shards on several
  // threads for a large n. Returns the position of the first id that repeats an earlier one (the
  // set then holds an unspecified part of the rows), or nullopt.
  std::optional<size_t> insert_all(const uint64_t* ids, const float* records, size_t n);
  // Adds the row or replaces its record (an incremental checkpoint's replay).
  void put(uint64_t row_id, const float* record);
  bool erase(uint64_t row_id);  // whether it was there
  size_t size() const;
  // fn(row_id, record) for every row, in no particular order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const RowIndex& shard : shards_) shard.for_each(fn);
  }

 private:
  friend class Table;
  uint32_t record_words_;
  std::vector<RowIndex> shards_;
};

// A point-in-time copy of a table: its rows, with everything a checkpoint records besides them, ready
// to install() into another table.
struct TableSnapshot {
  TableScanHeader header;
  RowSet rows;
};

// What a table changed since a change chain's previous cut (Table::cut_changes), or all of it: the
// unit of an incremental checkpoint (checkpoint_versions.h).
struct TableCut {
  TableScanHeader header;  // row_count = ids.size()
  // The rows are every row the table holds (the chain's first cut, or the first since a wholesale
  // change); otherwise they are the rows changed since the chain's previous cut, and `erased` the rows
  // dropped since (erased, evicted, or never kept).
  bool whole = false;
  std::vector<uint64_t> ids;
  std::vector<float> records;  // ids.size() x record words: weight, then optimizer state
  std::vector<uint64_t> erased;
  // The policy's config, clocks and sketch, with the touch metadata of `ids` only (in eviction order).
  std::optional<TablePolicyState> policy;
};

class Table {
 public:
  // `init_stream` is the table id fed to fill_row: it decides, with the rule's seed, the random
  // stream of this table's init values (see Store for how it is chosen).
  Table(uint64_t id, uint64_t init_stream, const TableConfig& config);
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  uint64_t id() const { return id_; }
  uint64_t num_rows() const { return num_rows_; }
  uint32_t row_words() const { return row_words_; }
  ElementType dtype() const { return dtype_; }
  TableConfig config() const;
  uint64_t init_stream() const;

  // Makes `rule` the value of every row: drops every materialized row, in time proportional to the
  // memory freed, not to num_rows.
  void set_init(const InitRule& rule);

  // The table as if just created under its id (a declaration's reset=True of the same shape and
  // dtype): every row dropped, the policy removed, the counters zeroed, `rule` and `optimizer`
  // installed with step 0, so that a reset in place leaves what a reset that replaces the table does.
  void reset(const InitRule& rule, const OptimizerConfig& optimizer);

  // out: n * row_words words. Materializes the rows that are not.
  void gather(const uint64_t* ids, size_t n, float* out);

  // Like gather, but a row that is not materialized gives its init value and stays unmaterialized.
  void peek(const uint64_t* ids, size_t n, float* out) const;

  // torch.nn.functional.embedding_bag on the table (see embedding_bag.h): out is num_bags rows of the
  // table's elements, float32 or rounded into the table's half type (PooledOutput); max_positions (Max
  // only, may be null) is as many int64s. Materializes the rows it reads; rows
  // equal to padding_idx are neither read nor materialized. ignore_nan: EmbeddingBag::ignore_nan
  // (then max_positions is required).
  void gather_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags, PoolingMode mode,
                     const float* per_sample_weights, bool include_last_offset, int64_t padding_idx,
                     const PooledOutput& out, int64_t* max_positions, const uint8_t* ignore_nan = nullptr);

  // rows: n * row_words words. With duplicate ids, the last one wins.
  void write(const uint64_t* ids, size_t n, const float* rows);

  // The table seen as a dense [num_rows, row_words] float32 array; a range may start and end anywhere.
  // read_bytes computes the init value of rows that are not materialized without materializing
  // them; write_bytes materializes the rows it writes (a partly written row keeps its init value in
  // the rest).
  void read_bytes(uint64_t byte_offset, uint64_t nbytes, void* out) const;
  void write_bytes(uint64_t byte_offset, uint64_t nbytes, const void* data);
  // Throws StoreError(OutOfRange) unless the range lies within the dense view; for callers that
  // allocate a buffer for the range first.
  void check_byte_range(uint64_t byte_offset, uint64_t nbytes) const;

  // out[i] = 1 if ids[i] is materialized, else 0.
  void exists(const uint64_t* ids, size_t n, uint8_t* out) const;
  // Dematerializes the rows, optimizer state included: the next read gives their init value (and
  // the optimizer's initial state) again.
  void erase(const uint64_t* ids, size_t n);

  TableStats stats() const;
  // stats().bytes, without waiting: while another holds the table's policy lock (a checkpoint
  // writing it, a request under its policy), the bytes of the last count. For memory limits, which
  // must not stall every request behind one table's checkpoint.
  uint64_t memory_bytes() const;
  // The bytes of the direct index (0 while the table has none); also counted by stats().bytes.
  size_t direct_index_bytes() const;

  // ---- Budget, eviction and admission (table_policy.h) ----

  // Sets the policy (an inactive config removes it). The rows held are adopted (in id order) and, if
  // over the new budget, evicted down to it at once; without evict that is StoreError(Full) and the
  // policy stays as it was. Changing the policy keeps the rows' touch metadata.
  void set_policy(const TablePolicyConfig& config);
  // Throws, changing nothing, if an update of these rows could be refused by the policy whatever
  // happens before it (TablePolicy::check_update_fits).
  void check_update_fits(const uint64_t* ids, size_t n) const;
  // Throws, changing nothing, what this request would be refused with by the policy now
  // (TablePolicy::check).
  void check_policy(const uint64_t* ids, size_t n, Touch touch);
  TablePolicyConfig policy() const;
  // Whether the table has a policy now (without taking the policy lock).
  bool has_policy() const { return has_policy_.load(std::memory_order_acquire); }
  // The rows' touch metadata and the policy's clocks and sketch, consistent with the rows, for
  // checkpoints; restore_policy_state installs them after the rows (nullopt if there is no policy).
  std::optional<TablePolicyState> policy_state() const;
  void restore_policy_state(const TablePolicyState& state);

  // ---- Fused optimizer (optimizer.h) ----

  // Attaches or replaces the optimizer (OptimizerKind::None detaches it). Materialized rows keep
  // their weights. When the kind changes, the step restarts at 0 and every materialized row's state
  // is reset to the new optimizer's initial state; when the state width changes, the records are
  // re-laid (time proportional to the rows materialized, holding every sub-shard's lock; the new
  // records are built before the old ones are freed, so memory peaks at twice the table's records).
  // The same kind with other parameters keeps the state and the step.
  void set_optimizer(const OptimizerConfig& config);
  OptimizerConfig optimizer() const;
  // Changes lr only (for LR schedulers); state and step stay. Needs an optimizer that uses lr.
  void set_learning_rate(double lr);
  // The number of update calls since the optimizer kind was set (or the value last set).
  uint64_t optimizer_step() const;
  void set_optimizer_step(uint64_t step);

  // Applies one optimizer step: grads is n * row_words words of the table's element type, row i of it the
  // gradient of row ids[i] (float16 and bfloat16 gradients are widened to float32 exactly, then
  // summed and applied in float32; float64 ones in float64).
  // Duplicate ids are summed first, then every distinct row moves once (rows not materialized are
  // materialized first: the update applies to the init value). A large batch runs on several threads
  // (task_runner.h), the caller's included. Validated before anything changes:
  // ids in range (OutOfRange), an optimizer attached and every gradient (and every summed gradient)
  // finite — a nan or inf is refused with StoreError(InvalidArgument) naming the first bad row, and
  // then no row, no state and not the step changes. Updates run concurrently with each other and
  // with every other batch operation; set_optimizer, set_learning_rate, set_optimizer_step and scan
  // wait for the updates in progress.
  void update(const uint64_t* ids, size_t n, const void* grads);

  // update() with the gradient of an embedding_bag's output (pooled_gradients.h): bag_grads is
  // num_bags * elements values of the table's type, as update()'s gradients are (elements: a row's),
  // and each id of the bags (the layout and arguments of gather_pooled) gets its bag's gradient as
  // the mode scaled it — Sum (times its per-sample weight, if any) or Mean, a scaled share rounded
  // into the table's type on float16 and bfloat16 tables; Max is refused with
  // StoreError(InvalidArgument). float32, float16 and bfloat16 tables (as gather_pooled): float64
  // ones take per-id gradients. Ids equal to padding_idx get none. The same
  // step, bit for bit, as update() with those per-id rows, without writing them out; validated the
  // same way (the bags as gather_pooled validates them, too), and a non-finite gradient names the
  // first id, counted among the ids that get one, whose gradient holds it.
  void update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags, PoolingMode mode,
                     const float* per_sample_weights, bool include_last_offset, int64_t padding_idx,
                     const void* bag_grads);

  // The optimizer state of each row: out is resized to n * state_words words (the returned width),
  // row i the state of ids[i], in the compute type (float64 tables: each value is two words). A row that is not materialized gives the initial state and stays so.
  uint32_t gather_state(const uint64_t* ids, size_t n, std::vector<float>& out) const;

  // ---- Checkpoints ----

  // A point-in-time view of the whole table, for checkpoints: calls on_header once, then on_row for
  // every materialized row (record = weight then state), while holding every sub-shard's read lock
  // and no update is in progress — readers go on, writers and updates wait.
  void scan(const std::function<void(const TableScanHeader&)>& on_header,
            const std::function<void(uint64_t row_id, const float* record)>& on_row) const;

  // The same point-in-time view as scan, written into arrays that allocate(header) returns, in no
  // particular row order: each sub-shard's ids and records are copied chunk by chunk, on several
  // threads for a large table.
  void scan_into(const std::function<RowArrays(const TableScanHeader&)>& allocate) const;

  // The same point-in-time view as scan, copied: each sub-shard's index and records are copied whole
  // (a memory copy, on several threads for a large table) instead of row by row.
  TableSnapshot snapshot() const;

  // ---- Incremental checkpoints ----

  // A point-in-time cut of the table for the change chain `chain` (any nonzero id its writer picks):
  // the rows changed since the chain's previous cut, or every row when the chain has none (its first
  // cut, or the first after a wholesale change: set_init, install, reset, set_policy, an optimizer
  // that re-lays the records). Holds the table's view locks only while it copies the changed rows
  // (and reads those on disk); tracking costs one hash insert per changed row while a chain exists.
  // A table follows at most kMaxChangeChains chains; a new one beyond that drops the one cut longest
  // ago, whose next cut is then whole.
  TableCut cut_changes(uint64_t chain) const;
  // Stops tracking for a chain (its writer failed to record a cut): its next cut is whole.
  void forget_change_chain(uint64_t chain) const;
  static constexpr size_t kMaxChangeChains = 8;

  // Replaces all rows, the init rule, the init stream, the optimizer and its step at once. The rows'
  // records must be row_words + state words, with state = optimizer_state_words(optimizer.kind, dtype, row_words)
  // unless optimizer.kind is None (then any width); state_words becomes that width. The table's old
  // rows are left in `rows`, to be freed by the caller outside the table's locks.
  void install(RowSet& rows, const InitRule& init, uint64_t init_stream, const OptimizerConfig& optimizer,
               uint64_t optimizer_step);

 private:
  enum class MissPolicy { Materialize, ComputeInit };

  // Row id -> the change generation in which the row last changed (cut_changes).
  using ChangedRows = FlatIdMap<uint64_t, 50>;

  struct alignas(64) Shard {  // one cache line apart, so sub-shard locks do not false-share
    mutable std::shared_mutex mutex;
    RowIndex rows;
    ChangedRows changed;  // rows of this sub-shard changed while a change chain exists
  };

  // A block of a batch's rows found in batch order (find_in_batch_order): the read locks of every
  // sub-shard they are in, and each row's record, null if it is not materialized. The records stay
  // valid while the locks are held; the vectors are scratch reused from block to block.
  struct LockedRecords {
    void unlock() {
      for (auto& lock : locks) {
        if (lock.owns_lock()) lock.unlock();
      }
    }
    std::array<std::shared_lock<std::shared_mutex>, kNumShards> locks;
    std::vector<const float*> records;
    std::vector<uint64_t> hashes;
    std::vector<const RowIndex*> index_of_row;
  };

  void check_ids(const uint64_t* ids, size_t n) const;
  // visit(position, record) for every id, record null where the row is not materialized, a sub-shard
  // at a time under its read lock (not in batch order).
  template <class Visit>
  void find_each_read_locked(const uint64_t* ids, size_t n, Visit visit) const {
    const ShardRoute route(ids, n);
    for (size_t s = 0; s < kNumShards; ++s) {
      if (route.begin(s) == route.end(s)) continue;
      const Shard& shard = shards_[s];
      std::shared_lock<std::shared_mutex> lock(shard.mutex);
      for (size_t entry = route.begin(s); entry < route.end(s); ++entry) {
        visit(route.position(entry), shard.rows.find(route.hash(entry)));
      }
    }
  }
  // A request's pass through the policy (see the header comment), held until the request ends: with
  // a policy, policy_mutex_ and (once decide() ran) the decision, whose stored says which of its rows
  // are materialized; without one, unpoliced_mutex_ shared.
  struct PolicyPass {
    std::shared_lock<std::shared_mutex> unpoliced;
    std::unique_lock<std::mutex> lock;
    std::optional<PolicyDecision> decision;
    bool policed() const { return lock.owns_lock(); }
  };
  PolicyPass open_policy_pass();
  // The policy decides the request (policed passes only): victims erased, admitted rows materialized.
  void decide(PolicyPass& pass, const uint64_t* ids, size_t n, Touch touch);
  // With a disk tier: the policy's new config without spill brings every row on disk back into
  // memory (the policy then adopts them and evicts as usual); with spill, the tier is made (or its
  // max_disk_bytes changed). Under policy_mutex_, before the policy changes.
  void configure_disk_tier(const TablePolicyConfig& config);
  void keep_expired_rows_of_request(PolicyDecision& decision);
  // Drops the disk tier's rows (set_init, install, reset); under every sub-shard's write lock.
  void drop_disk_rows();
  // A victim's record to the disk tier, if it has one; under its sub-shard's write lock.
  void spill_row(Shard& shard, uint64_t row_id, uint64_t hash);
  // A new record: the row's record back from disk if `back` has it (the disk tier then forgets it),
  // else its init value and the optimizer's initial state.
  void fill_record(uint64_t row_id, float* record, const RowsReadBack* back) const;
  PolicyPass enter_policy(const uint64_t* ids, size_t n, Touch touch);  // open_policy_pass, then decide
  // The rows this table holds, for a policy without touch metadata; under policy_mutex_.
  HeldRows held_rows() const;
  // update's core behind the policy: drops the gradients of rows the policy does not store.
  template <class G>
  void apply_gradients_with_policy(const uint64_t* ids, size_t n, const G* const* grads, const G* values,
                                   size_t value_count);
  // Erases rows (no checks, request_mutex_ held shared by the caller); erase_row: one, under its
  // sub-shard's write lock.
  // to_disk: victims of the policy, spilled first where the table has a disk tier.
  void erase_rows(const uint64_t* ids, size_t n, bool to_disk = false);
  void erase_row(Shard& shard, uint64_t row_id, uint64_t hash);
  // A policy's decision applied (request_mutex_ held shared): the victims erased, the admitted rows
  // materialized with their init values.
  void evict_and_admit(const std::vector<uint64_t>& victims, const std::vector<uint64_t>& admitted,
                       const RowsReadBack* back);
  // Erases rows the policy evicted outside a request (set_policy, set_optimizer, install), holding
  // request_mutex_ shared; under policy_mutex_.
  void evict_now(const std::vector<uint64_t>& victims);
  std::vector<uint64_t> materialized_ids() const;  // sorted; under every sub-shard's lock
  // Releases the locks `found` held, then read-locks the sub-shards of ids[0, count), in index order,
  // and finds their records; returns whether every row is materialized (no record is null).
  bool find_in_batch_order(const uint64_t* ids, size_t count, LockedRecords& found) const;
  // The unchecked cores of the batch operations; out and rows are dense rows of row_words words at any
  // alignment.
  void read_rows(const uint64_t* ids, size_t n, std::byte* out, MissPolicy policy) const;
  void write_rows(const uint64_t* ids, size_t n, const std::byte* rows);
  // read_rows' misses with a disk tier: each row's weight from disk, or its init value, to out at its
  // position; under the read locks of the rows' sub-shards.
  void read_not_in_memory(const std::vector<uint64_t>& ids, const std::vector<size_t>& at, std::byte* out) const;
  // gather_pooled's fast path for one block of bags: pools straight from the rows, all found first,
  // under the read locks of all their sub-shards. Returns false, writing nothing, if some row is not
  // materialized. block_ids[0, block_count) are the bags' ids but the skipped ones.
  bool pool_in_place(const EmbeddingBag& bag, size_t first_bag, size_t end_bag, const uint64_t* block_ids,
                     size_t block_count, const PooledOutput& out, int64_t* max_positions, LockedRecords& found) const;
  void write_row_part(uint64_t row_id, size_t byte_in_row, size_t nbytes, const std::byte* data);
  // Records that a row's record, presence or place changed, for the change chains; under its
  // sub-shard's write lock.
  void note_changed(Shard& shard, uint64_t row_id) const {
    if (tracking_changes_) shard.changed.insert(row_id, change_generation_);
  }
  // Every change chain dropped (their next cuts are whole); under every sub-shard's write lock.
  void forget_change_chains() const;
  // cut_changes' copies, under lock_for_view: every row; or the rows changed since generation
  // `since` (those gone as erased), dropping what no chain needs any more.
  void cut_whole(TableCut& cut) const;
  void cut_changed(TableCut& cut, uint64_t since, uint64_t prune_upto) const;
  // Requires the sub-shard's write lock.
  float* materialize(Shard& shard, uint64_t row_id, uint64_t hash, const RowsReadBack* back = nullptr) const;
  // Records that a row was materialized; under its sub-shard's write lock.
  void note_materialized(uint64_t row_id, const float* record) const;
  // Builds the direct index if the table has become dense enough for one (takes every sub-shard's
  // lock to do so); drops it once erasures have made it too large for the rows left.
  void build_direct_index_if_worth_it() const;
  void drop_direct_index_unless_worth_keeping();
  // After the rows were replaced wholesale, under every sub-shard's write lock: recounts them and
  // rebuilds the direct index for them, or drops it.
  void reindex_all_rows() const;
  TableStats stats_locked() const;  // stats() under policy_mutex_
  // check_gradients throws unless every gradient is finite (naming the first bad one in batch order);
  // apply_update applies one sub-shard's coalesced gradients under its lock.
  // apply_gradients: update's core, for n ids with their gradient rows; every row's elements are among
  // the value_count at values, which the finite check reads (unless the caller checked them). G is the
  // gradients' element type: float, uint16_t (Float16 and BFloat16 tables) or double.
  template <class G>
  void apply_gradients(const uint64_t* ids, size_t n, const G* const* grads, const G* values, size_t value_count,
                       bool gradients_checked = false);
  // The gradients summed per row, or the refusal of a sum that overflows; apply_coalesced takes one
  // optimizer step with them (request_mutex_ held shared by the caller).
  template <class G>
  CoalescedGradients<G> coalesce_or_refuse(const uint64_t* ids, size_t n, const G* const* grads, size_t threads) const;
  template <class G>
  void apply_coalesced(const CoalescedGradients<G>& coalesced, size_t threads);
  template <class G>
  void check_gradients(const uint64_t* ids, size_t n, const G* const* grads, const G* values, size_t value_count,
                       size_t threads) const;
  template <class G>
  void apply_update(Shard& shard, const std::vector<typename CoalescedGradients<G>::Row>& rows, const RowUpdate& rule);
  // A row's weight words: its init value (rule, stream) in the element type.
  void fill_weight(uint64_t row_id, float* words) const;
  // A new record's state words: the optimizer's initial state in the compute type.
  void fill_state(float* state) const;
  // Throws unless the table has a type the store computes on; `what` names the operation.
  void require_numeric(const char* what) const;
  // Refuses stochastic_rounding unless the rows are float16 or bfloat16.
  void check_stochastic_rounding(const OptimizerConfig& config) const;
  std::vector<std::unique_lock<std::shared_mutex>> lock_all_shards() const;
  // What scan and snapshot hold while they read: request_mutex_ exclusively, so that no request is
  // halfway through its rows and the step matches the rows, and every sub-shard's read lock.
  struct ViewLocks {
    std::unique_lock<std::mutex> policy;
    std::unique_lock<std::shared_mutex> requests;
    std::vector<std::shared_lock<std::shared_mutex>> shards;
  };
  ViewLocks lock_for_view() const;
  TableScanHeader scan_header() const;  // under lock_for_view
  void check_record_words(uint64_t state_words) const;

  const uint64_t id_;
  const uint64_t num_rows_;
  const uint32_t row_words_;
  const ElementType dtype_;
  const uint32_t elements_;  // of a row
  // Written only while holding every sub-shard's write lock and init_mutex_; read under either.
  uint32_t state_words_;
  uint32_t record_words_;
  double initial_state_;  // what new records' state values start at
  InitRule init_;
  uint64_t init_stream_;
  mutable std::mutex init_mutex_;
  // Held shared by each request that changes rows, for all of it, and exclusively by views (scan,
  // snapshot). optimizer_ and step_ change only under it exclusively; update holds it shared (and
  // increments step_ atomically).
  mutable std::shared_mutex request_mutex_;
  OptimizerConfig optimizer_;
  std::atomic<uint64_t> step_{0};
  mutable std::array<Shard, kNumShards> shards_;
  // Changed under every sub-shard's write lock only; its entries under their rows' sub-shard locks.
  mutable DirectIndex direct_;
  // direct_.built(), and the materialized rows: for deciding about the direct index without taking
  // every lock.
  mutable std::atomic<bool> has_direct_index_{false};
  mutable std::atomic<uint64_t> materialized_{0};
  mutable std::mutex policy_mutex_;
  std::shared_mutex unpoliced_mutex_;    // see the header comment
  std::unique_ptr<TablePolicy> policy_;  // under policy_mutex_; null without a policy
  std::atomic<bool> has_policy_{false};  // policy_ != null, read without the lock by requests
  // With spill: changed under policy_mutex_ and every sub-shard's write lock, read under either.
  std::unique_ptr<DiskTier> disk_;
  // Change chains (cut_changes): chain -> the generation of its last cut. Changed under lock_for_view
  // or every sub-shard's write lock; read under any sub-shard lock.
  mutable std::vector<std::pair<uint64_t, uint64_t>> change_chains_;
  mutable bool tracking_changes_ = false;  // !change_chains_.empty()
  mutable uint64_t change_generation_ = 1;
  // Rows whose touch metadata a policed request changed (with no change to their record), under
  // policy_mutex_, while a chain exists.
  mutable ChangedRows policy_changed_;
  mutable std::atomic<uint64_t> last_bytes_{0};  // stats().bytes when last counted (memory_bytes)
  mutable std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> updates_{0};
};

}  // namespace recdev::store
