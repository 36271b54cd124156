#include "chunk_pool.h"

#include "errors.h"
#include "memory_accounting.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace recdev::store {
namespace {

constexpr size_t kRegionBytes = kChunkRegionBytes;
// Pooled chunk sizes: below, a chunk is a small arena's and operator new is as good; up to
// kMaxAnyPooledBytes a region's unused tail is at most 1/32 of it; above, only sizes that divide a
// region exactly (the power-of-two bucket arrays of row indexes) are pooled, so that none is lost.
constexpr size_t kMinPooledBytes = size_t{4} << 10;
constexpr size_t kMaxAnyPooledBytes = size_t{64} << 10;

// How many bytes of empty regions the pool keeps for reuse: RECDEV_STORE_CACHE_BYTES, 1 GiB by
// default. A value that is not a number keeps none and leaves `error` to report.
struct CacheLimit {
  size_t bytes = size_t{1} << 30;
  std::string error;
};

CacheLimit cache_limit_from_env() {
  CacheLimit limit;
  const char* value = std::getenv("RECDEV_STORE_CACHE_BYTES");
  if (value == nullptr || *value == '\0') return limit;
  char* end = nullptr;
  errno = 0;
  limit.bytes = std::strtoull(value, &end, 10);
  if (*end != '\0' || errno == ERANGE || value[0] == '-') {
    limit.bytes = 0;
    limit.error = std::string("RECDEV_STORE_CACHE_BYTES must be a number of bytes; got '") + value +
                  "'. Unset it for the default (1 GiB), or set it to 0 to keep no freed memory.";
  }
  return limit;
}

// `bytes` (a multiple of kRegionBytes) aligned to a region, advised onto huge pages.
std::byte* map_aligned(size_t bytes) {
#if defined(__linux__)
  // A region more than asked, then the unaligned ends cut off: mmap only promises page alignment.
  void* mapped = mmap(nullptr, bytes + kRegionBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(mapped);
  const uintptr_t aligned = (start + kRegionBytes - 1) & ~uintptr_t{kRegionBytes - 1};
  if (aligned > start) munmap(mapped, aligned - start);
  munmap(reinterpret_cast<void*>(aligned + bytes), start + kRegionBytes - aligned);
  madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);  // a hint: no THP is fine
  return reinterpret_cast<std::byte*>(aligned);
#else
  return static_cast<std::byte*>(::operator new(bytes, std::align_val_t{kRegionBytes}));
#endif
}

void unmap(std::byte* base, size_t bytes) noexcept {
#if defined(__linux__)
  munmap(base, bytes);
#else
  ::operator delete(base, std::align_val_t{kRegionBytes});
#endif
}

// The pool's own mappings, counted as table memory reserved.
std::byte* map_counted(size_t bytes) {
  std::byte* base = map_aligned(bytes);
  count_reserved(MemoryKind::Table, static_cast<int64_t>(bytes));
  return base;
}

void unmap_counted(std::byte* base, size_t bytes) noexcept {
  unmap(base, bytes);
  count_reserved(MemoryKind::Table, -static_cast<int64_t>(bytes));
}

struct Region {
  std::byte* base;
  size_t chunk_bytes;
  size_t capacity;    // chunks that fit
  size_t carved = 0;  // chunks handed out at least once: [0, carved)
  size_t in_use = 0;
  std::vector<size_t> free_slots;  // slots below `carved` handed back; capacity reserved up front
  // The regions of one chunk size that have room, as an intrusive list (so that freeing a chunk
  // never allocates).
  Region* prev = nullptr;
  Region* next = nullptr;
  bool has_room() const { return !free_slots.empty() || carved < capacity; }
};

class Pool {
 public:
  // Never throws, since freeing any chunk reaches the pool: a malformed RECDEV_STORE_CACHE_BYTES
  // is reported by check_settings() when memory is asked for instead.
  Pool() : cache_limit_(cache_limit_from_env()) {}

  void check_settings() const {
    if (!cache_limit_.error.empty()) throw StoreError(ErrorCode::InvalidArgument, cache_limit_.error);
  }

  std::byte* allocate(size_t chunk_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    Region*& head = with_room_[chunk_bytes];
    if (head == nullptr) link(head, map_region(chunk_bytes));
    Region& region = *head;
    size_t slot;
    if (!region.free_slots.empty()) {
      slot = region.free_slots.back();
      region.free_slots.pop_back();
    } else {
      slot = region.carved++;
    }
    ++region.in_use;
    slack_ -= chunk_bytes;
    if (!region.has_room()) unlink(head, &region);
    return region.base + slot * chunk_bytes;
  }

  // A mapping of its own, `bytes` a multiple of kRegionBytes.
  std::byte* allocate_whole_regions(size_t bytes) {
    std::byte* base = map_counted(bytes);
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      whole_regions_.emplace(reinterpret_cast<uintptr_t>(base), bytes);
    } catch (...) {
      unmap_counted(base, bytes);
      throw;
    }
    return base;
  }

  // Returns false, doing nothing, for memory that is not the pool's.
  bool release(std::byte* chunk) noexcept {
    const uintptr_t base = reinterpret_cast<uintptr_t>(chunk) & ~uintptr_t{kRegionBytes - 1};
    std::lock_guard<std::mutex> lock(mutex_);
    if (const auto whole = whole_regions_.find(reinterpret_cast<uintptr_t>(chunk)); whole != whole_regions_.end()) {
      unmap_counted(chunk, whole->second);
      whole_regions_.erase(whole);
      return true;
    }
    const auto found = regions_.find(base);
    if (found == regions_.end()) return false;
    Region& region = *found->second;
    Region*& head = with_room_.find(region.chunk_bytes)->second;  // made by the region's first allocate
    const bool was_listed = region.has_room();
    --region.in_use;
    slack_ += region.chunk_bytes;
    if (region.in_use == 0) {
      if (was_listed) unlink(head, &region);
      slack_ -= kRegionBytes;
      keep_or_unmap(region.base);
      regions_.erase(found);
      return true;
    }
    region.free_slots.push_back(size_t(chunk - region.base) / region.chunk_bytes);
    if (!was_listed) link(head, &region);
    return true;
  }

  size_t slack() {
    std::lock_guard<std::mutex> lock(mutex_);
    return slack_;
  }

  size_t cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    return empty_regions_.size() * kRegionBytes;
  }

  void release_cached() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::byte* base : empty_regions_) unmap_counted(base, kRegionBytes);
    empty_regions_.clear();
  }

 private:
  Region* map_region(size_t chunk_bytes) {
    std::byte* base;
    if (!empty_regions_.empty()) {
      base = empty_regions_.back();  // the most recently freed: the likeliest still in cache
      empty_regions_.pop_back();
    } else {
      base = map_counted(kRegionBytes);
    }
    try {
      auto region = std::make_unique<Region>();
      region->base = base;
      region->chunk_bytes = chunk_bytes;
      region->capacity = kRegionBytes / chunk_bytes;
      region->free_slots.reserve(region->capacity);
      Region* result = region.get();
      regions_.emplace(reinterpret_cast<uintptr_t>(base), std::move(region));
      slack_ += kRegionBytes;
      return result;
    } catch (...) {
      unmap_counted(base, kRegionBytes);
      throw;
    }
  }

  // An empty region is kept for the next one mapped, up to the cache's limit: replacing a table
  // (load_state_dict, a checkpoint load) frees about as many regions as it maps again.
  void keep_or_unmap(std::byte* base) noexcept {
    if ((empty_regions_.size() + 1) * kRegionBytes <= cache_limit_.bytes) {
      try {
        empty_regions_.push_back(base);
        return;
      } catch (const std::bad_alloc&) {
        // No room to remember it: give it back instead.
      }
    }
    unmap_counted(base, kRegionBytes);
  }

  static void link(Region*& head, Region* region) {
    region->prev = nullptr;
    region->next = head;
    if (head != nullptr) head->prev = region;
    head = region;
  }

  static void unlink(Region*& head, Region* region) {
    (region->prev != nullptr ? region->prev->next : head) = region->next;
    if (region->next != nullptr) region->next->prev = region->prev;
    region->prev = region->next = nullptr;
  }

  std::mutex mutex_;
  std::unordered_map<uintptr_t, std::unique_ptr<Region>> regions_;  // by base address
  std::unordered_map<size_t, Region*> with_room_;                   // by chunk size: list heads
  std::unordered_map<uintptr_t, size_t> whole_regions_;             // by base address: bytes
  size_t slack_ = 0;
  const CacheLimit cache_limit_;
  std::vector<std::byte*> empty_regions_;  // kept for reuse: still mapped, still on huge pages
};

Pool& pool() {
  // Leaked on purpose: tables freed during static destruction still return their chunks.
  static Pool* instance = new Pool();
  return *instance;
}

bool pooled(size_t bytes) {
  return bytes >= kMinPooledBytes &&
         (bytes <= kMaxAnyPooledBytes || (bytes <= kRegionBytes && kRegionBytes % bytes == 0));
}

}  // namespace

void ChunkDeleter::operator()(std::byte* chunk) const noexcept {
  if (chunk == nullptr) return;
  count_allocated(MemoryKind::Table, -static_cast<int64_t>(bytes));
  if (!pool().release(chunk)) {
    delete[] chunk;
    count_reserved(MemoryKind::Table, -static_cast<int64_t>(bytes));
  }
}

ChunkPtr allocate_chunk(size_t bytes) {
  pool().check_settings();
  std::byte* chunk;
  if (pooled(bytes)) {
    chunk = pool().allocate(bytes);
  } else if (bytes > kRegionBytes && bytes % kRegionBytes == 0) {
    chunk = pool().allocate_whole_regions(bytes);
  } else {
    return allocate_heap_chunk(bytes);
  }
  count_allocated(MemoryKind::Table, static_cast<int64_t>(bytes));
  return ChunkPtr(chunk, ChunkDeleter{bytes});
}

ChunkPtr allocate_heap_chunk(size_t bytes) {
  ChunkPtr chunk(new std::byte[bytes], ChunkDeleter{bytes});
  count_reserved(MemoryKind::Table, static_cast<int64_t>(bytes));
  count_allocated(MemoryKind::Table, static_cast<int64_t>(bytes));
  return chunk;
}

std::byte* map_huge_pages(size_t bytes) { return map_aligned(bytes); }

void unmap_huge_pages(std::byte* base, size_t bytes) noexcept { unmap(base, bytes); }

size_t pooled_chunk_slack_bytes() { return pool().slack(); }

size_t cached_chunk_region_bytes() { return pool().cached(); }

void release_cached_chunk_regions() noexcept { pool().release_cached(); }

}  // namespace recdev::store
