// DiskIndex: where each row of a disk tier is (disk_tier.h): row id -> a 64-bit location, in a flat
// open-addressing map of 16-byte slots at most 80% full (flat_id_map.h): 20-40 bytes of memory per row
// on disk, the cost the memory tier still pays for every row it does not hold. Not thread-safe:
// DiskTier guards it.
#pragma once

#include <cstdint>

#include "flat_id_map.h"

namespace recdev::store {

using DiskIndex = FlatIdMap<uint64_t, 80>;

}  // namespace recdev::store
