// Table's row path: gathers, pooled gathers, writes and the dense byte view.
#include "table.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "errors.h"
#include "prefetch.h"
#include "row_copier.h"
#include "table_internals.h"
#include "task_runner.h"
#include "trace_range.h"

namespace recdev::store {
namespace {

// Gathers read, and gather_pooled pools, this many ids at a time in batch order, holding the read
// locks of all the sub-shards they are in: enough for each sub-shard's share of a block to be worth
// its lock, few enough that the locks are held briefly (tens of microseconds).
constexpr size_t kLockedBlockIds = 1024;

// A block of at least this many ids read-locks every sub-shard without hashing its ids to learn which
// it touches: it touches nearly all of them anyway unless its ids are skewed (512 uniform ids miss a
// given sub-shard of 64 with odds of 3e-4), and with a direct index its records are then found with
// no hash at all (hashing was a third of finding a pooled block's records, 3% of pooling it).
constexpr size_t kLockEverySubShardIds = 512;

// Whole-row ranges of read_bytes/write_bytes go through the batch cores this many rows at a time:
// large enough to amortize the per-batch routing, small enough that the scratch buffers stay in cache.
constexpr size_t kRowBatch = 2048;

// Ids of a gather under a policy, or of a pooled gather, worth a thread of their own.
constexpr size_t kPooledIdsPerThread = 8192;

// gather_pooled pools blocks of whole bags of up to this many ids (more for one larger bag), each
// under the read locks of every sub-shard: all of a thread's share at once in the usual task of 8,192
// ids (kernels::kRowsPerTask), about 70 microseconds of pooling per hold. Blocks of 1,024 took 64
// lock pairs per 1,024 ids, 6% of pooling a whole 1M x 128 table, and each block's first rows were
// found before any was prefetched.
constexpr size_t kPooledBlockIds = 8192;

// How many rows ahead a gather prefetches the records it copies: about 128 cache lines. A gather finds
// a block's records before it copies any, so unlike a single pass (records_ahead) it need not stay
// behind the index's prefetch. On the AMD host, calls alternated in a shuffled order in one process,
// 65,536 ids of a whole 1M x 128 table: float16 rows 0.65 ms at 48 lines, 0.55 at 128, 0.58 at 256;
// float32 0.93, 0.70, 0.67 in one process and 1.32, 1.26, 1.30 in another.
size_t gather_rows_ahead(size_t row_bytes) {
  constexpr size_t kGatherLinesAhead = 128;
  const size_t lines = std::max<size_t>(1, (row_bytes + kCacheLineBytes - 1) / kCacheLineBytes);
  return std::clamp<size_t>(kGatherLinesAhead / lines, 2, 64);
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

}  // namespace

bool Table::find_in_batch_order(const uint64_t* ids, size_t count, LockedRecords& found) const {
  found.unlock();
  if (count == 0) return true;
  found.records.resize(count);
  const auto hash_all = [&] {
    found.hashes.resize(count);
    found.index_of_row.resize(count);
    for (size_t k = 0; k < count; ++k) {
      found.hashes[k] = hash_row_id(ids[k]);
      found.index_of_row[k] = &shards_[shard_of(found.hashes[k])].rows;
    }
  };
  if (count >= kLockEverySubShardIds) {
    for (size_t s = 0; s < kNumShards; ++s) found.locks[s] = std::shared_lock<std::shared_mutex>(shards_[s].mutex);
  } else {
    hash_all();
    std::array<bool, kNumShards> touched{};
    for (size_t k = 0; k < count; ++k) touched[shard_of(found.hashes[k])] = true;
    for (size_t s = 0; s < kNumShards; ++s) {
      if (touched[s]) found.locks[s] = std::shared_lock<std::shared_mutex>(shards_[s].mutex);
    }
  }
  if (direct_.built()) {  // read under the locks just taken: it changes only under all of them
    return direct_.find_all(ids, count, found.records.data());
  }
  if (count >= kLockEverySubShardIds) hash_all();
  find_records([&](size_t k) -> const RowIndex& { return *found.index_of_row[k]; }, count,
               [&](size_t k) { return found.hashes[k]; }, found.records.data());
  return std::find(found.records.begin(), found.records.end(), nullptr) == found.records.end();
}

void Table::read_rows(const uint64_t* ids, size_t n, std::byte* out, MissPolicy policy) const {
  const size_t row_bytes = size_t{row_words_} * sizeof(float);
  const RowCopier copier(out, n * row_bytes, row_bytes);
  const size_t ahead = gather_rows_ahead(row_bytes);
  std::vector<float> init_value;         // ComputeInit only: the init value of a row that is not materialized
  std::vector<uint64_t> missing;         // Materialize only: the rows that are not materialized, and
  std::vector<size_t> missing_at;        // where in the batch
  std::vector<uint64_t> not_in_memory;   // ComputeInit with a disk tier: a block's rows not in memory,
  std::vector<size_t> not_in_memory_at;  // and where in the batch
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
      } else if (policy == MissPolicy::ComputeInit && disk_) {
        not_in_memory.push_back(ids[position]);
        not_in_memory_at.push_back(position);
      } else if (policy == MissPolicy::ComputeInit) {
        init_value.resize(row_words_);
        fill_weight(ids[position], init_value.data());
        std::memcpy(out + position * row_bytes, init_value.data(), row_bytes);
      } else {
        missing.push_back(ids[position]);
        missing_at.push_back(position);
      }
    }
    // Still under the block's read locks: a row moving between the tiers is in one or the other.
    if (!not_in_memory.empty()) {
      read_not_in_memory(not_in_memory, not_in_memory_at, out);
      not_in_memory.clear();
      not_in_memory_at.clear();
    }
  }
  found.unlock();
  // Second pass under the write locks, a sub-shard at a time: materialize what was missing (another
  // thread may have materialized, or written, some of it in between; materialize() then finds it).
  // Computing init values is most of a first touch, so sub-shards go to several threads.
  const trace::Range range = missing.empty()
                                 ? trace::Range()
                                 : trace::Range("recdev::first_touch", {{"table", id_}, {"rows", missing.size()}});
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
  const size_t row_bytes = size_t{row_words_} * sizeof(float);
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
          note_changed(shard, ids[position]);
          if (found != nullptr) {
            std::memcpy(found, rows + position * row_bytes, row_bytes);
            return;
          }
          const auto [record, created] = shard.rows.find_or_insert(ids[position], route.hash(begin + k));
          std::memcpy(record, rows + position * row_bytes, row_bytes);
          if (created) {
            fill_state(record + row_words_);
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
  note_changed(shard, row_id);
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
  const size_t row_bytes = size_t{row_words_} * sizeof(float);
  run_tasks(threads, threads, [&](size_t part) {
    const size_t begin = n * part / threads;
    read_rows(ids + begin, n * (part + 1) / threads - begin, reinterpret_cast<std::byte*>(out) + begin * row_bytes,
              MissPolicy::ComputeInit);
  });
}

void Table::read_not_in_memory(const std::vector<uint64_t>& ids, const std::vector<size_t>& at, std::byte* out) const {
  const size_t row_bytes = size_t{row_words_} * sizeof(float);
  std::vector<size_t> positions;
  std::vector<float> records;
  disk_->read(ids.data(), ids.size(), positions, records);
  std::vector<uint8_t> on_disk(ids.size(), 0);
  for (size_t k = 0; k < positions.size(); ++k) {
    on_disk[positions[k]] = 1;
    std::memcpy(out + at[positions[k]] * row_bytes, records.data() + k * record_words_, row_bytes);
  }
  std::vector<float> init_value(row_words_);
  for (size_t k = 0; k < ids.size(); ++k) {
    if (on_disk[k]) continue;
    fill_weight(ids[k], init_value.data());
    std::memcpy(out + at[k] * row_bytes, init_value.data(), row_bytes);
  }
}

void Table::peek(const uint64_t* ids, size_t n, float* out) const {
  check_ids(ids, n);
  build_direct_index_if_worth_it();
  read_rows(ids, n, reinterpret_cast<std::byte*>(out), MissPolicy::ComputeInit);
}

void Table::gather_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                          PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                          int64_t padding_idx, const PooledOutput& out, int64_t* max_positions,
                          const uint8_t* ignore_nan) {
  if (!computes_in_float32(dtype_)) {
    throw StoreError(ErrorCode::InvalidArgument, "gather_pooled of table " + std::to_string(id_) +
                                                     " refused: the store pools float32, float16 "
                                                     "and bfloat16 tables; a " +
                                                     describe(dtype_) +
                                                     " table's rows are gathered and pooled by the caller");
  }
  if (out.type != ElementType::Float32 && out.type != dtype_) {
    throw StoreError(ErrorCode::InvalidArgument, "gather_pooled of table " + std::to_string(id_) + " refused: a " +
                                                     describe(dtype_) + " table pools into float32 or " +
                                                     describe(dtype_) + ", not " + describe(out.type));
  }
  const EmbeddingBag bag{ids,         num_ids,   offsets, num_bags, include_last_offset, mode, per_sample_weights,
                         padding_idx, ignore_nan};
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
  // kPooledBlockIds ids, unless a single bag is larger.
  const auto pool_bag_range = [&](size_t first, size_t end_of_range) {
    std::vector<uint64_t> kept_ids;  // without padding_idx, a block's ids are the batch's own
    std::vector<const float*> rows;  // the gathered row of each of the block's ids
    std::vector<float> gathered;     // their weight words, as stored
    LockedRecords found;
    for (size_t first_bag = first; first_bag < end_of_range;) {
      const size_t begin = bag.bag_begin(first_bag);
      size_t end_bag = first_bag + 1;
      while (end_bag < end_of_range && bag.bag_end(end_bag) - begin <= kPooledBlockIds) ++end_bag;
      const size_t end = bag.bag_end(end_bag - 1);
      const uint64_t* block_ids = ids + begin;  // the block's ids, but the skipped ones
      size_t block_count = end - begin;
      if (padding_idx >= 0) {
        kept_ids.clear();
        for (size_t position = begin; position < end; ++position) {
          if (!bag.skips(position)) kept_ids.push_back(ids[position]);
        }
        block_ids = kept_ids.data();
        block_count = kept_ids.size();
      }
      const bool pooled = pool_in_place(bag, first_bag, end_bag, block_ids, block_count, out, max_positions, found);
      found.unlock();  // the fallback below may materialize
      if (!pooled) {
        // Some rows are not materialized: gather copies, which materializes them, and pool those.
        gathered.resize(block_count * row_words_);
        read_rows(block_ids, block_count, reinterpret_cast<std::byte*>(gathered.data()), miss);
        rows.resize(block_count);
        for (size_t k = 0; k < rows.size(); ++k) rows[k] = gathered.data() + k * row_words_;
        RowPointers source(rows.data(), rows.size(), row_words_);
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
    part_first[part] = size_t(
        std::partition_point(offsets, offsets + num_bags, [&](int64_t offset) { return size_t(offset) < first_id; }) -
        offsets);
  }
  run_tasks(threads, threads, [&](size_t part) { pool_bag_range(part_first[part], part_first[part + 1]); });
}

bool Table::pool_in_place(const EmbeddingBag& bag, size_t first_bag, size_t end_bag, const uint64_t* block_ids,
                          size_t block_count, const PooledOutput& out, int64_t* max_positions,
                          LockedRecords& found) const {
  // Every record found first, then pooled in bag order from prefetched pointers (for_each_prefetched
  // says why).
  if (!find_in_batch_order(block_ids, block_count, found)) return false;
  RowPointers rows(found.records.data(), found.records.size(), row_words_);
  pool_bags(bag, first_bag, end_bag, rows, dtype_, elements_, out, max_positions);
  reads_.fetch_add(block_count, std::memory_order_relaxed);
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
  std::vector<float> row(row_words_);
  split_into_rows(
      byte_offset, nbytes, uint64_t{row_words_} * sizeof(float),
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
    const uint64_t row_bytes = uint64_t{row_words_} * sizeof(float);
    std::vector<uint64_t> touched;
    for (uint64_t row = byte_offset / row_bytes; row <= (byte_offset + nbytes - 1) / row_bytes; ++row) {
      touched.push_back(row);
    }
    decide(pass, touched.data(), touched.size(), Touch::Write);
  }
  std::shared_lock<std::shared_mutex> request(request_mutex_);
  const auto* const source = static_cast<const std::byte*>(data);
  split_into_rows(
      byte_offset, nbytes, uint64_t{row_words_} * sizeof(float),
      [&](uint64_t row_id, uint64_t byte_in_row, uint64_t length, uint64_t data_offset) {
        write_row_part(row_id, byte_in_row, length, source + data_offset);
      },
      [&](const uint64_t* ids, size_t count, uint64_t data_offset) { write_rows(ids, count, source + data_offset); });
}

}  // namespace recdev::store
