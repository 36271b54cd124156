// What the files of Table's implementation (table*.cpp) share: the prefetching batch loop over a
// sub-shard's rows and its tuning, and small helpers. Nothing outside them includes this.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "element_type.h"
#include "prefetch.h"
#include "row_index.h"

namespace recdev::store {

// Rows to materialize (compute an init value and insert) worth a thread of their own.
constexpr size_t kMaterializeRowsPerThread = 4096;

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

inline size_t records_ahead(size_t record_bytes) {
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
    find_records([&](size_t) -> const RowIndex& { return index; }, block, [&](size_t k) { return hash_of(first + k); },
                 records.data());
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

// Sets `words` words of optimizer state to `value` in the compute type of `dtype`.
inline void fill_state_words(ElementType dtype, float* state, uint32_t words, double value) {
  if (dtype != ElementType::Float64) {
    std::fill(state, state + words, float(value));
    return;
  }
  for (uint32_t w = 0; w + 2 <= words; w += 2) std::memcpy(state + w, &value, sizeof(double));
}

inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace recdev::store
