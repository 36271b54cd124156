// SlabArena: fixed-size records addressed by a dense slot number 0..size()-1, stored in chunks.
//
// Why chunks: one growing vector would copy every row on each reallocation (a transient 2x of the
// whole table) and would move records under readers; per-row malloc would cost a header per row and
// fragment. Chunks are allocated once and never move, so a record pointer stays valid until that
// record is popped or the arena is cleared.
//
// Chunks come from chunk_pool.h (full-size ones on huge pages where the kernel allows).
//
// Chunk sizes grow geometrically up to a full-size chunk (8-16 KiB), then stay fixed:
//   chunk 0: B records, chunk k (1 <= k < K): B * 2^(k-1) records, chunk k >= K: C records,
// with C = B * 2^(K-1) a power of two. A tiny arena therefore holds a few KiB, not a full chunk, and
// a large one wastes at most one partly filled chunk. Finding a slot's chunk is a shift or a
// count-leading-zeros, no division.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "chunk_pool.h"

namespace recdev::store {

class SlabArena {
 public:
  explicit SlabArena(size_t record_bytes);
  // Moving leaves the source empty (and usable).
  SlabArena(SlabArena&& other) noexcept;
  SlabArena& operator=(SlabArena&& other) noexcept;

  size_t record_bytes() const { return record_bytes_; }
  size_t size() const { return size_; }

  std::byte* record(size_t slot) const {
    size_t chunk;
    size_t offset;
    if (slot >= full_rows_) {
      chunk = num_growing_chunks_ - 1 + (slot >> log_full_rows_);
      offset = slot & (full_rows_ - 1);
    } else if (slot < first_rows_) {
      chunk = 0;
      offset = slot;
    } else {
      const size_t quotient = slot >> log_first_rows_;  // in [1, 2^(K-1))
      chunk = size_t(64 - __builtin_clzll(quotient));
      offset = slot - (first_rows_ << (chunk - 1));
    }
    return chunks_[chunk].get() + offset * record_bytes_;
  }

  // A copy with the same records in the same slots, chunk by chunk (no per-record work). Explicit
  // rather than a copy constructor: copying a sub-shard's records is never incidental. Throws
  // std::bad_alloc.
  SlabArena copy() const;
  // Copies every record, in slot order, to size() * record_bytes() contiguous bytes at `out`.
  void copy_out(std::byte* out) const;

  // Appends an uninitialized record and returns its slot. Throws std::bad_alloc.
  size_t push_back();
  // Drops the last record. Frees a trailing chunk once the chunk before it is empty too, so that
  // alternating push/pop at a chunk boundary does not allocate and free each time.
  void pop_back();
  void clear();

  // Every byte this arena holds: chunks plus the chunk table.
  size_t bytes() const { return chunk_bytes_ + chunks_.capacity() * sizeof(chunks_[0]); }

 private:
  size_t chunk_start(size_t chunk) const;
  size_t chunk_rows(size_t chunk) const;
  size_t used_rows(size_t chunk) const;  // the records in use in that chunk

  size_t record_bytes_;
  unsigned log_full_rows_;
  unsigned log_first_rows_;
  size_t full_rows_;           // C
  size_t first_rows_;          // B
  size_t num_growing_chunks_;  // K
  std::vector<ChunkPtr> chunks_;
  size_t size_ = 0;
  size_t chunk_bytes_ = 0;
};

}  // namespace recdev::store
