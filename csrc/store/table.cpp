// Table's configuration, construction, row materialization, the direct index, erase and stats.
#include "table.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "errors.h"
#include "id_check.h"
#include "table_internals.h"
#include "task_runner.h"

namespace recdev::store {
namespace {

// A record of at most 1 GiB keeps every size computation far from overflow.
constexpr uint64_t kMaxRecordWords = uint64_t{1} << 28;

}  // namespace

uint32_t row_elements(const TableConfig& config) {
  return uint32_t(uint64_t{config.row_words} * 4 / element_bytes(config.dtype));
}

uint32_t optimizer_state_words(OptimizerKind kind, ElementType dtype, uint32_t row_words) {
  const uint64_t elements = uint64_t{row_words} * 4 / element_bytes(dtype);
  const uint64_t state = optimizer_state_elements(kind, uint32_t(elements));
  return uint32_t(state * compute_bytes(dtype) / 4);
}

bool operator==(const TableConfig& lhs, const TableConfig& rhs) {
  return lhs.num_rows == rhs.num_rows && lhs.row_words == rhs.row_words && lhs.state_words == rhs.state_words &&
         lhs.init == rhs.init && lhs.dtype == rhs.dtype;
}

bool operator!=(const TableConfig& lhs, const TableConfig& rhs) { return !(lhs == rhs); }

std::string describe(const TableConfig& config) {
  return "TableConfig(num_rows=" + std::to_string(config.num_rows) + ", dim=" + std::to_string(config.row_words) +
         ", state_words=" + std::to_string(config.state_words) + ", init=" + describe(config.init) +
         ", dtype=" + describe(config.dtype) + ")";
}

void validate_table_config(const TableConfig& config) {
  const auto invalid = [&](const std::string& problem) {
    throw StoreError(ErrorCode::InvalidArgument, "invalid " + describe(config) + ": " + problem);
  };
  if (config.row_words == 0) invalid("dim must be at least 1");
  validate_element_type(uint8_t(config.dtype));
  if (config.dtype == ElementType::Float64 && config.row_words % 2 != 0) {
    invalid("a float64 row is whole 8-byte elements: dim (in 4-byte words) must be even");
  }
  if (config.dtype == ElementType::Bytes && config.init.kind != InitKind::Zero) {
    invalid(
        "a table of bytes (a non-floating dtype) can only start at zero: the store does not compute "
        "values of its type");
  }
  if (uint64_t{config.row_words} + config.state_words > kMaxRecordWords) {
    invalid("dim + state_words must be at most " + std::to_string(kMaxRecordWords));
  }
  validate_init_rule(config.init);
}

Table::Table(uint64_t id, uint64_t init_stream, const TableConfig& config)
    : id_(id),
      num_rows_(config.num_rows),
      row_words_(config.row_words),
      dtype_(config.dtype),
      elements_(row_elements(config)),
      state_words_(config.state_words),
      record_words_(config.row_words + config.state_words),
      initial_state_(0.0),
      init_(config.init),
      init_stream_(init_stream) {
  validate_table_config(config);
  for (Shard& shard : shards_) shard.rows = RowIndex(record_words_);
}

TableConfig Table::config() const {
  std::lock_guard<std::mutex> lock(init_mutex_);
  return TableConfig{num_rows_, row_words_, state_words_, init_, dtype_};
}

uint64_t Table::init_stream() const {
  std::lock_guard<std::mutex> lock(init_mutex_);
  return init_stream_;
}

void Table::check_ids(const uint64_t* ids, size_t n) const {
  if (all_ids_below(ids, n, num_rows_)) return;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] >= num_rows_) {
      throw StoreError(ErrorCode::OutOfRange, "row id " + std::to_string(ids[i]) + " (ids[" + std::to_string(i) +
                                                  "]) is out of range [0, " + std::to_string(num_rows_) +
                                                  ") of table " + std::to_string(id_));
    }
  }
}

void check_dense_byte_range(uint64_t num_rows, uint32_t row_words, uint64_t byte_offset, uint64_t nbytes,
                            const std::string& table) {
  using uint128 = unsigned __int128;
  const uint128 table_bytes = uint128{num_rows} * row_words * sizeof(float);
  if (uint128{byte_offset} + nbytes > table_bytes) {
    throw StoreError(ErrorCode::OutOfRange, "byte range [" + std::to_string(byte_offset) + ", " +
                                                std::to_string(byte_offset) + " + " + std::to_string(nbytes) +
                                                ") is outside " + table + " of " + std::to_string(num_rows) +
                                                " rows of " + std::to_string(row_words * sizeof(float)) + " bytes");
  }
}

void Table::check_byte_range(uint64_t byte_offset, uint64_t nbytes) const {
  check_dense_byte_range(num_rows_, row_words_, byte_offset, nbytes, "table " + std::to_string(id_));
}

float* Table::materialize(Shard& shard, uint64_t row_id, uint64_t hash, const RowsReadBack* back) const {
  const auto [record, created] = shard.rows.find_or_insert(row_id, hash);
  if (created) {
    fill_record(row_id, record, back);
    note_materialized(row_id, record);
    note_changed(shard, row_id);
  }
  return record;
}

void Table::fill_record(uint64_t row_id, float* record, const RowsReadBack* back) const {
  if (const float* saved = back != nullptr ? back->find(row_id) : nullptr) {
    std::memcpy(record, saved, size_t{record_words_} * sizeof(float));
    disk_->forget(row_id);
    return;
  }
  fill_weight(row_id, record);
  fill_state(record + row_words_);
}

void Table::fill_weight(uint64_t row_id, float* words) const {
  if (dtype_ == ElementType::Float32) {
    fill_row(init_, init_stream_, row_id, row_words_, num_rows_, words);
    return;
  }
  // Other types take the float32 init values of a row of their element count, converted: rounded
  // once for half types, widened exactly for float64.
  thread_local std::vector<float> values;
  values.resize(elements_);
  fill_row(init_, init_stream_, row_id, elements_, num_rows_, values.data());
  store_init_values(dtype_, values.data(), words, elements_);
}

void Table::fill_state(float* state) const {
  fill_state_words(dtype_, state, record_words_ - row_words_, initial_state_);
}

void Table::require_numeric(const char* what) const {
  if (is_numeric(dtype_)) return;
  throw StoreError(ErrorCode::InvalidArgument,
                   std::string(what) + " of table " + std::to_string(id_) +
                       " refused: its rows are of a non-floating dtype, which the store holds as bytes and "
                       "cannot compute on; only float32, float16, bfloat16 and float64 tables can be trained "
                       "or pooled");
}

void Table::note_materialized(uint64_t row_id, const float* record) const {
  materialized_.fetch_add(1, std::memory_order_relaxed);
  if (direct_.built()) direct_.set(row_id, record);
}

void Table::build_direct_index_if_worth_it() const {
  const size_t weight_bytes = size_t{row_words_} * sizeof(float);
  if (has_direct_index_.load(std::memory_order_relaxed) ||
      !DirectIndex::worth_building(num_rows_, materialized_.load(std::memory_order_relaxed), weight_bytes)) {
    return;
  }
  const auto locks = lock_all_shards();
  if (!direct_.built()) reindex_all_rows();
}

void Table::drop_direct_index_unless_worth_keeping() {
  const size_t weight_bytes = size_t{row_words_} * sizeof(float);
  if (!has_direct_index_.load(std::memory_order_relaxed) ||
      DirectIndex::worth_keeping(num_rows_, materialized_.load(std::memory_order_relaxed), weight_bytes)) {
    return;
  }
  const auto locks = lock_all_shards();
  reindex_all_rows();
}

void Table::reindex_all_rows() const {
  uint64_t rows = 0;
  for (const Shard& shard : shards_) rows += shard.rows.size();
  materialized_.store(rows, std::memory_order_relaxed);
  const size_t weight_bytes = size_t{row_words_} * sizeof(float);
  const bool wanted = direct_.built() ? DirectIndex::worth_keeping(num_rows_, rows, weight_bytes)
                                      : DirectIndex::worth_building(num_rows_, rows, weight_bytes);
  direct_.drop();  // before building anew, so that memory never holds two
  if (wanted) {
    try {
      direct_.build(num_rows_);
      for (const Shard& shard : shards_) {
        shard.rows.for_each([&](uint64_t row_id, const float* record) { direct_.set(row_id, record); });
      }
    } catch (const std::bad_alloc&) {
      // Only an accelerator: the hash index serves every lookup without it.
      direct_.drop();
    }
  }
  has_direct_index_.store(direct_.built(), std::memory_order_relaxed);
}

void Table::exists(const uint64_t* ids, size_t n, uint8_t* out) const {
  check_ids(ids, n);
  find_each_read_locked(ids, n, [&](size_t position, const float* record) {
    out[position] = record != nullptr || (disk_ && disk_->contains(ids[position]));
  });
}

void Table::erase(const uint64_t* ids, size_t n) {
  check_ids(ids, n);
  std::unique_lock<std::mutex> policy_lock(policy_mutex_);
  if (policy_) policy_->forget(ids, n);
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  erase_rows(ids, n);
  if (disk_) {
    for (size_t i = 0; i < n; ++i) disk_->forget(ids[i]);
  }
}

void Table::erase_rows(const uint64_t* ids, size_t n, bool to_disk) {
  const ShardRoute route(ids, n);
  // Sub-shards on several threads for many rows: a policy evicts as many rows per request as it admits.
  run_tasks(kNumShards, threads_for(n, kMaterializeRowsPerThread), [&](size_t s) {
    if (route.begin(s) == route.end(s)) return;
    Shard& shard = shards_[s];
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    for (size_t entry = route.begin(s); entry < route.end(s); ++entry) {
      if (to_disk && disk_) spill_row(shard, ids[route.position(entry)], route.hash(entry));
      erase_row(shard, ids[route.position(entry)], route.hash(entry));
    }
  });
  drop_direct_index_unless_worth_keeping();
}

void Table::spill_row(Shard& shard, uint64_t row_id, uint64_t hash) {
  if (const float* record = shard.rows.find(hash)) disk_->stage(row_id, record);
}

void Table::erase_row(Shard& shard, uint64_t row_id, uint64_t hash) {
  const RowIndex::Erased erased = shard.rows.erase(row_id, hash);
  if (!erased.found) return;
  note_changed(shard, row_id);
  materialized_.fetch_sub(1, std::memory_order_relaxed);
  if (direct_.built()) {
    direct_.set(row_id, nullptr);
    if (erased.moved_record != nullptr) direct_.set(erased.moved_id, erased.moved_record);
  }
}

TableStats Table::stats() const {
  // Held while the sub-shards are counted: a request under a policy evicts in one sub-shard and
  // admits in another, and a count between the two would see the budget exceeded.
  std::lock_guard<std::mutex> policy_lock(policy_mutex_);
  return stats_locked();
}

uint64_t Table::memory_bytes() const {
  std::unique_lock<std::mutex> policy_lock(policy_mutex_, std::try_to_lock);
  // Held by a view (a checkpoint's whole file write) or a policed request: the last count stands.
  // A view adds no rows, and a request's growth is the caller's to reserve.
  if (!policy_lock.owns_lock()) return last_bytes_.load(std::memory_order_relaxed);
  return stats_locked().bytes;
}

TableStats Table::stats_locked() const {
  PolicyStats policy;
  if (policy_) policy = policy_->stats();
  TableStats stats{num_rows_,
                   row_words_,
                   0,
                   sizeof(Table),
                   reads_.load(std::memory_order_relaxed),
                   writes_.load(std::memory_order_relaxed),
                   updates_.load(std::memory_order_relaxed)};
  for (const Shard& shard : shards_) {
    std::shared_lock<std::shared_mutex> lock(shard.mutex);
    stats.rows += shard.rows.size();
    stats.bytes += shard.rows.bytes();
  }
  stats.bytes += direct_index_bytes() + policy.bytes;
  stats.rows_in_memory = stats.rows;
  stats.evicted = policy.evicted;
  if (disk_) {
    const DiskTierStats disk = disk_->stats();
    stats.rows += disk.rows;
    stats.rows_on_disk = disk.rows;
    stats.bytes += disk.memory_bytes;
    stats.disk_bytes = disk.file_bytes;
    stats.disk_live_bytes = disk.live_bytes;
    stats.disk_reads = disk.reads;
    stats.disk_read_ops = disk.read_ops;
    stats.disk_writes = disk.writes;
    stats.evicted += disk.dropped;  // evictions from either tier
  }
  stats.admitted = policy.admitted;
  stats.pending = policy.pending;
  last_bytes_.store(stats.bytes, std::memory_order_relaxed);
  return stats;
}

size_t Table::direct_index_bytes() const {
  std::shared_lock<std::shared_mutex> lock(shards_[0].mutex);  // any one: it changes under all of them
  return direct_.bytes();
}

std::vector<std::unique_lock<std::shared_mutex>> Table::lock_all_shards() const {
  // Sub-shard locks are always taken in index order (here and in scan), so whole-table operations
  // cannot deadlock with each other; batch operations hold one sub-shard lock at a time.
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  locks.reserve(kNumShards);
  for (Shard& shard : shards_) locks.emplace_back(shard.mutex);
  return locks;
}

void Table::check_record_words(uint64_t state_words) const {
  if (uint64_t{row_words_} + state_words > kMaxRecordWords) {
    throw StoreError(ErrorCode::InvalidArgument, "table " + std::to_string(id_) + " of " + std::to_string(row_words_) +
                                                     "-word rows" + " cannot hold " + std::to_string(state_words) +
                                                     " optimizer-state words per row: a record is at most " +
                                                     std::to_string(kMaxRecordWords) + " words (4 bytes each)");
  }
}

}  // namespace recdev::store
