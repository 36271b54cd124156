#include "shard_route.h"

namespace recdev::store {

ShardRoute::ShardRoute(const uint64_t* ids, size_t n) : positions_(new size_t[n]), hashes_(new uint64_t[n]) {
  std::array<size_t, kNumShards> counts{};
  for (size_t i = 0; i < n; ++i) ++counts[shard_of(hash_row_id(ids[i]))];
  for (size_t shard = 0; shard < kNumShards; ++shard) bounds_[shard + 1] = bounds_[shard] + counts[shard];

  std::array<size_t, kNumShards> cursor;
  for (size_t shard = 0; shard < kNumShards; ++shard) cursor[shard] = bounds_[shard];
  for (size_t i = 0; i < n; ++i) {
    // Hashing again is cheaper than storing the hashes in batch order and reading them back.
    const uint64_t hash = hash_row_id(ids[i]);
    const size_t entry = cursor[shard_of(hash)]++;
    positions_[entry] = i;
    hashes_[entry] = hash;
  }
}

}  // namespace recdev::store
