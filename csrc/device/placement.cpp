#include "placement.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace recdev::device {

namespace {

constexpr uint32_t kChunkBytes = 256;
// A row must fit a store record (1 GiB) and be at least one 4-byte word.
constexpr uint64_t kMaxRowBytes = uint64_t{1} << 30;

uint64_t from_env(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return fallback;
  }
  try {
    return std::stoull(value);
  } catch (const std::exception&) {
    TORCH_CHECK(false, name, " must be a number of bytes; got '", value, "'");
  }
}

std::atomic<uint64_t>& min_bytes() {
  static std::atomic<uint64_t> value{from_env("RECDEV_TABLE_MIN_BYTES", uint64_t{64} << 20)};
  return value;
}

std::atomic<uint64_t>& fallback_limit() {
  static std::atomic<uint64_t> value{from_env("RECDEV_MAX_FALLBACK_BYTES", uint64_t{1} << 30)};
  return value;
}

thread_local PlacementOverride current_override = PlacementOverride::None;

}  // namespace

uint64_t table_min_bytes() { return min_bytes().load(); }

void set_table_min_bytes(uint64_t bytes) { min_bytes().store(bytes); }

PlacementOverride placement_override() { return current_override; }

void set_placement_override(PlacementOverride p) { current_override = p; }

uint64_t max_fallback_bytes() { return fallback_limit().load(); }

void set_max_fallback_bytes(uint64_t bytes) { fallback_limit().store(bytes); }

bool place_in_table(uint64_t nbytes) {
  switch (current_override) {
    case PlacementOverride::Host: return false;
    case PlacementOverride::Table: return nbytes > 0;
    case PlacementOverride::None: break;
  }
  return nbytes > 0 && nbytes >= table_min_bytes();
}

uint32_t table_row_bytes(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  if (sizes.size() >= 2 && sizes[0] > 0) {
    uint64_t row = c10::elementSize(dtype);
    for (size_t i = 1; i < sizes.size(); ++i) {
      row *= static_cast<uint64_t>(sizes[i]);
    }
    if (row > 0 && row % 4 == 0 && row <= kMaxRowBytes) {
      return static_cast<uint32_t>(row);
    }
  }
  return kChunkBytes;
}

}  // namespace recdev::device
