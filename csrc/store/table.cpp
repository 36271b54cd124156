#include "table.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <type_traits>

#include "coalesce.h"
#include "errors.h"
#include "gradient_check.h"
#include "pooled_gradients.h"
#include "prefetch.h"
#include "row_copier.h"
#include "task_runner.h"

namespace recdev::store {
namespace {

// A record of at most 1 GiB keeps every size computation far from overflow.
constexpr uint64_t kMaxRecordFloats = uint64_t{1} << 28;
// Gathers read, and gather_pooled pools, this many ids at a time in batch order, holding the read
// locks of all the sub-shards they are in: enough for each sub-shard's share of a block to be worth
// its lock, few enough that the locks are held briefly (tens of microseconds).
constexpr size_t kLockedBlockIds = 1024;
// Batches of at least this many ids spread an update over more than one thread.
constexpr size_t kUpdateIdsPerThread = 4096;
// Gradient rows per task of the finite check: 64 KiB at dim 128.
constexpr size_t kFiniteCheckRows = 128;
// Whole-row ranges of read_bytes/write_bytes go through the batch cores this many rows at a time:
// large enough to amortize the per-batch routing, small enough that the scratch buffers stay in cache.
constexpr size_t kRowBatch = 2048;
// Rows per thread of a snapshot's copy: a memory copy, worth a thread only for a large table.
constexpr size_t kCopyRowsPerThread = 65536;
// Ids of a gather under a policy, or of a pooled gather, worth a thread of their own.
constexpr size_t kPooledIdsPerThread = 8192;
// Rows to materialize (compute an init value and insert) worth a thread of their own.
constexpr size_t kMaterializeRowsPerThread = 4096;
// Rows a policy evicts or admits worth a thread of their own: each is a bucket miss or two, and an
// admitted row's init value, about half a microsecond.
constexpr size_t kEvictedOrAdmittedRowsPerThread = 1024;

// How far ahead, in rows, batch loops prefetch: a row's index bucket kBucketAhead rows before it is
// looked up, its record records_ahead(bytes) rows before it is visited. Far enough to hide a DRAM
// miss, near enough to stay within the core's budget of outstanding misses, which whole records use
// up fast (a 512-byte row is 8 lines): about kLinesAhead lines in flight, which measured best for
// embedding_bag (6 rows of 512 bytes) and Adagrad updates on this project's 2-core machines.
constexpr size_t kBucketAhead = 16;
constexpr size_t kLinesAhead = 48;
// Rows whose records for_each_prefetched finds before it visits any: enough to keep the prefetches of
// both passes streaming, few enough for a small array on the stack.
constexpr size_t kFindBlock = 256;

size_t records_ahead(size_t record_bytes) {
  const size_t lines = std::max<size_t>(1, (record_bytes + kCacheLineBytes - 1) / kCacheLineBytes);
  return std::clamp<size_t>(kLinesAhead / lines, 2, kBucketAhead / 2);
}

// records[k] = the record of the row with hash hash_of(k) in index_of(k), or null, for k in
// [0, count): each bucket prefetched kBucketAhead rows before its lookup, so that many bucket misses
// overlap.
template <class IndexOf, class HashOf, class Record>
void find_records(IndexOf index_of, size_t count, HashOf hash_of, Record* records) {
  for (size_t k = 0; k < std::min(count, kBucketAhead); ++k) index_of(k).prefetch_bucket(hash_of(k));
  for (size_t k = 0; k < count; ++k) {
    if (k + kBucketAhead < count) index_of(k + kBucketAhead).prefetch_bucket(hash_of(k + kBucketAhead));
    records[k] = index_of(k).find(hash_of(k));
  }
}

// Calls visit(k, record) for k in [0, count), in order, where item k is the row of `index` with hash
// hash_of(k) and `record` its record, or null if the row is not materialized. A block of kFindBlock
// rows at a time: first its records are found (find_records), then visited, each record's first
// `record_bytes` bytes, along with whatever also_prefetch(k) asks for, prefetched records_ahead rows
// before. Finding first makes a record's prefetch independent of its bucket's miss, so that the
// misses of both overlap as widely as the core allows: one pass that prefetched a record once its
// bucket had arrived was 20% slower (pooled gather of 1M x 128 rows, single thread).
// A visit may insert rows (records never move); one that finds its row missing must look again, as an
// earlier visit may have inserted it.
template <class HashOf, class AlsoPrefetch, class Visit>
void for_each_prefetched(const RowIndex& index, size_t count, size_t record_bytes, HashOf hash_of,
                         AlsoPrefetch also_prefetch, Visit visit) {
  const size_t ahead = records_ahead(record_bytes);
  std::array<float*, kFindBlock> records;
  for (size_t first = 0; first < count; first += kFindBlock) {
    const size_t block = std::min(kFindBlock, count - first);
    find_records([&](size_t) -> const RowIndex& { return index; }, block,
                 [&](size_t k) { return hash_of(first + k); }, records.data());
    const auto prefetch_row = [&](size_t k) {
      if (records[k] != nullptr) prefetch_range(records[k], record_bytes);
      also_prefetch(first + k);
    };
    for (size_t k = 0; k < std::min(block, ahead); ++k) prefetch_row(k);
    for (size_t k = 0; k < block; ++k) {
      if (k + ahead < block) prefetch_row(k + ahead);
      visit(first + k, records[k]);
    }
  }
}

// Splits the byte range [byte_offset, byte_offset + nbytes) of a dense array of row_bytes-sized rows
// into a partial first row, batches of whole rows and a partial last row:
//   part(row, byte_in_row, nbytes, data_offset)    whole(ids, count, data_offset)
// where data_offset is where the piece starts within the caller's buffer.
template <class Part, class Whole>
void split_into_rows(uint64_t byte_offset, uint64_t nbytes, uint64_t row_bytes, Part part, Whole whole) {
  if (nbytes == 0) return;  // even at the very end of the table, where no row starts
  uint64_t row = byte_offset / row_bytes;
  uint64_t data_offset = 0;
  if (const uint64_t byte_in_row = byte_offset % row_bytes; byte_in_row != 0 || nbytes < row_bytes) {
    const uint64_t length = std::min(row_bytes - byte_in_row, nbytes);
    part(row, byte_in_row, length, data_offset);
    data_offset += length;
    ++row;
  }
  std::vector<uint64_t> ids;
  for (uint64_t remaining = (nbytes - data_offset) / row_bytes; remaining > 0;) {
    const size_t count = size_t(std::min<uint64_t>(remaining, kRowBatch));
    ids.resize(count);
    for (size_t i = 0; i < count; ++i) ids[i] = row + i;
    whole(ids.data(), count, data_offset);
    row += count;
    data_offset += count * row_bytes;
    remaining -= count;
  }
  if (data_offset < nbytes) part(row, 0, nbytes - data_offset, data_offset);
}

// Sets `words` words of optimizer state to `value` in the compute type of `dtype`.
void fill_state_words(ElementType dtype, float* state, uint32_t words, double value) {
  if (dtype != ElementType::Float64) {
    std::fill(state, state + words, float(value));
    return;
  }
  for (uint32_t w = 0; w + 2 <= words; w += 2) std::memcpy(state + w, &value, sizeof(double));
}

void require_optimizer(uint64_t table, OptimizerKind kind) {
  if (kind == OptimizerKind::None) {
    throw StoreError(ErrorCode::InvalidArgument, "table " + std::to_string(table) +
                                                     " has no optimizer: attach one with set_optimizer (" +
                                                     optimizer_names() + ") before update");
  }
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t row_elements(const TableConfig& config) {
  return uint32_t(uint64_t{config.dim} * 4 / element_bytes(config.dtype));
}

uint32_t optimizer_state_words(OptimizerKind kind, ElementType dtype, uint32_t dim) {
  const uint64_t elements = uint64_t{dim} * 4 / element_bytes(dtype);
  const uint64_t state = optimizer_state_floats(kind, uint32_t(elements));
  return uint32_t(state * compute_bytes(dtype) / 4);
}

bool operator==(const TableConfig& lhs, const TableConfig& rhs) {
  return lhs.num_rows == rhs.num_rows && lhs.dim == rhs.dim && lhs.state_floats == rhs.state_floats &&
         lhs.init == rhs.init && lhs.dtype == rhs.dtype;
}

bool operator!=(const TableConfig& lhs, const TableConfig& rhs) { return !(lhs == rhs); }

std::string describe(const TableConfig& config) {
  return "TableConfig(num_rows=" + std::to_string(config.num_rows) + ", dim=" + std::to_string(config.dim) +
         ", state_floats=" + std::to_string(config.state_floats) + ", init=" + describe(config.init) +
         ", dtype=" + describe(config.dtype) + ")";
}

void validate_table_config(const TableConfig& config) {
  const auto invalid = [&](const std::string& problem) {
    throw StoreError(ErrorCode::InvalidArgument, "invalid " + describe(config) + ": " + problem);
  };
  if (config.dim == 0) invalid("dim must be at least 1");
  validate_element_type(uint8_t(config.dtype));
  if (config.dtype == ElementType::Float64 && config.dim % 2 != 0) {
    invalid("a float64 row is whole 8-byte elements: dim (in 4-byte words) must be even");
  }
  if (config.dtype == ElementType::Bytes && config.init.kind != InitKind::Zero) {
    invalid("a table of bytes (a non-floating dtype) can only start at zero: the store does not compute "
            "values of its type");
  }
  if (uint64_t{config.dim} + config.state_floats > kMaxRecordFloats) {
    invalid("dim + state_floats must be at most " + std::to_string(kMaxRecordFloats));
  }
  validate_init_rule(config.init);
}

RowSet::RowSet(uint32_t record_floats) : record_floats_(record_floats) {
  shards_.reserve(kNumShards);
  for (size_t shard = 0; shard < kNumShards; ++shard) shards_.emplace_back(record_floats);
}

bool RowSet::insert(uint64_t row_id, const float* record) {
  const uint64_t hash = hash_row_id(row_id);
  const auto [floats, created] = shards_[shard_of(hash)].find_or_insert(row_id, hash);
  if (created) std::memcpy(floats, record, size_t{record_floats_} * sizeof(float));
  return created;
}

std::optional<size_t> RowSet::insert_all(const uint64_t* ids, const float* records, size_t n) {
  const ShardRoute route(ids, n);
  const size_t record_bytes = size_t{record_floats_} * sizeof(float);
  // Per sub-shard, the first repeat in batch order (entries keep it within a sub-shard).
  std::array<size_t, kNumShards> first_repeat;
  first_repeat.fill(n);
  run_tasks(kNumShards, threads_for(n, kCopyRowsPerThread), [&](size_t s) {
    shards_[s].reserve(shards_[s].size() + (route.end(s) - route.begin(s)));
    for (size_t entry = route.begin(s); entry < route.end(s); ++entry) {
      const size_t position = route.position(entry);
      const auto [record, created] = shards_[s].find_or_insert(ids[position], route.hash(entry));
      if (!created) {
        first_repeat[s] = position;
        return;
      }
      std::memcpy(record, records + position * size_t{record_floats_}, record_bytes);
    }
  });
  const size_t first = *std::min_element(first_repeat.begin(), first_repeat.end());
  return first < n ? std::optional<size_t>(first) : std::nullopt;
}

Table::Table(uint64_t id, uint64_t init_stream, const TableConfig& config)
    : id_(id),
      num_rows_(config.num_rows),
      dim_(config.dim),
      dtype_(config.dtype),
      elements_(row_elements(config)),
      state_floats_(config.state_floats),
      record_floats_(config.dim + config.state_floats),
      initial_state_(0.0),
      init_(config.init),
      init_stream_(init_stream) {
  validate_table_config(config);
  for (Shard& shard : shards_) shard.rows = RowIndex(record_floats_);
}

TableConfig Table::config() const {
  std::lock_guard<std::mutex> lock(init_mutex_);
  return TableConfig{num_rows_, dim_, state_floats_, init_, dtype_};
}

uint64_t Table::init_stream() const {
  std::lock_guard<std::mutex> lock(init_mutex_);
  return init_stream_;
}

void Table::check_ids(const uint64_t* ids, size_t n) const {
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] >= num_rows_) {
      throw StoreError(ErrorCode::OutOfRange, "row id " + std::to_string(ids[i]) + " (ids[" + std::to_string(i) +
                                                  "]) is out of range [0, " + std::to_string(num_rows_) + ") of table " +
                                                  std::to_string(id_));
    }
  }
}

void check_dense_byte_range(uint64_t num_rows, uint32_t dim, uint64_t byte_offset, uint64_t nbytes,
                            const std::string& table) {
  using uint128 = unsigned __int128;
  const uint128 table_bytes = uint128{num_rows} * dim * sizeof(float);
  if (uint128{byte_offset} + nbytes > table_bytes) {
    throw StoreError(ErrorCode::OutOfRange, "byte range [" + std::to_string(byte_offset) + ", " +
                                                std::to_string(byte_offset) + " + " + std::to_string(nbytes) +
                                                ") is outside " + table + " of " + std::to_string(num_rows) +
                                                " rows of " + std::to_string(dim * sizeof(float)) + " bytes");
  }
}

void Table::check_byte_range(uint64_t byte_offset, uint64_t nbytes) const {
  check_dense_byte_range(num_rows_, dim_, byte_offset, nbytes, "table " + std::to_string(id_));
}

float* Table::materialize(Shard& shard, uint64_t row_id, uint64_t hash) const {
  const auto [record, created] = shard.rows.find_or_insert(row_id, hash);
  if (created) {
    fill_weight(row_id, record);
    fill_state(record + dim_);
    note_materialized(row_id, record);
  }
  return record;
}

void Table::fill_weight(uint64_t row_id, float* words) const {
  if (dtype_ == ElementType::Float32) {
    fill_row(init_, init_stream_, row_id, dim_, num_rows_, words);
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
  fill_state_words(dtype_, state, record_floats_ - dim_, initial_state_);
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
  const size_t weight_bytes = size_t{dim_} * sizeof(float);
  if (has_direct_index_.load(std::memory_order_relaxed) ||
      !DirectIndex::worth_building(num_rows_, materialized_.load(std::memory_order_relaxed), weight_bytes)) {
    return;
  }
  const auto locks = lock_all_shards();
  if (!direct_.built()) reindex_all_rows();
}

void Table::drop_direct_index_unless_worth_keeping() {
  const size_t weight_bytes = size_t{dim_} * sizeof(float);
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
  const size_t weight_bytes = size_t{dim_} * sizeof(float);
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

void Table::find_in_batch_order(const uint64_t* ids, size_t count, LockedRecords& found) const {
  found.unlock();
  if (count == 0) return;
  found.hashes.resize(count);
  found.index_of_row.resize(count);
  found.records.resize(count);
  std::array<bool, kNumShards> touched{};
  for (size_t k = 0; k < count; ++k) {
    found.hashes[k] = hash_row_id(ids[k]);
    const size_t s = shard_of(found.hashes[k]);
    found.index_of_row[k] = &shards_[s].rows;
    touched[s] = true;
  }
  for (size_t s = 0; s < kNumShards; ++s) {
    if (touched[s]) found.locks[s] = std::shared_lock<std::shared_mutex>(shards_[s].mutex);
  }
  if (direct_.built()) {  // read under the locks just taken: it changes only under all of them
    direct_.find_all(ids, count, found.records.data());
    return;
  }
  find_records([&](size_t k) -> const RowIndex& { return *found.index_of_row[k]; }, count,
               [&](size_t k) { return found.hashes[k]; }, found.records.data());
}

void Table::read_rows(const uint64_t* ids, size_t n, std::byte* out, MissPolicy policy) const {
  const size_t row_bytes = size_t{dim_} * sizeof(float);
  const RowCopier copier(out, n * row_bytes, row_bytes);
  const size_t ahead = records_ahead(row_bytes);
  std::vector<float> init_value;   // ComputeInit only: the init value of a row that is not materialized
  std::vector<uint64_t> missing;   // Materialize only: the rows that are not materialized, and
  std::vector<size_t> missing_at;  // where in the batch
  // First pass, a block at a time in batch order (so that the output is written in order and no
  // per-sub-shard pipeline restarts): copy out every materialized row under the read locks.
  LockedRecords found;
  for (size_t begin = 0; begin < n; begin += kLockedBlockIds) {
    const size_t count = std::min(kLockedBlockIds, n - begin);
    find_in_batch_order(ids + begin, count, found);
    for (size_t k = 0; k < std::min(count, ahead); ++k) {
      if (found.records[k] != nullptr) prefetch_range(found.records[k], row_bytes);
    }
    for (size_t k = 0; k < count; ++k) {
      if (k + ahead < count && found.records[k + ahead] != nullptr) prefetch_range(found.records[k + ahead], row_bytes);
      const size_t position = begin + k;
      if (found.records[k] != nullptr) {
        copier.copy(out + position * row_bytes, found.records[k]);
      } else if (policy == MissPolicy::ComputeInit) {
        init_value.resize(dim_);
        fill_weight(ids[position], init_value.data());
        std::memcpy(out + position * row_bytes, init_value.data(), row_bytes);
      } else {
        missing.push_back(ids[position]);
        missing_at.push_back(position);
      }
    }
  }
  found.unlock();
  // Second pass under the write locks, a sub-shard at a time: materialize what was missing (another
  // thread may have materialized, or written, some of it in between; materialize() then finds it).
  // Computing init values is most of a first touch, so sub-shards go to several threads.
  const ShardRoute route(missing.data(), missing.size());
  run_tasks(kNumShards, threads_for(missing.size(), kMaterializeRowsPerThread), [&](size_t s) {
    if (route.begin(s) == route.end(s)) return;
    Shard& shard = shards_[s];
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    shard.rows.reserve(shard.rows.size() + (route.end(s) - route.begin(s)));  // one rehash, not many
    // A sub-shard's entries are about every kNumShards-th row of the batch: each one's batch-order
    // slots (missing, missing_at) and output row are a cache miss of their own, so all are prefetched.
    for (size_t entry = route.begin(s); entry < route.end(s); ++entry) {
      if (entry + 2 * kBucketAhead < route.end(s)) {
        const size_t ahead = route.position(entry + 2 * kBucketAhead);
        prefetch(&missing[ahead]);
        prefetch(&missing_at[ahead]);
      }
      if (entry + kBucketAhead < route.end(s)) {
        shard.rows.prefetch_bucket(route.hash(entry + kBucketAhead));
        prefetch_range(out + missing_at[route.position(entry + kBucketAhead)] * row_bytes, row_bytes);
      }
      const size_t k = route.position(entry);
      std::memcpy(out + missing_at[k] * row_bytes, materialize(shard, missing[k], route.hash(entry)), row_bytes);
    }
  });
  reads_.fetch_add(n, std::memory_order_relaxed);
}

void Table::write_rows(const uint64_t* ids, size_t n, const std::byte* rows) {
  const size_t row_bytes = size_t{dim_} * sizeof(float);
  const ShardRoute route(ids, n);
  for (size_t s = 0; s < kNumShards; ++s) {
    const size_t begin = route.begin(s);
    const size_t end = route.end(s);
    if (begin == end) continue;
    Shard& shard = shards_[s];
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    for_each_prefetched(
        shard.rows, end - begin, row_bytes, [&](size_t k) { return route.hash(begin + k); }, [](size_t) {},
        [&](size_t k, float* found) {
          const size_t position = route.position(begin + k);
          if (found != nullptr) {
            std::memcpy(found, rows + position * row_bytes, row_bytes);
            return;
          }
          const auto [record, created] = shard.rows.find_or_insert(ids[position], route.hash(begin + k));
          std::memcpy(record, rows + position * row_bytes, row_bytes);
          if (created) {
            fill_state(record + dim_);
            note_materialized(ids[position], record);
          }
        });
  }
  writes_.fetch_add(n, std::memory_order_relaxed);
}

void Table::write_row_part(uint64_t row_id, size_t byte_in_row, size_t nbytes, const std::byte* data) {
  const uint64_t hash = hash_row_id(row_id);
  Shard& shard = shards_[shard_of(hash)];
  std::unique_lock<std::shared_mutex> lock(shard.mutex);
  std::memcpy(reinterpret_cast<std::byte*>(materialize(shard, row_id, hash)) + byte_in_row, data, nbytes);
  writes_.fetch_add(1, std::memory_order_relaxed);
}

void Table::gather(const uint64_t* ids, size_t n, float* out) {
  check_ids(ids, n);
  // With a policy, the rows it stores are materialized by now, and the others must stay out.
  const auto pass = enter_policy(ids, n, Touch::Lookup);
  build_direct_index_if_worth_it();
  if (!pass.policed()) {
    read_rows(ids, n, reinterpret_cast<std::byte*>(out), MissPolicy::Materialize);
    return;
  }
  // Under a policy nothing is materialized here, so a large batch's parts read on several threads.
  const size_t threads = threads_for(n, kPooledIdsPerThread);
  const size_t row_bytes = size_t{dim_} * sizeof(float);
  run_tasks(threads, threads, [&](size_t part) {
    const size_t begin = n * part / threads;
    read_rows(ids + begin, n * (part + 1) / threads - begin, reinterpret_cast<std::byte*>(out) + begin * row_bytes,
              MissPolicy::ComputeInit);
  });
}

void Table::peek(const uint64_t* ids, size_t n, float* out) const {
  check_ids(ids, n);
  build_direct_index_if_worth_it();
  read_rows(ids, n, reinterpret_cast<std::byte*>(out), MissPolicy::ComputeInit);
}

void Table::gather_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                          PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                          int64_t padding_idx, float* out, int64_t* max_positions, const uint8_t* ignore_nan) {
  if (!computes_in_float32(dtype_)) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "gather_pooled of table " + std::to_string(id_) + " refused: the store pools float32, float16 "
                     "and bfloat16 tables; a " + describe(dtype_) + " table's rows are gathered and pooled by the caller");
  }
  const EmbeddingBag bag{ids,  num_ids,           offsets,     num_bags, include_last_offset,
                         mode, per_sample_weights, padding_idx, ignore_nan};
  validate_embedding_bag(bag, num_rows_);
  if (ignore_nan != nullptr && max_positions == nullptr) {
    throw StoreError(ErrorCode::InvalidArgument, "embedding_bag: ignoring nan needs the max positions");
  }
  check_ids(ids, num_ids);
  PolicyPass pass = open_policy_pass();
  if (pass.policed()) {
    std::vector<uint64_t> touched;
    touched.reserve(num_ids);
    for (size_t position = 0; position < num_ids; ++position) {
      if (!bag.skips(position)) touched.push_back(ids[position]);
    }
    decide(pass, touched.data(), touched.size(), Touch::Lookup);
  }
  const MissPolicy miss = pass.policed() ? MissPolicy::ComputeInit : MissPolicy::Materialize;
  build_direct_index_if_worth_it();
  // Bags [first, end) are pooled a block at a time: a block holds whole bags and at most
  // kLockedBlockIds ids, unless a single bag is larger.
  const auto pool_bag_range = [&](size_t first, size_t end_of_range) {
    std::vector<uint64_t> block_ids;  // the block's ids, but the skipped ones
    std::vector<const float*> rows;   // the gathered row of each of block_ids
    std::vector<float> gathered;      // their weight words, as stored
    LockedRecords found;
    for (size_t first_bag = first; first_bag < end_of_range;) {
      const size_t begin = bag.bag_begin(first_bag);
      size_t end_bag = first_bag + 1;
      while (end_bag < end_of_range && bag.bag_end(end_bag) - begin <= kLockedBlockIds) ++end_bag;
      const size_t end = bag.bag_end(end_bag - 1);
      if (padding_idx < 0) {
        block_ids.assign(ids + begin, ids + end);
      } else {
        block_ids.clear();
        for (size_t position = begin; position < end; ++position) {
          if (!bag.skips(position)) block_ids.push_back(ids[position]);
        }
      }
      const bool pooled = pool_in_place(bag, first_bag, end_bag, block_ids, out, max_positions, found);
      found.unlock();  // the fallback below may materialize
      if (!pooled) {
        // Some rows are not materialized: gather copies, which materializes them, and pool those.
        gathered.resize(block_ids.size() * dim_);
        read_rows(block_ids.data(), block_ids.size(), reinterpret_cast<std::byte*>(gathered.data()), miss);
        rows.resize(block_ids.size());
        for (size_t k = 0; k < rows.size(); ++k) rows[k] = gathered.data() + k * dim_;
        RowPointers source(rows.data(), rows.size(), dim_);
        pool_bags(bag, first_bag, end_bag, source, dtype_, elements_, out, max_positions);
      }
      first_bag = end_bag;
    }
  };
  // A large batch's bags go to several threads, in runs of about equal numbers of ids. (A thread that
  // falls back to materializing rows waits for the others' read locks of those sub-shards, never the
  // other way round: a block takes its locks only after releasing its previous block's.)
  const size_t threads = threads_for(num_ids, kPooledIdsPerThread);
  std::vector<size_t> part_first(threads + 1, num_bags);
  for (size_t part = 0; part < threads; ++part) {
    const size_t first_id = num_ids * part / threads;
    part_first[part] = size_t(std::partition_point(offsets, offsets + num_bags,
                                                   [&](int64_t offset) { return size_t(offset) < first_id; }) -
                              offsets);
  }
  run_tasks(threads, threads, [&](size_t part) { pool_bag_range(part_first[part], part_first[part + 1]); });
}

bool Table::pool_in_place(const EmbeddingBag& bag, size_t first_bag, size_t end_bag,
                          const std::vector<uint64_t>& block_ids, float* out, int64_t* max_positions,
                          LockedRecords& found) const {
  // Every record found first, then pooled in bag order from prefetched pointers (for_each_prefetched
  // says why).
  find_in_batch_order(block_ids.data(), block_ids.size(), found);
  if (std::find(found.records.begin(), found.records.end(), nullptr) != found.records.end()) return false;
  RowPointers rows(found.records.data(), found.records.size(), dim_);
  pool_bags(bag, first_bag, end_bag, rows, dtype_, elements_, out, max_positions);
  reads_.fetch_add(block_ids.size(), std::memory_order_relaxed);
  return true;
}

void Table::write(const uint64_t* ids, size_t n, const float* rows) {
  check_ids(ids, n);
  const auto pass = enter_policy(ids, n, Touch::Write);  // a write stores every row it writes
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  write_rows(ids, n, reinterpret_cast<const std::byte*>(rows));
}

void Table::read_bytes(uint64_t byte_offset, uint64_t nbytes, void* out) const {
  check_byte_range(byte_offset, nbytes);
  auto* const dest = static_cast<std::byte*>(out);
  std::vector<float> row(dim_);
  split_into_rows(
      byte_offset, nbytes, uint64_t{dim_} * sizeof(float),
      [&](uint64_t row_id, uint64_t byte_in_row, uint64_t length, uint64_t data_offset) {
        read_rows(&row_id, 1, reinterpret_cast<std::byte*>(row.data()), MissPolicy::ComputeInit);
        std::memcpy(dest + data_offset, reinterpret_cast<const std::byte*>(row.data()) + byte_in_row, length);
      },
      [&](const uint64_t* ids, size_t count, uint64_t data_offset) {
        read_rows(ids, count, dest + data_offset, MissPolicy::ComputeInit);
      });
}

void Table::write_bytes(uint64_t byte_offset, uint64_t nbytes, const void* data) {
  check_byte_range(byte_offset, nbytes);
  PolicyPass pass = open_policy_pass();
  if (pass.policed() && nbytes > 0) {
    const uint64_t row_bytes = uint64_t{dim_} * sizeof(float);
    std::vector<uint64_t> touched;
    for (uint64_t row = byte_offset / row_bytes; row <= (byte_offset + nbytes - 1) / row_bytes; ++row) {
      touched.push_back(row);
    }
    decide(pass, touched.data(), touched.size(), Touch::Write);
  }
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  const auto* const source = static_cast<const std::byte*>(data);
  split_into_rows(
      byte_offset, nbytes, uint64_t{dim_} * sizeof(float),
      [&](uint64_t row_id, uint64_t byte_in_row, uint64_t length, uint64_t data_offset) {
        write_row_part(row_id, byte_in_row, length, source + data_offset);
      },
      [&](const uint64_t* ids, size_t count, uint64_t data_offset) {
        write_rows(ids, count, source + data_offset);
      });
}

void Table::exists(const uint64_t* ids, size_t n, uint8_t* out) const {
  check_ids(ids, n);
  const ShardRoute route(ids, n);
  for (size_t s = 0; s < kNumShards; ++s) {
    if (route.begin(s) == route.end(s)) continue;
    const Shard& shard = shards_[s];
    std::shared_lock<std::shared_mutex> lock(shard.mutex);
    for (size_t entry = route.begin(s); entry < route.end(s); ++entry) {
      const size_t position = route.position(entry);
      out[position] = shard.rows.find(route.hash(entry)) != nullptr;
    }
  }
}

void Table::erase(const uint64_t* ids, size_t n) {
  check_ids(ids, n);
  std::unique_lock<std::mutex> policy_lock(policy_mutex_);
  if (policy_) policy_->forget(ids, n);
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  erase_rows(ids, n);
}

void Table::erase_rows(const uint64_t* ids, size_t n) {
  const ShardRoute route(ids, n);
  // Sub-shards on several threads for many rows: a policy evicts as many rows per request as it admits.
  run_tasks(kNumShards, threads_for(n, kMaterializeRowsPerThread), [&](size_t s) {
    if (route.begin(s) == route.end(s)) return;
    Shard& shard = shards_[s];
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    for (size_t entry = route.begin(s); entry < route.end(s); ++entry) {
      erase_row(shard, ids[route.position(entry)], route.hash(entry));
    }
  });
  drop_direct_index_unless_worth_keeping();
}

void Table::erase_row(Shard& shard, uint64_t row_id, uint64_t hash) {
  const RowIndex::Erased erased = shard.rows.erase(row_id, hash);
  if (!erased.found) return;
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
                   dim_,
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
  stats.evicted = policy.evicted;
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

Table::ViewLocks Table::lock_for_view() const {
  ViewLocks locks{std::unique_lock<std::mutex>(policy_mutex_), std::unique_lock<std::shared_mutex>(request_mutex_), {}};
  locks.shards.reserve(kNumShards);
  for (const Shard& shard : shards_) locks.shards.emplace_back(shard.mutex);
  return locks;
}

TableScanHeader Table::scan_header() const {
  uint64_t row_count = 0;
  for (const Shard& shard : shards_) row_count += shard.rows.size();
  return TableScanHeader{TableConfig{num_rows_, dim_, state_floats_, init_, dtype_}, init_stream_, optimizer_, step_.load(),
                         row_count};
}

void Table::scan(const std::function<void(const TableScanHeader&)>& on_header,
                 const std::function<void(uint64_t, const float*)>& on_row) const {
  const ViewLocks locks = lock_for_view();
  on_header(scan_header());
  for (const Shard& shard : shards_) shard.rows.for_each(on_row);
}

void Table::scan_into(const std::function<RowArrays(const TableScanHeader&)>& allocate) const {
  const ViewLocks locks = lock_for_view();
  const TableScanHeader header = scan_header();
  const RowArrays out = allocate(header);
  std::array<size_t, kNumShards + 1> first_row{};  // of each sub-shard's rows in the arrays
  for (size_t s = 0; s < kNumShards; ++s) first_row[s + 1] = first_row[s] + shards_[s].rows.size();
  run_tasks(kNumShards, threads_for(header.row_count, kCopyRowsPerThread), [&](size_t s) {
    shards_[s].rows.copy_out(out.ids + first_row[s], out.records + first_row[s] * size_t{record_floats_});
  });
}

TableSnapshot Table::snapshot() const {
  const ViewLocks locks = lock_for_view();
  TableSnapshot snapshot{scan_header(), RowSet(record_floats_)};
  run_tasks(kNumShards, threads_for(snapshot.header.row_count, kCopyRowsPerThread),
            [&](size_t s) { snapshot.rows.shards_[s] = shards_[s].rows.copy(); });
  return snapshot;
}

void Table::set_init(const InitRule& rule) {
  validate_init_rule(rule);
  if (!is_numeric(dtype_) && rule.kind != InitKind::Zero) {
    throw StoreError(ErrorCode::InvalidArgument, "table " + std::to_string(id_) +
                                                     " holds a non-floating dtype as bytes: its init rule can only be "
                                                     "Zero, not " + describe(rule));
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
  reindex_all_rows();
  init_ = rule;
}

void Table::reset(const InitRule& rule, const OptimizerConfig& optimizer) {
  set_policy(TablePolicyConfig{});
  set_init(rule);
  set_optimizer(optimizer);
  set_optimizer_step(0);
  reads_.store(0, std::memory_order_relaxed);
  writes_.store(0, std::memory_order_relaxed);
  updates_.store(0, std::memory_order_relaxed);
}

void Table::check_record_floats(uint64_t state_floats) const {
  if (uint64_t{dim_} + state_floats > kMaxRecordFloats) {
    throw StoreError(ErrorCode::InvalidArgument, "table " + std::to_string(id_) + " of dim " + std::to_string(dim_) +
                                                     " cannot hold " + std::to_string(state_floats) +
                                                     " optimizer-state floats per row: a record is at most " +
                                                     std::to_string(kMaxRecordFloats) + " floats");
  }
}

void Table::install(RowSet& rows, const InitRule& init, uint64_t init_stream, const OptimizerConfig& optimizer,
                    uint64_t optimizer_step) {
  validate_init_rule(init);
  validate_optimizer(optimizer);
  if (rows.record_floats() < dim_) {
    throw StoreError(ErrorCode::InvalidArgument, "cannot install rows of " + std::to_string(rows.record_floats()) +
                                                     " floats into table " + std::to_string(id_) + " of dim " +
                                                     std::to_string(dim_));
  }
  const uint32_t state_floats = rows.record_floats() - dim_;
  if (optimizer.kind != OptimizerKind::None) require_numeric("installing an optimizer");
  check_stochastic_rounding(optimizer);
  if (optimizer.kind != OptimizerKind::None && state_floats != optimizer_state_words(optimizer.kind, dtype_, dim_)) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "cannot install rows with " + std::to_string(state_floats) + " state words into table " +
                         std::to_string(id_) + " with optimizer " + describe(optimizer) + ", which needs " +
                         std::to_string(optimizer_state_words(optimizer.kind, dtype_, dim_)));
  }
  std::unique_lock<std::mutex> policy_lock(policy_mutex_);
  std::unique_lock<std::shared_mutex> request(request_mutex_);
  auto locks = lock_all_shards();
  std::unique_lock<std::mutex> init_lock(init_mutex_);
  for (size_t s = 0; s < kNumShards; ++s) std::swap(shards_[s].rows, rows.shards_[s]);
  reindex_all_rows();
  state_floats_ = state_floats;
  record_floats_ = rows.record_floats();
  rows.record_floats_ = dim_ + state_floats_;  // what the old rows now held by `rows` are
  initial_state_ = optimizer.kind == OptimizerKind::Adagrad ? optimizer.initial_accumulator_value : 0.0;
  init_ = init;
  init_stream_ = init_stream;
  optimizer_ = optimizer;
  step_.store(optimizer_step);
  if (!policy_) return;
  // The installed rows start fresh in the policy (restore_policy_state brings back their metadata),
  // held within the budget.
  policy_->clear();
  policy_->set_record_bytes(uint64_t{record_floats_} * sizeof(float));
  policy_->adopt(materialized_ids(), steady_seconds());
  init_lock.unlock();
  locks.clear();
  request.unlock();
  // Without evict, rows over the budget stay (the rows are installed by now): the next request that
  // adds a row is refused.
  if (policy_->config().evict != EvictKind::None) evict_now(policy_->enforce(steady_seconds(), held_rows()));
}

// ---- Fused optimizer ----

void Table::check_stochastic_rounding(const OptimizerConfig& config) const {
  if (!config.stochastic_rounding || dtype_ == ElementType::Float16 || dtype_ == ElementType::BFloat16) return;
  throw StoreError(ErrorCode::InvalidArgument,
                   "table " + std::to_string(id_) + " holds " + element_type_name(dtype_) +
                       " rows: stochastic_rounding applies to float16 and bfloat16 tables only (their float32 "
                       "update is rounded to 16 bits; " + element_type_name(dtype_) + " rows are not rounded)");
}

void Table::set_optimizer(const OptimizerConfig& config) {
  validate_optimizer(config);
  if (config.kind != OptimizerKind::None) require_numeric(("attaching optimizer " + describe(config)).c_str());
  check_stochastic_rounding(config);
  const uint32_t new_state_floats = optimizer_state_words(config.kind, dtype_, dim_);
  check_record_floats(new_state_floats);
  // float64 tables keep the value exactly; the others hold it in float32.
  const double new_initial_state = config.kind == OptimizerKind::Adagrad ? config.initial_accumulator_value : 0.0;
  const uint32_t new_record_floats = dim_ + new_state_floats;

  std::vector<RowIndex> old_rows;  // freed after the locks are released
  std::unique_lock<std::mutex> policy_lock(policy_mutex_);
  std::unique_lock<std::shared_mutex> request(request_mutex_);
  auto locks = lock_all_shards();
  const bool kind_changed = config.kind != optimizer_.kind;
  if (new_state_floats != state_floats_) {
    // Build every new sub-shard before changing any, so that running out of memory leaves the table
    // as it was.
    std::vector<RowIndex> relaid;
    relaid.reserve(kNumShards);
    for (const Shard& shard : shards_) {
      RowIndex& index = relaid.emplace_back(new_record_floats);
      const uint32_t copy_floats = std::min(record_floats_, new_record_floats);
      shard.rows.for_each([&](uint64_t row_id, const float* record) {
        float* destination = index.find_or_insert(row_id, hash_row_id(row_id)).first;
        std::memcpy(destination, record, size_t{copy_floats} * sizeof(float));
        // With the same kind (None with raw state only: an optimizer fixes its width) the state
        // that fits is kept; otherwise it restarts.
        const uint32_t keep = kind_changed ? dim_ : copy_floats;
        fill_state_words(dtype_, destination + keep, new_record_floats - keep, new_initial_state);
      });
    }
    old_rows.reserve(kNumShards);
    for (size_t s = 0; s < kNumShards; ++s) {
      old_rows.push_back(std::move(shards_[s].rows));
      shards_[s].rows = std::move(relaid[s]);
    }
    reindex_all_rows();
  } else if (kind_changed && new_state_floats > 0) {
    for (Shard& shard : shards_) {
      shard.rows.for_each([&](uint64_t, const float* record) {
        // for_each hands out const records of rows this thread holds exclusively.
        float* state = const_cast<float*>(record) + dim_;
        fill_state_words(dtype_, state, new_state_floats, new_initial_state);
      });
    }
  }
  {
    std::lock_guard<std::mutex> init_lock(init_mutex_);
    state_floats_ = new_state_floats;
    record_floats_ = new_record_floats;
    initial_state_ = new_initial_state;
  }
  optimizer_ = config;
  if (kind_changed) step_.store(0);
  locks.clear();
  request.unlock();
  if (policy_) {
    // Wider records shrink a byte budget's rows.
    policy_->set_record_bytes(uint64_t{new_record_floats} * sizeof(float));
    if (policy_->config().evict != EvictKind::None) evict_now(policy_->enforce(steady_seconds(), held_rows()));
  }
}

OptimizerConfig Table::optimizer() const {
  std::shared_lock<std::shared_mutex> lock(request_mutex_);
  return optimizer_;
}

void Table::set_learning_rate(double lr) {
  std::unique_lock<std::shared_mutex> lock(request_mutex_);
  if (optimizer_.kind == OptimizerKind::None) {
    throw StoreError(ErrorCode::InvalidArgument, "table " + std::to_string(id_) +
                                                     " has no optimizer to set the learning rate of; the optimizers are " +
                                                     optimizer_names());
  }
  OptimizerConfig config = optimizer_;
  config.lr = lr;
  validate_optimizer(config);
  optimizer_ = config;
}

uint64_t Table::optimizer_step() const {
  std::shared_lock<std::shared_mutex> lock(request_mutex_);
  return step_.load();
}

void Table::set_optimizer_step(uint64_t step) {
  std::unique_lock<std::shared_mutex> lock(request_mutex_);
  step_.store(step);
}

void Table::update(const uint64_t* ids, size_t n, const void* grads) {
  check_ids(ids, n);
  require_numeric("update");
  const size_t elements = elements_;
  const size_t count = n * elements;
  const auto run = [&](const auto* values) {
    using G = std::remove_const_t<std::remove_pointer_t<decltype(values)>>;
    std::vector<const G*> rows(n);
    for (size_t i = 0; i < n; ++i) rows[i] = values + i * elements;
    apply_gradients_with_policy<G>(ids, n, rows.data(), values, count);
  };
  switch (dtype_) {
    case ElementType::Float32: run(static_cast<const float*>(grads)); return;
    case ElementType::Float64: {
      // Copied: a request's payload need not be 8-byte aligned.
      std::vector<double> wide(count);
      if (count > 0) std::memcpy(wide.data(), grads, count * sizeof(double));
      run(static_cast<const double*>(wide.data()));
      return;
    }
    default: run(static_cast<const uint16_t*>(grads)); return;  // half: widened as the rule loads them
  }
}

void Table::update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                          PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                          int64_t padding_idx, const void* bag_grads) {
  if (!computes_in_float32(dtype_)) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "update_pooled of table " + std::to_string(id_) + " refused: the store pools float32, float16 "
                     "and bfloat16 tables; a " + describe(dtype_) + " table takes per-id gradients (update)");
  }
  const EmbeddingBag bag{ids, num_ids, offsets, num_bags, include_last_offset, mode, per_sample_weights, padding_idx};
  validate_embedding_bag(bag, num_rows_);
  check_ids(ids, num_ids);
  const auto run = [&](const auto* typed_bag_grads) {
    using G = std::remove_const_t<std::remove_pointer_t<decltype(typed_bag_grads)>>;
    const PooledGradients<G> gradients(bag, typed_bag_grads, elements_, dtype_);
    apply_gradients_with_policy<G>(gradients.ids(), gradients.size(), gradients.rows(), gradients.values(),
                                   gradients.value_count());
  };
  if (dtype_ == ElementType::Float32) {
    run(static_cast<const float*>(bag_grads));
  } else {
    run(static_cast<const uint16_t*>(bag_grads));
  }
}

template <class G>
void Table::apply_gradients(const uint64_t* ids, size_t n, const G* const* grads, const G* values, size_t value_count,
                            bool gradients_checked) {
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  require_optimizer(id_, optimizer_.kind);
  const size_t threads = threads_for(n, kUpdateIdsPerThread);
  if (!gradients_checked) check_gradients(ids, n, grads, values, value_count, threads);
  apply_coalesced(coalesce_or_refuse(ids, n, grads, threads), threads);
}

template <class G>
CoalescedGradients<G> Table::coalesce_or_refuse(const uint64_t* ids, size_t n, const G* const* grads,
                                                size_t threads) const {
  CoalescedGradients<G> coalesced(ids, n, grads, dtype_, elements_, threads);
  if (const auto overflow = coalesced.first_overflow()) {
    refuse_overflowing_sum(overflow->row_id, overflow->column, "table " + std::to_string(id_));
  }
  return coalesced;
}

template <class G>
void Table::apply_coalesced(const CoalescedGradients<G>& coalesced, size_t threads) {
  const uint64_t step = step_.fetch_add(1) + 1;
  const RowUpdate rule(optimizer_, step, elements_);
  run_tasks(kNumShards, threads, [&](size_t s) { apply_update<G>(shards_[s], coalesced.rows(s), rule); });
  updates_.fetch_add(coalesced.size(), std::memory_order_relaxed);
}

template <class G>
void Table::apply_gradients_with_policy(const uint64_t* ids, size_t n, const G* const* grads, const G* values,
                                        size_t value_count) {
  PolicyPass pass = open_policy_pass();
  if (!pass.policed()) {
    apply_gradients<G>(ids, n, grads, values, value_count);
    return;
  }
  // Everything apply_gradients refuses (no optimizer, a non-finite gradient, a sum that overflows) is
  // refused before the policy counts a touch, evicts a row or admits one: a refused update changes
  // nothing.
  const size_t threads = threads_for(n, kUpdateIdsPerThread);
  std::optional<CoalescedGradients<G>> coalesced;
  {
    std::shared_lock<std::shared_mutex> request(request_mutex_);
    require_optimizer(id_, optimizer_.kind);
    check_gradients(ids, n, grads, values, value_count, threads);
    coalesced.emplace(coalesce_or_refuse(ids, n, grads, threads));
  }
  decide(pass, ids, n, Touch::Update);
  if (pass.decision->all_stored) {
    std::shared_lock<std::shared_mutex> request(request_mutex_);
    require_optimizer(id_, optimizer_.kind);
    apply_coalesced(*coalesced, threads);
    return;
  }
  // Rows pending admission keep their init value: their gradients are dropped (a row's sum is the
  // same in the subset, so it cannot overflow there).
  std::vector<uint64_t> stored_ids;
  std::vector<const G*> stored_grads;
  for (size_t i = 0; i < n; ++i) {
    if (!pass.decision->stored[i]) continue;
    stored_ids.push_back(ids[i]);
    stored_grads.push_back(grads[i]);
  }
  apply_gradients<G>(stored_ids.data(), stored_ids.size(), stored_grads.data(), values, value_count,
                     /*gradients_checked=*/true);
}

template <class G>
void Table::check_gradients(const uint64_t* ids, size_t n, const G* const* grads, const G* values, size_t value_count,
                            size_t threads) const {
  const size_t dim = elements_;
  const size_t chunk_floats = kFiniteCheckRows * dim;
  const size_t num_chunks = (value_count + chunk_floats - 1) / chunk_floats;
  std::atomic<bool> all_ok{true};
  run_tasks(num_chunks, threads, [&](size_t chunk) {
    const size_t first = chunk * chunk_floats;
    if (!all_finite_values(dtype_, values + first, std::min(chunk_floats, value_count - first))) {
      all_ok.store(false, std::memory_order_relaxed);
    }
  });
  if (all_ok.load()) return;
  // Name the first bad value in batch order (a bad value no id's row holds is harmless).
  refuse_first_non_finite(dtype_, ids, n, grads, elements_, "table " + std::to_string(id_));
}

template <class G>
void Table::apply_update(Shard& shard, const std::vector<typename CoalescedGradients<G>::Row>& rows,
                         const RowUpdate& rule) {
  using Sum = typename CoalescedGradients<G>::Sum;
  if (rows.empty()) return;
  std::unique_lock<std::shared_mutex> lock(shard.mutex);
  const size_t record_bytes = size_t{record_floats_} * sizeof(float);
  const size_t grad_bytes = size_t{elements_} * sizeof(G);
  const size_t sum_bytes = size_t{elements_} * sizeof(Sum);
  const size_t state_words = record_floats_ - dim_;
  // Half rows are updated in float32 with their float32 state in place and rounded once (scratch:
  // the widened row and gradient); float64 records are copied out and back (a record's words need not
  // be 8-byte aligned for a double's access rules).
  std::vector<Sum> scratch(std::is_same_v<G, float> ? 0 : 2 * size_t{elements_});
  std::vector<double> state(std::is_same_v<G, double> ? state_words / 2 : 0);
  for_each_prefetched(
      shard.rows, rows.size(), record_bytes, [&](size_t k) { return rows[k].hash; },
      [&](size_t k) {
        if (rows[k].grad != nullptr) {
          prefetch_range(rows[k].grad, grad_bytes);
        } else {
          prefetch_range(rows[k].sum, sum_bytes);
        }
      },
      [&](size_t k, float* found) {
        const auto& row = rows[k];
        float* record = found != nullptr ? found : materialize(shard, row.id, row.hash);
        if constexpr (std::is_same_v<G, double>) {
          std::memcpy(scratch.data(), record, elements_ * sizeof(double));
          std::memcpy(state.data(), record + dim_, state_words * sizeof(float));
          rule.apply(scratch.data(), state.data(), row.sum != nullptr ? row.sum : row.grad);
          std::memcpy(record, scratch.data(), elements_ * sizeof(double));
          std::memcpy(record + dim_, state.data(), state_words * sizeof(float));
        } else if constexpr (std::is_same_v<G, float>) {
          rule.apply(record, record + dim_, row.sum != nullptr ? row.sum : row.grad);
        } else if (rule.stochastic_rounding()) {
          const float* grad = row.sum;
          if (grad == nullptr) {
            widen_to_float(dtype_, row.grad, scratch.data() + elements_, elements_);
            grad = scratch.data() + elements_;
          }
          widen_to_float(dtype_, record, scratch.data(), elements_);
          rule.apply(scratch.data(), record + dim_, grad);
          narrow_stochastic(dtype_, scratch.data(), record, elements_, rule.rounding_key(row.id));
        } else if (row.sum != nullptr) {
          rule.apply_half(dtype_, record, record + dim_, row.sum, scratch.data());
        } else {
          rule.apply_half(dtype_, record, record + dim_, row.grad, scratch.data());
        }
      });
}

uint32_t Table::gather_state(const uint64_t* ids, size_t n, std::vector<float>& out) const {
  check_ids(ids, n);
  // Shared: the state width cannot change meanwhile (set_optimizer and install are exclusive).
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  const uint32_t width = state_floats_;
  out.assign(n * width, 0.0f);
  if (width == 0) return 0;
  const ShardRoute route(ids, n);
  for (size_t s = 0; s < kNumShards; ++s) {
    if (route.begin(s) == route.end(s)) continue;
    const Shard& shard = shards_[s];
    std::shared_lock<std::shared_mutex> lock(shard.mutex);
    for (size_t entry = route.begin(s); entry < route.end(s); ++entry) {
      const size_t position = route.position(entry);
      float* destination = out.data() + position * width;
      if (const float* record = shard.rows.find(route.hash(entry))) {
        std::memcpy(destination, record + dim_, size_t{width} * sizeof(float));
      } else {
        fill_state_words(dtype_, destination, width, initial_state_);
      }
    }
  }
  return width;
}

}  // namespace recdev::store

namespace recdev::store {

// ---- Budget, eviction and admission ----

Table::PolicyPass Table::open_policy_pass() {
  if (!has_policy_.load(std::memory_order_acquire)) {
    std::shared_lock<std::shared_mutex> unpoliced(unpoliced_mutex_);
    // A policy is published under unpoliced_mutex_: seen absent here, it waits for this request.
    if (!has_policy_.load(std::memory_order_acquire)) return PolicyPass{std::move(unpoliced), {}, {}};
  }
  std::unique_lock<std::mutex> lock(policy_mutex_);
  if (!policy_) {  // removed in between
    return PolicyPass{std::shared_lock<std::shared_mutex>(unpoliced_mutex_), {}, {}};
  }
  return PolicyPass{{}, std::move(lock), {}};
}

void Table::decide(PolicyPass& pass, const uint64_t* ids, size_t n, Touch touch) {
  PolicyDecision decision = policy_->apply(ids, n, touch, steady_seconds(), held_rows());
  {
    std::shared_lock<std::shared_mutex> request(request_mutex_);
    evict_and_admit(decision.victims, decision.admitted);
  }
  pass.decision = std::move(decision);
}

Table::PolicyPass Table::enter_policy(const uint64_t* ids, size_t n, Touch touch) {
  PolicyPass pass = open_policy_pass();
  if (pass.policed()) decide(pass, ids, n, touch);
  return pass;
}

HeldRows Table::held_rows() const {
  return HeldRows{[this](const uint64_t* ids, size_t n, uint8_t* held) { exists(ids, n, held); },
                  [this] {
                    uint64_t rows = 0;
                    for (const Shard& shard : shards_) {
                      std::shared_lock<std::shared_mutex> lock(shard.mutex);
                      rows += shard.rows.size();
                    }
                    return rows;
                  }};
}

// Victim and admitted rows of a sub-shard pair up, each admitted row taking a victim's record in
// place (RowIndex::replace); the rest are erased or appended. Under a budget nearly every admission
// comes with an eviction, and a pair then costs two bucket probes and the init value, where erasing
// moved the sub-shard's last record into the hole (a third miss, and a record copy) and appending grew
// the arena. Sub-shards go to several threads, the ids and buckets ahead prefetched.
void Table::evict_and_admit(const std::vector<uint64_t>& victims, const std::vector<uint64_t>& admitted) {
  if (victims.empty() && admitted.empty()) return;
  const ShardRoute out(victims.data(), victims.size());
  const ShardRoute in(admitted.data(), admitted.size());
  run_tasks(kNumShards, threads_for(victims.size() + admitted.size(), kEvictedOrAdmittedRowsPerThread), [&](size_t s) {
    if (out.begin(s) == out.end(s) && in.begin(s) == in.end(s)) return;
    Shard& shard = shards_[s];
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    const auto prefetch_ahead = [&](const ShardRoute& route, const std::vector<uint64_t>& ids, size_t entry) {
      if (entry + 2 * kBucketAhead < route.end(s)) prefetch(&ids[route.position(entry + 2 * kBucketAhead)]);
      if (entry + kBucketAhead < route.end(s)) shard.rows.prefetch_bucket(route.hash(entry + kBucketAhead));
    };
    size_t victim = out.begin(s);
    size_t entry = in.begin(s);
    for (; victim < out.end(s) && entry < in.end(s); ++victim, ++entry) {
      prefetch_ahead(out, victims, victim);
      prefetch_ahead(in, admitted, entry);
      const uint64_t victim_id = victims[out.position(victim)];
      const uint64_t row_id = admitted[in.position(entry)];
      float* record = shard.rows.replace(out.hash(victim), row_id, in.hash(entry));
      if (record == nullptr) {  // not as the policy said: the general path
        erase_row(shard, victim_id, out.hash(victim));
        materialize(shard, row_id, in.hash(entry));
        continue;
      }
      if (direct_.built()) direct_.set(victim_id, nullptr);
      fill_weight(row_id, record);
      fill_state(record + dim_);
      if (direct_.built()) direct_.set(row_id, record);
    }
    for (; victim < out.end(s); ++victim) {
      prefetch_ahead(out, victims, victim);
      erase_row(shard, victims[out.position(victim)], out.hash(victim));
    }
    if (entry < in.end(s)) shard.rows.reserve(shard.rows.size() + (in.end(s) - entry));
    for (; entry < in.end(s); ++entry) {
      prefetch_ahead(in, admitted, entry);
      materialize(shard, admitted[in.position(entry)], in.hash(entry));
    }
  });
  drop_direct_index_unless_worth_keeping();
}

void Table::evict_now(const std::vector<uint64_t>& victims) {
  if (victims.empty()) return;
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  erase_rows(victims.data(), victims.size());
}

std::vector<uint64_t> Table::materialized_ids() const {
  std::vector<uint64_t> ids;
  for (const Shard& shard : shards_) {
    shard.rows.for_each([&](uint64_t row_id, const float*) { ids.push_back(row_id); });
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

void Table::check_update_fits(const uint64_t* ids, size_t n) const {
  std::lock_guard<std::mutex> lock(policy_mutex_);
  if (policy_) policy_->check_update_fits(ids, n, held_rows());
}

void Table::check_policy(const uint64_t* ids, size_t n, Touch touch) {
  check_ids(ids, n);
  std::lock_guard<std::mutex> lock(policy_mutex_);
  if (policy_) policy_->check(ids, n, touch, steady_seconds(), held_rows());
}

void Table::set_policy(const TablePolicyConfig& config) {
  validate_policy(config);
  std::lock_guard<std::mutex> lock(policy_mutex_);
  if (!config.active()) {
    policy_.reset();
    has_policy_.store(false, std::memory_order_release);
    return;
  }
  const uint64_t record_bytes = uint64_t{record_floats_} * sizeof(float);
  if (config.max_bytes != 0 && config.max_bytes / (record_bytes + TablePolicy::kRowOverheadBytes) == 0) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "invalid " + describe(config) + ": max_bytes holds no row of table " + std::to_string(id_) +
                         " (a row costs " + std::to_string(record_bytes + TablePolicy::kRowOverheadBytes) +
                         " bytes: its record and " + std::to_string(TablePolicy::kRowOverheadBytes) +
                         " of index and touch metadata)");
  }
  const double now = steady_seconds();
  if (policy_) {
    const bool adopt_rows = !policy_->keeps_touches() && config.evict != EvictKind::None;
    policy_->reconfigure(config, held_rows());
    if (adopt_rows) {
      const auto locks = lock_all_shards();
      policy_->adopt(materialized_ids(), now);
    }
    // Only a budget without evict refuses, and reconfigure checked that one.
    evict_now(policy_->enforce(now, held_rows()));
    return;
  }
  auto fresh = std::make_unique<TablePolicy>(config, record_bytes);
  // Requests without a policy finish first; later ones see it (see the header comment).
  std::unique_lock<std::shared_mutex> unpoliced(unpoliced_mutex_);
  {
    const auto locks = lock_all_shards();
    fresh->adopt(materialized_ids(), now);
  }
  const std::vector<uint64_t> victims = fresh->enforce(now, held_rows());
  policy_ = std::move(fresh);
  has_policy_.store(true, std::memory_order_release);
  unpoliced.unlock();
  evict_now(victims);
}

TablePolicyConfig Table::policy() const {
  std::lock_guard<std::mutex> lock(policy_mutex_);
  return policy_ ? policy_->config() : TablePolicyConfig{};
}

std::optional<Table::PolicyState> Table::policy_state() const {
  std::lock_guard<std::mutex> lock(policy_mutex_);
  if (!policy_) return std::nullopt;
  const FrequencySketch* sketch = policy_->sketch();
  return PolicyState{policy_->config(), policy_->touches(steady_seconds()), policy_->clocks(),
                     sketch ? sketch->counters() : std::vector<uint16_t>{}, sketch ? sketch->since_aging() : 0};
}

void Table::restore_policy_state(const PolicyState& state) {
  validate_policy(state.config);
  std::lock_guard<std::mutex> lock(policy_mutex_);
  const double now = steady_seconds();
  auto fresh = std::make_unique<TablePolicy>(state.config, uint64_t{record_floats_} * sizeof(float));
  std::unique_lock<std::shared_mutex> unpoliced(unpoliced_mutex_);  // as in set_policy
  std::vector<uint64_t> ids;
  {
    const auto locks = lock_all_shards();
    ids = materialized_ids();
  }
  // Metadata of rows the table no longer holds is dropped; rows without metadata are adopted.
  std::vector<RowTouch> kept;
  std::vector<uint64_t> kept_ids;
  for (const RowTouch& row : state.touches) {
    if (std::binary_search(ids.begin(), ids.end(), row.id)) {
      kept.push_back(row);
      kept_ids.push_back(row.id);
    }
  }
  std::sort(kept_ids.begin(), kept_ids.end());
  std::vector<uint64_t> unknown;
  std::set_difference(ids.begin(), ids.end(), kept_ids.begin(), kept_ids.end(), std::back_inserter(unknown));
  fresh->restore(kept, state.clocks, state.sketch.empty() ? nullptr : &state.sketch, state.sketch_since_aging, now);
  fresh->adopt(unknown, now);
  const std::vector<uint64_t> victims = fresh->enforce(now, held_rows());
  policy_ = std::move(fresh);
  has_policy_.store(true, std::memory_order_release);
  unpoliced.unlock();
  evict_now(victims);
}

}  // namespace recdev::store
