#include "host_block_cache.h"

#include "memory_stats.h"

#include <cstdlib>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

namespace recdev::device {

namespace {

size_t cache_limit() {
  static const size_t limit = [] {
    const char* value = std::getenv("RECDEV_HOST_CACHE_BYTES");
    return value != nullptr && *value != '\0' ? static_cast<size_t>(std::stoull(value)) : size_t{1} << 30;
  }();
  return limit;
}

struct Cache {
  std::mutex mutex;
  // Oldest first; the map points at every block of one size.
  std::list<std::pair<size_t, c10::DataPtr>> blocks;
  std::unordered_multimap<size_t, std::list<std::pair<size_t, c10::DataPtr>>::iterator> by_size;
  size_t bytes = 0;

  void evict_oldest() {
    auto oldest = blocks.begin();
    auto [first, last] = by_size.equal_range(oldest->first);
    for (auto it = first; it != last; ++it) {
      if (it->second == oldest) {
        by_size.erase(it);
        break;
      }
    }
    bytes -= oldest->first;
    count_cached_host_block(-static_cast<int64_t>(oldest->first));
    blocks.erase(oldest);
  }
};

Cache& cache() {
  // Leaked on purpose: storages freed during interpreter shutdown still return blocks.
  static Cache* instance = new Cache();
  return *instance;
}

}  // namespace

c10::DataPtr take_cached_block(size_t nbytes) {
  if (nbytes < kMinCachedBlockBytes) {
    return {};
  }
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto found = c.by_size.find(nbytes);
  if (found == c.by_size.end()) {
    return {};
  }
  auto entry = found->second;
  c.by_size.erase(found);
  c10::DataPtr block = std::move(entry->second);
  c.bytes -= nbytes;
  c.blocks.erase(entry);
  count_cached_host_block(-static_cast<int64_t>(nbytes));
  return block;
}

void return_block(c10::DataPtr block, size_t nbytes) {
  if (nbytes < kMinCachedBlockBytes || nbytes > cache_limit() || block.get() == nullptr) {
    return;  // freed by the DataPtr's own deleter
  }
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  while (c.bytes + nbytes > cache_limit()) {
    c.evict_oldest();
  }
  c.blocks.emplace_back(nbytes, std::move(block));
  c.by_size.emplace(nbytes, std::prev(c.blocks.end()));
  c.bytes += nbytes;
  count_cached_host_block(static_cast<int64_t>(nbytes));
}

void empty_host_cache() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.by_size.clear();
  for (const auto& [nbytes, block] : c.blocks) count_cached_host_block(-static_cast<int64_t>(nbytes));
  c.blocks.clear();
  c.bytes = 0;
}

size_t cached_host_bytes() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.bytes;
}

}  // namespace recdev::device
