// Software prefetch: starts loading the cache line that holds an address, without waiting for it.
// Batch loops use it to overlap the cache misses of many rows instead of paying them one after
// another. A prefetch never faults, whatever the address.
#pragma once

#include <cstddef>
#include <cstdint>

namespace recdev::store {

constexpr size_t kCacheLineBytes = 64;

inline void prefetch(const void* address) {
#if defined(__x86_64__) || defined(__i386__)
  // Not __builtin_prefetch: GCC 12 at -O2 silently drops some of those as dead code (one under a
  // branch, or in a loop that does nothing else).
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(address)));
#else
  __builtin_prefetch(address);
#endif
}

// Prefetches every cache line of [address, address + bytes).
inline void prefetch_range(const void* address, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(address);
  for (uintptr_t line = begin & ~uintptr_t{kCacheLineBytes - 1}; line < begin + bytes; line += kCacheLineBytes) {
    prefetch(reinterpret_cast<const void*>(line));
  }
}

}  // namespace recdev::store
