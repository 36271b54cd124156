// CoalescedGradients: the gradients of one Table::update, summed per distinct row and grouped by
// sub-shard, ready to be applied one sub-shard at a time.
//
// Duplicates are found per sub-shard with a small open-addressing map rather than by sorting the
// batch: a sub-shard's share of a batch is small enough for its map to stay in cache, and sub-shards
// are independent, so they coalesce in parallel. A row named once keeps pointing at the caller's
// gradient row, so only duplicates are copied; their gradients are summed in the compute type
// (element_type.h) in batch order (optimizer.h). G is the type of the caller's gradient elements,
// the table's own: float; uint16_t for Float16 and BFloat16 tables, whose duplicates are widened and
// summed in float32; or double for float64 tables, summed in double as torch sums float64 gradients.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "element_type.h"
#include "shard_route.h"

namespace recdev::store {

template <class G>
class CoalescedGradients {
 public:
  using Sum = std::conditional_t<std::is_same_v<G, double>, double, float>;

  // Exactly one of grad and sum is set.
  struct Row {
    uint64_t id;
    uint64_t hash;   // hash_row_id(id)
    const G* grad;   // a row named once: the caller's gradient row
    const Sum* sum;  // a row named more than once: the sum of its gradients
  };

  // A summed gradient that is not finite: the row and its first column that is not.
  struct Overflow {
    uint64_t row_id;
    uint32_t column;
  };

  // n ids and their gradient rows: grads[i], dim elements of `type` (Float32, Float64, or a half type
  // for G = uint16_t), is the gradient of ids[i] (rows may be shared between ids, and must outlive
  // this object). The work is spread over `threads` threads.
  CoalescedGradients(const uint64_t* ids, size_t n, const G* const* grads, ElementType type, uint32_t dim,
                     size_t threads);

  // The distinct rows of a sub-shard, in the order of their first occurrence in the batch.
  const std::vector<Row>& rows(size_t shard) const { return shards_[shard].rows; }
  size_t size() const;  // distinct rows in all

  // The overflowing sum with the smallest row id, if any: a sum of finite gradients can still be inf.
  std::optional<Overflow> first_overflow() const;

 private:
  struct Shard {
    std::vector<Row> rows;
    std::vector<Sum> sums;  // dim values per row named more than once
    std::optional<Overflow> overflow;
  };

  void coalesce_shard(const ShardRoute& route, size_t shard, const uint64_t* ids, const G* const* grads,
                      ElementType type, uint32_t dim);

  std::array<Shard, kNumShards> shards_;
};

extern template class CoalescedGradients<float>;
extern template class CoalescedGradients<uint16_t>;
extern template class CoalescedGradients<double>;

}  // namespace recdev::store
