// CoalescedGradients: the gradients of one Table::update, summed per distinct row and grouped by
// sub-shard, ready to be applied one sub-shard at a time.
//
// Duplicates are found per sub-shard with a small open-addressing map rather than by sorting the
// batch: a sub-shard's share of a batch is small enough for its map to stay in cache, and sub-shards
// are independent, so they coalesce in parallel. A row's gradients are summed in float32 in batch
// order (optimizer.h); a row named once keeps pointing at the caller's gradient row, so only
// duplicates are copied. T is the compute type of the table (element_type.h): float, or double for
// float64 tables, whose duplicates are summed in double as torch sums float64 gradients.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "shard_route.h"

namespace recdev::store {

template <class T>
class CoalescedGradients {
 public:
  struct Row {
    uint64_t id;
    uint64_t hash;      // hash_row_id(id)
    const T* grad;  // dim values: the caller's gradient row, or the sum of the row's gradients
  };

  // A summed gradient that is not finite: the row and its first column that is not.
  struct Overflow {
    uint64_t row_id;
    uint32_t column;
  };

  // n ids and their gradient rows: grads[i], dim floats, is the gradient of ids[i] (rows may be shared
  // between ids, and must outlive this object). The work is spread over `threads` threads.
  CoalescedGradients(const uint64_t* ids, size_t n, const T* const* grads, uint32_t dim, size_t threads);

  // The distinct rows of a sub-shard, in the order of their first occurrence in the batch.
  const std::vector<Row>& rows(size_t shard) const { return shards_[shard].rows; }
  size_t size() const;  // distinct rows in all

  // The overflowing sum with the smallest row id, if any: a sum of finite gradients can still be inf.
  std::optional<Overflow> first_overflow() const;

 private:
  struct Shard {
    std::vector<Row> rows;
    std::vector<T> sums;  // dim values per row named more than once
    std::optional<Overflow> overflow;
  };

  void coalesce_shard(const ShardRoute& route, size_t shard, const uint64_t* ids, const T* const* grads,
                      uint32_t dim);

  std::array<Shard, kNumShards> shards_;
};

extern template class CoalescedGradients<float>;
extern template class CoalescedGradients<double>;

}  // namespace recdev::store
