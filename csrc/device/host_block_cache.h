#pragma once
// Keeps large freed host blocks for reuse. Allocating a fresh multi-megabyte
// block costs a page fault per 4 KiB page on first touch, which dominates ops
// like embedding lookups whose outputs are tens of megabytes; a reused block
// is already mapped. Blocks are matched by exact size, the common case in a
// training loop, and the cache is capped (RECDEV_HOST_CACHE_BYTES, default
// 1 GiB), evicting the oldest block first.

#include <c10/core/Allocator.h>

#include <cstddef>

namespace recdev::device {

// Blocks smaller than this are cheap to get from the CPU allocator.
constexpr size_t kMinCachedBlockBytes = size_t{1} << 20;

// A cached block of exactly `nbytes`, or an empty DataPtr.
c10::DataPtr take_cached_block(size_t nbytes);

// Offers a block for reuse; frees it when the cache is full.
void return_block(c10::DataPtr block, size_t nbytes);

// Frees every cached block (torch_recdev.empty_cache()).
void empty_host_cache();
size_t cached_host_bytes();

}  // namespace recdev::device
