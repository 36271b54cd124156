// Memory for SlabArena's chunks and RowIndex's bucket arrays. Chunks of a few KiB — the full-size
// chunks that hold nearly every row of a large table — and power-of-two bucket arrays up to 2 MiB are
// carved from 2 MiB regions that the kernel is asked to back with transparent huge pages (madvise
// MADV_HUGEPAGE; honoured when THP is "always" or "madvise"); a bucket array of several regions gets
// a huge-page mapping of its own.
//
// Why: lookups and updates touch rows at random across hundreds of MiB of records. With 4 KiB pages
// nearly every row costs a TLB miss and a page walk, which also holds up the prefetches meant to
// overlap the rows' cache misses; 2 MiB pages cover a table of gigabytes with the TLB entries a core
// has. (Measured on 1M x 128 rows, single thread: gather -9%, pooled gather -10%, an Adagrad training
// step -18%.) The same holds for the buckets, one random line per row: a 1M-row table's 32 MiB of
// them took a page walk per row too (pooled gather, found in bag order across all sub-shards: a
// further -7%). Memory from the malloc heap cannot get huge pages: neighbouring allocations fault the
// heap in 4 KiB pages first.
//
// A region serves chunks of one size, one table's or many tables'; a freed chunk is reused by the
// next chunk of its size, and a region whose chunks are all free is unmapped, so memory follows the
// rows down as well as up. What the pool holds beyond the chunks in use — the unused part of the
// last region of each chunk size, and freed chunks in regions still partly used — is counted by no
// table; pooled_chunk_slack_bytes() reports it. Sizes the regions would waste memory on (small ones,
// and large ones that do not divide or fill whole regions) come from operator new. Thread-safe.
#pragma once

#include <cstddef>
#include <memory>

namespace recdev::store {

// Frees a chunk from allocate_chunk, wherever it came from.
struct ChunkDeleter {
  void operator()(std::byte* chunk) const noexcept;
};
using ChunkPtr = std::unique_ptr<std::byte[], ChunkDeleter>;

// `bytes` of uninitialized memory, aligned for any record. Throws std::bad_alloc.
ChunkPtr allocate_chunk(size_t bytes);

// Bytes the pool holds in its regions that are not in a chunk in use.
size_t pooled_chunk_slack_bytes();

}  // namespace recdev::store
