// Sub-shards and batch routing.
//
// A table splits its rows over kNumShards sub-shards by the top bits of the row id's hash, each with
// its own lock and RowIndex. A batch operation first groups its ids by sub-shard (a counting sort),
// then takes each sub-shard's lock once for all of that sub-shard's ids, instead of once per id.
// Within a sub-shard, ids keep their batch order, so duplicates apply in order (the last write wins).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "row_index.h"

namespace recdev::store {

constexpr unsigned kShardBits = 6;
constexpr size_t kNumShards = size_t{1} << kShardBits;

// The index's buckets and tags use the low hash bits, so the shard takes the high ones.
inline size_t shard_of(uint64_t hash) { return size_t(hash >> (64 - kShardBits)); }

class ShardRoute {
 public:
  ShardRoute(const uint64_t* ids, size_t n);

  // Entries [begin(s), end(s)) belong to sub-shard s.
  size_t begin(size_t shard) const { return bounds_[shard]; }
  size_t end(size_t shard) const { return bounds_[shard + 1]; }

  size_t position(size_t entry) const { return positions_[entry]; }  // index of the id in the batch
  uint64_t hash(size_t entry) const { return hashes_[entry]; }

 private:
  std::unique_ptr<size_t[]> positions_;
  std::unique_ptr<uint64_t[]> hashes_;
  std::array<size_t, kNumShards + 1> bounds_{};
};

}  // namespace recdev::store
