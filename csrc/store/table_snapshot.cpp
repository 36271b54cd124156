// Table's point-in-time views (scan, scan_into, snapshot) and wholesale changes (set_init, reset, install).
#include "table.h"

#include <algorithm>
#include <cstring>

#include "errors.h"
#include "row_copier.h"
#include "table_internals.h"
#include "task_runner.h"

namespace recdev::store {
namespace {

// Rows per thread of a snapshot's copy: a memory copy, worth a thread only for a large table.
constexpr size_t kCopyRowsPerThread = 65536;

}  // namespace

RowSet::RowSet(uint32_t record_words) : record_words_(record_words) {
  shards_.reserve(kNumShards);
  for (size_t shard = 0; shard < kNumShards; ++shard) shards_.emplace_back(record_words);
}

bool RowSet::insert(uint64_t row_id, const float* record) {
  const uint64_t hash = hash_row_id(row_id);
  const auto [floats, created] = shards_[shard_of(hash)].find_or_insert(row_id, hash);
  if (created) std::memcpy(floats, record, size_t{record_words_} * sizeof(float));
  return created;
}

void RowSet::put(uint64_t row_id, const float* record) {
  const uint64_t hash = hash_row_id(row_id);
  std::memcpy(shards_[shard_of(hash)].find_or_insert(row_id, hash).first, record,
              size_t{record_words_} * sizeof(float));
}

bool RowSet::erase(uint64_t row_id) {
  const uint64_t hash = hash_row_id(row_id);
  return shards_[shard_of(hash)].erase(row_id, hash).found;
}

size_t RowSet::size() const {
  size_t rows = 0;
  for (const RowIndex& shard : shards_) rows += shard.size();
  return rows;
}

std::optional<size_t> RowSet::insert_all(const uint64_t* ids, const float* records, size_t n) {
  const ShardRoute route(ids, n);
  const size_t record_bytes = size_t{record_words_} * sizeof(float);
  // Per sub-shard, the first repeat in batch order (entries keep it within a sub-shard).
  std::array<size_t, kNumShards> first_repeat;
  first_repeat.fill(n);
  // A sub-shard's entries are about every kNumShards-th row of the batch, so each one's bucket and
  // source record are misses of their own, prefetched ahead (a torch.load of 10^6 rows of 64 floats
  // spent 41% of its time in these lookups without).
  // The records go in with streaming stores (row_copier.h): a bulk load's records are not read soon.
  const size_t records_before = records_ahead(record_bytes);
  run_tasks(kNumShards, threads_for(n, kCopyRowsPerThread), [&](size_t s) {
    const RowCopier copier(RowCopier::ScatteredRows{}, n * record_bytes, record_bytes);
    RowIndex& index = shards_[s];
    index.reserve(index.size() + (route.end(s) - route.begin(s)));
    for (size_t entry = route.begin(s); entry < route.end(s); ++entry) {
      if (entry + kBucketAhead < route.end(s)) index.prefetch_bucket(route.hash(entry + kBucketAhead));
      if (entry + records_before < route.end(s)) {
        prefetch_range(records + route.position(entry + records_before) * size_t{record_words_}, record_bytes);
      }
      const size_t position = route.position(entry);
      const auto [record, created] = index.find_or_insert(ids[position], route.hash(entry));
      if (!created) {
        first_repeat[s] = position;
        return;
      }
      copier.copy(record, records + position * size_t{record_words_});
    }
  });
  const size_t first = *std::min_element(first_repeat.begin(), first_repeat.end());
  return first < n ? std::optional<size_t>(first) : std::nullopt;
}

Table::ViewLocks Table::lock_for_view() const {
  ViewLocks locks{std::unique_lock<std::mutex>(policy_mutex_), std::unique_lock<std::shared_mutex>(request_mutex_), {}};
  locks.shards.reserve(kNumShards);
  for (const Shard& shard : shards_) locks.shards.emplace_back(shard.mutex);
  return locks;
}

TableScanHeader Table::scan_header() const {
  uint64_t row_count = disk_ ? disk_->size() : 0;
  for (const Shard& shard : shards_) row_count += shard.rows.size();
  return TableScanHeader{TableConfig{num_rows_, row_words_, state_words_, init_, dtype_}, init_stream_, optimizer_,
                         step_.load(), row_count};
}

void Table::scan(const std::function<void(const TableScanHeader&)>& on_header,
                 const std::function<void(uint64_t, const float*)>& on_row) const {
  const ViewLocks locks = lock_for_view();
  on_header(scan_header());
  for (const Shard& shard : shards_) shard.rows.for_each(on_row);
  if (disk_) disk_->for_each(on_row);
}

void Table::scan_into(const std::function<RowArrays(const TableScanHeader&)>& allocate) const {
  const ViewLocks locks = lock_for_view();
  const TableScanHeader header = scan_header();
  const RowArrays out = allocate(header);
  std::array<size_t, kNumShards + 1> first_row{};  // of each sub-shard's rows in the arrays
  for (size_t s = 0; s < kNumShards; ++s) first_row[s + 1] = first_row[s] + shards_[s].rows.size();
  run_tasks(kNumShards, threads_for(header.row_count, kCopyRowsPerThread), [&](size_t s) {
    shards_[s].rows.copy_out(out.ids + first_row[s], out.records + first_row[s] * size_t{record_words_});
  });
  if (!disk_) return;
  size_t next = first_row[kNumShards];
  disk_->for_each([&](uint64_t id, const float* record) {
    out.ids[next] = id;
    std::memcpy(out.records + next * size_t{record_words_}, record, size_t{record_words_} * sizeof(float));
    ++next;
  });
}

TableSnapshot Table::snapshot() const {
  const ViewLocks locks = lock_for_view();
  TableSnapshot snapshot{scan_header(), RowSet(record_words_)};
  run_tasks(kNumShards, threads_for(snapshot.header.row_count, kCopyRowsPerThread),
            [&](size_t s) { snapshot.rows.shards_[s] = shards_[s].rows.copy(); });
  if (disk_) disk_->for_each([&](uint64_t id, const float* record) { snapshot.rows.insert(id, record); });
  return snapshot;
}

void Table::set_init(const InitRule& rule) {
  validate_init_rule(rule);
  if (!is_numeric(dtype_) && rule.kind != InitKind::Zero) {
    throw StoreError(ErrorCode::InvalidArgument, "table " + std::to_string(id_) +
                                                     " holds a non-floating dtype as bytes: its init rule can only be "
                                                     "Zero, not " +
                                                     describe(rule));
  }
  // Declared before the locks, so that the old rows are freed after the locks are released.
  std::vector<RowIndex> dropped;
  dropped.reserve(kNumShards);
  std::lock_guard<std::mutex> policy_lock(policy_mutex_);
  if (policy_) policy_->clear();
  auto locks = lock_all_shards();
  std::lock_guard<std::mutex> init_lock(init_mutex_);
  // A moved-from RowIndex is empty, with the same record width.
  for (Shard& shard : shards_) dropped.push_back(std::move(shard.rows));
  drop_disk_rows();
  forget_change_chains();
  reindex_all_rows();
  init_ = rule;
}

void Table::reset(const InitRule& rule, const OptimizerConfig& optimizer) {
  {
    // Dropped first, so that removing the policy does not bring them back only to drop them.
    std::lock_guard<std::mutex> policy_lock(policy_mutex_);
    const auto locks = lock_all_shards();
    drop_disk_rows();
  }
  set_policy(TablePolicyConfig{});
  set_init(rule);
  set_optimizer(optimizer);
  set_optimizer_step(0);
  reads_.store(0, std::memory_order_relaxed);
  writes_.store(0, std::memory_order_relaxed);
  updates_.store(0, std::memory_order_relaxed);
}

void Table::install(RowSet& rows, const InitRule& init, uint64_t init_stream, const OptimizerConfig& optimizer,
                    uint64_t optimizer_step) {
  validate_init_rule(init);
  validate_optimizer(optimizer);
  if (rows.record_words() < row_words_) {
    throw StoreError(ErrorCode::InvalidArgument, "cannot install rows of " + std::to_string(rows.record_words()) +
                                                     " floats into table " + std::to_string(id_) + " of dim " +
                                                     std::to_string(row_words_));
  }
  const uint32_t state_words = rows.record_words() - row_words_;
  if (optimizer.kind != OptimizerKind::None) require_numeric("installing an optimizer");
  check_stochastic_rounding(optimizer);
  if (optimizer.kind != OptimizerKind::None &&
      state_words != optimizer_state_words(optimizer.kind, dtype_, row_words_)) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "cannot install rows with " + std::to_string(state_words) + " state words into table " +
                         std::to_string(id_) + " with optimizer " + describe(optimizer) + ", which needs " +
                         std::to_string(optimizer_state_words(optimizer.kind, dtype_, row_words_)));
  }
  std::unique_lock<std::mutex> policy_lock(policy_mutex_);
  std::unique_lock<std::shared_mutex> request(request_mutex_);
  auto locks = lock_all_shards();
  std::unique_lock<std::mutex> init_lock(init_mutex_);
  for (size_t s = 0; s < kNumShards; ++s) std::swap(shards_[s].rows, rows.shards_[s]);
  reindex_all_rows();
  forget_change_chains();
  state_words_ = state_words;
  record_words_ = rows.record_words();
  rows.record_words_ = row_words_ + state_words_;  // what the old rows now held by `rows` are
  if (disk_ && disk_->record_words() != record_words_) {
    disk_ = std::make_unique<DiskTier>(id_, record_words_, policy_->config().max_disk_bytes);
  }
  drop_disk_rows();
  initial_state_ = optimizer.kind == OptimizerKind::Adagrad ? optimizer.initial_accumulator_value : 0.0;
  init_ = init;
  init_stream_ = init_stream;
  optimizer_ = optimizer;
  step_.store(optimizer_step);
  if (!policy_) return;
  // The installed rows start fresh in the policy (restore_policy_state brings back their metadata),
  // held within the budget.
  policy_->clear();
  policy_->set_record_bytes(uint64_t{record_words_} * sizeof(float));
  policy_->adopt(materialized_ids(), steady_seconds());
  init_lock.unlock();
  locks.clear();
  request.unlock();
  // Without evict, rows over the budget stay (the rows are installed by now): the next request that
  // adds a row is refused.
  if (policy_->config().evict != EvictKind::None) evict_now(policy_->enforce(steady_seconds(), held_rows()));
}

}  // namespace recdev::store
