#include "direct_index.h"

#include <algorithm>

namespace recdev::store {
namespace {

using uint128 = unsigned __int128;

// Whether `rows` records of record_bytes hold at least `factor` times the 8 bytes per possible id.
bool records_outweigh(uint64_t num_rows, uint64_t rows, size_t record_bytes, uint64_t factor) {
  return num_rows != 0 && uint128{rows} * record_bytes >= uint128{num_rows} * sizeof(float*) * factor;
}

}  // namespace

bool DirectIndex::worth_building(uint64_t num_rows, uint64_t rows, size_t record_bytes) {
  return records_outweigh(num_rows, rows, record_bytes, kBuildFactor);
}

bool DirectIndex::worth_keeping(uint64_t num_rows, uint64_t rows, size_t record_bytes) {
  return records_outweigh(num_rows, rows, record_bytes, kKeepFactor);
}

void DirectIndex::build(uint64_t num_rows) {
  size_t bytes = num_rows * sizeof(float*);  // no overflow: records of at least 16x that are in memory
  // Whole regions come as a huge-page mapping of their own (chunk_pool.h): every lookup reads a
  // random entry, and on 4 KiB pages each would cost a page walk.
  if (bytes >= kChunkRegionBytes) bytes = (bytes + kChunkRegionBytes - 1) / kChunkRegionBytes * kChunkRegionBytes;
  memory_ = allocate_chunk(bytes);
  allocated_bytes_ = bytes;
  records_ = reinterpret_cast<const float**>(memory_.get());
  std::fill(records_, records_ + num_rows, nullptr);
}

void DirectIndex::drop() {
  records_ = nullptr;
  allocated_bytes_ = 0;
  memory_.reset();
}

}  // namespace recdev::store
