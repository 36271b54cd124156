#include "pooled_gradients.h"

#include <type_traits>

#include "errors.h"

namespace recdev::store {

template <class G>
PooledGradients<G>::PooledGradients(const EmbeddingBag& bag, const G* bag_grads, uint32_t dim, ElementType type) {
  if (bag.mode == PoolingMode::Max) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "update_pooled: mode Max has no per-bag gradient (each element goes to the id that won it); "
                     "expand it per id and call update");
  }
  bool skips_some = false;
  for (size_t position = 0; position < bag.num_ids && !skips_some; ++position) skips_some = bag.skips(position);
  if (skips_some) {
    kept_ids_.reserve(bag.num_ids);
  } else {
    ids_ = bag.ids;
  }
  rows_.reserve(bag.num_ids);
  const bool weighted = bag.per_sample_weights != nullptr;
  const bool bag_copies = !weighted && bag.mode == PoolingMode::Mean;  // each bag's row scaled
  if (weighted) {
    scaled_.resize(bag.num_ids * size_t{dim});
  } else if (bag_copies) {
    scaled_.resize(bag.num_bags * size_t{dim});
  }
  // A scaled share is computed in float32 and rounded into the table's type, as PyTorch's mul / div
  // of the expanded half rows would round it.
  std::vector<float> wide(std::is_same_v<G, float> ? 0 : dim);
  std::vector<float> share(std::is_same_v<G, float> ? 0 : dim);
  const auto scale = [&](const G* bag_grad, G* out, auto&& scaled_value) {
    if constexpr (std::is_same_v<G, float>) {
      for (uint32_t d = 0; d < dim; ++d) out[d] = scaled_value(bag_grad[d]);
    } else {
      for (uint32_t d = 0; d < dim; ++d) share[d] = scaled_value(wide[d]);
      narrow_from_float(type, share.data(), out, dim);
    }
  };
  for (size_t b = 0; b < bag.num_bags; ++b) {
    const G* bag_grad = bag_grads + b * dim;
    if constexpr (!std::is_same_v<G, float>) {
      if (!scaled_.empty()) widen_to_float(type, bag_grad, wide.data(), dim);
    }
    const size_t begin = bag.bag_begin(b);
    const size_t end = bag.bag_end(b);
    size_t count = 0;
    for (size_t position = begin; position < end; ++position) {
      if (bag.skips(position)) continue;
      if (skips_some) kept_ids_.push_back(bag.ids[position]);
      const G* row = bag_grad;
      if (weighted) {
        G* scaled = scaled_.data() + position * dim;
        const float weight = bag.per_sample_weights[position];
        scale(bag_grad, scaled, [weight](float value) { return value * weight; });
        row = scaled;
      } else if (bag_copies) {
        row = scaled_.data() + b * dim;
      }
      rows_.push_back(row);
      ++count;
    }
    if (bag_copies && count > 0) {
      const float divisor = float(count);
      scale(bag_grad, scaled_.data() + b * dim, [divisor](float value) { return value / divisor; });
    }
  }
  values_ = scaled_.empty() ? bag_grads : scaled_.data();
  value_count_ = scaled_.empty() ? bag.num_bags * size_t{dim} : scaled_.size();
}

template class PooledGradients<float>;
template class PooledGradients<uint16_t>;

}  // namespace recdev::store
