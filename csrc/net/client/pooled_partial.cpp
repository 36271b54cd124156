#include "pooled_partial.h"

#include <algorithm>
#include <string>

#include "store/errors.h"

namespace recdev::net {

using store::PoolingMode;

std::vector<ShardBags> split_bags(const store::EmbeddingBag& bag, size_t first_bag, size_t end_bag,
                                  const std::vector<uint32_t>& owner, size_t num_shards) {
  std::vector<ShardBags> shares(num_shards);
  for (size_t b = first_bag; b < end_bag; ++b) {
    for (ShardBags& share : shares) share.offsets.push_back(share.ids.size());
    if (bag.mode == PoolingMode::Max) {
      size_t first = bag.bag_begin(b);
      while (first < bag.bag_end(b) && bag.skips(first)) ++first;
      for (size_t s = 0; s < num_shards; ++s) {
        shares[s].ignore_nan.push_back(first < bag.bag_end(b) && owner[first] != s ? 1 : 0);
      }
    }
    for (size_t position = bag.bag_begin(b); position < bag.bag_end(b); ++position) {
      ShardBags& share = shares[owner[position]];
      share.ids.push_back(bag.ids[position]);
      share.positions.push_back(position);
      if (bag.per_sample_weights != nullptr) share.weights.push_back(bag.per_sample_weights[position]);
    }
  }
  return shares;
}

void combine_partials(const store::EmbeddingBag& bag, size_t first_bag, size_t end_bag,
                      const std::vector<ShardBags>& shares, const std::vector<PooledPartialResponse>& partials,
                      uint32_t dim, float* out, int64_t* max_positions) {
  const size_t num_bags = end_bag - first_bag;
  const bool is_max = bag.mode == PoolingMode::Max;
  for (size_t s = 0; s < partials.size(); ++s) {
    const PooledPartialResponse& partial = partials[s];
    const bool shaped = partial.values.size() == num_bags * dim &&
                        (is_max ? partial.positions.size() == num_bags * dim && partial.counts.empty()
                                : partial.counts.size() == num_bags && partial.positions.empty());
    if (!shaped) {
      throw store::StoreError(store::ErrorCode::Protocol,
                              "shard " + std::to_string(s) + " answered a pooled lookup of " +
                                  std::to_string(num_bags) + " bags with a result of another shape");
    }
    for (const int32_t position : partial.positions) {
      if (position < -1 || (position >= 0 && size_t(position) >= shares[s].ids.size())) {
        throw store::StoreError(store::ErrorCode::Protocol, "shard " + std::to_string(s) +
                                                                " answered a pooled lookup with a position outside "
                                                                "its ids");
      }
    }
  }
  struct Candidate {
    int64_t position;
    float value;
  };
  std::vector<Candidate> candidates;
  for (size_t k = 0; k < num_bags; ++k) {
    float* bag_out = out + (first_bag + k) * dim;
    int64_t* bag_positions = max_positions != nullptr ? max_positions + (first_bag + k) * dim : nullptr;
    if (!is_max) {
      std::fill(bag_out, bag_out + dim, 0.0f);
      uint64_t count = 0;
      for (const PooledPartialResponse& partial : partials) {
        const float* values = partial.values.data() + k * dim;
        for (uint32_t d = 0; d < dim; ++d) bag_out[d] += values[d];
        count += partial.counts[k];
      }
      if (bag.mode == PoolingMode::Mean && count > 0) {
        for (uint32_t d = 0; d < dim; ++d) bag_out[d] /= float(count);
      }
      continue;
    }
    for (uint32_t d = 0; d < dim; ++d) {
      candidates.clear();
      for (size_t s = 0; s < partials.size(); ++s) {
        const int32_t local = partials[s].positions[k * dim + d];
        if (local >= 0)
          candidates.push_back({int64_t(shares[s].positions[size_t(local)]), partials[s].values[k * dim + d]});
      }
      // In batch order, an earlier candidate is replaced only by a greater later one, as pool_bags does.
      std::sort(candidates.begin(), candidates.end(),
                [](const Candidate& lhs, const Candidate& rhs) { return lhs.position < rhs.position; });
      float best = 0.0f;
      int64_t best_position = -1;
      for (const Candidate& candidate : candidates) {
        if (best_position < 0 || candidate.value > best) {
          best = candidate.value;
          best_position = candidate.position;
        }
      }
      bag_out[d] = best;
      if (bag_positions != nullptr) bag_positions[d] = best_position;
    }
  }
}

}  // namespace recdev::net
