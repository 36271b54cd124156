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
// next chunk of its size. A region whose chunks are all free is kept, mapped, for the next region
// of any chunk size, up to RECDEV_STORE_CACHE_BYTES (1 GiB by default) of them, and unmapped past
// that, so memory follows the rows down as well as up. Why keep any: a fresh region costs a page
// fault that zeroes 2 MiB, as much as copying rows into it, and replacing a table (load_state_dict,
// a checkpoint load, set_init) frees about as many regions as the new rows then need: a 1M x 64
// table's load_state_dict took 61 ms with every region fresh, 27 ms with them kept.
// What the pool holds beyond the chunks in use — the unused part of the last region of each chunk
// size, and freed chunks in regions still partly used — is counted by no table;
// pooled_chunk_slack_bytes() reports it, and cached_chunk_region_bytes() the empty regions kept.
// Sizes the regions would waste memory on (small ones, and large ones that do not divide or fill
// whole regions) come from operator new. Every chunk is table memory to memory_accounting.h: in use
// while held, reserved with the regions it lies in. Thread-safe.
#pragma once

#include <cstddef>
#include <memory>

namespace recdev::store {

// The pool's unit of mapping, and of a huge page: an allocate_chunk of a multiple of it is a
// huge-page mapping of its own (or a region).
inline constexpr size_t kChunkRegionBytes = size_t{2} << 20;

// Frees a chunk from allocate_chunk, wherever it came from; it carries the chunk's size for the
// memory accounts.
struct ChunkDeleter {
  size_t bytes = 0;
  void operator()(std::byte* chunk) const noexcept;
};
using ChunkPtr = std::unique_ptr<std::byte[], ChunkDeleter>;

// `bytes` of uninitialized memory, aligned for any record. Throws std::bad_alloc, or StoreError
// (InvalidArgument) when RECDEV_STORE_CACHE_BYTES is not a number.
ChunkPtr allocate_chunk(size_t bytes);

// `bytes` from operator new, never pooled, but counted as a chunk: for arrays too small to share regions.
ChunkPtr allocate_heap_chunk(size_t bytes);

// `bytes` (a multiple of kChunkRegionBytes) of huge-page memory outside the pool and its accounts,
// for CPU arrays that are not table memory (a snapshot's rows); give it back with unmap_huge_pages.
std::byte* map_huge_pages(size_t bytes);
void unmap_huge_pages(std::byte* base, size_t bytes) noexcept;

// Bytes the pool holds in its regions that are not in a chunk in use (empty regions kept aside).
size_t pooled_chunk_slack_bytes();

// Bytes of empty regions kept for reuse, and giving them back to the system.
size_t cached_chunk_region_bytes();
void release_cached_chunk_regions() noexcept;

}  // namespace recdev::store
