// PooledGradients: the per-id gradients of an embedding_bag's output, as Table::update_pooled hands
// them to coalescing — without writing out a gradient row per id.
//
// The gradient an id gets is its bag's, scaled as the bag was pooled: Sum as it is (times the id's
// per-sample weight when there is one), Mean divided by the number of ids pooled in the bag. So
// every id of a Sum bag points at its bag's gradient row, and Mean needs one scaled row per bag; only
// per-sample weights need a row per id. Skipped ids (padding_idx) get no gradient. The values are
// bit for bit those of expanding first (PyTorch's index_select of the bag gradients, then mul / div
// in float32), so the update is the same.
//
// G is the type of the bag gradients, the table's own: float, or uint16_t for Float16 and BFloat16
// tables. Half bag rows are used as they are — the optimizer widens them in registers, and a Sum bag
// needs no other copy — and each scaled share (Mean, per-sample weights) is computed in float32 and
// rounded back into the table's type, as PyTorch's mul / div of the expanded half rows would round it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "element_type.h"
#include "embedding_bag.h"

namespace recdev::store {

template <class G>
class PooledGradients {
 public:
  // bag: validated, with mode Sum or Mean; bag_grads: num_bags * dim elements of `type` (must
  // outlive this); type: the table's (Float32 for G = float, Float16 or BFloat16 for uint16_t), dim
  // its row's elements.
  PooledGradients(const EmbeddingBag& bag, const G* bag_grads, uint32_t dim, ElementType type);

  // The ids that get a gradient (batch order, skipped ones left out) and each one's gradient row.
  size_t size() const { return rows_.size(); }
  const uint64_t* ids() const { return ids_ != nullptr ? ids_ : kept_ids_.data(); }
  const G* const* rows() const { return rows_.data(); }

  // Every element the rows point into (and maybe some no id points at, e.g. an empty bag's
  // gradient): checking these is enough to know every row is finite.
  const G* values() const { return values_; }
  size_t value_count() const { return value_count_; }

 private:
  const uint64_t* ids_ = nullptr;  // the bag's own ids, when none is skipped
  std::vector<uint64_t> kept_ids_;
  std::vector<const G*> rows_;
  // Mean: a row per bag; per-sample weights: a row per id.
  std::vector<G> scaled_;
  const G* values_ = nullptr;
  size_t value_count_ = 0;
};

extern template class PooledGradients<float>;
extern template class PooledGradients<uint16_t>;

}  // namespace recdev::store
