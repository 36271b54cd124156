// embedding_bag across shards: each shard pools the ids it owns into one partial result per bag
// (GATHER_POOLED_PARTIAL, docs/protocol.md), and the client combines the partials into what
// store::pool_bags gives for the whole batch — so the wire carries one row per bag and shard instead
// of one per id.
//
// Combination: Sum adds the shards' partial sums (in shard order: the result equals the embedded
// store's up to the order of float additions); Mean divides that by the total count of non-padding
// ids; Max takes each element's candidates in the order of their positions in the batch and keeps a
// later one only if it is greater, so the first of equal maxima wins and a nan that comes first in
// its bag stays, as on the CPU. A shard whose share of a bag does not hold the bag's first row
// ignores nan (ignore_nan), as the CPU does after a bag's first row: otherwise a nan first in that
// share would hide the rows after it there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "net/wire/protocol.h"
#include "store/embedding_bag.h"

namespace recdev::net {

// One shard's share of bags [first_bag, end_bag) of a batch.
struct ShardBags {
  std::vector<uint64_t> ids;
  std::vector<uint64_t> offsets;    // bag starts into ids, one per bag of the range
  std::vector<float> weights;       // per-sample weights of ids (when the batch has them)
  std::vector<uint64_t> positions;  // the position in the batch of each of ids
  std::vector<uint8_t> ignore_nan;  // Max: per bag, whether another shard holds the bag's first row
};

// `owner[p]` is the shard of the id at batch position p. `bag` must be valid (validate_embedding_bag).
std::vector<ShardBags> split_bags(const store::EmbeddingBag& bag, size_t first_bag, size_t end_bag,
                                  const std::vector<uint32_t>& owner, size_t num_shards);

// Writes bags [first_bag, end_bag) of out (and of max_positions, for Max, when not null: batch
// positions, -1 for a bag with no row) from the shards' answers to their shares.
// StoreError(Protocol) if an answer does not have the shape of its request.
void combine_partials(const store::EmbeddingBag& bag, size_t first_bag, size_t end_bag,
                      const std::vector<ShardBags>& shares, const std::vector<PooledPartialResponse>& partials,
                      uint32_t dim, float* out, int64_t* max_positions);

}  // namespace recdev::net
