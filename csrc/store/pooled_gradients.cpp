#include "pooled_gradients.h"

#include <algorithm>

#include "errors.h"
#include "task_runner.h"

namespace recdev::store {

namespace {
// Values widened per task, and per thread worth starting.
constexpr size_t kWidenChunk = 64 * 1024;
constexpr size_t kWidenPerThread = 256 * 1024;
}  // namespace

PooledGradients::PooledGradients(const EmbeddingBag& bag, const void* bag_grads, uint32_t dim, ElementType type) {
  if (bag.mode == PoolingMode::Max) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "update_pooled: mode Max has no per-bag gradient (each element goes to the id that won it); "
                     "expand it per id and call update");
  }
  // Widening is exact, so a half Sum bag's rows need no rounding.
  const float* bag_rows = static_cast<const float*>(bag_grads);
  if (type != ElementType::Float32) {
    const size_t count = bag.num_bags * size_t{dim};
    // Not zero-filled first, and on both cores: a float16 training step's 16,384 x 128 gradients took
    // 1.4 ms on one thread through a zeroed vector.
    widened_ = std::make_unique_for_overwrite<float[]>(count);
    const size_t chunks = (count + kWidenChunk - 1) / kWidenChunk;
    run_tasks(chunks, threads_for(count, kWidenPerThread), [&](size_t chunk) {
      const size_t first = chunk * kWidenChunk;
      widen_to_float(type, static_cast<const uint16_t*>(bag_grads) + first, widened_.get() + first,
                     std::min(kWidenChunk, count - first));
    });
    bag_rows = widened_.get();
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
  for (size_t b = 0; b < bag.num_bags; ++b) {
    const float* bag_grad = bag_rows + b * dim;
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
    }
  }
  // A scaled share rounds into the table's type, as PyTorch's mul / div of the expanded half rows would.
  round_through(type, scaled_.data(), scaled_.size());
  values_ = scaled_.empty() ? bag_rows : scaled_.data();
  value_count_ = scaled_.empty() ? bag.num_bags * size_t{dim} : scaled_.size();
}

}  // namespace recdev::store
