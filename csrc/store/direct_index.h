// DirectIndex: a table's row id -> record map kept as a plain array indexed by row id, beside the
// hash index (row_index.h), for tables whose ids are dense: batch reads then find each record with
// one load from an 8-byte entry instead of a hash and a probe of a 16-byte bucket.
//
// Why: a lookup of 1M x 128 rows is bound by the misses the core can keep in flight, and a bucket
// costs one more random line per row, from an array four times the size of this one (which, from
// 2 MiB on, sits on huge pages like the buckets). Measured on 65,536 ids, 2 threads, rows in cache
// and not: F.embedding 2.16 -> 1.93 ms, embedding_bag sum 2.07 -> 1.80 ms, with fresh ids 3.64 ->
// 3.05 ms.
//
// It costs 8 bytes per possible id, so a table has one only while its materialized records are at
// least kBuildFactor times the array's size, and drops it when they fall under kKeepFactor times:
// a lazy 10^10-row table never has one; a dense 1M x 128 table spends 1.6% more memory on it.
//
// The hash index stays the authority: the Table (table.h) mirrors into this map every change of where
// a row's record lives (a row materialized or erased, a record moved by an erase, all of them by
// set_init, install or a relayout), under the same sub-shard locks. Not thread-safe by itself.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "chunk_pool.h"
#include "prefetch.h"

namespace recdev::store {

class DirectIndex {
 public:
  // Build one once the records hold at least kBuildFactor times the array's bytes; drop it under
  // kKeepFactor times (apart, so that erasing and rewriting a few rows does not rebuild it each time).
  static constexpr uint64_t kBuildFactor = 16;
  static constexpr uint64_t kKeepFactor = 8;
  static bool worth_building(uint64_t num_rows, uint64_t rows, size_t record_bytes);
  static bool worth_keeping(uint64_t num_rows, uint64_t rows, size_t record_bytes);

  bool built() const { return records_ != nullptr; }
  // An array of num_rows empty entries. Throws std::bad_alloc, leaving the index unbuilt.
  void build(uint64_t num_rows);
  void drop();
  size_t bytes() const { return built() ? allocated_bytes_ : 0; }

  // Only while built; row_id < num_rows.
  void set(uint64_t row_id, const float* record) { records_[row_id] = record; }

  // records[k] = the record of ids[k], or null if it is not materialized, for k in [0, count): each
  // entry prefetched far enough ahead for its miss to overlap many others. Returns whether none is null.
  // Only while built; every id is below num_rows.
  bool find_all(const uint64_t* ids, size_t count, const float** records) const {
    // 192 ids ahead: the loop takes a few cycles an id, and an entry not in cache takes hundreds.
    // On the AMD host, pooling 65,536 ids of a whole 1M x 128 table took 0.37 ms with 192 ahead
    // against 0.41 with 48 (float16, bags of 4) and 0.49 against 0.54 (float32, bags of 32); 16
    // ahead had been slower still, 384 measured as 192.
    constexpr size_t kAhead = 192;
    for (size_t k = 0; k < std::min(count, kAhead); ++k) prefetch(&records_[ids[k]]);
    bool all_found = true;
    for (size_t k = 0; k < count; ++k) {
      if (k + kAhead < count) prefetch(&records_[ids[k + kAhead]]);
      records[k] = records_[ids[k]];
      all_found &= records[k] != nullptr;
    }
    return all_found;
  }

 private:
  ChunkPtr memory_;
  const float** records_ = nullptr;  // in memory_
  size_t allocated_bytes_ = 0;
};

}  // namespace recdev::store
