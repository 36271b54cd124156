#include "pooled_gradients.h"

#include <algorithm>

#include "errors.h"

namespace recdev::store {

PooledGradients::PooledGradients(const EmbeddingBag& bag, const float* bag_grads, uint32_t dim, ElementType type) {
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
  // Whether each bag's row is its own copy: scaled (Mean), or rounded into the table's type.
  const bool bag_copies = !weighted && (bag.mode == PoolingMode::Mean || type != ElementType::Float32);
  if (weighted) {
    scaled_.resize(bag.num_ids * size_t{dim});
  } else if (bag_copies) {
    scaled_.resize(bag.num_bags * size_t{dim});
  }
  for (size_t b = 0; b < bag.num_bags; ++b) {
    const float* bag_grad = bag_grads + b * dim;
    const size_t begin = bag.bag_begin(b);
    const size_t end = bag.bag_end(b);
    size_t count = 0;
    for (size_t position = begin; position < end; ++position) {
      if (bag.skips(position)) continue;
      if (skips_some) kept_ids_.push_back(bag.ids[position]);
      const float* row = bag_grad;
      if (weighted) {
        float* scaled = scaled_.data() + position * dim;
        const float weight = bag.per_sample_weights[position];
        for (uint32_t d = 0; d < dim; ++d) scaled[d] = bag_grad[d] * weight;
        row = scaled;
      } else if (bag_copies) {
        row = scaled_.data() + b * dim;
      }
      rows_.push_back(row);
      ++count;
    }
    if (!weighted && bag.mode == PoolingMode::Mean && count > 0) {
      float* scaled = scaled_.data() + b * dim;
      const float divisor = float(count);
      for (uint32_t d = 0; d < dim; ++d) scaled[d] = bag_grad[d] / divisor;
    } else if (bag_copies) {
      std::copy_n(bag_grad, dim, scaled_.data() + b * dim);
    }
  }
  round_through(type, scaled_.data(), scaled_.size());
  values_ = scaled_.empty() ? bag_grads : scaled_.data();
  value_count_ = scaled_.empty() ? bag.num_bags * size_t{dim} : scaled_.size();
}

}  // namespace recdev::store
