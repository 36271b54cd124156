// Whether a batch's row ids are all in range: the check every lookup makes before it touches a row
// (a refused request changes nothing), so it reads each id once more than the lookup does and must
// cost no more than that read.
#pragma once

#include <cstddef>
#include <cstdint>

namespace recdev::store {

// Whether every ids[i] < limit, for i in [0, count). Int64 ids read as uint64 fail it when negative.
bool all_ids_below(const uint64_t* ids, size_t count, uint64_t limit);

}  // namespace recdev::store
