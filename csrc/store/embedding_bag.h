// The pooling half of Table::gather_pooled: torch.nn.functional.embedding_bag's bag layout,
// validation and reduction, on rows the table has located (in place, or gathered into a buffer).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "element_type.h"
#include "prefetch.h"

namespace recdev::store {

enum class PoolingMode : uint8_t { Sum = 0, Mean = 1, Max = 2 };

// ids[0, num_ids) split into bags as embedding_bag splits them: bag b is ids[offsets[b], end) where
// end is offsets[b + 1], or num_ids for the last bag unless include_last_offset, in which case
// offsets holds num_bags + 1 entries and the last one ends the last bag.
struct EmbeddingBag {
  const uint64_t* ids;
  size_t num_ids;
  const int64_t* offsets;
  size_t num_bags;
  bool include_last_offset;
  PoolingMode mode;
  const float* per_sample_weights;  // num_ids weights (Sum only), or null
  int64_t padding_idx;              // -1, or a row id whose entries are skipped
  // Max, with max positions, per bag (or null): where nonzero, a nan never counts, as in a bag's rows
  // after its first. A remote shard pools its share of a bag so when another shard holds the bag's
  // first row (net/client/pooled_partial.h): then the shards' maxima combine into the CPU's result.
  const uint8_t* ignore_nan = nullptr;

  size_t bag_begin(size_t bag) const { return size_t(offsets[bag]); }
  size_t bag_end(size_t bag) const {
    return bag + 1 < num_bags || include_last_offset ? size_t(offsets[bag + 1]) : num_ids;
  }
  bool skips(size_t position) const { return padding_idx >= 0 && ids[position] == uint64_t(padding_idx); }
};

// Throws StoreError(InvalidArgument) for what embedding_bag rejects: offsets not starting at 0,
// decreasing or past the end; per_sample_weights with a mode other than Sum; a padding_idx outside
// the table. Row ids are the table's to check.
void validate_embedding_bag(const EmbeddingBag& bag, uint64_t num_rows);

// Rows to read in turn, and for each of them the row a fixed distance after it (`ahead[k]`, for k
// below ahead_count: the ones that exist), which a reader of the run prefetches as it reads.
struct RowRun {
  const float* const* rows;
  const float* const* ahead;
  size_t ahead_count;
};

// Where pool_bags takes its rows: rows[k] (words 4-byte words: a table's record, or a copy of its
// weight words) for the k-th non-skipped id of the bags, anywhere in memory, prefetched a few rows
// ahead of their turn: the first ones whole when the pointers are made, and the others by whoever
// takes them — next() a whole row at a time, a run's reader line by line as it reads.
class RowPointers {
 public:
  RowPointers(const float* const* rows, size_t count, uint32_t words)
      : rows_(rows), count_(count), row_bytes_(size_t{words} * sizeof(float)), ahead_(rows_ahead(row_bytes_)) {
    for (size_t k = 0; k < std::min(count, ahead_); ++k) prefetch_range(rows_[k], row_bytes_);
  }
  // The next row, in order; there must be one.
  const float* next() {
    if (next_ + ahead_ < count_) prefetch_range(rows_[next_ + ahead_], row_bytes_);
    return rows_[next_++];
  }
  // The next n rows, in order; there must be n.
  RowRun take(size_t n) {
    const size_t ahead_first = next_ + ahead_;
    const RowRun run{rows_ + next_, rows_ + ahead_first, ahead_first < count_ ? std::min(n, count_ - ahead_first) : 0};
    next_ += n;
    return run;
  }

 private:
  // Rows are prefetched about kLinesAhead cache lines ahead of their reader: 32 rows of 512 bytes,
  // 64 of 256. On the Intel host 4 to 16 rows of either measured alike; on the AMD host, whose dense
  // kernel finds the rows in its L3, the summer waited on them at every shorter distance tried. 8
  // rows ahead: float32 bags of 32 took 0.72-0.74 ms, 16 rows 0.54-0.63, 24 rows 0.52-0.57 (1M x 128
  // rows, 65,536 ids). Later, with the index prefetched further and the sums streamed, calls of each
  // distance alternated in a shuffled order in one process: 128 lines against 256, float32 bags of 4
  // 0.59 against 0.53 ms, of 32 0.47 against 0.39 (0.52 against 0.46 weighted), float16 bags of 4
  // 0.34 against 0.33, of 32 0.25 against 0.23; bags of 1 alike; 384 and 512 lines no better.
  static constexpr size_t kLinesAhead = 256;
  static size_t rows_ahead(size_t row_bytes) {
    const size_t lines = std::max<size_t>(1, (row_bytes + kCacheLineBytes - 1) / kCacheLineBytes);
    return std::clamp<size_t>(kLinesAhead / lines, 4, 64);
  }
  const float* const* rows_;
  size_t count_;
  size_t row_bytes_;
  size_t ahead_;
  size_t next_ = 0;
};

// Where pooled bags go, bag b at row b: float32 values (a float* converts to this), or a half table's
// bags rounded into its own type as CPU's embedding_bag rounds them — each bag in turn, straight
// from its float32 sum, while the sum is in cache. For half outputs, Mean is CPU's: the sum rounded to
// the type, divided by the bag's size (at least 1) rounded to the type, in float32, and rounded
// again, as its apply_bag_size does after the float32-accumulated sum.
struct PooledOutput {
  PooledOutput(float* sums) : data(sums) {}  // implicit: float32 sums are the plain case
  PooledOutput(void* rows, ElementType type, bool bfloat16_ties_away)
      : data(rows), type(type), bfloat16_ties_away(bfloat16_ties_away) {}

  void* data;
  ElementType type = ElementType::Float32;  // Float32, Float16 or BFloat16
  // The whole output (of which this may be a part) is too large to stay in cache until it is read
  // (kStreamingOutputBytes and up): Sum bags' sums go to it with streaming stores, which write a
  // line without first reading it, where its rows start at multiples of 64 bytes.
  bool streams = false;
  // bfloat16 sums round with ties away from zero, as fbgemm rounds them where CPU pools with it (no
  // padding_idx); otherwise to nearest even. Sums of a few bfloat16 rows meet ties often.
  bool bfloat16_ties_away = false;
};

// Pools bags [first_bag, end_bag) into out (dim elements per bag, indexed by bag number), taking their
// rows (dim elements of `type`: Float32, Float16 or BFloat16) from `rows`, which holds one for each
// of their non-skipped ids. Half rows are widened exactly as they are read (in registers where the
// CPU can), so the arithmetic (and every result) is float32's on the widened values, and the rows'
// memory traffic is half of float32's. Empty bags give zeros; Mean divides by the number of
// non-skipped ids (into half outputs, as PooledOutput says); Max keeps the first of equal maxima and,
// when max_positions is not null, records per element the position in ids of the maximum (-1 for an
// empty bag), exactly as embedding_bag on CPU does (a nan stays only if it comes first in its bag).
void pool_bags(const EmbeddingBag& bag, size_t first_bag, size_t end_bag, RowPointers& rows, ElementType type,
               uint32_t dim, const PooledOutput& out, int64_t* max_positions);

}  // namespace recdev::store
